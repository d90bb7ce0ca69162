"""Issue 19 with the real kubelet: the static CPU manager (CPU 0 reserved, so it stays
shared) gives a Guaranteed pod CPU 1 exclusively; anolisnuma (NUMA placement on a fake
2-node topology, node i = CPU i) puts two BestEffort pods on what is left, node 0; the
Guaranteed pod is deleted, the kubelet gives CPU 1 back to its shared pool, and the
re-spread loop moves one BestEffort pod to node 1, live. Their real ``cpuset.cpus`` (and
their processes' allowed CPUs) agree with ``anolisnuma-ctl pods``.

Re-spread thresholds scaled to 1-CPU nodes, no settle time, no cool-down; the loop plans
every second (its minimum); the test waits for the conditions it checks."""

from __future__ import annotations

import json
from typing import Any, Dict, Optional

import pytest

from anolisnuma.testing.daemon_probes import wait_until
from anolisnuma.testing.kubelet_node import KubeletNode

pytestmark = pytest.mark.containerd

NS = "batch"
RESPREAD = {"threshold_cpus": 0.5, "settle_seconds": 0.0, "interval_seconds": 1.0, "max_moves_per_interval": 4,
            "cooldown_seconds": 0.0}


def ctl_pods(node: KubeletNode) -> Dict[str, Dict[str, Any]]:
    return {r["name"]: r for r in json.loads(node.ctl("pods", "-o", "json")) if r["namespace"] == NS}


def cpu_manager_state(node: KubeletNode) -> Dict[str, Any]:
    with open(node.cpu_manager_state) as f:
        return json.load(f)


def agreeing(node: KubeletNode, names: Any) -> Optional[Dict[str, str]]:
    """{pod: CPUs} once every pod's real cpuset (cgroup and process) is what
    ``anolisnuma-ctl pods`` says it placed it on; else None."""
    pods = node.running(NS, names)
    if pods is None:
        return None
    rows = ctl_pods(node)
    out = {}
    for n in names:
        numa = rows.get(n, {}).get("numa", {})
        real = node.real_cpus(node.container_id(pods[n]))
        if not numa.get("placed") or real["cgroup"] != numa["cpus"] or real["allowed"] != numa["cpus"]:
            return None
        out[n] = numa["cpus"]
    return out


def test_the_guaranteed_pod_leaving_re_spreads_the_best_effort_pods(make_node):
    node = make_node(cpu_manager_static=True, reserved_cpus="0", numa=True, numa_namespaces=[NS],
                     respread=RESPREAD)
    node.run_pod("guaranteed", NS, cpu="1")
    g = node.wait_running(NS, ["guaranteed"])["guaranteed"]
    g_uid = g["metadata"]["uid"]
    assert node.real_cpus(node.container_id(g)) == {"cgroup": "1", "allowed": "1"}
    state = cpu_manager_state(node)
    assert state["policyName"] == "static" and state["defaultCpuSet"] == "0"
    assert state["entries"][g_uid] == {"guaranteed": "1"}

    node.run_pod("be-0", NS)
    node.run_pod("be-1", NS)
    best_effort = ["be-0", "be-1"]
    assert wait_until(lambda: agreeing(node, best_effort), "both BestEffort pods on node 0", 60) == \
        {"be-0": "0", "be-1": "0"}
    rows = ctl_pods(node)
    assert rows["guaranteed"]["numa"].get("kubelet_exclusive") == {"guaranteed": "1"}
    assert node.real_cpus(node.container_id(node.pods(NS)["guaranteed"])) == {"cgroup": "1", "allowed": "1"}

    node.delete_pod("guaranteed", NS)
    wait_until(lambda: cpu_manager_state(node)["defaultCpuSet"] == "0-1", "CPU 1 back in the kubelet's pool", 60)
    where = wait_until(lambda: (lambda a: a if a and sorted(a.values()) == ["0", "1"] else None)(
        agreeing(node, best_effort)), "one BestEffort pod moved to node 1", 60)
    rows = ctl_pods(node)
    moved = next(n for n, cpus in where.items() if cpus == "1")
    assert rows[moved]["numa"]["source"] == "respread", rows[moved]
    assert rows[moved]["numa"]["nodes"] == [1]
    stayed = next(n for n in best_effort if n != moved)
    assert rows[stayed]["numa"]["nodes"] == [0]
    errors = [line for line in node.runtime_errors() if "code = NotFound" not in line
              and "DeleteContainer returned error" not in line and "pleg has yet to be successful" not in line]
    assert errors == [], "\n".join(errors)
