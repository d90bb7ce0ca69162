"""Re-spread on the real containerd and real cgroup v1: the daemon's ``numa-respread`` loop
moves placed pods back toward balance, and their real ``cpuset.cpus`` follow.

1. pods leaving one by one: six pods of 300 m on the fake 2-node topology (node 0 = CPU 0,
   node 1 = CPU 1, as in test_numa_e2e.py), three per node; the pods of node 1 leave one by
   one; once node 1 is 600 m freer than node 0, one pod of node 0 is moved there, live
   (UpdateContainerResources through the re-pinner), and every remaining container's real
   cpuset agrees with the ledger;
2. the pool growing back: the kubelet's checkpoint (static policy, written by the test)
   gives CPU 0 exclusively to a Guaranteed pod, so the managed pods all land on node 1; the
   Guaranteed pod goes and the checkpoint gives CPU 0 back: one pod moves to node 0.

Thresholds are scaled to the 1-CPU nodes (0.5 CPU, no settle time, no cool-down) and the
loop checks every 0.1 s; the test waits for the condition it checks.
"""

from __future__ import annotations

import os
import uuid
from typing import Any, Dict, List, Tuple

from cri_client import KubeletLike, Pod
from test_numa_e2e import NS, alloc_of, check_ledger_consistent, direct, inprocess_numa_proxy, real_cpus, res  # noqa: F401

from anolisnuma.testing.fake_sysfs import write_cpu_manager_state
from anolisnuma.testing.waiting import wait_until

RESPREAD = {"threshold_cpus": 0.5, "settle_seconds": 0.0, "interval_seconds": 1.0, "max_moves_per_interval": 4,
            "cooldown_seconds": 0.0}
NODE_CPU = {0: "0", 1: "1"}


def limited(kl: KubeletLike) -> Any:
    return res(kl, quota=30000, period=100000)     # 300 m


def settled(hook: Any, direct: KubeletLike, pods: List[Tuple[Pod, str]]) -> Dict[str, int]:
    """{pod name: node} once no re-pin is pending and every container's real cpuset is its
    pod's node in the ledger; else {} (to wait on)."""
    p = hook.placement
    if p.pending_updates() or p.moves_in_flight():
        return {}
    out = {}
    for pod, cid in pods:
        a = alloc_of(hook, pod.uid)
        if a is None or len(a.nodes) != 1 or real_cpus(direct, cid) != NODE_CPU[a.nodes[0]]:
            return {}
        out[pod.name] = a.nodes[0]
    return out


def test_pods_leaving_one_by_one_the_rest_spread_again_in_the_real_cgroups(containerd, direct, tmp_path):
    with inprocess_numa_proxy(containerd, str(tmp_path), direct, respread=RESPREAD) as (proxy, hook, kl, data):
        loop = proxy.daemon.controllers.get("numa-respread")
        assert loop is not None and loop.running
        pods = []
        for i in range(6):
            pod = kl.run_pod(name=f"spread-{i}", namespace=NS)
            pods.append((pod, kl.run_container(pod, "main", limited(kl))))
        where = wait_until(lambda: settled(hook, direct, pods), "the six pods placed")
        assert sorted(where.values()) == [0, 0, 0, 1, 1, 1]
        assert loop.counts()["moves"] == 0
        leaving = [(p, c) for p, c in pods if where[p.name] == 1]
        staying = [(p, c) for p, c in pods if where[p.name] == 0]
        for k, (pod, _) in enumerate(leaving):
            kl.stop_pod(pod)
            kl.remove_pod(pod)
            left = staying + leaving[k + 1:]
            if k == 1:
                # node 1 now 1000 m free, node 0 100 m: one of node 0's pods is moved over
                wait_until(lambda: loop.counts()["moves"] == 1, "a re-spread move")
            where = wait_until(lambda: settled(hook, direct, left), "the real cpusets to agree with the ledger")
            check_ledger_consistent(hook)
        # 3 pods of node 0 were left: one moved to node 1 after the second departure
        assert sorted(where.values()) == [0, 0, 1]
        moved = [p for p, _ in staying if where[p.name] == 1]
        assert len(moved) == 1 and alloc_of(hook, moved[0].uid).source == "respread"
        assert loop.counts()["moves"] == 1 and loop.counts()["moves_rolled_back"] == 0 and loop.errors == 0
        kl.cleanup()


def test_the_pool_growing_back_after_an_exclusive_allocation_re_spreads(containerd, direct, tmp_path):
    base = str(tmp_path)
    excl_uid = str(uuid.uuid4())
    state_path = os.path.join(base, "host", "kubelet", "cpu_manager_state")
    write_cpu_manager_state(state_path, default_cpuset="1", entries={excl_uid: {"pinned": "0"}})
    with inprocess_numa_proxy(containerd, base, direct, respread=RESPREAD) as (proxy, hook, kl, data):
        assert str(hook.placement.shared_pool) == "1"
        loop = proxy.daemon.controllers.get("numa-respread")
        g = kl.run_pod(name="guaranteed", namespace="numa-e2e-other", uid=excl_uid, qos="guaranteed",
                       pod_resources=res(kl, quota=100000, period=100000))
        pinned = kl.run_container(g, "pinned", res(kl, shares=1024, quota=100000, period=100000, cpuset="0"))
        direct.parents.add(g.cgroup_parent)  # type: ignore[attr-defined]
        assert real_cpus(direct, pinned) == "0"
        pods = []
        for i in range(2):
            pod = kl.run_pod(name=f"shared-{i}", namespace=NS)
            pods.append((pod, kl.run_container(pod, "main", res(kl, quota=30000, period=100000, cpuset="1"))))
        assert wait_until(lambda: settled(hook, direct, pods), "both pods on node 1") == {"shared-0": 1, "shared-1": 1}
        assert loop.counts()["moves"] == 0        # node 0 has no shared CPU: nowhere to spread to

        # the Guaranteed pod ends; the kubelet gives CPU 0 back to the shared pool
        kl.stop_pod(g)
        kl.remove_pod(g)
        write_cpu_manager_state(state_path, default_cpuset="0-1")
        wait_until(lambda: loop.counts()["moves"] == 1, "a re-spread move after the pool grew")
        where = wait_until(lambda: settled(hook, direct, pods), "the real cpusets to agree with the ledger")
        assert sorted(where.values()) == [0, 1]
        moved = next(p for p, _ in pods if where[p.name] == 0)
        assert alloc_of(hook, moved.uid).source == "respread"
        assert loop.errors == 0
        check_ledger_consistent(hook)
        kl.cleanup()
