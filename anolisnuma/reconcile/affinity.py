"""Traffic affinity, live: move pods that talk to each other onto one NUMA node.

Every ``interval_seconds``, :class:`AffinityController`:

1. lists the managed pods from the placement service's ledger and one PID per pod (a container's
   ``info.pid`` from containerd's verbose ContainerStatus, cached per container);
2. samples the :class:`~anolisnuma.system.traffic.TrafficObserver` (pod-pair bytes/s since
   the previous sample) and folds the **raw** rates into an
   :class:`~anolisnuma.policies.numa.affinity.AffinityGraph` (the one place rates are
   smoothed and confirmed);
3. calls :func:`~anolisnuma.policies.numa.affinity.plan_moves` with where every pod is, the
   free shared-pool capacity per node and the configured constraints (threshold, cap,
   cool-down, minimum improvement);
4. applies each move with ``PlacementService.move`` (capacity, exclusive CPUs and rule
   pins are checked again under the service's lock; the ledger is persisted, so a move
   survives a restart), then has the re-pinner apply them at once; a re-pin that fails
   rolls the move back (``PlacementService.apply_failed``).

Each move is logged (which pair, bytes/s, from which node to which, why) and counted in
:attr:`AffinityController.counters` (``samples``, ``moves``, ``moves_refused``,
``moves_rolled_back``; failed passes are the controller's ``errors``).

Its caches (the graph's pairs, when each pod last moved, the PIDs) follow the ledger at
every pass, and forget at once what the daemon's :class:`~anolisnuma.state.gone.Reaper`
says is gone (the controller is a :class:`~anolisnuma.state.gone.PodStateHolder`).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Optional

import structlog

from anolisnuma.controller import Controller
from anolisnuma.decision_events import DecisionEvents, NumaMoved, PodRef, no_events
from anolisnuma.pipeline.metrics import Counters
from anolisnuma.policies.numa.affinity import AffinityGraph, Move, MoveConstraints, PodPlacement, free_millicpu, plan_moves
from anolisnuma.policies.numa.config import AffinityConfig
from anolisnuma.state.gone import PodGone, PodKeys, PodStateHolder
from anolisnuma.system.procfs import process_exists
from anolisnuma.system.traffic import PodProcess, TrafficObserver

log = structlog.get_logger("anolisnuma.numa.affinity")


class ContainerPids:
    """A PID per container from containerd's verbose ContainerStatus (``info.pid``),
    cached; a cached PID whose ``/proc/<pid>`` is gone is asked again."""

    def __init__(self, client: Any, proc_root: str = "/proc") -> None:
        self.client = client
        self.proc_root = proc_root
        self._cache: Dict[str, int] = {}
        self._lock = threading.Lock()   # the affinity pass and a Reaper's forget

    def pid(self, container_id: str) -> Optional[int]:
        pid = self._cache.get(container_id)
        if pid is not None and process_exists(self.proc_root, pid):
            return pid
        with self._lock:
            self._cache.pop(container_id, None)
        try:
            _, info = self.client.container_status(container_id, verbose=True)
        except Exception as e:
            log.debug("no PID for a container", container_id=container_id, error=str(e).splitlines()[0][:200])
            return None
        pid = info.get("pid") if isinstance(info, dict) else None
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
            return None
        with self._lock:
            self._cache[container_id] = pid
        return pid

    def keep(self, container_ids: Iterable[str]) -> None:
        """Forget the containers that are not in ``container_ids``."""
        live = set(container_ids)
        with self._lock:
            for cid in [c for c in self._cache if c not in live]:
                del self._cache[cid]

    def forget(self, container_ids: Iterable[str]) -> None:
        with self._lock:
            for cid in container_ids:
                self._cache.pop(cid, None)

    def cached(self) -> List[str]:
        with self._lock:
            return list(self._cache)

    def close(self) -> None:
        close = getattr(self.client, "close", None)
        if close is not None:
            close()


class AffinityController(Controller, PodStateHolder):
    """``AffinityController(placement, observer, pids, config, apply=None)``: ``placement``
    is the :class:`~anolisnuma.placement.service.PlacementService`, ``pids`` something with ``pid(container_id)`` (:class:`ContainerPids`),
    ``apply`` a callable that applies the service's pending re-pins now (the re-pinner's
    ``run_once``); without it they wait for the re-pinner's next pass."""

    name = "numa-affinity"

    def __init__(self, placement: Any, observer: TrafficObserver, pids: Any, config: AffinityConfig,
                 apply: Optional[Callable[[], Any]] = None, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.placement = placement
        self.observer = observer
        self.pids = pids
        self.config = config
        self.apply = apply
        self.clock = clock
        self.interval = config.interval_seconds
        self.graph = AffinityGraph(half_life=config.half_life_seconds, confirm_samples=config.confirm_samples)
        self.counters = Counters()
        self.last_moved: Dict[str, float] = {}
        self.last_moves: List[Move] = []
        self.decisions: DecisionEvents = no_events   # told each move kept (the NUMA hook wires it)
        # The graph and last_moved are edited by the pass and by a Reaper's forget (from
        # another thread): each holds this while it does (no I/O under it).
        self._caches = threading.Lock()

    # ------------------------------------------------------------------ one pass
    def run_once(self) -> List[Move]:
        """Sample, plan, move; returns the moves that were made (and not rolled back)."""
        allocs = {a.pod_uid: a for a in self.placement.allocations()}
        pods: Dict[str, PodProcess] = {}
        for uid, a in allocs.items():
            for cid in sorted(a.containers):
                pid = self.pids.pid(cid)
                if pid is not None:
                    pods[uid] = PodProcess(pid)
                    break
        keep = getattr(self.pids, "keep", None)
        if keep is not None:
            keep([cid for a in allocs.values() for cid in a.containers])
        sample = self.observer.sample(pods)
        self.counters.add("samples")
        for error in sample.errors:
            log.debug("traffic sample problem", error=error)
        with self._caches:
            self._forget_pods({p for pair in self.graph.weights() for p in pair} - set(allocs))
            self._forget_pods([p for p in self.last_moved if p not in allocs])
            if sample.interval is None or sample.interval <= 0:
                return []   # the first sample has no rates
            # Raw rates, smoothed once here (the observer's own EWMA is not used).
            self.graph.update({k: v for k, v in sample.rates.items() if k[0] in allocs and k[1] in allocs},
                              elapsed=sample.interval)
            affine = self.graph.affine_pairs(self.config.threshold_bytes_per_second)
            last_moved = dict(self.last_moved)
        if not affine:
            return []
        now = self.clock()
        kstate = self.placement.kubelet_state
        in_flight = set(self.placement.moves_in_flight())
        placements = {uid: PodPlacement(nodes=tuple(a.nodes), millicpu=a.demand_millicpu(),
                                        rule_pinned=self.placement.rule_pinned(a) or uid in in_flight,
                                        exclusive=kstate.has_exclusive(uid))
                      for uid, a in allocs.items()}
        constraints = MoveConstraints(
            free=free_millicpu(self.placement.topology, self.placement.shared_pool, placements),
            max_moves=self.config.max_moves_per_interval, min_improvement=self.config.min_improvement,
            cooldown=self.config.cooldown_seconds, now=now, last_moved=last_moved)
        moves = plan_moves(self.placement.topology, placements, affine, constraints)
        made: List[Move] = []
        peers: Dict[str, str] = {}
        refused_plans = set()
        for m in moves:
            a = allocs[m.pod]
            partner = m.reason.pair[1] if m.reason.pair[0] == m.pod else m.reason.pair[0]
            other = allocs.get(partner)
            fields = dict(pod=a.ref, pod_uid=m.pod, partner=other.ref if other else partner,
                          bytes_per_second=round(m.reason.bytes_per_second), from_nodes=list(m.from_nodes),
                          to_nodes=list(m.to_nodes), kind=m.reason.kind,
                          distance=f"{m.reason.distance_before:g} -> {m.reason.distance_after:g}",
                          why=m.describe())
            if m.plan in refused_plans:
                self.counters.add("moves_refused")
                log.info("affinity move skipped: an earlier move of its plan was refused", **fields)
                continue
            if not self.placement.move(m.pod, m.to_nodes, m.describe()):
                refused_plans.add(m.plan)
                self.counters.add("moves_refused")
                log.info("affinity move refused by the placement service", **fields)
                continue
            with self._caches:
                self.last_moved[m.pod] = now
            made.append(m)
            peers[m.pod] = fields["partner"]
            log.info("affinity move", **fields)
        if made and self.apply is not None:
            self.apply()
        kept: List[Move] = []
        after = {a.pod_uid: a for a in self.placement.allocations()}
        for m in made:
            a = after.get(m.pod)
            if a is not None and tuple(a.nodes) == tuple(m.to_nodes):
                kept.append(m)
                self.counters.add("moves")
                self.decisions(NumaMoved(PodRef(a.namespace, a.name, m.pod), tuple(m.from_nodes), tuple(m.to_nodes),
                                         peers[m.pod], m.reason.bytes_per_second, m.reason.kind))
            else:
                self.counters.add("moves_rolled_back")
                log.warning("affinity move rolled back (its re-pin failed)", pod_uid=m.pod, to_nodes=list(m.to_nodes))
        self.last_moves = kept
        return kept

    def affine_groups(self) -> List[tuple]:
        """The pods joined by affine pairs now (pod uid tuples): re-spread moves each group
        whole or not at all."""
        with self._caches:
            return [g.pods for g in self.graph.groups(self.config.threshold_bytes_per_second)]

    def _forget_pods(self, pods: Iterable[str]) -> None:
        for pod in pods:
            self.graph.forget_pod(pod)
            self.last_moved.pop(pod, None)

    # ------------------------------------------------------------------ PodStateHolder
    def held(self) -> PodKeys:
        with self._caches:
            uids = {p for pair in self.graph.weights() for p in pair} | set(self.last_moved)
        cids = self.pids.cached() if isinstance(self.pids, ContainerPids) else []
        return PodKeys.of(uids, (), cids)

    def forget(self, gone: PodGone) -> None:
        with self._caches:
            self._forget_pods(gone.uids)
        if isinstance(self.pids, ContainerPids):
            self.pids.forget(gone.container_ids)

    def structures(self) -> Dict[str, int]:
        with self._caches:
            out = {"pairs": len(self.graph), "last_moved": len(self.last_moved)}
        out["pids"] = len(self.pids.cached()) if isinstance(self.pids, ContainerPids) else 0
        return out

    # ------------------------------------------------------------------ controller
    def counts(self) -> Dict[str, int]:
        snap = self.counters.snapshot()
        return {k: snap.get(k, 0) for k in ("samples", "moves", "moves_refused", "moves_rolled_back")}

    def closed(self) -> None:
        self.observer.close()
        close = getattr(self.pids, "close", None)
        if close is not None:
            close()
