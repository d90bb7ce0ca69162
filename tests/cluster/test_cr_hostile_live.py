"""Issue 33's tenant, end to end on the real API server: a CR of an untrusted namespace
carrying H1's and H2's CPU lists is refused at the door, while the CR of a trusted
namespace applied in the same ``kubectl apply`` moves its pod; the same CRs let through
(as an older CRD, operator-numaadj's own, would) cost the running daemon a bounded amount
and leave the kubelet's calls as fast as they were; after a restart the link is up and a
new CR still moves a pod."""

from __future__ import annotations

import copy
import json
import resource
import statistics
import time
import uuid
from typing import Any, Dict, Iterator, List

import psutil
import pytest
from cluster_helpers import Cluster, Node, start_node, stop_node
from test_cr_trust_live import ADMIN, TENANT, namespaces, oenuma

from anolisnuma.testing.waiting import wait_until

H1 = "0-0:2147483648/2147483648"                          # 558 MB peak RSS before
H1_CPU = ",".join(["0-65535:1/1"] * 85)                  # 1 KiB: 1.7 s of CPU before
H2 = "0-0:18446744073709551616/18446744073709551616"      # MemoryError / OverflowError before


def hostile(name: str, namespace: str, node: str) -> Dict[str, Any]:
    return json.loads(oenuma(name, namespace, node, [{"podName": "mv-*", "numaNum": 1}],
                             numa=[{"numaNum": 1, "cpuset": H1, "memset": H2},
                                   {"numaNum": 2, "cpuset": H1_CPU, "memset": "2"}]))


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def version_p50(node: Node, n: int = 40) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        node.kubelet.version()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


@pytest.fixture
def workdir(cluster: Cluster, tmp_path: Any, sockdir: str) -> Iterator[Dict[str, Any]]:
    namespaces(cluster)
    name = f"worker-{uuid.uuid4().hex[:8]}"
    run = {"name": name, "kubeconfig": cluster.node_kubeconfig(name), "base": str(tmp_path), "sockdir": sockdir,
           "node": None}
    try:
        yield run
    finally:
        if run["node"] is not None:
            stop_node(run["node"])


def start(run: Dict[str, Any]) -> Node:
    run["node"] = start_node(run["base"], run["sockdir"], run["kubeconfig"], run["name"], trusted_namespaces=[ADMIN])
    return run["node"]


def test_a_tenants_h1_h2_cr_fails_alone_and_the_node_keeps_its_link(cluster: Cluster, workdir: Dict[str, Any]) -> None:
    node = start(workdir)
    pod = node.kubelet.run("mv-0")
    target = (node.nodes_of(pod)[0] + 1) % 4
    # when a tenant's CR with H1's and H2's lists and an administrator's CR moving the pod
    # come in one `kubectl apply`
    mover = json.loads(oenuma("mover", ADMIN, node.name, [{"namespace": "batch", "podName": "mv-0",
                                                            "numaNum": target}]))
    both = {"apiVersion": "v1", "kind": "List", "items": [hostile("h1h2", TENANT, node.name), mover]}
    done = cluster.cp.kubectl("apply", "-f", "-", input=json.dumps(both), check=False)
    # then the API server refuses the tenant's, naming the field, and the other still moves the pod
    assert done.returncode != 0 and "spec.node[0].numa[0].cpuset" in done.stderr and "should match" in done.stderr
    assert cluster.cp.kubectl("get", "oenuma", "-n", TENANT, "h1h2", check=False).returncode != 0
    wait_until(lambda: node.settled(pod, (target,)), "the administrator's CR moving the pod")

    # when the same CRs reach the daemon as an older CRD would let them (trusted and not),
    # with the kubelet calling meanwhile
    before = version_p50(node)
    rss, cpu = psutil.Process().memory_info().rss, cpu_seconds()
    crs = node.link.crs
    let_through: List[Dict[str, Any]] = []
    for i, namespace in enumerate((TENANT, ADMIN)):
        obj = hostile(f"old-crd-{i}", namespace, node.name)
        obj["metadata"].update(uid=f"u{i}", generation=1, resourceVersion="1")
        let_through.append(obj)
        crs.upsert(copy.deepcopy(obj))
    node.link.sync.wake()
    keys = {("tenant-a", "old-crd-0"), (ADMIN, "old-crd-1")}
    wait_until(lambda: keys <= {cr.key for cr in node.link.sync.current if cr.error},
               "the hostile CRs taken and refused")
    during = version_p50(node)
    # then they cost the daemon little and fail alone
    assert cpu_seconds() - cpu < 1.0
    assert psutil.Process().memory_info().rss - rss < 64 * 1024 * 1024
    assert during <= 3 * before + 0.002, (during, before)
    assert node.nodes_of(pod) == (target,) and node.link.watcher.state == "synced"

    # when the daemon restarts (its saved rules read back first), then the link is up and
    # a new CR still moves a new pod
    stop_node(node)
    workdir["node"] = None
    node = start(workdir)
    wait_until(lambda: node.link.watcher.state == "synced", "the API server link up after the restart")
    later = node.kubelet.run("mv-1")
    target = (node.nodes_of(later)[0] + 2) % 4
    cluster.apply(oenuma("mover-2", ADMIN, node.name, [{"namespace": "batch", "podName": "mv-1", "numaNum": target}]))
    wait_until(lambda: node.settled(later, (target,)), "a new CR moving a pod after the restart")
    for name in ("mover", "mover-2"):
        cluster.cp.kubectl("delete", "oenuma", "-n", ADMIN, name)
