"""``NumaTopology``: the NUMA nodes of the machine, their CPUs, memory and distances.

Pure data. :meth:`NumaTopology.from_raw` turns what
:mod:`anolisnuma.system.sysfs_topology` read from sysfs (plain strings and numbers) into a
validated topology; :meth:`NumaTopology.build` makes one from literals for tests and the
simulator.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from anolisnuma.policies.numa.cpuset import EMPTY, CpuSet, CpuSetError, union_all

LOCAL_DISTANCE = 10
REMOTE_DISTANCE = 20   # what the kernel assumes when firmware gives no SLIT table


class TopologyError(ValueError):
    """The topology data is unusable (overlapping nodes, no CPUs at all, garbled lists)."""


@dataclass(frozen=True)
class NumaNode:
    """One NUMA node: its online CPUs (empty for a memory-only node) and memory size."""

    id: int
    cpus: CpuSet
    memory_bytes: int = 0          # MemTotal; 0 when unknown
    offline_cpus: CpuSet = EMPTY   # CPUs of the node that are offline now

    @property
    def has_cpus(self) -> bool:
        return bool(self.cpus)


@dataclass(frozen=True)
class NumaTopology:
    """The machine's NUMA layout.

    ``nodes`` are ordered by id; ``distances[(a, b)]`` is the kernel's relative distance
    (10 = local); ``online`` are the online CPUs; ``smt_groups`` the sets of hardware
    threads that share a core (a single CPU when there is no SMT).
    """

    nodes: Tuple[NumaNode, ...]
    distances: Mapping[Tuple[int, int], int]
    online: CpuSet
    smt_groups: Tuple[CpuSet, ...] = ()
    problems: Tuple[str, ...] = field(default=(), compare=False)
    _by_id: Dict[int, NumaNode] = field(default_factory=dict, compare=False, repr=False)
    _cpu_node: Dict[int, int] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        by_id = {n.id: n for n in self.nodes}
        if len(by_id) != len(self.nodes):
            raise TopologyError("duplicate NUMA node ids")
        seen = EMPTY
        cpu_node: Dict[int, int] = {}
        for n in self.nodes:
            if not n.cpus.isdisjoint(seen):
                raise TopologyError(f"CPUs {n.cpus & seen} belong to more than one NUMA node")
            seen = seen | n.cpus
            for cpu in n.cpus:
                cpu_node[cpu] = n.id
        if not self.nodes:
            raise TopologyError("no NUMA nodes")
        if not seen:
            raise TopologyError("no online CPU in any NUMA node")
        object.__setattr__(self, "_by_id", by_id)
        object.__setattr__(self, "_cpu_node", cpu_node)

    # ------------------------------------------------------------------ builders
    @classmethod
    def build(cls, node_cpus: Mapping[int, str], distances: Optional[Sequence[Sequence[int]]] = None,
              memory_bytes: Optional[Mapping[int, int]] = None, online: Optional[str] = None,
              smt_groups: Iterable[str] = ()) -> "NumaTopology":
        """A topology from literals: ``{node id: "cpulist"}``, a distance matrix in node id
        order (default 10 local / 20 remote), memory per node, online CPUs (default all)."""
        ids = sorted(node_cpus)
        all_cpus = union_all(CpuSet.parse(node_cpus[i]) for i in ids)
        online_set = CpuSet.parse(online) if online is not None else all_cpus
        mem = memory_bytes or {}
        nodes = tuple(NumaNode(id=i, cpus=CpuSet.parse(node_cpus[i]) & online_set,
                               memory_bytes=int(mem.get(i, 0)),
                               offline_cpus=CpuSet.parse(node_cpus[i]) - online_set) for i in ids)
        dist = _distance_map(ids, distances)
        groups = tuple(CpuSet.parse(g) & online_set for g in smt_groups)
        groups = tuple(g for g in groups if g) or tuple(CpuSet([c]) for c in online_set)
        return cls(nodes=nodes, distances=dist, online=online_set, smt_groups=_dedupe(groups))

    @classmethod
    def from_raw(cls, raw: Any) -> "NumaTopology":
        """Validate what :func:`anolisnuma.system.sysfs_topology.read_sysfs_topology` read.

        Node CPUs are reduced to the online CPUs; a missing or inconsistent distance table is
        replaced by 10/20 (recorded in ``problems``). Raises :class:`TopologyError` when a
        list is garbled, nodes overlap, or no node has an online CPU.
        """
        problems: List[str] = list(getattr(raw, "problems", ()) or ())
        try:
            listed = {n.id: CpuSet.parse(n.cpulist) for n in raw.nodes}
            if raw.online is not None:
                online = CpuSet.parse(raw.online)
            else:
                online = union_all(listed.values())
                problems.append("no online CPU list; assuming every CPU of every node is online")
            siblings = {cpu: CpuSet.parse(text) for cpu, text in raw.siblings.items()}
        except CpuSetError as e:
            raise TopologyError(str(e)) from e
        ids = sorted(listed)
        if not ids:
            # A kernel without NUMA support has no node directories: one node, every CPU.
            listed = {0: online}
            ids = [0]
            problems.append("no NUMA nodes in sysfs; treating the machine as one node")
        mem = {n.id: n.memory_bytes for n in raw.nodes}
        nodes = tuple(NumaNode(id=i, cpus=listed[i] & online, memory_bytes=int(mem.get(i, 0) or 0),
                               offline_cpus=listed[i] - online) for i in ids)
        rows = {n.id: list(n.distances) for n in raw.nodes}
        matrix: Optional[List[List[int]]] = [rows.get(i, []) for i in ids]
        if any(len(r) != len(ids) for r in matrix) or any(
                matrix[k][k] != LOCAL_DISTANCE or any(d < LOCAL_DISTANCE for d in matrix[k])
                for k in range(len(ids))):
            if len(ids) > 1 or any(matrix):
                problems.append("NUMA distance table missing or inconsistent; assuming 10 local / 20 remote")
            matrix = None
        covered = union_all(n.cpus for n in nodes)
        stray = online - covered
        if stray:
            problems.append(f"online CPUs {stray} belong to no NUMA node; they are never used for pinning")
        groups: List[CpuSet] = []
        for cpu in online:
            g = siblings.get(cpu, CpuSet([cpu])) & online
            groups.append(g | CpuSet([cpu]))
        return cls(nodes=nodes, distances=_distance_map(ids, matrix), online=online,
                   smt_groups=_dedupe(groups), problems=tuple(problems))

    # ------------------------------------------------------------------ queries
    @property
    def node_ids(self) -> Tuple[int, ...]:
        return tuple(n.id for n in self.nodes)

    def node(self, node_id: int) -> NumaNode:
        """The node with this id; KeyError when there is none."""
        return self._by_id[node_id]

    def has_node(self, node_id: int) -> bool:
        return node_id in self._by_id

    @property
    def cpus(self) -> CpuSet:
        """Online CPUs that belong to a node (the CPUs placement can use)."""
        return union_all(n.cpus for n in self.nodes)

    def distance(self, a: int, b: int) -> int:
        return self.distances.get((a, b), LOCAL_DISTANCE if a == b else REMOTE_DISTANCE)

    def cpus_of(self, node_ids: Iterable[int]) -> CpuSet:
        """The online CPUs of these nodes."""
        return union_all(self._by_id[i].cpus for i in node_ids)

    def memory_of(self, node_ids: Iterable[int]) -> int:
        return sum(self._by_id[i].memory_bytes for i in node_ids)

    def node_of_cpu(self, cpu: int) -> Optional[int]:
        return self._cpu_node.get(cpu)

    def nodes_of_cpus(self, cpus: CpuSet) -> Tuple[int, ...]:
        """The nodes that own at least one CPU of ``cpus``, ascending."""
        return tuple(n.id for n in self.nodes if not n.cpus.isdisjoint(cpus))

    def nearest(self, origin: Iterable[int], candidates: Optional[Iterable[int]] = None) -> List[int]:
        """``candidates`` (default: every node not in ``origin``) ordered by their summed
        distance to the ``origin`` nodes, then by id."""
        src = list(origin)
        chosen = set(src)
        pool = [i for i in (candidates if candidates is not None else self.node_ids) if i not in chosen]
        return sorted(pool, key=lambda i: (sum(self.distance(s, i) for s in src), i))

    def describe(self) -> str:
        parts = []
        for n in self.nodes:
            gib = n.memory_bytes / (1 << 30)
            parts.append(f"node{n.id}: cpus {n.cpus or '-'} mem {gib:.1f}GiB")
        return "; ".join(parts)


def _distance_map(ids: Sequence[int], matrix: Optional[Sequence[Sequence[int]]]) -> Dict[Tuple[int, int], int]:
    out: Dict[Tuple[int, int], int] = {}
    for a_i, a in enumerate(ids):
        for b_i, b in enumerate(ids):
            if matrix is not None:
                out[(a, b)] = int(matrix[a_i][b_i])
            else:
                out[(a, b)] = LOCAL_DISTANCE if a == b else REMOTE_DISTANCE
    return out


def _dedupe(groups: Iterable[CpuSet]) -> Tuple[CpuSet, ...]:
    seen = {}
    for g in groups:
        seen.setdefault(g.mask, g)
    return tuple(sorted(seen.values(), key=lambda g: g.min()))
