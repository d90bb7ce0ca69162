"""This node's NUMA zones as a ``topology.node.k8s.io/v1alpha2`` NodeResourceTopology (pure).

The object topology-aware scheduling reads (the scheduler's NodeResourceTopologyMatch
filter and its scoring): cluster-scoped, named after the node, one zone per NUMA node
(``node-0``, ``node-1``..., type ``Node``) with

- ``resources``: ``cpu`` and ``memory``, each with ``capacity`` (the node's online CPUs,
  its MemTotal), ``allocatable`` (the node's CPUs in the shared pool, i.e. not the
  kubelet's exclusive ones, less the CPUs the kubelet reserves for the system by name,
  ``reservedSystemCPUs`` / ``--reserved-cpus``, which stay in its shared pool; memory: all
  of it, as anolisnuma does not carve memory) and ``available`` (allocatable minus what
  anolisnuma's ledger has placed there: a pod on several nodes counts on each in
  proportion to its CPUs there, as the ledger counts it; never below 0). A CPU
  reservation given only as a quantity (``kubeReserved``/``systemReserved``) names no CPU
  and is not left out;
- ``costs``: the kernel's NUMA distance to every zone, itself included (10 = local);

and at the top the kubelet's topology manager policy and scope as ``attributes``
(``topologyManagerPolicy``, ``topologyManagerScope``: what v1alpha2 readers look at) and
as the older ``topologyPolicies`` (deprecated in v1alpha2, still read by schedulers built
for v1alpha1).

Quantities are Kubernetes quantity strings: a whole number of CPUs (``"2"``) or
milli-CPUs (``"1500m"``), memory in bytes.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping

from anolisnuma.policies.numa.balance import NodeLoad
from anolisnuma.policies.numa.cpuset import EMPTY, CpuSet
from anolisnuma.policies.numa.topology import NumaTopology

API_VERSION = "topology.node.k8s.io/v1alpha2"
KIND = "NodeResourceTopology"
ZONE_TYPE = "Node"

# The v1alpha1 names of the kubelet's topology manager policies (topologyPolicies)
_LEGACY_POLICY = {"none": "None", "best-effort": "BestEffort", "restricted": "Restricted"}


def zone_name(node_id: int) -> str:
    return f"node-{node_id}"


def quantity_millis(millis: int) -> str:
    """A milli-unit count as a quantity: whole units without a suffix."""
    millis = max(millis, 0)
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def legacy_policy(policy: str, scope: str) -> str:
    if policy == "single-numa-node":
        return "SingleNUMANodePodLevel" if scope == "pod" else "SingleNUMANodeContainerLevel"
    return _LEGACY_POLICY.get(policy, "None")


def topology_object(node_name: str, topology: NumaTopology, pool: CpuSet, loads: Mapping[int, NodeLoad],
                    policy: str = "none", scope: str = "container", reserved: CpuSet = EMPTY) -> Dict[str, Any]:
    """The whole NodeResourceTopology object of ``node_name`` (for a server-side apply);
    ``reserved``: the kubelet's reserved CPUs, left out of ``allocatable``."""
    zones: List[Dict[str, Any]] = []
    for node in topology.nodes:
        load = loads.get(node.id) or NodeLoad()
        cpus = len((node.cpus & pool) - reserved)
        memory = max(node.memory_bytes, 0)
        zones.append({
            "name": zone_name(node.id),
            "type": ZONE_TYPE,
            "costs": [{"name": zone_name(other), "value": topology.distance(node.id, other)}
                      for other in topology.node_ids],
            "resources": [
                {"name": "cpu", "capacity": str(len(node.cpus)), "allocatable": str(cpus),
                 "available": quantity_millis(cpus * 1000 - load.millicpu)},
                {"name": "memory", "capacity": str(memory), "allocatable": str(memory),
                 "available": str(max(memory - load.memory_bytes, 0))},
            ],
        })
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": node_name},
        "topologyPolicies": [legacy_policy(policy, scope)],
        "attributes": [{"name": "topologyManagerPolicy", "value": policy},
                       {"name": "topologyManagerScope", "value": scope}],
        "zones": zones,
    }
