"""Hours of pod churn on one machine: balance at arrival vs balance + re-spread.

Used by ``scripts/simulate_numa.py`` (its "churn over time" table); the model:

- Pods arrive as a Poisson process (``--rate`` per hour) and live an exponential time (mean
  ``--life`` minutes). A share of them (``G_SHARE``) are Guaranteed pods that the kubelet's
  static CPU manager gives exclusive CPUs (2, 4 or 8), the lowest-numbered CPUs of the shared
  pool first, as it does on a machine without SMT; they leave the pool while they live. The
  others are the pods anolisnuma places: 1-8 CPUs, 15 % without resources.
- The scheduler admits a pod only while the requests of the live pods stay within ``ADMIT``
  of the machine's CPUs (the rest are scheduled elsewhere): the admitted timeline is the
  same for both policies.
- Both policies place with ``balance`` on the real ``Ledger``. A pod whose node lost every
  shared CPU to exclusive ones follows the pool (``balance`` near its old node), in both.
- Re-spread runs the daemon's decision and pacing (``plan_respread``, ``RespreadPacer``)
  with the default ``[numa.respread]`` values, at every arrival and departure and every
  ``SAMPLE_S`` seconds (the daemon checks every ``poll_interval_seconds``, 1 s); its moves
  are applied at once.
- The spread is sampled every ``SAMPLE_S`` seconds, as re-spread measures it
  (``cpu_spread``: the most free shared CPUs on a node minus the least on a node that
  carries demand) and raw (max - min free over every node with shared CPUs, an empty node
  included: the kubelet's exclusive CPUs alone can make that one large).
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from anolisnuma.policies.numa.balance import NoPlacement, Placement, PodRequest, balance, node_capacity
from anolisnuma.policies.numa.config import RespreadConfig
from anolisnuma.policies.numa.cpuset import CpuSet
from anolisnuma.policies.numa.ledger import Allocation, Ledger
from anolisnuma.policies.numa.respread import (
    RespreadPacer, SpreadPod, free_per_node, over_threshold, plan_respread, spread, urgent)
from anolisnuma.policies.numa.topology import NumaTopology

G_SHARE = 0.2            # of the arrivals: Guaranteed pods with exclusive CPUs
G_SIZES = (2, 4, 8)
MAX_POD = 8
NO_RESOURCES = 0.15
ADMIT = 0.85             # the scheduler's view: requests within 85 % of the machine
SAMPLE_S = 10.0


@dataclass(frozen=True)
class Arrival:
    at: float
    leaves: float
    pod: int
    cpus: int
    exclusive: bool


def timeline(total_cpus: int, hours: float, rate_per_hour: float, life_minutes: float,
             rng: random.Random) -> List[Arrival]:
    """The admitted arrivals, in time order (their departure times included)."""
    out: List[Arrival] = []
    live: List[Tuple[float, int]] = []   # (leaves, cpus) heap
    used = 0
    t = 0.0
    end = hours * 3600.0
    pod = 0
    while True:
        t += rng.expovariate(rate_per_hour / 3600.0)
        if t >= end:
            return out
        while live and live[0][0] <= t:
            used -= heapq.heappop(live)[1]
        exclusive = rng.random() < G_SHARE
        if exclusive:
            cpus = rng.choice(G_SIZES)
        else:
            cpus = 0 if rng.random() < NO_RESOURCES else rng.randint(1, MAX_POD)
        life = rng.expovariate(1.0 / (life_minutes * 60.0))
        if used + cpus > ADMIT * total_cpus:
            continue
        used += cpus
        heapq.heappush(live, (t + life, cpus))
        out.append(Arrival(t, t + life, pod, cpus, exclusive))
        pod += 1


@dataclass
class ChurnResult:
    spreads: List[float]          # CPUs, one per sample (as re-spread measures it)
    raw: List[float]              # CPUs, one per sample (max - min free over every node)
    managed: int                  # pods anolisnuma placed
    exclusive: int                # Guaranteed pods
    moves: int                    # re-spread moves (pods)
    followed: int                 # pods that followed the pool (both policies)
    plans: int
    stages: Dict[str, int]


class ChurnNode:
    """One machine under one policy."""

    def __init__(self, topo: NumaTopology, respread: Optional[RespreadConfig]) -> None:
        self.topo = topo
        self.ledger = Ledger(topo, topo.cpus)
        self.exclusive: Dict[int, CpuSet] = {}
        self.config = respread
        self.pacer = RespreadPacer(respread.interval_seconds, respread.max_moves_per_interval,
                                   respread.settle_seconds) if respread else None
        self.last_moved: Dict[str, float] = {}
        self.version = 0      # what the re-spread signature stands for: bumped at every change
        self.moves = 0
        self.followed = 0
        self.plans = 0
        self.stages: Dict[str, int] = {}

    # ------------------------------------------------------------------ the kubelet's calls
    def arrive(self, a: Arrival) -> None:
        self.version += 1
        if a.exclusive:
            mine = CpuSet(list(self.ledger.pool)[:a.cpus])
            self.exclusive[a.pod] = mine
            self._set_pool(self.ledger.pool - mine)
            return
        p = balance(self.topo, self.ledger.pool, self.ledger.loads(), PodRequest(a.cpus * 1000))
        self.ledger.add(Allocation(str(a.pod), "sim", f"pod{a.pod}", f"sb{a.pod}", p.nodes, p.home, p.mems,
                                   pod_millicpu=a.cpus * 1000))

    def leave(self, a: Arrival) -> None:
        self.version += 1
        if a.exclusive:
            self._set_pool(self.ledger.pool | self.exclusive.pop(a.pod))
        else:
            self.ledger.remove(str(a.pod))
            self.last_moved.pop(str(a.pod), None)

    def _set_pool(self, pool: CpuSet) -> None:
        self.ledger.set_pool(pool)
        for alloc in self.ledger:
            if alloc.home.isdisjoint(pool):
                # the kubelet's next update re-places it (PlacementService._follow_pool)
                request = PodRequest(alloc.demand_millicpu(), near=alloc.nodes)
                self.ledger.remove(alloc.pod_uid)
                try:
                    p = balance(self.topo, pool, self.ledger.loads(), request)
                except NoPlacement:
                    self.ledger.add(alloc)
                    continue
                self.ledger.add(alloc)
                self.ledger.move(alloc.pod_uid, p)
                self.followed += 1

    # ------------------------------------------------------------------ re-spread
    def respread(self, now: float) -> None:
        if self.pacer is None or self.config is None:
            return
        pods = {a.pod_uid: SpreadPod(a.nodes, a.demand_millicpu()) for a in self.ledger}
        c = self.config.constraints(self.pacer.budget(now), now, self.last_moved)
        pool = self.ledger.pool
        if self.pacer.due(now, self.version, over_threshold(self.topo, pool, pods, c),
                          urgent(self.topo, pool, pods, c)) is None:
            return
        if c.max_moves <= 0:
            return   # (due again at the next check, once the window has room)
        self.pacer.planned(now, self.version)
        self.plans += 1
        for m in plan_respread(self.topo, self.ledger.pool, pods, (), c):
            self.stages[m.stage] = self.stages.get(m.stage, 0) + len(m.pods)
            for uid in m.pods:
                home = self.topo.cpus_of([m.to_node])
                alloc = self.ledger.get(uid)
                assert alloc is not None
                self.ledger.move(uid, Placement((m.to_node,), home, home & self.ledger.pool, alloc.mems))
                self.last_moved[uid] = now
                self.moves += 1
            self.pacer.moved(now, len(m.pods))
            self.version += 1

    def spread_cpus(self) -> Tuple[float, float]:
        """(as re-spread measures it, raw), in CPUs."""
        pods = {a.pod_uid: SpreadPod(a.nodes, a.demand_millicpu()) for a in self.ledger}
        pool = self.ledger.pool
        free = free_per_node(self.topo, pool, pods)
        cap = node_capacity(self.topo, pool)
        return spread(free, {n: cap[n] - v for n, v in free.items()}) / 1000, spread(free) / 1000


def run(topo: NumaTopology, arrivals: Sequence[Arrival], hours: float,
        respread: Optional[RespreadConfig]) -> ChurnResult:
    node = ChurnNode(topo, respread)
    events: List[Tuple[float, int, int]] = []   # (time, kind, index): 0 leave, 1 arrive, 2 sample
    for i, a in enumerate(arrivals):
        events.append((a.at, 1, i))
        if a.leaves < hours * 3600.0:
            events.append((a.leaves, 0, i))
    k = 1
    while k * SAMPLE_S < hours * 3600.0:
        events.append((k * SAMPLE_S, 2, k))
        k += 1
    events.sort()
    spreads: List[float] = []
    raw: List[float] = []
    for t, kind, i in events:
        if kind == 1:
            node.arrive(arrivals[i])
        elif kind == 0:
            node.leave(arrivals[i])
        node.respread(t)
        if kind == 2:
            measured, whole = node.spread_cpus()
            spreads.append(measured)
            raw.append(whole)
    return ChurnResult(spreads=spreads, raw=raw, managed=sum(1 for a in arrivals if not a.exclusive),
                       exclusive=sum(1 for a in arrivals if a.exclusive), moves=node.moves,
                       followed=node.followed, plans=node.plans, stages=node.stages)


# ---------------------------------------------------------------------------- the table
SCENARIOS = (("long-lived", 15.0, 120.0), ("fast churn", 60.0, 30.0))   # (name, arrivals/h, mean life min)


def pct(values: Sequence[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))] if s else float("nan")


def pod_sizes(arrivals: Sequence[Arrival]) -> Tuple[float, float, float]:
    """(median, p95, max) CPUs requested by the pods anolisnuma places (those without
    resources count as 0): what "one pod's CPUs" is in this workload."""
    sizes = [float(a.cpus) for a in arrivals if not a.exclusive]
    return pct(sizes, .5), pct(sizes, .95), max(sizes, default=0.0)


def churn_table(topo: NumaTopology, name: str, hours: float, seed: int) -> Dict[str, bool]:
    """Print the churn-over-time table; per scenario, whether re-spread with the defaults
    meets both targets (spread <= one pod, MAX_POD CPUs, at p95; <= 0.2 moves per pod)."""
    import dataclasses

    defaults = RespreadConfig()
    policies: List[Tuple[str, Optional[RespreadConfig]]] = [
        ("balance at arrival", None), ("balance + re-spread", defaults),
        ("  ... settle_seconds = 10", dataclasses.replace(defaults, settle_seconds=10.0))]
    print(f"churn over time: {name}, {hours:g} h (seed {seed}); {int(G_SHARE * 100)}% of arrivals Guaranteed with "
          f"exclusive CPUs {'/'.join(map(str, G_SIZES))}, the others 1-{MAX_POD} CPUs ({int(NO_RESOURCES * 100)}% "
          f"without resources), admitted while requests <= {int(ADMIT * 100)}% of the CPUs; re-spread: threshold "
          f"{defaults.threshold_cpus:g} CPUs, settle {defaults.settle_seconds:g} s, <= {defaults.max_moves_per_interval} "
          f"moves per {defaults.interval_seconds:g} s, cool-down {defaults.cooldown_seconds:g} s, demand-free pods "
          f"moved off nodes with < {defaults.idle_share_cpus:g} free CPU each")
    header = (f"{'scenario':<30} {'policy':<26} {'pods':>8} {'spread p50/p95/max':>19} {'>8 CPUs':>8} {'raw p95':>8} "
              f"{'moves':>6} {'per pod':>8} {'(count)':>8} {'followed':>8}")
    print(header)
    print("-" * len(header))
    ok: Dict[str, bool] = {}
    sizes = []
    for label, rate, life in SCENARIOS:
        arrivals = timeline(len(topo.cpus), hours, rate, life, random.Random(seed))
        sizes.append((label, pod_sizes(arrivals)))
        first = True
        for policy, cfg in policies:
            r = run(topo, arrivals, hours, cfg)
            per_pod = r.moves / max(r.managed, 1)
            over = sum(1 for v in r.spreads if v > MAX_POD) / max(len(r.spreads), 1)
            scen = f"{label} ({rate:g}/h, {life:g} min)" if first else ""
            pods = f"{r.managed}+{r.exclusive}" if first else ""
            first = False
            print(f"{scen:<30} {policy:<26} {pods:>8} {pct(r.spreads, .5):>7.0f}/{pct(r.spreads, .95):.0f}/"
                  f"{max(r.spreads):<4.0f}   {over * 100:>6.1f}% {pct(r.raw, .95):>7.0f} {r.moves:>6} {per_pod:>8.2f} "
                  f"{r.stages.get('count', 0):>8} {r.followed:>8}")
            if cfg is defaults:
                ok[label] = pct(r.spreads, .95) <= MAX_POD and per_pod <= 0.2
    print("one pod's CPUs (requests of the placed pods, median / p95 / max): "
          + "; ".join(f"{label} {m:g} / {p:g} / {x:g}" for label, (m, p, x) in sizes))
    return ok
