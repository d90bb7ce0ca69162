"""Balance placement: pure functions from (topology, load, shared pool, pod) to a decision.

The kubelet's static CPU manager hands out CPUs from NUMA node 0 upwards, so on a
many-node machine the first nodes fill up while the last ones idle. Balance placement does
the opposite for the pods it manages: each pod goes to the node with the most free
capacity, and all of its containers are pinned to that node's shared CPUs and memory.

Capacity is counted in milli-CPUs. A node's capacity is 1000 per CPU it has in the kubelet's
shared pool (exclusive CPUs are not ours to budget); its load is the sum of the demands of
the pods placed on it. A pod's demand is its CPU limit (``cpu_quota / cpu_period``) or,
without a limit, its request (``cpu_shares / 1024``); a pod with neither demands nothing and
is spread by pod count. Ties go to the node closest to ``PodRequest.near`` (the pod's
previous nodes when it is re-placed), then to the lowest node id.

Nothing here does I/O; the same functions drive the hook, the tests and the simulator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from anolisnuma.policies.numa.cpuset import EMPTY, CpuSet
from anolisnuma.policies.numa.topology import NumaTopology

MEMORY_WIDEN = "widen"     # pin memory to the CPU nodes, add the nearest nodes when it does not fit
MEMORY_STRICT = "strict"   # pin memory to exactly the CPU nodes
MEMORY_OFF = "off"         # leave cpuset_mems alone
MEMORY_POLICIES = (MEMORY_WIDEN, MEMORY_STRICT, MEMORY_OFF)

# The kubelet gives best-effort containers cpu.shares = 2 (the kernel's minimum): no request.
MIN_SHARES = 2


class NoPlacement(Exception):
    """No node can take the pod (e.g. every allowed node's CPUs are exclusive to others)."""


@dataclass(frozen=True)
class NodeLoad:
    """What is already placed on one node."""

    millicpu: int = 0
    pods: int = 0
    memory_bytes: int = 0


@dataclass(frozen=True)
class PodRequest:
    """What a pod needs: milli-CPUs and memory limit (0 = none declared)."""

    millicpu: int = 0
    memory_bytes: int = 0
    near: Tuple[int, ...] = ()


@dataclass(frozen=True)
class Placement:
    """A decision: the pod's nodes, its home CPUs (the nodes' CPUs, or a rule's CPU list),
    the CPUs to pin now (``home`` within the shared pool) and the memory nodes (empty = do
    not pin memory)."""

    nodes: Tuple[int, ...]
    home: CpuSet
    cpus: CpuSet
    mems: CpuSet
    reason: str = ""

    def describe(self) -> str:
        where = "node" if len(self.nodes) == 1 else "nodes"
        text = f"{where} {','.join(str(n) for n in self.nodes)} cpus {self.cpus}"
        if self.mems:
            text += f" mems {self.mems}"
        return text


def millicpu_of(cpu_period: int, cpu_quota: int, cpu_shares: int) -> int:
    """A container's CPU demand in milli-CPUs from its LinuxContainerResources: the limit
    (quota/period, rounded up) when set, else the request (shares/1024), else 0."""
    if cpu_quota > 0 and cpu_period > 0:
        return -(-cpu_quota * 1000 // cpu_period)
    if cpu_shares > MIN_SHARES:
        return -(-cpu_shares * 1000 // 1024)
    return 0


def node_capacity(topology: NumaTopology, pool: CpuSet) -> Dict[int, int]:
    """Milli-CPUs each node has in the shared pool."""
    return {n.id: len(n.cpus & pool) * 1000 for n in topology.nodes}


def free_capacity(topology: NumaTopology, pool: CpuSet, loads: Mapping[int, NodeLoad]) -> Dict[int, int]:
    """Capacity minus load per node (negative when overcommitted)."""
    zero = NodeLoad()
    return {i: cap - loads.get(i, zero).millicpu for i, cap in node_capacity(topology, pool).items()}


def balance(topology: NumaTopology, pool: CpuSet, loads: Mapping[int, NodeLoad], request: PodRequest,
            memory_pinning: str = MEMORY_WIDEN, allowed: Optional[Iterable[int]] = None) -> Placement:
    """Place a pod on the node with the most free capacity.

    Only nodes with at least one shared-pool CPU (and in ``allowed``, when given) are
    candidates. A pod that fits one node's capacity goes to the best node that can hold it
    (even when that overcommits it: shared CPUs are time-shared, and a single node keeps the
    pod's memory local); a pod larger than any node spans the best node plus its nearest
    neighbours until their capacity holds it. Raises :class:`NoPlacement` when there is no
    candidate.
    """
    zero = NodeLoad()
    allowed_set = None if allowed is None else set(allowed)
    cap: Dict[int, int] = {}
    free: Dict[int, int] = {}
    pods: Dict[int, int] = {}
    for n in topology.nodes:
        if allowed_set is not None and n.id not in allowed_set:
            continue
        c = len(n.cpus & pool) * 1000
        if c <= 0:
            continue
        load = loads.get(n.id, zero)
        cap[n.id] = c
        free[n.id] = c - load.millicpu
        pods[n.id] = load.pods
    if not cap:
        raise NoPlacement("no NUMA node has CPUs in the shared pool")
    near = request.near
    dist = topology.distance

    def key(i: int) -> Tuple[int, int, int, int]:
        return (-free[i], pods[i], sum(dist(i, m) for m in near) if near else 0, i)

    want = request.millicpu
    fitting = [i for i in cap if cap[i] >= want]
    if fitting:
        best = min(fitting, key=key)
        nodes: List[int] = [best]
        reason = f"most free capacity ({free[best] / 1000:g} of {cap[best] // 1000} CPUs free)"
    else:
        best = min(cap, key=key)
        nodes = [best]
        total = cap[best]
        while total < want and len(nodes) < len(cap):
            nxt = min((i for i in cap if i not in nodes),
                      key=lambda i: (sum(dist(i, m) for m in nodes), -free[i], i))
            nodes.append(nxt)
            total += cap[nxt]
        nodes.sort()
        reason = f"larger than a node ({want / 1000:g} CPUs); spans the nearest nodes"
    home = topology.cpus_of(nodes)
    mems = memory_nodes(topology, nodes, request.memory_bytes, loads, memory_pinning)
    return Placement(nodes=tuple(nodes), home=home, cpus=home & pool, mems=mems, reason=reason)


def pin(topology: NumaTopology, pool: CpuSet, loads: Mapping[int, NodeLoad], nodes: Sequence[int],
        request: PodRequest, cpus: Optional[CpuSet] = None, mems: Optional[CpuSet] = None,
        memory_pinning: str = MEMORY_WIDEN, reason: str = "placement rule") -> Placement:
    """Place a pod where a placement rule says: ``nodes`` (or the explicit ``cpus`` of the
    rule), within the shared pool. Raises :class:`NoPlacement` when none of those CPUs is
    in the shared pool."""
    home = cpus if cpus is not None else topology.cpus_of(nodes)
    effective = home & pool
    if not effective:
        raise NoPlacement(f"the rule's CPUs {home or '(none)'} are not in the shared pool")
    owners = topology.nodes_of_cpus(home) if cpus is not None else tuple(sorted(set(nodes)))
    owners = owners or tuple(sorted(set(nodes)))
    if mems is None:
        mem_set = memory_nodes(topology, owners, request.memory_bytes, loads, memory_pinning)
    else:
        mem_set = mems
    return Placement(nodes=tuple(owners), home=home, cpus=effective, mems=mem_set, reason=reason)


def memory_nodes(topology: NumaTopology, cpu_nodes: Sequence[int], memory_bytes: int,
                 loads: Mapping[int, NodeLoad], memory_pinning: str = MEMORY_WIDEN) -> CpuSet:
    """The memory nodes for a pod on ``cpu_nodes``: those nodes; under ``widen``, plus the
    nearest other nodes (memory-only nodes included) while the pod's memory limit exceeds
    the free memory of the set. Empty under ``off``. Nodes of unknown size never widen."""
    if memory_pinning == MEMORY_OFF:
        return EMPTY
    chosen = list(cpu_nodes)
    if memory_pinning == MEMORY_WIDEN and memory_bytes > 0:
        zero = NodeLoad()

        def free_mem(i: int) -> int:
            return topology.node(i).memory_bytes - loads.get(i, zero).memory_bytes

        if all(topology.node(i).memory_bytes > 0 for i in chosen):
            have = sum(max(free_mem(i), 0) for i in chosen)
            while have < memory_bytes:
                rest = [n.id for n in topology.nodes if n.id not in chosen and n.memory_bytes > 0]
                if not rest:
                    break
                nxt = min(rest, key=lambda i: (sum(topology.distance(i, c) for c in cpu_nodes), -free_mem(i), i))
                chosen.append(nxt)
                have += max(free_mem(nxt), 0)
    return CpuSet(chosen)
