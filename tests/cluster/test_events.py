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

    rec = EventRecorder(KubeClient(load_kubeconfig(cluster.node_kubeconfig("n1")), 5.0), "n1", clock=lambda: 1000.0)
    about = oenuma_regarding("batch", "flood", "")
    taken = [rec.record(Event(about, "Warning", "OenumaRefused", "Refuse", f"n1: {i}")) for i in range(BURST + 5)]
    assert taken == [True] * BURST + [False] * 5 and rec.dropped_rate == 5
    assert rec.record(Event(oenuma_regarding("batch", "other", ""), "Warning", "OenumaRefused", "Refuse", "n1: x"))
    assert rec.run_once() == BURST + 1 and rec.sent == BURST + 1, getattr(rec, "last_error", "")


def test_pods_a_cr_releases_are_told_where_they_went_and_a_cr_made_again_tells_again(
        cluster: Cluster, node: Node) -> None:
    keep, drop = node.kubelet.run("rel-0"), node.kubelet.run("rel-1")
    cluster.apply(oenuma("rel", node.name, {"rel-0": 3, "rel-1": 2}))
    wait_until(lambda: node.settled(keep, (3,)) and node.settled(drop, (2,)), "both pods pinned")

    def released(pod) -> list:
        return [e for e in events_about(cluster, "batch", pod.name) if e["reason"] == "NumaReleased"]

    def where(pod) -> str:
        a = node.placement.ledger.get(pod.uid)
        return (f"NUMA node {','.join(map(str, a.nodes))}, cpuset {a.cpus(node.placement.shared_pool)}, "
                f"memset {a.mems}")

    # the pod's entry removed from the CR: that pod alone is released, to balance
    cluster.apply(oenuma("rel", node.name, {"rel-0": 3}))
    ev = wait_until(lambda: released(drop), "the released pod's event")[0]
    assert ev["type"] == "Normal" and ev["regarding"]["uid"] == drop.uid and ev["action"] == "Release"
    assert ev["note"] == f"{node.name}: Oenuma batch/rel no longer pins it: back to balance: {where(drop)}"
    assert not released(keep)

    # the CR deleted: its last pod is released
    cluster.cp.kubectl("delete", "oenuma", "-n", "batch", "rel")
    ev = wait_until(lambda: released(keep), "the event of the pod the deleted CR released")[0]
    assert ev["note"] == f"{node.name}: Oenuma batch/rel no longer pins it: back to balance: {where(keep)}"

    # made again: it pins the pod again, and says so again (the same event, counted in its series)
    cluster.apply(oenuma("rel", node.name, {"rel-0": 3}))
    wait_until(lambda: [e for e in events_about(cluster, "batch", "rel-0") if e["reason"] == "NumaRepinned"
                        and (e.get("series") or {}).get("count") == 2], "the re-pin told again")
    assert node.link.status()["pods_released"] == 2
    cluster.cp.kubectl("delete", "oenuma", "-n", "batch", "rel")
