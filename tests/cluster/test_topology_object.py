"""The NodeResourceTopology object built from a topology, the shared pool and the ledger's
loads (pure; no API server)."""

from __future__ import annotations

from anolisnuma.cluster.topology_object import legacy_policy, quantity_millis, topology_object
from anolisnuma.policies.numa.balance import NodeLoad
from anolisnuma.policies.numa.cpuset import CpuSet
from anolisnuma.policies.numa.topology import NumaNode, NumaTopology

GIB = 1 << 30


def two_nodes() -> NumaTopology:
    return NumaTopology(nodes=(NumaNode(0, CpuSet.parse("0-3"), 8 * GIB), NumaNode(1, CpuSet.parse("4-7"), 8 * GIB)),
                        distances={(0, 0): 10, (0, 1): 21, (1, 0): 21, (1, 1): 10}, online=CpuSet.parse("0-7"))


def resources(zone):
    return {r["name"]: (r["capacity"], r["allocatable"], r["available"]) for r in zone["resources"]}


def test_zones_capacity_allocatable_available_and_costs() -> None:
    # CPUs 0 and 1 are the kubelet's (exclusive or reserved): not in the shared pool
    loads = {0: NodeLoad(millicpu=1500, pods=2, memory_bytes=3 * GIB), 1: NodeLoad()}
    obj = topology_object("w1", two_nodes(), CpuSet.parse("2-7"), loads, "single-numa-node", "pod")
    assert obj["apiVersion"] == "topology.node.k8s.io/v1alpha2" and obj["kind"] == "NodeResourceTopology"
    assert obj["metadata"] == {"name": "w1"}
    z0, z1 = obj["zones"]
    assert (z0["name"], z0["type"], z1["name"]) == ("node-0", "Node", "node-1")
    assert resources(z0) == {"cpu": ("4", "2", "500m"), "memory": (str(8 * GIB), str(8 * GIB), str(5 * GIB))}
    assert resources(z1) == {"cpu": ("4", "4", "4"), "memory": (str(8 * GIB), str(8 * GIB), str(8 * GIB))}
    assert z0["costs"] == [{"name": "node-0", "value": 10}, {"name": "node-1", "value": 21}]
    assert z1["costs"] == [{"name": "node-0", "value": 21}, {"name": "node-1", "value": 10}]
    assert obj["attributes"] == [{"name": "topologyManagerPolicy", "value": "single-numa-node"},
                                 {"name": "topologyManagerScope", "value": "pod"}]
    assert obj["topologyPolicies"] == ["SingleNUMANodePodLevel"]


def test_available_never_below_zero_and_a_memory_only_node() -> None:
    topo = NumaTopology(nodes=(NumaNode(0, CpuSet.parse("0-1"), 2 * GIB), NumaNode(1, CpuSet.parse(""), 16 * GIB)),
                        distances={}, online=CpuSet.parse("0-1"))
    obj = topology_object("w1", topo, CpuSet.parse("0-1"), {0: NodeLoad(millicpu=5000, memory_bytes=9 * GIB)})
    z0, z1 = obj["zones"]
    assert resources(z0) == {"cpu": ("2", "2", "0"), "memory": (str(2 * GIB), str(2 * GIB), "0")}
    assert resources(z1)["cpu"] == ("0", "0", "0") and resources(z1)["memory"][2] == str(16 * GIB)
    # (no distance table: the defaults, 10 local / 20 remote)
    assert [c["value"] for c in z0["costs"]] == [10, 20]
    assert obj["topologyPolicies"] == ["None"]


def test_quantities_and_legacy_policy_names() -> None:
    assert [quantity_millis(m) for m in (0, 1000, 2500, 999, -5)] == ["0", "1", "2500m", "999m", "0"]
    assert legacy_policy("single-numa-node", "container") == "SingleNUMANodeContainerLevel"
    assert (legacy_policy("restricted", "pod"), legacy_policy("best-effort", "container")) == ("Restricted", "BestEffort")


def test_the_same_state_builds_the_same_object() -> None:
    loads = {0: NodeLoad(millicpu=100)}
    assert topology_object("w1", two_nodes(), CpuSet.parse("0-7"), loads) == \
        topology_object("w1", two_nodes(), CpuSet.parse("0-7"), dict(loads))
