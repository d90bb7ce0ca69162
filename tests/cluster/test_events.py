"""Events on the real API server: a pod re-pinned by a CR, a CR skipped as malformed (a
repeat of the same event counted in its series), the rate limit per object."""

from __future__ import annotations

import json

from cluster_helpers import Cluster, Node, events_about, oenuma

from anolisnuma.cluster.events import BURST, Event, EventRecorder, oenuma_regarding
from anolisnuma.testing.waiting import wait_until


def test_a_pod_re_pinned_by_a_cr_gets_an_event(cluster: Cluster, node: Node) -> None:
    pod = node.kubelet.run("ev-0")
    cluster.apply(oenuma("ev", node.name, {"ev-0": 3}))
    wait_until(lambda: node.settled(pod, (3,)), "the pod re-pinned")
    ev = wait_until(lambda: [e for e in events_about(cluster, "batch", "ev-0") if e["reason"] == "NumaRepinned"],
                    "the pod's event")[0]
    assert ev["type"] == "Normal" and ev["regarding"]["uid"] == pod.uid and ev["regarding"]["kind"] == "Pod"
    assert ev["note"] == f"{node.name}: NUMA node 3, cpuset 6-7, memset 3, by Oenuma batch/ev"
    assert ev["reportingController"] == "anolisnuma.io/numa"
    described = cluster.cp.kubectl("get", "events", "-n", "batch", "--field-selector",
                                   "involvedObject.name=ev-0").stdout
    assert "NumaRepinned" in described
    cluster.cp.kubectl("delete", "oenuma", "-n", "batch", "ev")


def test_a_malformed_cr_gets_an_event_and_its_repeats_a_series(cluster: Cluster, node: Node) -> None:
    bad = {"apiVersion": "resource.sop.huawei.com/v1alpha1", "kind": "Oenuma",
           "metadata": {"name": "evbad", "namespace": "batch"},
           "spec": {"node": [{"name": node.name, "podAffinity": [{"podName": "x"}]}]}}   # (no numaNum)
    cluster.apply(json.dumps(bad))
    first = wait_until(lambda: events_about(cluster, "batch", "evbad"), "the CR's event")
    assert first[0]["reason"] == "OenumaMalformed" and first[0]["type"] == "Warning"
    bad["spec"]["replicas"] = 2          # a new generation, the same problem
    cluster.apply(json.dumps(bad))
    again = wait_until(lambda: [e for e in events_about(cluster, "batch", "evbad") if e.get("series")],
                       "the repeat counted in the series")
    assert len(events_about(cluster, "batch", "evbad")) == 1 and again[0]["series"]["count"] == 2
    cluster.cp.kubectl("delete", "oenuma", "-n", "batch", "evbad")


def test_events_past_the_burst_are_dropped_per_object(cluster: Cluster) -> None:
    from anolisnuma.cluster.kube_client import KubeClient
    from anolisnuma.cluster.kubeconfig import load_kubeconfig

    rec = EventRecorder(KubeClient(load_kubeconfig(cluster.kubeconfig), 5.0), "n1", clock=lambda: 1000.0)
    about = oenuma_regarding("batch", "flood", "")
    taken = [rec.record(Event(about, "Normal", "Test", "Test", f"n{i}")) for i in range(BURST + 5)]
    assert taken == [True] * BURST + [False] * 5 and rec.dropped_rate == 5
    assert rec.record(Event(oenuma_regarding("batch", "other", ""), "Normal", "Test", "Test", "x"))
    assert rec.run_once() == BURST + 1 and rec.sent == BURST + 1, getattr(rec, "last_error", "")
