"""The live moves of :class:`~anolisnuma.placement.service.PlacementService` (a part of it).

A live move re-places a running pod (traffic affinity, re-spread, a rule change): its
allocation moves at once (``numa.json`` is written behind it), its containers are listed
for the re-pinner, and the move is in flight until every re-pin is applied
(:meth:`LiveMoves.mark_applied`); one failed re-pin rolls the whole move back
(:meth:`LiveMoves.apply_failed`).

Why a part of the service and not an object of its own: a move changes the ledger and the
pending re-pins under the service's lock, and the kubelet's calls (a container removed, a
resync) end moves too; as a part of one class it reads that state directly, and every
caller keeps calling the service.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Set, Tuple

import structlog

from anolisnuma.decision_events import NumaMoveFailed, PodRef
from anolisnuma.policies.numa.balance import NoPlacement, Placement, PodRequest, free_capacity, node_capacity, pin
from anolisnuma.policies.numa.cpuset import CpuSet
from anolisnuma.policies.numa.ledger import Allocation
from anolisnuma.system.cgroups import enable_memory_migrate

log = structlog.get_logger("anolisnuma.numa")


@dataclass
class MoveInFlight:
    """A live move whose re-pins are not all applied yet: what to go back to when one
    fails, and the containers already re-pinned."""

    nodes: Tuple[int, ...]
    home: CpuSet
    mems: CpuSet
    source: str
    reason: str
    applied: Set[str] = field(default_factory=set)


class LiveMoves:
    """Live moves and the re-pinner's reports, for
    :class:`~anolisnuma.placement.service.PlacementService` (a part of it: the state is the
    service's, see ``PlacementService.__init__``)."""

    # ================================================================== live moves
    def moves_in_flight(self) -> List[str]:
        """Pods whose live move is not fully applied yet."""
        with self._lock:
            return sorted(self._moves)

    def move(self, pod_uid: str, nodes: Sequence[int], reason: str = "", source: str = "affinity") -> bool:
        """Move a running managed pod onto ``nodes``: check it may move and fits, move its
        allocation (marked for the writer of ``numa.json``), and list every container of
        the pod for the re-pinner (:meth:`pending_updates`) with the new ``cpuset_cpus``
        and ``cpuset_mems``. On
        cgroup v1, ``cpuset.memory_migrate`` is set in the containers' cpuset cgroups
        first, so that their memory follows the new mems.

        Refused (False, with a log line) when the pod is unknown, pinned by a rule, has
        kubelet-exclusive CPUs, has no container, is being moved already, is already there,
        or the target nodes lack shared CPUs or free capacity for its demand. A re-pin that
        fails later rolls the move back (:meth:`apply_failed`). ``source`` becomes the
        allocation's source (who moved it: ``affinity``, ``respread``); ``reason`` is logged
        with the move.
        """
        target = tuple(sorted(set(int(n) for n in nodes)))
        if not target:
            return False
        self.follow_pool()
        with self._lock:
            alloc = self.ledger.get(pod_uid)
            why = self._why_not_movable(pod_uid, alloc, target)
            if why is not None or alloc is None:
                log.info("live NUMA move refused", pod=alloc.ref if alloc else None, pod_uid=pod_uid,
                         to_nodes=list(target), why=why, reason=reason or None)
                return False
            pool = self.ledger.pool
            request = PodRequest(alloc.demand_millicpu(), alloc.demand_memory())
            old = MoveInFlight(alloc.nodes, alloc.home, alloc.mems, alloc.source, reason)
            self.ledger.remove(pod_uid)
            try:
                loads = self.ledger.loads()
                cap = node_capacity(self.topology, pool)
                free = free_capacity(self.topology, pool, loads)
                room = sum(free.get(n, 0) for n in target)
                if any(cap.get(n, 0) <= 0 for n in target):
                    why = "a target node has no CPU in the shared pool"
                elif room < max(request.millicpu, 1):
                    why = f"not enough free capacity ({room / 1000:g} CPUs free, {request.millicpu / 1000:g} needed)"
                placement = None if why else pin(self.topology, pool, loads, target, request,
                                                   memory_pinning=self.config.memory_pinning, reason=reason)
            except NoPlacement as e:
                why, placement = str(e), None
            finally:
                self.ledger.add(alloc)
            if placement is None:
                log.info("live NUMA move refused", pod=alloc.ref, pod_uid=pod_uid, to_nodes=list(target), why=why,
                         reason=reason or None)
                return False
            self._start_move(alloc, placement, source, old)
            self._changed()
        return True

    def _start_move(self, alloc: Allocation, placement: Placement, source: str, old: MoveInFlight) -> None:
        """Move the allocation (under the lock) and list its containers for the re-pinner;
        the memory of its containers follows on cgroup v1. The caller saves."""
        if placement.mems and placement.mems != alloc.mems:
            for problem in enable_memory_migrate(self._cgroups, alloc.pod_uid, sorted(alloc.containers)):
                log.warning("cannot make memory follow a live NUMA move; pages stay where they are",
                            pod=alloc.ref, problem=problem)
        self.ledger.move(alloc.pod_uid, placement, source=source)
        want = alloc.cpus(self.ledger.pool)
        for cid in alloc.containers:
            self._pending_updates[cid] = (want, alloc.mems)
        self._moves[alloc.pod_uid] = old
        self.move_history.decided(alloc.pod_uid, old.nodes, alloc.nodes, source, old.reason)
        log.info("live NUMA move decided", pod=alloc.ref, pod_uid=alloc.pod_uid, from_nodes=list(old.nodes),
                 to_nodes=list(alloc.nodes), cpus=str(want), mems=str(alloc.mems), containers=len(alloc.containers),
                 source=source, reason=old.reason or None)

    def _why_not_movable(self, pod_uid: str, alloc: Optional[Allocation], target: Tuple[int, ...]) -> Optional[str]:
        if alloc is None:
            return "not a placed pod"
        if self.rule_pinned(alloc):
            return "pinned by a placement rule"
        if self._kubelet.has_exclusive(pod_uid):
            return "has kubelet-exclusive CPUs"
        if not alloc.containers:
            return "no running container"
        if pod_uid in self._moves:
            return "a move of this pod is still being applied"
        if any(not self.topology.has_node(n) for n in target):
            return "no such NUMA node"
        if tuple(alloc.nodes) == target:
            return "already there"
        return None

    # ================================================================== re-pins
    def mark_applied(self, container_id: str, cpus: Optional[str] = None, mems: Optional[str] = None) -> None:
        """The re-pinner applied a pending update. With ``cpus``/``mems`` (what it sent), an
        update that changed meanwhile (a move decided during the call) stays pending."""
        with self._lock:
            if cpus is not None:
                now = self._pending_updates.get(container_id)
                if now is not None and (str(now[0]), str(now[1])) != (cpus, mems if mems is not None else str(now[1])):
                    return
            self._pending_updates.pop(container_id, None)
            alloc = self.ledger.by_container(container_id)
            if alloc is not None and alloc.pod_uid in self._moves:
                self._moves[alloc.pod_uid].applied.add(container_id)
                self._move_progress(alloc)

    def apply_failed(self, container_id: str, error: str = "") -> bool:
        """The re-pinner could not apply a container's pending cpuset. When the container
        belongs to a live move, the move is rolled back: the pod's allocation goes back
        where it was (marked for the writer), containers already re-pinned are listed to be re-pinned
        back, the others are no longer pending. True when a move was rolled back (other
        failures stay pending and are retried)."""
        with self._lock:
            alloc = self.ledger.by_container(container_id)
            if alloc is None or alloc.pod_uid not in self._moves:
                return False
            mv = self._moves.pop(alloc.pod_uid)
            self.move_history.finished(alloc.pod_uid, "rolled back", error)
            new_nodes, moved_by = alloc.nodes, alloc.source
            if alloc.source == "rule":   # (not retried until the rules change again)
                self._rule_failures[alloc.pod_uid] = f"re-pin failed and was rolled back: {error or 'error'}"
            self.ledger.move(alloc.pod_uid, Placement(nodes=mv.nodes, home=mv.home, cpus=mv.home & self.ledger.pool,
                                                       mems=mv.mems), source=mv.source)
            want = alloc.cpus(self.ledger.pool)
            for cid in alloc.containers:
                if cid in mv.applied and want:
                    self._pending_updates[cid] = (want, alloc.mems)
                else:
                    self._pending_updates.pop(cid, None)
            self._changed()
        log.warning("live NUMA move failed; pod rolled back", pod=alloc.ref, pod_uid=alloc.pod_uid,
                    from_nodes=list(new_nodes), back_to=list(mv.nodes), container_id=container_id,
                    error=error or None, repin_back=sorted(mv.applied) or None)
        if moved_by != "rule":   # (a rule's failure is told by the cluster side's NumaRuleFailed)
            self.decisions(NumaMoveFailed(PodRef(alloc.namespace, alloc.name, alloc.pod_uid), tuple(new_nodes),
                                          tuple(mv.nodes), error, mv.reason))
        return True

    def _move_progress(self, alloc: Allocation) -> None:
        if any(cid in self._pending_updates for cid in alloc.containers):
            return
        mv = self._moves.pop(alloc.pod_uid, None)
        if mv is not None:
            self.move_history.finished(alloc.pod_uid, "applied")
            log.info("live NUMA move applied", pod=alloc.ref, pod_uid=alloc.pod_uid, from_nodes=list(mv.nodes),
                     to_nodes=list(alloc.nodes), cpus=str(alloc.cpus(self.ledger.pool)), mems=str(alloc.mems),
                     reason=mv.reason)
