"""Who may move which pods, on the real API server: a CR of a namespace the node does not
trust (the default: ``[kubernetes] trusted_namespaces`` empty) that names another
namespace, a namespace pattern or a numa[] table changes no placement and is reported in
its status entry and by a Warning event; it cannot make the node manage a pod ``[numa]``
leaves alone; a CR in the pod's own namespace still moves it; a CR of a trusted namespace
may do everything a CR could before."""

from __future__ import annotations

import json
import uuid
from typing import Any, Dict, Iterator, List, Optional

import pytest
from cluster_helpers import Cluster, Node, events_about, start_node, stop_node

from anolisnuma.testing.kubelet_client import Pod
from anolisnuma.testing.waiting import wait_until

TENANT = "tenant-a"     # a namespace the nodes do not trust
ADMIN = "numa-admin"    # the namespace the trusting node trusts


def namespaces(cluster: Cluster) -> None:
    for ns in (TENANT, ADMIN):
        if cluster.cp.kubectl("get", "namespace", ns, check=False).returncode != 0:
            cluster.cp.kubectl("create", "namespace", ns)


@pytest.fixture
def trusting(cluster: Cluster, tmp_path: Any, sockdir: str) -> Iterator[Node]:
    """A node that trusts ADMIN."""
    namespaces(cluster)
    name = f"worker-{uuid.uuid4().hex[:8]}"
    n = start_node(str(tmp_path), sockdir, cluster.node_kubeconfig(name), name, trusted_namespaces=[ADMIN])
    try:
        yield n
    finally:
        stop_node(n)


def oenuma(name: str, namespace: str, node: str, affinity: List[Dict[str, Any]],
           numa: Optional[List[Dict[str, Any]]] = None) -> str:
    entry: Dict[str, Any] = {"name": node, "podAffinity": affinity}
    if numa is not None:
        entry["numa"] = numa
    return json.dumps({"apiVersion": "resource.sop.huawei.com/v1alpha1", "kind": "Oenuma",
                       "metadata": {"name": name, "namespace": namespace}, "spec": {"node": [entry]}})


def entry_of(cluster: Cluster, node: Node, namespace: str, name: str) -> Any:
    """This node's status entry of the CR once it reports on the CR's generation."""
    def mine() -> Any:
        cr = cluster.oenuma(namespace, name)
        found = [e for e in (cr.get("status") or {}).get("nodes") or [] if e["name"] == node.name]
        return found and found[0]["observedGeneration"] == cr["metadata"]["generation"] and found[0]
    return wait_until(mine, f"{node.name}'s status entry on {namespace}/{name}")


def refused_event(cluster: Cluster, namespace: str, name: str) -> Any:
    return wait_until(lambda: [e for e in events_about(cluster, namespace, name) if e["reason"] == "OenumaRefused"],
                      f"the Warning event on {namespace}/{name}")[0]


def unmoved(node: Node, pod: Pod, nodes: tuple, sent: List[str]) -> bool:
    return node.nodes_of(pod) == nodes and node.repinned(pod.containers["c0"]) == sent \
        and node.placement.ledger.get(pod.uid).source == "balance"


@pytest.mark.parametrize("namespace", ["batch", "*", "b?tch"])
def test_a_tenant_cr_naming_another_namespace_or_a_pattern_moves_nothing_and_is_reported(
        cluster: Cluster, node: Node, namespace: str) -> None:
    namespaces(cluster)
    victim = node.kubelet.run("victim-0")
    start = node.nodes_of(victim)
    sent = node.repinned(victim.containers["c0"])
    name = f"grab-{uuid.uuid4().hex[:6]}"
    cluster.apply(oenuma(name, TENANT, node.name, [{"namespace": namespace, "podName": "*",
                                                    "numaNum": (start[0] + 1) % 4}]))
    e = entry_of(cluster, node, TENANT, name)
    assert e["conditions"][0]["status"] == "False" and e["conditions"][0]["reason"] == "Refused"
    assert "only an Oenuma of a namespace this node trusts may name pods of other namespaces" in e["problems"][0]
    assert e["pods"] == []   # nothing of another namespace listed: no names, no UIDs
    event = refused_event(cluster, TENANT, name)
    assert event["type"] == "Warning" and event["note"].startswith(f"{node.name}: parts refused")
    assert unmoved(node, victim, start, sent)
    cluster.cp.kubectl("delete", "oenuma", "-n", TENANT, name)


def test_a_tenant_crs_numa_table_moves_nothing_and_is_reported(cluster: Cluster, node: Node) -> None:
    pod = node.kubelet.run("tbl-0")
    start = node.nodes_of(pod)
    sent = node.repinned(pod.containers["c0"])
    target = (start[0] + 1) % 4
    cluster.apply(oenuma("tbl", "batch", node.name, [{"podName": "tbl-0", "numaNum": target}],
                         numa=[{"numaNum": target, "cpuset": str(2 * target), "memset": str(start[0])}]))
    e = entry_of(cluster, node, "batch", "tbl")
    assert e["conditions"][0]["reason"] == "Refused"
    assert any("a numa[] table" in p for p in e["problems"]) and any("not pinned" in p for p in e["problems"])
    assert "numa[] table" in refused_event(cluster, "batch", "tbl")["note"]
    assert unmoved(node, pod, start, sent)
    cluster.cp.kubectl("delete", "oenuma", "-n", "batch", "tbl")


def test_a_tenant_cr_moves_its_own_managed_pods_and_cannot_make_the_node_manage_more(
        cluster: Cluster, node: Node) -> None:
    namespaces(cluster)
    mine = node.kubelet.run("own-0")                            # batch: [numa] manages it
    outside = node.kubelet.run("own-0", namespace=TENANT)      # tenant-a: [numa] leaves it alone
    assert node.placement.ledger.get(outside.uid) is None
    target = (node.nodes_of(mine)[0] + 2) % 4
    cluster.apply(oenuma("own", "batch", node.name, [{"podName": "own-*", "numaNum": target}]))
    cluster.apply(oenuma("own", TENANT, node.name, [{"podName": "own-*", "numaNum": target}]))
    wait_until(lambda: node.settled(mine, (target,)), "the pod of the CR's own namespace re-pinned")
    e = entry_of(cluster, node, TENANT, "own")
    assert [(p["name"], p["state"]) for p in e["pods"]] == [("own-*", "Absent")]
    assert "[numa] selection manages" in e["pods"][0]["reason"]
    assert node.placement.ledger.get(outside.uid) is None and node.repinned(outside.containers["c0"]) == []
    assert entry_of(cluster, node, "batch", "own")["conditions"][0]["status"] == "True"
    cluster.cp.kubectl("delete", "oenuma", "-n", "batch", "own")
    cluster.cp.kubectl("delete", "oenuma", "-n", TENANT, "own")


def test_a_trusted_namespaces_cr_may_do_everything(cluster: Cluster, trusting: Node) -> None:
    node = trusting
    managed = node.kubelet.run("big-0")                        # batch
    outside = node.kubelet.run("big-0", namespace=TENANT)      # not managed by [numa]
    assert node.placement.ledger.get(outside.uid) is None
    cluster.apply(oenuma("all", ADMIN, node.name, [{"namespace": "b*", "podName": "big-?", "numaNum": 3},
                                                   {"namespace": TENANT, "podName": "big-0", "numaNum": 1}],
                         numa=[{"numaNum": 3, "cpuset": "7", "memset": "3"}]))
    wait_until(lambda: node.settled(managed, (3,)), "the other namespace's pod pinned by a pattern")
    alloc = node.placement.ledger.get(managed.uid)
    assert str(alloc.cpus(node.placement.shared_pool)) == "7" and str(alloc.mems) == "3"
    # a pod [numa] leaves alone is managed from its next container: a trusted CR may select it
    later = node.kubelet.run("big-0", namespace=TENANT)
    assert node.nodes_of(later) == (1,) and node.placement.ledger.get(later.uid).source == "rule"
    e = entry_of(cluster, node, ADMIN, "all")
    assert e["problems"] == [] and not [ev for ev in events_about(cluster, ADMIN, "all")
                                         if ev["reason"] == "OenumaRefused"]
    cluster.cp.kubectl("delete", "oenuma", "-n", ADMIN, "all")
