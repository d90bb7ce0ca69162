"""Re-spread, live: move placed pods back toward balance after departures and pool changes.

Balance places a pod when it arrives. :class:`RespreadController` keeps the nodes balanced
afterwards: at every check (``[numa] poll_interval_seconds``) it reads the placement
service's ledger and shared pool, and once the nodes have stayed out of balance for
``settle_seconds`` (:func:`~anolisnuma.policies.numa.respread.over_threshold`), it plans
with :func:`~anolisnuma.policies.numa.respread.plan_respread` when the pool or the pods
changed since the last plan, or ``interval_seconds`` passed. Each move goes through
``PlacementService.move`` with source ``respread`` (capacity, exclusive CPUs and rule pins
are checked again under the service's lock; memory follows on cgroup v1; the ledger is
persisted), then the re-pinner applies them at once; a re-pin that fails rolls the move
back (``PlacementService.apply_failed``). At most ``max_moves_per_interval`` pods move
within any ``interval_seconds``, and a moved pod stays put for ``cooldown_seconds``.

Never moved: pods a rule pins, pods with kubelet-exclusive CPUs, pods whose move is still
being applied, pods without a running container, pods on several nodes or on a CPU list.
An affinity group (``groups()``, from the traffic-affinity controller) moves whole or not
at all; when part of a group's move is refused or rolled back, the rest is moved back.

Each move is logged (``re-spread move``: the pod, from and to, the spread before and
after, what triggered it) and counted (``plans``, ``moves``, ``moves_refused``,
``moves_rolled_back``; failed passes are the controller's ``errors``).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

import structlog

from anolisnuma.controller import Controller
from anolisnuma.pipeline.metrics import Counters
from anolisnuma.policies.numa.config import RespreadConfig
from anolisnuma.policies.numa.respread import (
    RespreadMove, RespreadPacer, SpreadPod, cpu_spread, over_threshold, plan_respread, urgent)
from anolisnuma.state.gone import PodGone, PodKeys, PodStateHolder

log = structlog.get_logger("anolisnuma.numa.respread")

SOURCE = "respread"


class RespreadController(Controller, PodStateHolder):
    """``RespreadController(placement, config, apply=None, groups=None, check_interval=1.0)``:
    ``placement`` is the :class:`~anolisnuma.placement.service.PlacementService`, ``apply``
    applies its pending re-pins now (the re-pinner's ``run_once``), ``groups`` returns the
    affinity groups (pod uid tuples) that must stay together."""

    name = "numa-respread"

    def __init__(self, placement: Any, config: RespreadConfig, apply: Optional[Callable[[], Any]] = None,
                 groups: Optional[Callable[[], Sequence[Sequence[str]]]] = None, check_interval: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.placement = placement
        self.config = config
        self.apply = apply
        self.groups = groups
        self.clock = clock
        self.interval = check_interval
        self.pacer = RespreadPacer(config.interval_seconds, config.max_moves_per_interval, config.settle_seconds)
        self.counters = Counters()
        self.last_moved: Dict[str, float] = {}
        self.last_moves: List[RespreadMove] = []
        self._seen: Optional[Tuple[Any, Set[str]]] = None   # (pool, pod uids) at the last check
        self._causes: Set[str] = set()                       # what changed since the last plan
        self._caches = threading.Lock()   # last_moved: the pass and a Reaper's forget

    # ------------------------------------------------------------------ one pass
    def run_once(self) -> List[RespreadMove]:
        """Check, and plan and move when due; the moves made (and not rolled back)."""
        now = self.clock()
        p = self.placement
        allocs = {a.pod_uid: a for a in p.allocations()}
        pool = p.shared_pool
        self._note_changes(pool, set(allocs))
        with self._caches:
            for uid in [u for u in self.last_moved if u not in allocs]:
                del self.last_moved[uid]
            last_moved = dict(self.last_moved)
        pods = self._pods(allocs)
        c = self.config.constraints(self.pacer.budget(now), now, last_moved)
        signature = (str(pool), tuple(sorted((uid, sp.nodes, sp.millicpu, sp.fixed) for uid, sp in pods.items())))
        due = self.pacer.due(now, signature, over_threshold(p.topology, pool, pods, c),
                             urgent(p.topology, pool, pods, c))
        if due is None or c.max_moves <= 0:
            return []
        self.pacer.planned(now, signature)
        self.counters.add("plans")
        causes = ", ".join(sorted(self._causes)) or ("started" if due == "start" else "spread over the threshold")
        self._causes.clear()
        groups = [tuple(g) for g in self.groups()] if self.groups is not None else []
        plan = plan_respread(p.topology, pool, pods, groups, c)
        if not plan:
            log.debug("re-spread: nothing may move", spread_cpus=cpu_spread(p.topology, pool, pods) / 1000,
                      trigger=causes)
            return []
        made = []
        for m in plan:
            if self._move(m, allocs, causes):
                made.append(m)
                self.pacer.moved(now, len(m.pods))
                with self._caches:
                    for uid in m.pods:
                        self.last_moved[uid] = now
        if made and self.apply is not None:
            self.apply()
        kept = self._check_applied(made, causes)
        self.last_moves = kept
        return kept

    def _pods(self, allocs: Dict[str, Any]) -> Dict[str, SpreadPod]:
        p = self.placement
        kstate = p.kubelet_state
        in_flight = set(p.moves_in_flight())
        out = {}
        for uid, a in allocs.items():
            fixed = ""
            if p.rule_pinned(a):
                fixed = "pinned by a placement rule"
            elif kstate.has_exclusive(uid):
                fixed = "has kubelet-exclusive CPUs"
            elif uid in in_flight:
                fixed = "a move of this pod is still being applied"
            elif not a.containers:
                fixed = "no running container"
            elif a.home != p.topology.cpus_of(a.nodes):
                fixed = "pinned to a CPU list"
            out[uid] = SpreadPod(nodes=tuple(a.nodes), millicpu=a.demand_millicpu(), fixed=fixed)
        return out

    def _note_changes(self, pool: Any, uids: Set[str]) -> None:
        if self._seen is not None:
            old_pool, old_uids = self._seen
            if pool != old_pool and old_pool.issubset(pool):
                self._causes.add(f"shared pool grew ({old_pool} -> {pool})")
            elif pool != old_pool:
                self._causes.add(f"shared pool changed ({old_pool} -> {pool})")
            gone = len(old_uids - uids)
            if gone:
                self._causes.add(f"{gone} pod{'s' if gone > 1 else ''} gone")
        self._seen = (pool, uids)

    def _move(self, m: RespreadMove, allocs: Dict[str, Any], causes: str) -> bool:
        """Make one planned move (every pod of its unit); a unit moved in part is moved back."""
        reason = f"{m.describe()} ({causes})"
        done: List[str] = []
        for uid in m.pods:
            a = allocs[uid]
            fields = dict(pod=a.ref, pod_uid=uid, from_node=m.from_node, to_node=m.to_node,
                          millicpu=a.demand_millicpu(), stage=m.stage, trigger=causes, why=m.describe())
            if not self.placement.move(uid, (m.to_node,), reason, source=SOURCE):
                self.counters.add("moves_refused")
                log.info("re-spread move refused by the placement service", **fields)
                if done and self.apply is not None:
                    self.apply()   # (a move is undone once it is applied)
                self._undo(done, m.from_node, "the rest of its affinity group could not move")
                return False
            done.append(uid)
            log.info("re-spread move", **fields)
        return True

    def _check_applied(self, made: Iterable[RespreadMove], causes: str) -> List[RespreadMove]:
        after = {a.pod_uid: a for a in self.placement.allocations()}
        kept = []
        for m in made:
            there = [uid for uid in m.pods if uid in after and tuple(after[uid].nodes) == (m.to_node,)]
            if len(there) == len(m.pods):
                kept.append(m)
                self.counters.add("moves", len(m.pods))
                continue
            self.counters.add("moves_rolled_back", len(m.pods) - len(there))
            log.warning("re-spread move rolled back (its re-pin failed)", pods=list(m.pods),
                        to_node=m.to_node, back_to=m.from_node)
            self._undo(there, m.from_node, "part of its affinity group's move was rolled back")
            if there and self.apply is not None:
                self.apply()
        return kept

    def _undo(self, uids: Sequence[str], node: int, why: str) -> None:
        for uid in uids:
            if not self.placement.move(uid, (node,), f"re-spread undone: {why}", source=SOURCE):
                log.warning("re-spread could not move a pod back to its group", pod_uid=uid, to_node=node, why=why)

    # ------------------------------------------------------------------ PodStateHolder
    def held(self) -> PodKeys:
        with self._caches:
            return PodKeys.of(list(self.last_moved), (), ())

    def forget(self, gone: PodGone) -> None:
        with self._caches:
            for uid in gone.uids:
                self.last_moved.pop(uid, None)

    def structures(self) -> Dict[str, int]:
        with self._caches:
            return {"last_moved": len(self.last_moved)}

    # ------------------------------------------------------------------ controller
    def counts(self) -> Dict[str, int]:
        snap = self.counters.snapshot()
        return {k: snap.get(k, 0) for k in ("plans", "moves", "moves_refused", "moves_rolled_back")}
