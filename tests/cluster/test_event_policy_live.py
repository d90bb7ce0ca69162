"""A node's events say only what the daemon says, on the real API server
(deploy/node-policy-v1alpha1.yaml's anolisnuma-node-events; docs/cluster.md, "One identity
per node"): root on node A, with A's credentials, may not word an event with another
reason or action (the kubelet's ``BackOff``, a ``Killing``), give a NUMA reason as the QoS
component's, nor write a note that does not start with its own name; a note past the API
server's size is refused by the API server, and the daemon cuts its own to fit."""

from __future__ import annotations

from typing import Any, Dict, Tuple

from cluster_helpers import Cluster, events_about, node_request
from test_node_identity import EVENTS, POD, event, refused, two_nodes

from anolisnuma.cluster.events import MAX_NOTE_BYTES, Event, EventRecorder, pod_regarding
from anolisnuma.cluster.kube_client import KubeClient
from anolisnuma.cluster.kubeconfig import load_kubeconfig

POLICY = "anolisnuma-node-events"


def test_a_node_may_make_events_only_with_the_daemons_reasons_and_its_own_name_on_the_note(
        cluster: Cluster) -> None:
    a, b = two_nodes(cluster)
    mine = f"anolisnuma-{a}"

    def create(name: str, **fields: Any) -> Tuple[int, str]:
        return node_request(cluster.cp, a, "POST", EVENTS, event(f"{name}-{a}", mine, POD, **fields))
    # reasons and actions the daemon never has (a Warning as the kubelet would word it)
    assert refused(create("f1", type="Warning", reason="BackOff", note=f"{a}: Back-off restarting failed container"),
                   POLICY)
    assert refused(create("f2", reason="Killing", action="Kill"), POLICY)
    assert refused(create("f3", action="Delete"), POLICY)
    assert refused(create("f4", controller="anolisnuma.io/qos"), POLICY)     # (NumaPlaced is NUMA's)
    # a note in nobody's name, or in another node's
    assert refused(create("f5", note="Pod compromised: run kubectl delete ns batch"), POLICY)
    assert refused(create("f6", note=f"{b}: NUMA node 0"), POLICY)
    assert refused(create("f7", note=f"{a}-x: NUMA node 0"), POLICY)
    assert not [e for e in events_about(cluster, "batch", POD["name"]) if e["reportingInstance"] == mine]

    # what the daemon makes: allowed
    assert create("ok1")[0] == 201
    assert create("ok2", type="Warning", reason="QosSkipped", action="Skip", controller="anolisnuma.io/qos",
                  note=f"{a}: QoS not applied: cgroup_parent not recognized")[0] == 201


def test_a_note_past_the_api_servers_size_is_refused_and_the_daemon_cuts_its_own_to_fit(cluster: Cluster) -> None:
    a, _ = two_nodes(cluster)
    over = f"{a}: " + "x" * (MAX_NOTE_BYTES + 1 - len(a) - 2)
    code, message = node_request(cluster.cp, a, "POST", EVENTS, event(f"big-{a}", f"anolisnuma-{a}", POD, note=over))
    assert code == 422 and "at most 1024" in message, (code, message)   # (the API server's own bound)

    # the daemon's path: a note of 2-byte characters, 1,400 bytes, is cut to the bound and sent
    recorder = EventRecorder(KubeClient(load_kubeconfig(cluster.node_kubeconfig(a)), 5.0), a)
    regarding = pod_regarding("batch", f"wide-{a}", "c56c2ebb")
    try:
        assert recorder.record(Event(regarding, "Warning", "NumaRuleFailed", "Repin", f"{a}: " + "é" * 700))
        assert recorder.run_once() == 1, recorder.last_error
    finally:
        recorder.client.close()
    sent: Dict[str, Any] = events_about(cluster, "batch", f"wide-{a}")[0]
    assert sent["note"].startswith(f"{a}: é") and len(sent["note"].encode()) <= MAX_NOTE_BYTES
