"""The ledger of NUMA allocations: which pod is placed on which nodes, with what demand.

In-memory and pure (no I/O, no locking: the hook serializes access). Per-node loads are
kept up to date incrementally, so a placement decision costs the same with 5 pods or 5,000.

A pod's demand is the larger of the pod-level demand the kubelet declared (the sum over
its containers, sent with the sandbox config) and the sum of the demands of its
containers: those containerd created (by container id) plus those being created (by
container name, until the reply gives their id). A pod placed on several nodes counts on
each in proportion to the CPUs it has there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Tuple

from anolisnuma.policies.numa.balance import NodeLoad, Placement
from anolisnuma.policies.numa.cpuset import CpuSet, CpuSetError
from anolisnuma.policies.numa.topology import NumaTopology
from anolisnuma.state.numa_state import AllocationRecord, ContainerShareRecord


@dataclass
class ContainerShare:
    name: str
    millicpu: int = 0
    memory_bytes: int = 0


@dataclass
class Allocation:
    pod_uid: str
    namespace: str
    name: str
    sandbox_id: str
    nodes: Tuple[int, ...]
    home: CpuSet
    mems: CpuSet
    pod_millicpu: int = 0
    pod_memory_bytes: int = 0
    containers: Dict[str, ContainerShare] = field(default_factory=dict)
    pending: Dict[str, ContainerShare] = field(default_factory=dict)
    source: str = "balance"

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    def demand_millicpu(self) -> int:
        total = sum(c.millicpu for c in self.containers.values()) + sum(c.millicpu for c in self.pending.values())
        return max(self.pod_millicpu, total)

    def demand_memory(self) -> int:
        total = (sum(c.memory_bytes for c in self.containers.values())
                 + sum(c.memory_bytes for c in self.pending.values()))
        return max(self.pod_memory_bytes, total)

    def cpus(self, pool: CpuSet) -> CpuSet:
        """The CPUs its containers should have now: its home CPUs within the shared pool."""
        return self.home & pool

    def to_json(self) -> Dict[str, Any]:
        """The JSON form of :meth:`to_record` (built directly: this runs on every change)."""
        return {
            "pod_uid": self.pod_uid, "namespace": self.namespace, "name": self.name,
            "sandbox_id": self.sandbox_id, "nodes": list(self.nodes), "home": str(self.home),
            "mems": str(self.mems), "pod_millicpu": self.pod_millicpu, "pod_memory_bytes": self.pod_memory_bytes,
            "containers": {k: {"name": v.name, "millicpu": v.millicpu, "memory_bytes": v.memory_bytes}
                           for k, v in self.containers.items()},
            "pending": {k: {"name": v.name, "millicpu": v.millicpu, "memory_bytes": v.memory_bytes}
                        for k, v in self.pending.items()},
            "source": self.source,
        }

    def to_record(self) -> AllocationRecord:
        return AllocationRecord(
            pod_uid=self.pod_uid, namespace=self.namespace, name=self.name, sandbox_id=self.sandbox_id,
            nodes=list(self.nodes), home=str(self.home), mems=str(self.mems),
            pod_millicpu=self.pod_millicpu, pod_memory_bytes=self.pod_memory_bytes,
            containers={k: ContainerShareRecord(v.name, v.millicpu, v.memory_bytes) for k, v in self.containers.items()},
            pending={k: ContainerShareRecord(v.name, v.millicpu, v.memory_bytes) for k, v in self.pending.items()},
            source=self.source)

    @classmethod
    def from_record(cls, rec: AllocationRecord) -> "Allocation":
        """Raises CpuSetError when a CPU list in the record is garbled."""
        return cls(
            pod_uid=rec.pod_uid, namespace=rec.namespace, name=rec.name, sandbox_id=rec.sandbox_id,
            nodes=tuple(rec.nodes), home=CpuSet.parse(rec.home), mems=CpuSet.parse(rec.mems),
            pod_millicpu=max(rec.pod_millicpu, 0), pod_memory_bytes=max(rec.pod_memory_bytes, 0),
            containers={k: ContainerShare(v.name, max(v.millicpu, 0), max(v.memory_bytes, 0))
                        for k, v in rec.containers.items()},
            pending={k: ContainerShare(v.name, max(v.millicpu, 0), max(v.memory_bytes, 0))
                     for k, v in rec.pending.items()},
            source=rec.source)


_Contribution = List[Tuple[int, int, int, int]]   # (node, millicpu, memory bytes, pods)


class Ledger:
    """Allocations by pod uid, an index by container id, and per-node loads."""

    def __init__(self, topology: NumaTopology, pool: CpuSet) -> None:
        self.topology = topology
        self._pool = pool
        self._allocs: Dict[str, Allocation] = {}
        self._by_container: Dict[str, str] = {}
        self._by_sandbox: Dict[str, str] = {}
        self._contrib: Dict[str, _Contribution] = {}
        self._json: Dict[str, str] = {}   # encoded JSON per pod, dropped on every change
        self._cpu: Dict[int, int] = {i: 0 for i in topology.node_ids}
        self._mem: Dict[int, int] = {i: 0 for i in topology.node_ids}
        self._pods: Dict[int, int] = {i: 0 for i in topology.node_ids}

    # ------------------------------------------------------------------ queries
    @property
    def pool(self) -> CpuSet:
        return self._pool

    def loads(self) -> Dict[int, NodeLoad]:
        return {i: NodeLoad(self._cpu[i], self._pods[i], self._mem[i]) for i in self._cpu}

    def get(self, pod_uid: str) -> Optional[Allocation]:
        return self._allocs.get(pod_uid)

    def by_container(self, container_id: str) -> Optional[Allocation]:
        uid = self._by_container.get(container_id)
        return self._allocs.get(uid) if uid is not None else None

    def by_sandbox(self, sandbox_id: str) -> Optional[Allocation]:
        uid = self._by_sandbox.get(sandbox_id) if sandbox_id else None
        return self._allocs.get(uid) if uid is not None else None

    def knows_sandbox(self, sandbox_id: str) -> bool:
        return sandbox_id in self._by_sandbox

    def knows_container(self, container_id: str) -> bool:
        return container_id in self._by_container

    def __iter__(self) -> Iterator[Allocation]:
        return iter(list(self._allocs.values()))

    def __len__(self) -> int:
        return len(self._allocs)

    def __contains__(self, pod_uid: object) -> bool:
        return pod_uid in self._allocs

    # ------------------------------------------------------------------ changes
    def set_pool(self, pool: CpuSet) -> None:
        """The shared pool changed: loads are re-split over the CPUs pods have now."""
        if pool == self._pool:
            return
        for uid in self._allocs:
            self._retract(uid)
        self._pool = pool
        for uid in self._allocs:
            self._account(uid)

    def add(self, alloc: Allocation) -> None:
        """Record ``alloc`` (replacing any allocation of the same pod)."""
        if alloc.pod_uid in self._allocs:
            self.remove(alloc.pod_uid)
        for cid in list(alloc.containers):
            other = self._by_container.get(cid)
            if other is not None and other != alloc.pod_uid:
                # A container belongs to one pod: never count it twice.
                self.remove_container(cid)
        if alloc.sandbox_id:
            stale = self._by_sandbox.get(alloc.sandbox_id)
            if stale is not None and stale != alloc.pod_uid:
                self.remove(stale)
            self._by_sandbox[alloc.sandbox_id] = alloc.pod_uid
        self._allocs[alloc.pod_uid] = alloc
        for cid in alloc.containers:
            self._by_container[cid] = alloc.pod_uid
        self._account(alloc.pod_uid)

    def remove(self, pod_uid: str) -> Optional[Allocation]:
        """Forget a pod; its capacity returns. Idempotent."""
        alloc = self._allocs.get(pod_uid)
        if alloc is None:
            return None
        self._retract(pod_uid)
        del self._allocs[pod_uid]
        if self._by_sandbox.get(alloc.sandbox_id) == pod_uid:
            del self._by_sandbox[alloc.sandbox_id]
        for cid in alloc.containers:
            if self._by_container.get(cid) == pod_uid:
                del self._by_container[cid]
        return alloc

    def move(self, pod_uid: str, placement: Placement, source: Optional[str] = None) -> Allocation:
        """Re-place a pod (e.g. the shared pool left its old nodes)."""
        alloc = self._allocs[pod_uid]
        self._retract(pod_uid)
        alloc.nodes, alloc.home, alloc.mems = placement.nodes, placement.home, placement.mems
        if source is not None:
            alloc.source = source
        self._account(pod_uid)
        return alloc

    def set_sandbox(self, pod_uid: str, sandbox_id: str) -> None:
        alloc = self._allocs[pod_uid]
        self._json.pop(pod_uid, None)
        if self._by_sandbox.get(alloc.sandbox_id) == pod_uid:
            del self._by_sandbox[alloc.sandbox_id]
        alloc.sandbox_id = sandbox_id
        if sandbox_id:
            self._by_sandbox[sandbox_id] = pod_uid

    def set_pending(self, pod_uid: str, container_name: str, share: ContainerShare) -> None:
        """A container of the pod is being created (its id is not known yet)."""
        self._retract(pod_uid)
        self._allocs[pod_uid].pending[container_name] = share
        self._account(pod_uid)

    def add_container(self, pod_uid: str, container_id: str, share: ContainerShare) -> None:
        """containerd created the container: count it by id (replacing its pending entry)."""
        other = self._by_container.get(container_id)
        if other is not None and other != pod_uid:
            self.remove_container(container_id)
        self._retract(pod_uid)
        alloc = self._allocs[pod_uid]
        alloc.pending.pop(share.name, None)
        alloc.containers[container_id] = share
        self._by_container[container_id] = pod_uid
        self._account(pod_uid)

    def update_container(self, container_id: str, millicpu: Optional[int] = None,
                         memory_bytes: Optional[int] = None) -> None:
        """A container's resources were updated (in-place resize)."""
        uid = self._by_container.get(container_id)
        if uid is None:
            return
        self._retract(uid)
        share = self._allocs[uid].containers[container_id]
        if millicpu is not None:
            share.millicpu = max(millicpu, 0)
        if memory_bytes is not None:
            share.memory_bytes = max(memory_bytes, 0)
        self._account(uid)

    def remove_container(self, container_id: str) -> Optional[Allocation]:
        """Forget one container; its share of the pod's demand returns. Idempotent."""
        uid = self._by_container.pop(container_id, None)
        if uid is None:
            return None
        alloc = self._allocs[uid]
        self._retract(uid)
        alloc.containers.pop(container_id, None)
        self._account(uid)
        return alloc

    def clear_pending(self, pod_uid: str) -> None:
        alloc = self._allocs.get(pod_uid)
        if alloc is not None and alloc.pending:
            self._retract(pod_uid)
            alloc.pending.clear()
            self._account(pod_uid)

    # ------------------------------------------------------------------ persistence
    def to_records(self) -> List[AllocationRecord]:
        return [a.to_record() for a in self._allocs.values()]

    def to_json(self) -> List[Dict[str, Any]]:
        """Every allocation in JSON form, sorted by pod uid."""
        return [self._allocs[uid].to_json() for uid in sorted(self._allocs)]

    def encoded(self) -> List[str]:
        """Every allocation encoded as a JSON text, sorted by pod uid. Only allocations that
        changed since the last call are encoded again, so saving after each change costs
        little more than the write itself, whatever the number of pods."""
        out = []
        for uid in sorted(self._allocs):
            text = self._json.get(uid)
            if text is None:
                text = self._json[uid] = json.dumps(self._allocs[uid].to_json(), separators=(",", ":"),
                                                    sort_keys=True)
            out.append(text)
        return out

    def load_records(self, records: List[AllocationRecord]) -> List[str]:
        """Add saved allocations; the problems of those that were dropped (unknown nodes,
        garbled CPU lists)."""
        problems = []
        for rec in records:
            try:
                alloc = Allocation.from_record(rec)
            except CpuSetError as e:
                problems.append(f"pod {rec.pod_uid}: {e}")
                continue
            if not alloc.nodes or not all(self.topology.has_node(n) for n in alloc.nodes):
                problems.append(f"pod {rec.pod_uid}: nodes {list(alloc.nodes)} do not all exist")
                continue
            if not all(self.topology.has_node(n) for n in alloc.mems):
                problems.append(f"pod {rec.pod_uid}: memory nodes {alloc.mems} do not all exist")
                continue
            self.add(alloc)
        return problems

    # ------------------------------------------------------------------ load accounting
    def recomputed_loads(self) -> Dict[int, NodeLoad]:
        """Loads computed from scratch (for checks: must equal :meth:`loads`)."""
        cpu = {i: 0 for i in self._cpu}
        mem = {i: 0 for i in self._cpu}
        pods = {i: 0 for i in self._cpu}
        for alloc in self._allocs.values():
            for node, m, b, p in self._contribution(alloc):
                cpu[node] += m
                mem[node] += b
                pods[node] += p
        return {i: NodeLoad(cpu[i], pods[i], mem[i]) for i in cpu}

    def _account(self, uid: str) -> None:
        self._json.pop(uid, None)
        contrib = self._contribution(self._allocs[uid])
        self._contrib[uid] = contrib
        for node, m, b, p in contrib:
            self._cpu[node] += m
            self._mem[node] += b
            self._pods[node] += p

    def _retract(self, uid: str) -> None:
        self._json.pop(uid, None)
        for node, m, b, p in self._contrib.pop(uid, ()):
            self._cpu[node] -= m
            self._mem[node] -= b
            self._pods[node] -= p

    def _contribution(self, alloc: Allocation) -> _Contribution:
        nodes = [n for n in alloc.nodes if n in self._cpu]
        if not nodes:
            return []
        usable = alloc.home & self._pool
        cpu_weights = [len(usable & self.topology.node(n).cpus) for n in nodes]
        cpu_split = _split(alloc.demand_millicpu(), cpu_weights)
        mem_nodes = [n for n in alloc.mems if n in self._cpu] or nodes
        mem_weights = [self.topology.node(n).memory_bytes for n in mem_nodes]
        mem_split = dict(zip(mem_nodes, _split(alloc.demand_memory(), mem_weights)))
        out: _Contribution = []
        for node, m in zip(nodes, cpu_split):
            out.append((node, m, mem_split.pop(node, 0), 1))
        for node, b in mem_split.items():
            out.append((node, 0, b, 0))
        return out


def _split(total: int, weights: List[int]) -> List[int]:
    """``total`` divided in proportion to ``weights`` (equally when they are all 0), in
    integers that add up to ``total``."""
    if not weights:
        return []
    if sum(weights) <= 0:
        weights = [1] * len(weights)
    wsum = sum(weights)
    parts = [total * w // wsum for w in weights]
    rest = total - sum(parts)
    for i in range(len(parts)):
        if rest <= 0:
            break
        if weights[i] > 0:
            parts[i] += 1
            rest -= 1
    return parts
