"""``PlacementService``: the ledger of NUMA allocations, its lock, persistence and re-pins.

Every change goes through one of a few typed entry points, each under the lock; each marks
the ledger changed for the writer thread (:attr:`PlacementService.writer`, a
:class:`~anolisnuma.state.write_behind.WriteBehind`) and returns without waiting for the
write, so no kubelet call waits for an fsync of ``numa.json``:

- :meth:`PlacementService.place_container` / :meth:`~PlacementService.container_created` /
  :meth:`~PlacementService.update_container` / :meth:`~PlacementService.release_sandbox` /
  :meth:`~PlacementService.release_container` / :meth:`~PlacementService.sandbox_started`:
  the kubelet's calls, as the NUMA hook reads them;
- :meth:`~PlacementService.move`: a live move of a running pod (traffic affinity);
- :meth:`~PlacementService.follow_pool`: the kubelet's shared pool changed (its CPU manager
  checkpoint); :meth:`~PlacementService.reload_rules`: the rule files changed;
  :meth:`~PlacementService.set_cluster_rules`: the Oenuma CRs of the API server changed;
  :meth:`~PlacementService.reconcile_rules`: running pods re-pinned where the rules changed;
- :meth:`~PlacementService.resync`: what containerd runs now (at start, then every
  ``[runtime] resync_interval_seconds``);
- :meth:`~PlacementService.forget`: what the daemon's
  :class:`~anolisnuma.state.gone.Reaper` found gone (the service is a
  :class:`~anolisnuma.state.gone.PodStateHolder`).

Durable is what containerd runs, not the file: ``numa.json`` may lag the ledger by the
changes not written yet and a ``kill -9`` loses them; the start-up
:meth:`~PlacementService.resync` drops what containerd no longer runs and counts, once, what
it runs that the file missed (under its pod's allocation, or adopting a managed pod from its
container's cpuset). A placement reaches containerd only as a container's cpuset, so each
window is safe: placed but not created (nothing runs, nothing holds capacity; created with
the reply lost: adopted), created or removed but not written (counted or dropped as
containerd says), a live move partly re-pinned but not written (rolled back: the moved
containers are off the old placement and re-pinned back). docs/restarts.md ("What a crash
can lose") has the table and the tests (tests/hooks/test_numa_crash_windows.py,
tests/restart/test_crash_windows_e2e.py). :meth:`~PlacementService.close` (the shutdown)
writes what is unwritten; without the writer thread each change is written before returning.

Containers whose cgroup must be re-pinned without a kubelet call (adopted unpinned, an edit
that did not reach containerd, a live move) are listed by
:meth:`~PlacementService.pending_updates` for the re-pinner, which reports back with
:meth:`~PlacementService.mark_applied` or :meth:`~PlacementService.apply_failed` (a failed
re-pin of a move rolls the whole move back).

The class is one, its code in three modules: this one holds the state (in ``__init__``),
the kubelet's calls, the pool, persistence (the writer) and resync; :mod:`.rules` the rule
sources and the re-pins a rule change causes
(:class:`~anolisnuma.placement.rules.PlacementRules`); :mod:`.moves` the live moves and the
re-pinner's reports (:class:`~anolisnuma.placement.moves.LiveMoves`). They share one lock,
one ledger and one list of pending re-pins, and each entry point of one part may end in
another (a removed container ends a move; a rule change starts moves), so they are parts of
one class rather than objects passing that state between them.
"""

from __future__ import annotations

import threading
from typing import Any, Container, Dict, List, Optional, Set, Tuple

import structlog

from anolisnuma.decision_events import DecisionEvents, NumaPlaced, NumaPoolMoved, PodRef, no_events, pod_ref
from anolisnuma.placement.answer import Answer, parse_cpus, where
from anolisnuma.placement.move_history import MoveHistory
from anolisnuma.placement.moves import LiveMoves, MoveInFlight
from anolisnuma.placement.rules import PlacementRules
from anolisnuma.policies.numa.balance import NoPlacement, Placement, PodRequest, balance, millicpu_of, pin
from anolisnuma.policies.numa.config import NumaConfig
from anolisnuma.policies.numa.cpu_manager import CpuManagerStateError, KubeletCpuState
from anolisnuma.policies.numa.cpuset import CpuSet
from anolisnuma.policies.numa.ledger import Allocation, ContainerShare, Ledger
from anolisnuma.policies.numa.rules import PinRule, resolve_pins
from anolisnuma.policies.numa.selection import PodSelector
from anolisnuma.policies.numa.topology import NumaTopology
from anolisnuma.state.gone import PodGone, PodKeys, PodStateHolder
from anolisnuma.state.numa_state import NumaStateFile
from anolisnuma.state.records import ContainerRecord, PodRecord
from anolisnuma.state.write_behind import WriteBehind
from anolisnuma.system.cgroups import CgroupFs
from anolisnuma.system.kubelet_state import CpuManagerStateFile
from anolisnuma.system.rule_files import RuleDirectory

log = structlog.get_logger("anolisnuma.numa")


class PlacementService(PlacementRules, LiveMoves, PodStateHolder):
    """``PlacementService(config, topology, kubelet_file, state_file, cgroups)``; allocations
    are loaded from ``state_file``, rules from ``config.pins`` and ``config.rules_dir``."""

    name = "numa"

    def __init__(self, config: NumaConfig, topology: NumaTopology, kubelet_file: CpuManagerStateFile,
                 state_file: NumaStateFile, cgroups: CgroupFs) -> None:
        self.config = config
        self.topology = topology
        for problem in topology.problems:
            log.warning("NUMA topology", problem=problem)
        self.node_name = config.effective_node_name()
        self._lock = threading.RLock()
        self._kubelet_file = kubelet_file
        self._kubelet = KubeletCpuState()
        self._state = state_file
        self._cgroups = cgroups
        self.ledger = Ledger(topology, topology.cpus)
        self.follow_pool()
        self._pending_updates: Dict[str, Tuple[CpuSet, CpuSet]] = {}
        self._moves: Dict[str, MoveInFlight] = {}   # live moves being applied, by pod uid
        self.move_history = MoveHistory()             # why each placed pod moved (ctl pods/explain)
        self._resynced = False
        # numa.json is written behind the calls once the daemon starts this thread
        self.writer: WriteBehind[List[str]] = WriteBehind(
            "numa-writer", self._lock, self.ledger.encoded, state_file.save_encoded, state_file.path,
            "NUMA allocations")
        self._config_rules, problems = resolve_pins(config.pins, topology)
        for problem in problems:
            log.warning("placement rule ignored", problem=problem)
        self._selector = PodSelector(config.namespaces, config.pod_name_patterns, self._config_rules)
        self._rules = RuleDirectory(config.rules_dir) if config.rules_dir else None
        self._rules_sig: Any = None
        self._file_rules: List[PinRule] = []
        self._cluster_rules: List[PinRule] = []
        self._rules_dirty = False        # rules changed since running pods were last re-pinned
        self._rule_failures: Dict[str, str] = {}   # pod uid -> why its rule could not be applied
        self.rule_files_skipped = 0      # rule files skipped as malformed, since start (a file read again counts again)
        self.decisions: DecisionEvents = no_events   # told each placement and failed move (the daemon wires it)
        self.reload_rules()
        self._load_state()

    # ================================================================== queries
    def pending_pods(self) -> Set[str]:
        """Pods with a re-pin not applied yet."""
        with self._lock:
            return {a.pod_uid for a in self.ledger if any(c in self._pending_updates for c in a.containers)}

    @property
    def shared_pool(self) -> CpuSet:
        return self.ledger.pool

    @property
    def kubelet_state(self) -> KubeletCpuState:
        return self._kubelet

    def allocations(self) -> List[Allocation]:
        """A snapshot of the allocations (the objects are the ledger's: do not edit)."""
        with self._lock:
            return list(self.ledger)

    def knows_pod(self, pod_uid: str) -> bool:
        return pod_uid in self.ledger

    def knows_sandbox(self, sandbox_id: str) -> bool:
        return self.ledger.knows_sandbox(sandbox_id)

    def knows_container(self, container_id: str) -> bool:
        return self.ledger.knows_container(container_id)

    def pending_updates(self) -> List[Tuple[str, str, str]]:
        """Containers whose cpuset differs from their pod's placement and that no CRI call
        will fix by itself (adopted unpinned at resync, an edit that did not reach
        containerd, a live move): ``(container_id, cpuset_cpus, cpuset_mems)`` to apply with
        UpdateContainerResources. ``cpuset_mems`` is "" when memory is not pinned."""
        with self._lock:
            return [(cid, str(c), str(m)) for cid, (c, m) in sorted(self._pending_updates.items())]

    # ================================================================== the kubelet's calls
    def place_container(self, pod: PodRecord, sandbox_id: str, share: ContainerShare, pod_demand: PodRequest,
                        kubelet_cpus: CpuSet, kubelet_mems: str, logger: Any = None) -> Answer:
        """CreateContainer: the cpuset for container ``share.name`` of ``pod``, placing the
        pod when this is its first container (a rule that names it, else balance).
        ``pod_demand`` is the pod-level request (the kubelet's sum over its containers),
        ``kubelet_cpus``/``kubelet_mems`` what the kubelet sent."""
        logger = logger or log
        sel = self.select(pod)
        if not sel.managed and pod.uid not in self.ledger:
            # (a pod already placed stays managed even if the rules changed since: all of
            # its containers must share one placement)
            return Answer()
        self.follow_pool()
        kstate = self._kubelet
        if kstate.is_exclusive(pod.uid, share.name):
            own = kstate.entries[pod.uid][share.name]
            self.decisions(NumaPlaced(PodRef(pod.namespace, pod.name, pod.uid), self.topology.nodes_of_cpus(own),
                                      str(own), "", "kubelet-exclusive", container=share.name))
            return Answer(note="kubelet-exclusive CPUs; left alone")
        with self._lock:
            pool = self.ledger.pool
            if kubelet_cpus and kubelet_cpus.isdisjoint(pool):
                # CPUs outside the shared pool can only be an exclusive assignment we have not
                # read yet: never move a container off CPUs the kubelet reserved for it.
                return Answer(note=f"kubelet cpuset {kubelet_cpus} outside the shared pool; left alone")
            alloc = self.ledger.get(pod.uid)
            if alloc is not None and sandbox_id and alloc.sandbox_id and alloc.sandbox_id != sandbox_id:
                logger.info("pod has a new sandbox; its old placement is released", old_sandbox_id=alloc.sandbox_id)
                self._forget(alloc)
                alloc = None
            decided: Optional[Placement] = None
            if alloc is None:
                if kstate.has_exclusive(pod.uid):
                    # (the pod-level sum would include the exclusive containers' CPUs)
                    pod_demand = PodRequest(0, 0)
                request = PodRequest(max(pod_demand.millicpu, share.millicpu),
                                     max(pod_demand.memory_bytes, share.memory_bytes))
                try:
                    decided, source = self._decide(sel.rule, request, pool, logger)
                except NoPlacement as e:
                    logger.warning("NUMA placement impossible; container left as the kubelet sent it", reason=str(e))
                    return Answer(note=f"not placed: {e}")
                alloc = Allocation(pod_uid=pod.uid, namespace=pod.namespace, name=pod.name, sandbox_id=sandbox_id,
                                   nodes=decided.nodes, home=decided.home, mems=decided.mems,
                                   pod_millicpu=pod_demand.millicpu, pod_memory_bytes=pod_demand.memory_bytes,
                                   source=source)
                self.ledger.add(alloc)
            elif sandbox_id and not alloc.sandbox_id:
                self.ledger.set_sandbox(pod.uid, sandbox_id)
            self.ledger.set_pending(pod.uid, share.name, share)
            view = kubelet_cpus or pool
            cpus = alloc.home & view
            if not cpus:
                if self._follow_pool(alloc, view, logger) is None:
                    self._changed()
                    return Answer(note="shared pool left the pod's nodes and no node fits; kubelet's cpuset kept")
                cpus = alloc.home & view
            mems = self._merge_mems(alloc.mems, kubelet_mems, logger)
            self._changed()
        note = f"{'placed on' if decided else 'pod on'} {where(alloc.nodes)} cpus {cpus}"
        if mems is not None and str(mems):
            note += f" mems {mems}"
        if decided is not None:
            note += f" ({alloc.source}: {decided.reason})"
            self.decisions(NumaPlaced(PodRef(pod.namespace, pod.name, pod.uid), tuple(alloc.nodes), str(cpus),
                                      str(mems) if mems is not None else "", alloc.source,
                                      rule=sel.rule.source if alloc.source == "rule" and sel.rule else "",
                                      detail=decided.reason))
        return Answer(cpus=cpus, mems=mems, note=note)

    def container_created(self, pod_uid: str, container_name: str, container_id: str,
                          sent_cpus: Optional[CpuSet]) -> None:
        """CreateContainer succeeded: count the container under its id. ``sent_cpus`` is the
        cpuset containerd was sent; when it is not the placement's (the edit did not reach
        containerd), the container is listed for a re-pin."""
        if not container_id or pod_uid not in self.ledger:
            return
        with self._lock:
            alloc = self.ledger.get(pod_uid)
            if alloc is None or container_name not in alloc.pending:
                return
            self.ledger.add_container(pod_uid, container_id, alloc.pending[container_name])
            want = alloc.cpus(self.ledger.pool)
            if want and (not sent_cpus or not sent_cpus.issubset(alloc.home)):
                self._pending_updates[container_id] = (want, alloc.mems)
            self._changed()

    def update_container(self, container_id: str, kubelet_cpus: CpuSet, kubelet_mems: str,
                         resize: Optional[Tuple[int, Optional[int]]], claim: Optional[Tuple[PodRecord, ContainerRecord]],
                         logger: Any = None) -> Answer:
        """UpdateContainerResources: the kubelet's cpuset merged with the placement (our
        CPUs within its pool); when the pool left the pod's nodes, the pod follows it.
        ``resize`` is the container's new (millicpu, memory bytes or None) on an in-place
        resize. ``claim`` (the pod and container the call is about) counts a container we
        pinned whose CreateContainer reply we never saw."""
        logger = logger or log
        if not self.ledger.knows_container(container_id) and not (claim and self._claim_pending(*claim)):
            return Answer()
        self.follow_pool()
        with self._lock:
            alloc = self.ledger.by_container(container_id)
            if alloc is None:
                return Answer()
            share = alloc.containers[container_id]
            if self._kubelet.is_exclusive(alloc.pod_uid, share.name):
                return Answer()
            if resize is not None:
                milli, mem = resize
                if milli != share.millicpu or (mem is not None and mem != share.memory_bytes):
                    self.ledger.update_container(container_id, milli, mem)
                    self._changed()
            view = kubelet_cpus or self.ledger.pool
            cpus = alloc.home & view
            if not cpus:
                if self._follow_pool(alloc, view, logger) is None:
                    self._changed()
                    return Answer(note="shared pool left the pod's nodes; kubelet's cpuset kept")
                self._changed()
                cpus = alloc.home & view
            mems = self._merge_mems(alloc.mems, kubelet_mems, logger)
            self._pending_updates.pop(container_id, None)
        return Answer(cpus=cpus, mems=mems,
                      note=f"merged kubelet cpuset {kubelet_cpus or '(none)'} -> {cpus} ({where(alloc.nodes)})")

    def _claim_pending(self, pod: PodRecord, container: ContainerRecord) -> bool:
        if pod.uid not in self.ledger:
            return False
        with self._lock:
            alloc = self.ledger.get(pod.uid)
            if alloc is None or alloc.sandbox_id != container.sandbox_id or container.name not in alloc.pending:
                return False
            self.ledger.add_container(pod.uid, container.container_id, alloc.pending[container.name])
            self._changed()
        return True

    def release_sandbox(self, sandbox_id: str) -> Optional[Tuple[int, ...]]:
        """StopPodSandbox / RemovePodSandbox: the pod's capacity is freed; the nodes it had."""
        if not self.ledger.knows_sandbox(sandbox_id):
            return None
        with self._lock:
            alloc = self.ledger.by_sandbox(sandbox_id)
            if alloc is None:
                return None
            self._forget(alloc)
            self._changed()
        return tuple(alloc.nodes)

    def release_container(self, container_id: str) -> Optional[Tuple[int, ...]]:
        """RemoveContainer: the container's share is freed; the nodes of its pod."""
        if not self.ledger.knows_container(container_id):
            return None
        with self._lock:
            alloc = self.ledger.remove_container(container_id)
            self._pending_updates.pop(container_id, None)
            if alloc is None:
                return None
            if alloc.pod_uid in self._moves:
                self._move_progress(alloc)
            self._changed()
        return tuple(alloc.nodes)

    # ================================================================== what is gone
    def held(self) -> PodKeys:
        with self._lock:
            allocs = list(self.ledger)
        return PodKeys.of([a.pod_uid for a in allocs], [a.sandbox_id for a in allocs],
                          [cid for a in allocs for cid in a.containers])

    def forget(self, gone: PodGone) -> None:
        """Release what is gone: capacity comes back as at StopPodSandbox/RemoveContainer."""
        released = [sid for sid in gone.sandbox_ids if self.release_sandbox(sid) is not None]
        for cid in gone.container_ids:
            self.release_container(cid)
        for uid in gone.uids:
            with self._lock:
                alloc = self.ledger.get(uid)
                if alloc is not None:
                    self._forget(alloc)
                    self._changed()
                    released.append(alloc.sandbox_id)
        if released:
            log.info("NUMA allocations of gone pods released", pods=len(released), reason=gone.reason)

    def structures(self) -> Dict[str, int]:
        with self._lock:
            return {"allocations": len(self.ledger), "containers": sum(len(a.containers) for a in self.ledger),
                    "pending_repins": len(self._pending_updates), "moves_in_flight": len(self._moves),
                    "moved_pods": len(self.move_history)}

    def sandbox_started(self, pod_uid: str, sandbox_id: str, logger: Any = None) -> None:
        """RunPodSandbox succeeded: a pod that got a new sandbox loses the old one's placement."""
        alloc = self.ledger.get(pod_uid)
        if alloc is None or not alloc.sandbox_id or not sandbox_id or alloc.sandbox_id == sandbox_id:
            return
        with self._lock:
            alloc = self.ledger.get(pod_uid)
            if alloc is not None and alloc.sandbox_id != sandbox_id:
                (logger or log).info("pod has a new sandbox; its old placement is released",
                                     old_sandbox_id=alloc.sandbox_id)
                self._forget(alloc)
                self._changed()

    # ================================================================== decisions
    def _decide(self, rule: Optional[PinRule], request: PodRequest, pool: CpuSet, logger: Any) -> Tuple[Placement, str]:
        loads = self.ledger.loads()
        if rule is not None:
            try:
                placement = pin(self.topology, pool, loads, rule.nodes, request, cpus=rule.cpus, mems=rule.mems,
                                memory_pinning=self.config.memory_pinning, reason=f"pinned by {rule.source}")
                return placement, "rule"
            except NoPlacement as e:
                logger.warning("placement rule cannot be applied; balancing instead", rule=rule.describe(),
                               reason=str(e))
        placement = balance(self.topology, pool, loads, request, memory_pinning=self.config.memory_pinning)
        return placement, "balance"

    def _follow_pool(self, alloc: Allocation, pool: CpuSet, logger: Any) -> Optional[Allocation]:
        """The shared pool no longer covers the pod's home CPUs: re-place the pod within it
        (closest to where it was). None when no node has shared CPUs left."""
        old_nodes = alloc.nodes
        request = PodRequest(alloc.demand_millicpu(), alloc.demand_memory(), near=old_nodes)
        self.ledger.remove(alloc.pod_uid)
        try:
            placement = balance(self.topology, pool, self.ledger.loads(), request,
                                memory_pinning=self.config.memory_pinning)
        except NoPlacement as e:
            self.ledger.add(alloc)
            logger.warning("shared pool left the pod's NUMA nodes and no node has shared CPUs; "
                           "following the kubelet's cpuset", pod=alloc.ref, old_nodes=list(old_nodes), reason=str(e))
            return None
        self.ledger.add(alloc)
        self.ledger.move(alloc.pod_uid, placement, source="balance")
        logger.warning("shared pool left the pod's NUMA nodes; pod re-placed", pod=alloc.ref,
                       old_nodes=list(old_nodes), new_nodes=list(placement.nodes), pool=str(pool))
        self.decisions(NumaPoolMoved(pod_ref(alloc.ref, alloc.pod_uid), tuple(old_nodes), tuple(placement.nodes), str(pool)))
        return alloc

    @staticmethod
    def _merge_mems(ours: CpuSet, kubelet_text: str, logger: Any) -> Optional[CpuSet]:
        """The memory nodes to set: ours within the kubelet's (its memory manager may set
        them); None to leave the field as the kubelet sent it."""
        if not ours:
            return None
        if not kubelet_text.strip():
            return ours
        theirs = parse_cpus(kubelet_text)
        if theirs is None:
            return None
        merged = ours & theirs
        if not merged:
            logger.info("kubelet's cpuset_mems is disjoint from the pod's NUMA nodes; keeping the kubelet's",
                        kubelet=str(theirs), ours=str(ours))
            return None
        return merged

    def _forget(self, alloc: Allocation) -> None:
        self.ledger.remove(alloc.pod_uid)
        self._moves.pop(alloc.pod_uid, None)
        self.move_history.forget(alloc.pod_uid)
        for cid in alloc.containers:
            self._pending_updates.pop(cid, None)

    # ================================================================== the kubelet's pool
    def follow_pool(self) -> None:
        """Re-read the kubelet's CPU manager checkpoint when it changed (one ``stat``
        otherwise): its shared pool is where our placements live."""
        raw = self._kubelet_file.refresh()
        if raw is None:
            return
        try:
            state = KubeletCpuState.from_raw(raw)
        except CpuManagerStateError as e:
            log.warning("kubelet cpu_manager_state has a garbled CPU list; keeping the last good one",
                        path=self._kubelet_file.path, error=str(e))
            return
        with self._lock:
            self._kubelet = state
            old = self.ledger.pool
            pool = state.shared_pool(self.topology.cpus)
            if pool == old:
                return
            self.ledger.set_pool(pool)
            stranded = [a.ref for a in self.ledger if a.home.isdisjoint(pool)]
            log.info("kubelet shared CPU pool changed", policy=state.policy, old=str(old), new=str(pool),
                     exclusive=str(state.exclusive_cpus), stranded_pods=stranded or None)

    # ================================================================== persistence and resync
    def _load_state(self) -> None:
        records = self._state.load()
        if records is None:
            return
        with self._lock:
            problems = self.ledger.load_records(records)
        for problem in problems:
            log.warning("saved NUMA allocation dropped", problem=problem)

    def _changed(self) -> None:
        """The ledger changed (under the lock): for the writer thread, off the caller's path."""
        self.writer.mark()

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until numa.json holds every change made so far; False when the write failed
        (logged, retried) or did not end within ``timeout`` seconds."""
        return self.writer.flush(timeout)

    def close(self) -> None:
        """Stop the writer thread, writing what is unwritten first (the daemon's shutdown)."""
        self.writer.stop()

    def resync(self, pods: List[PodRecord], containers: List[ContainerRecord],
               fresh: Container[str] = frozenset()) -> None:
        """Reconcile the allocations with what containerd runs now: drop pods and containers
        that are gone, count containers we did not know under their pod (adopting managed
        pods from the cpusets they have), and never count a container twice. Pods and
        containers in ``fresh`` (named by calls newer than the listing) are left as the
        calls made them."""
        self.follow_pool()
        with self._lock:
            first = not self._resynced
            by_sandbox = {p.sandbox_id: p for p in pods if p.sandbox_id}
            live_uids = {p.uid for p in pods}
            live_cids = {c.container_id for c in containers}
            dropped = []
            for alloc in self.ledger:
                if alloc.pod_uid in fresh or alloc.sandbox_id in fresh:
                    continue  # changed by calls newer than the listing: the calls are right
                if alloc.pod_uid not in live_uids or (alloc.sandbox_id and alloc.sandbox_id not in by_sandbox):
                    self._forget(alloc)
                    dropped.append(alloc.ref)
                    continue
                for cid in list(alloc.containers):
                    if cid not in live_cids and cid not in fresh:
                        self.ledger.remove_container(cid)
                        self._pending_updates.pop(cid, None)
                if alloc.pod_uid in self._moves:
                    self._move_progress(alloc)   # a move waiting only for containers now gone ends
                if first:
                    # creates in flight when the proxy stopped never got their reply to us
                    self.ledger.clear_pending(alloc.pod_uid)
            adopted: Dict[str, List[str]] = {}
            told: List[NumaPlaced] = []   # the pods adopted: told after the lock
            unpinned: Dict[str, List[ContainerRecord]] = {}
            pool = self.ledger.pool
            for c in containers:
                pod = by_sandbox.get(c.sandbox_id)
                if pod is None or c.container_id in fresh or pod.uid in fresh or pod.sandbox_id in fresh:
                    continue
                known = self.ledger.by_container(c.container_id)
                if known is not None:
                    self._note_drift(c, known, parse_cpus(c.resources.cpuset_cpus) or CpuSet())
                    continue
                if self._kubelet.is_exclusive(pod.uid, c.name):
                    continue
                share = _share_of(c)
                have = parse_cpus(c.resources.cpuset_cpus) or CpuSet()
                alloc = self.ledger.get(pod.uid)
                if alloc is not None:
                    if alloc.sandbox_id != c.sandbox_id:
                        continue
                    self.ledger.add_container(pod.uid, c.container_id, share)
                    self._note_drift(c, alloc, have)
                    adopted.setdefault(pod.ref, []).append(c.name)
                    continue
                if not self.select(pod).managed:
                    continue
                cpus = have & self.topology.cpus
                if not cpus or (pool.issubset(cpus) and len(self.topology.nodes_of_cpus(pool)) > 1):
                    # no cpuset, or the whole multi-node pool: nobody pinned it
                    unpinned.setdefault(pod.sandbox_id, []).append(c)
                    continue
                alloc = self._adopt(pod, c, cpus, share)
                told.append(NumaPlaced(PodRef(pod.namespace, pod.name, pod.uid), tuple(alloc.nodes), str(cpus),
                                       str(alloc.mems), "adopted", adopted=True))
                adopted.setdefault(pod.ref, []).append(c.name)
                self._note_drift(c, alloc, have)
            for sid, group in unpinned.items():
                pod = by_sandbox[sid]
                alloc = self.ledger.get(pod.uid)
                if alloc is None:
                    shares = [_share_of(c) for c in group]
                    demand = PodRequest(sum(s.millicpu for s in shares), sum(s.memory_bytes for s in shares))
                    try:
                        placement, source = self._decide(rule := self.select(pod).rule, demand, pool, log)
                    except NoPlacement:
                        continue
                    alloc = Allocation(pod_uid=pod.uid, namespace=pod.namespace, name=pod.name,
                                       sandbox_id=pod.sandbox_id, nodes=placement.nodes, home=placement.home,
                                       mems=placement.mems, source=source)
                    self.ledger.add(alloc)
                    told.append(NumaPlaced(PodRef(pod.namespace, pod.name, pod.uid), tuple(alloc.nodes),
                                           str(alloc.cpus(pool)), str(alloc.mems), source, detail=placement.reason,
                                           rule=rule.source if source == "rule" and rule else "", adopted=True))
                for c in group:
                    self.ledger.add_container(pod.uid, c.container_id, _share_of(c))
                    self._note_drift(c, alloc, parse_cpus(c.resources.cpuset_cpus) or CpuSet())
                    adopted.setdefault(pod.ref, []).append(c.name)
            self._resynced = True
            self._changed()
        for fact in told:
            self.decisions(fact)
        (log.info if first or dropped or adopted else log.debug)(
            "NUMA allocations reconciled with containerd", allocations=len(self.ledger),
            dropped_pods=dropped or None, adopted=adopted or None,
            pending_updates=len(self._pending_updates) or None)

    def _adopt(self, pod: PodRecord, c: ContainerRecord, cpus: CpuSet, share: ContainerShare) -> Allocation:
        """An allocation for a managed pod found running with a cpuset: its nodes are those
        owning the CPUs; its home is those nodes' CPUs when the cpuset is what we would have
        given (the nodes' shared CPUs), else the cpuset itself (a rule's CPU list)."""
        nodes = self.topology.nodes_of_cpus(cpus)
        node_cpus = self.topology.cpus_of(nodes)
        home = node_cpus if (node_cpus & self.ledger.pool).issubset(cpus) else cpus
        mems = parse_cpus(c.resources.cpuset_mems) or CpuSet()
        if not all(self.topology.has_node(m) for m in mems):
            mems = CpuSet(nodes)
        alloc = Allocation(pod_uid=pod.uid, namespace=pod.namespace, name=pod.name, sandbox_id=pod.sandbox_id,
                           nodes=nodes, home=home, mems=mems, source="adopted")
        self.ledger.add(alloc)
        self.ledger.add_container(pod.uid, c.container_id, share)
        return alloc

    def _note_drift(self, c: ContainerRecord, alloc: Allocation, have: CpuSet) -> None:
        want = alloc.cpus(self.ledger.pool)
        have_mems = parse_cpus(c.resources.cpuset_mems) or CpuSet()
        mems_off = bool(alloc.mems) and not (have_mems and have_mems.issubset(alloc.mems))
        if want and (have != want or mems_off):
            self._pending_updates[c.container_id] = (want, alloc.mems)
        elif alloc.pod_uid not in self._moves:
            # (a move's re-pins are only done when the re-pinner says so: a record that
            # already shows the target may predate an earlier move away from it)
            self._pending_updates.pop(c.container_id, None)


def _share_of(c: ContainerRecord) -> ContainerShare:
    r = c.resources
    return ContainerShare(c.name, millicpu_of(r.cpu_period, r.cpu_quota, r.cpu_shares), max(r.memory_limit_in_bytes, 0))
