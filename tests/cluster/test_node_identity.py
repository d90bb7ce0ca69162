"""One identity per node, enforced by the API server (deploy/rbac.yaml, deploy/node-policy*.yaml;
docs/cluster.md, "One identity per node"): node A's own credentials, as root on node A has
them, are refused by the API server for node B's status entry, topology object and events,
and allowed their own. Each attempt is the request an attacker would send (raw JSON, any
field manager, ``force``), not only what the daemon sends."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Dict, Optional, Tuple

from cluster_helpers import Cluster, node_request, oenuma, start_node, stop_node

from anolisnuma.testing.waiting import wait_until

OENUMAS = "/apis/resource.sop.huawei.com/v1alpha1/namespaces/batch/oenumas"
NRTS = "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies"
EVENTS = "/apis/events.k8s.io/v1/namespaces/batch/events"
APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"


def two_nodes(cluster: Cluster) -> Tuple[str, str]:
    a, b = (f"{x}-{uuid.uuid4().hex[:6]}" for x in ("node-a", "node-b"))
    cluster.node_kubeconfig(a)
    cluster.node_kubeconfig(b)
    return a, b


def refused(reply: Tuple[int, str], policy: str) -> bool:
    """Refused by the API server's admission, by the policy named (not by RBAC, not a
    malformed request)."""
    code, message = reply
    return code == 403 and f"ValidatingAdmissionPolicy '{policy}'" in message


def entry(node: str, summary: str = "1/1 pods pinned") -> Dict[str, Any]:
    return {"name": node, "observedGeneration": 1, "summary": summary, "problems": [],
            "pods": [{"namespace": "batch", "name": "web-0", "state": "Pinned", "cpuset": "4-5"}]}


def naming_both(cr: str, a: str, b: str) -> str:
    """An Oenuma naming node ``b``, then node ``a``."""
    return oenuma(cr, a, {"web-0": 2}).replace('"spec": {"node": [', f'"spec": {{"node": [{{"name": "{b}"}}, ')


def status_apply(cluster: Cluster, node: str, cr: str, status: Optional[Dict[str, Any]],
                 manager: str) -> Tuple[int, str]:
    """A server-side apply of ``status`` (None: nothing, which takes away all the field
    manager held) to the CR's status, with ``force``, by ``node``'s credentials."""
    body: Dict[str, Any] = {"apiVersion": "resource.sop.huawei.com/v1alpha1", "kind": "Oenuma",
                            "metadata": {"name": cr, "namespace": "batch"}}
    if status is not None:
        body["status"] = status
    return node_request(cluster.cp, node, "PATCH", f"{OENUMAS}/{cr}/status?fieldManager={manager}&force=true",
                        body, APPLY)


def status_of(cluster: Cluster, cr: str) -> Dict[str, Any]:
    return cluster.oenuma("batch", cr).get("status") or {}


def test_a_node_may_not_forge_nor_erase_another_nodes_status_entry(cluster: Cluster) -> None:
    a, b = two_nodes(cluster)
    cr = f"id-{a}"
    cluster.apply(naming_both(cr, a, b))
    theirs = {"summary": f"{b}, gen 1: ok", "nodes": [entry(b)]}
    assert status_apply(cluster, b, cr, theirs, f"anolisnuma/{b}")[0] == 200
    b_entry = status_of(cluster, cr)["nodes"]

    forged = {"summary": f"{a}, gen 1: ok", "nodes": [entry(a), entry(b, "0/1 pods pinned")]}
    assert refused(status_apply(cluster, a, cr, forged, f"anolisnuma/{a}"), "anolisnuma-node-status")
    assert refused(status_apply(cluster, a, cr, {"nodes": [entry(b, "forged")]}, f"anolisnuma/{b}"),
                   "anolisnuma-node-status")   # (under B's own field manager)
    assert refused(status_apply(cluster, a, cr, None, f"anolisnuma/{b}"), "anolisnuma-node-status")   # erase
    assert refused(node_request(cluster.cp, a, "PATCH", f"{OENUMAS}/{cr}/status", {"status": {"nodes": []}}, MERGE),
                   "anolisnuma-node-status")
    assert status_of(cluster, cr)["nodes"] == b_entry

    # its own entry, as the daemon writes it: allowed, beside B's
    own = {"summary": f"{a}, gen 1: ok", "nodes": [entry(a)]}
    assert status_apply(cluster, a, cr, own, f"anolisnuma/{a}")[0] == 200
    assert [e["name"] for e in status_of(cluster, cr)["nodes"]] == [b, a]
    cluster.cp.kubectl("delete", "oenuma", "-n", "batch", cr)


def test_a_node_may_not_keep_another_nodes_entry_alive_nor_speak_for_it(cluster: Cluster) -> None:
    """Server-side apply removes an entry when no field manager holds it any more: a node
    that co-owns another's entry (applying the same content) would keep it after that node
    took it away. And status.summary says which node reported last."""
    a, b = two_nodes(cluster)
    cr = f"id-{a}"
    cluster.apply(naming_both(cr, a, b))
    assert status_apply(cluster, b, cr, {"nodes": [entry(b)]}, f"anolisnuma/{b}")[0] == 200
    same = status_of(cluster, cr)["nodes"][0]
    for manager in (f"anolisnuma/{a}", "kubectl"):
        assert refused(status_apply(cluster, a, cr, {"nodes": [entry(a), same]}, manager), "anolisnuma-node-status")
    assert refused(status_apply(cluster, a, cr, {"summary": f"{b}, gen 1: 0/1 pods pinned", "nodes": [entry(a)]},
                                f"anolisnuma/{a}"), "anolisnuma-node-status")

    assert status_apply(cluster, b, cr, None, f"anolisnuma/{b}")[0] == 200     # B stops reporting
    assert not status_of(cluster, cr).get("nodes")
    cluster.cp.kubectl("delete", "oenuma", "-n", "batch", cr)


def nrt(name: str) -> Dict[str, Any]:
    return {"apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology", "metadata": {"name": name},
            "zones": [], "topologyPolicies": ["None"]}


def test_a_node_may_publish_only_its_own_topology_object(cluster: Cluster) -> None:
    a, b = two_nodes(cluster)

    def apply(node: str, name: str) -> Tuple[int, str]:
        return node_request(cluster.cp, node, "PATCH", f"{NRTS}/{name}?fieldManager=anolisnuma/{node}&force=true",
                            nrt(name), APPLY)
    assert refused(apply(a, b), "anolisnuma-node-topology")                 # made in B's name
    assert refused(node_request(cluster.cp, a, "POST", NRTS, nrt(b)), "anolisnuma-node-topology")
    assert apply(b, b)[0] in (200, 201) and apply(a, a)[0] in (200, 201)
    rewritten = dict(nrt(b), zones=[{"name": "node-0", "type": "Node"}])
    assert refused(node_request(cluster.cp, a, "PATCH", f"{NRTS}/{b}?fieldManager=x&force=true", rewritten, APPLY),
                   "anolisnuma-node-topology")
    assert refused(node_request(cluster.cp, a, "PATCH", f"{NRTS}/{b}", {"zones": []}, MERGE),
                   "anolisnuma-node-topology")
    assert node_request(cluster.cp, a, "DELETE", f"{NRTS}/{b}", {})[0] == 403     # (RBAC: no delete)
    assert cluster.cp.request("GET", f"{NRTS}/{b}")["zones"] == []
    # anyone but a node identity is not looked at: an admin may still write (or remove) it
    cluster.cp.request("PATCH", f"{NRTS}/{b}", {"zones": [{"name": "node-0", "type": "Node"}]}, content_type=MERGE)
    cluster.cp.request("DELETE", f"{NRTS}/{b}")


def event(name: str, instance: str, regarding: Dict[str, str], controller: str = "anolisnuma.io/numa",
          **extra: Any) -> Dict[str, Any]:
    """An event as the daemon makes one (a NUMA placement by default), its note
    starting with the node's name (``instance`` less its ``anolisnuma-``)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%S.000001Z", time.gmtime())
    note = f"{instance[len('anolisnuma-'):]}: NUMA node 2, cpuset 4-5, memset 2, by balance"
    return dict({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": name, "namespace": "batch"},
                 "eventTime": now, "type": "Normal", "reason": "NumaPlaced", "action": "Place", "note": note,
                 "reportingController": controller, "reportingInstance": instance, "regarding": regarding}, **extra)


POD = {"kind": "Pod", "apiVersion": "v1", "namespace": "batch", "name": "web-0", "uid": "c56c2ebb"}


def test_a_node_may_make_and_count_only_its_own_events(cluster: Cluster) -> None:
    a, b = two_nodes(cluster)

    def create(body: Dict[str, Any]) -> Tuple[int, str]:
        return node_request(cluster.cp, a, "POST", EVENTS, body)
    # in B's name, or posing as the kubelet or the scheduler
    assert refused(create(event(f"e1-{a}", f"anolisnuma-{b}", POD)), "anolisnuma-node-events")
    assert refused(create(event(f"e2-{a}", b, POD, controller="kubelet")), "anolisnuma-node-events")
    assert refused(create(event(f"e3-{a}", f"anolisnuma-{a}", POD, controller="default-scheduler")),
                   "anolisnuma-node-events")
    # about what the daemon never tells of, or pointing at another object
    secret = {"kind": "Secret", "apiVersion": "v1", "namespace": "batch", "name": "db-password"}
    assert refused(create(event(f"e4-{a}", f"anolisnuma-{a}", secret)), "anolisnuma-node-events")
    assert refused(create(event(f"e5-{a}", f"anolisnuma-{a}", POD, related=secret)), "anolisnuma-node-events")
    # the core API's events: RBAC grants none
    core = {"apiVersion": "v1", "kind": "Event", "metadata": {"name": f"e6-{a}", "namespace": "batch"},
            "involvedObject": dict(POD), "reason": "X", "message": "x"}
    assert node_request(cluster.cp, a, "POST", "/api/v1/namespaces/batch/events", core)[0] == 403

    # B's event: A may not count it in a series (what else there is, is immutable)
    assert node_request(cluster.cp, b, "POST", EVENTS, event(f"eb-{b}", f"anolisnuma-{b}", POD))[0] == 201
    series = {"series": {"count": 2, "lastObservedTime": "2026-01-01T00:00:00.000001Z"}}
    assert refused(node_request(cluster.cp, a, "PATCH", f"{EVENTS}/eb-{b}", series, MERGE), "anolisnuma-node-events")
    assert "series" not in cluster.cp.request("GET", f"{EVENTS}/eb-{b}")

    # its own, about a pod or an Oenuma, and their series: allowed
    assert create(event(f"ea-{a}", f"anolisnuma-{a}", POD))[0] == 201
    cr = {"kind": "Oenuma", "apiVersion": "resource.sop.huawei.com/v1alpha1", "namespace": "batch", "name": "web"}
    assert create(event(f"ec-{a}", f"anolisnuma-{a}", cr, reason="OenumaRefused", action="Refuse",
                        type="Warning"))[0] == 201
    assert node_request(cluster.cp, a, "PATCH", f"{EVENTS}/ea-{a}", series, MERGE)[0] == 200


def test_a_daemon_given_another_nodes_name_is_refused_by_the_api_server(cluster: Cluster, tmp_path: Any,
                                                                       sockdir: str) -> None:
    """Root on node A has node A's token; a daemon it configures as node B (``node_name``)
    gets nothing written in B's name: its status entry, topology object and events about
    the pods it says it placed are refused, and the link says so."""
    a, b = two_nodes(cluster)
    node = start_node(str(tmp_path), sockdir, cluster.node_kubeconfig(a), b, topology=True,
                      topology_interval_seconds=1.0)
    try:
        node.kubelet.run("forged-0")
        cluster.apply(oenuma(f"id-{b}", b, {"forged-0": 1}))
        link = node.link
        wait_until(lambda: link.reporter.failures and link.topology.failures and link.events.failed,
                   "the status entry, the topology object and the events refused")
        for error in (link.reporter.last_error, link.topology.publish_error, link.events.last_error):
            assert "403" in error and "ValidatingAdmissionPolicy" in error, error
        assert not status_of(cluster, f"id-{b}").get("nodes")
        assert not [e for e in cluster.cp.request("GET", EVENTS)["items"]
                    if e["reportingInstance"] == f"anolisnuma-{b}"]
        assert json.dumps(cluster.cp.request("GET", NRTS)).count(f'"name": "{b}"') == 0
    finally:
        stop_node(node)
        cluster.cp.kubectl("delete", "oenuma", "-n", "batch", f"id-{b}")
