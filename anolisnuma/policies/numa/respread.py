"""Re-spread: which running pods to move so that the NUMA nodes are balanced again.

Balance placement (:mod:`.balance`) decides when a pod arrives. Departures, and the kubelet
taking exclusive CPUs and giving them back, change the nodes' free capacity afterwards: a
node can end up full while another idles, until arrivals happen to fill the gap.
:func:`plan_respread` turns (topology, shared pool, where every pod is, the affinity groups,
constraints) into the few moves that bring the nodes back within a threshold.

The measure is the one balance equalizes: a node's **free** milli-CPUs, its shared-pool
capacity (1000 per CPU; exclusive CPUs are not in the pool) minus the demands of the pods
on it. The **spread** is the most free on any node with shared CPUs minus the least free on
a node that carries some demand: a node with nothing on it is as free as it can be, even
when the kubelet's exclusive CPUs left it little (no move can help there, and none is made
for it). Pods that demand nothing (no request, no limit) do not change it. The second stage
spreads them by their number per node, but only off a *crowded* node: one where they have
less than ``idle_share_millicpu`` of its free CPUs each (balance places such a pod on the
freest node, so two of them on one node with CPUs to spare is what balance chose, not a
wrong to undo; two of them sharing one CPU while another node idles is).

Every move takes a unit of demand ``d`` from a node ``a`` to a node ``b`` with
``free[a] < free[b]`` and ``0 < d < free[b] - free[a]``: both nodes end within
``[free[a], free[b]]``, so the spread never grows and the sum of squared free values
strictly falls (the plan always ends). Of the moves allowed, the one leaving the smallest
spread wins, then the smallest sum of squares (the move closest to halving the gap), then
fewer pods, then the nearer target, then names and ids: the plan is deterministic. Moves
stop as soon as the spread is within the threshold (disturbing as few pods as possible),
when the move cap is spent, or when no move helps.

What never moves (it still counts as load): a pod a placement rule pins, a pod with
kubelet-exclusive CPUs, a pod on several nodes or on an explicit CPU list, a pod cooling
down after a move, and whatever the caller marks ``fixed`` (a move in flight, no
container). An affinity group (pods that talk, :mod:`.affinity`) moves as one unit when all
of it sits on one node and all of it may move; otherwise none of it moves. Nothing here
does I/O; the same functions drive the controller (``reconcile/respread.py``), the tests
and the simulator (``scripts/simulate_numa.py``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Deque, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from anolisnuma.policies.numa.balance import node_capacity
from anolisnuma.policies.numa.cpuset import CpuSet
from anolisnuma.policies.numa.topology import NumaTopology

STAGE_CPU = "cpu"     # pods with a demand, on free milli-CPUs
STAGE_COUNT = "count"  # pods without one, on their number per node


@dataclass(frozen=True)
class SpreadPod:
    """Where a pod is and what it demands, as re-spread sees it. ``fixed`` says why it never
    moves ("" = it may, unless it is cooling down or in an affinity group that cannot)."""

    nodes: Tuple[int, ...]
    millicpu: int = 0
    fixed: str = ""


@dataclass(frozen=True)
class RespreadConstraints:
    """What bounds one plan.

    ``threshold_millicpu``: the spread of free milli-CPUs that is tolerated (moves are made
    only while the spread exceeds it, and stop once it does not). ``pods_threshold``: the
    same for the count of demand-free pods per node (at least 2: one pod more on a node is
    as even as whole pods go). ``idle_share_millicpu``: demand-free pods move only off a
    node where they have less than this of its free milli-CPUs each (see
    :func:`crowded`). ``max_moves``: pods moved by the plan, at most (a group of three
    costs three). ``cooldown``: a pod moved at ``last_moved[pod]`` stays put until
    ``now - last_moved >= cooldown`` (same clock, seconds). ``urgent_millicpu``: a CPU
    spread above this is not left to settle (:class:`RespreadPacer`; 0 = never urgent).
    """

    threshold_millicpu: int = 4000
    pods_threshold: int = 2
    idle_share_millicpu: int = 1000
    urgent_millicpu: int = 0
    max_moves: int = 2
    cooldown: float = 600.0
    now: float = 0.0
    last_moved: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class RespreadMove:
    """Move ``pods`` (one pod, or an affinity group that stays together) from node
    ``from_node`` to ``to_node``; ``spread_before``/``spread_after`` are the spread of the
    stage's measure (milli-CPUs, or demand-free pods) around this move."""

    pods: Tuple[str, ...]
    from_node: int
    to_node: int
    millicpu: int
    stage: str
    spread_before: int
    spread_after: int
    free_from: int     # the stage's free value of the two nodes before the move
    free_to: int

    def describe(self) -> str:
        who = self.pods[0] if len(self.pods) == 1 else f"affinity group {','.join(self.pods)}"
        if self.stage == STAGE_CPU:
            return (f"re-spread {who} ({self.millicpu / 1000:g} CPUs) from node {self.from_node} "
                    f"({self.free_from / 1000:g} CPUs free) to node {self.to_node} ({self.free_to / 1000:g} free): "
                    f"spread {self.spread_before / 1000:g} -> {self.spread_after / 1000:g} CPUs")
        return (f"re-spread {who} (no CPU demand) from node {self.from_node} ({-self.free_from} such pods) "
                f"to node {self.to_node} ({-self.free_to}): count spread {self.spread_before} -> {self.spread_after}")


# ---------------------------------------------------------------------------- measures
def free_per_node(topology: NumaTopology, pool: CpuSet, pods: Mapping[str, SpreadPod]) -> Dict[int, int]:
    """Free milli-CPUs of each node with shared CPUs: capacity minus the demands placed on
    it (a pod on several nodes counts on each in proportion to its capacity there, as the
    ledger counts it). Negative when overcommitted (e.g. the pool shrank under its pods)."""
    cap = node_capacity(topology, pool)
    free = dict(cap)
    for p in pods.values():
        _charge(free, cap, p.nodes, p.millicpu)
    return {n: v for n, v in free.items() if cap[n] > 0}


def _charge(free: Dict[int, int], cap: Mapping[int, int], nodes: Sequence[int], millicpu: int) -> None:
    nodes = [n for n in nodes if n in cap]
    if not nodes or millicpu <= 0:
        return
    weights = [cap[n] for n in nodes]
    total = sum(weights)
    if total <= 0:
        weights, total = [1] * len(nodes), len(nodes)
    left = millicpu
    for i, n in enumerate(nodes):
        share = left if i == len(nodes) - 1 else millicpu * weights[i] // total
        free[n] -= share
        left -= share


def spread(values: Mapping[int, int], loaded: Optional[Mapping[int, int]] = None) -> int:
    """max - min of per-node values (0 with fewer than two nodes). With ``loaded`` (demand
    per node), the min is taken over the nodes with a demand only (0 when there is none)."""
    if len(values) < 2:
        return 0
    if loaded is None:
        return max(values.values()) - min(values.values())
    low = [v for n, v in values.items() if loaded.get(n, 0) > 0]
    return max(max(values.values()) - min(low), 0) if low else 0


def load_per_node(topology: NumaTopology, pool: CpuSet, pods: Mapping[str, SpreadPod]) -> Dict[int, int]:
    """Milli-CPUs demanded on each node with shared CPUs (capacity minus free)."""
    cap = node_capacity(topology, pool)
    return {n: cap[n] - v for n, v in free_per_node(topology, pool, pods).items()}


def cpu_spread(topology: NumaTopology, pool: CpuSet, pods: Mapping[str, SpreadPod]) -> int:
    """The spread re-spread acts on, in milli-CPUs (see the module's docstring)."""
    cap = node_capacity(topology, pool)
    free = free_per_node(topology, pool, pods)
    return spread(free, {n: cap[n] - v for n, v in free.items()})


def idle_pods_per_node(topology: NumaTopology, pool: CpuSet, pods: Mapping[str, SpreadPod]) -> Dict[int, int]:
    """Demand-free pods on each single node with shared CPUs."""
    cap = node_capacity(topology, pool)
    out = {n: 0 for n, c in cap.items() if c > 0}
    for p in pods.values():
        if p.millicpu <= 0 and len(p.nodes) == 1 and p.nodes[0] in out:
            out[p.nodes[0]] += 1
    return out


def crowded(free: int, idle: int, idle_share_millicpu: int) -> bool:
    """Whether ``idle`` demand-free pods on a node with ``free`` milli-CPUs free have less
    than ``idle_share_millicpu`` each (an overcommitted node, ``free < 0``, is crowded for
    any of them)."""
    return idle > 0 and free < idle * max(int(idle_share_millicpu), 0)


def over_threshold(topology: NumaTopology, pool: CpuSet, pods: Mapping[str, SpreadPod],
                   constraints: RespreadConstraints) -> bool:
    """Whether the nodes are out of balance by the constraints' thresholds (the CPU spread
    exceeds ``threshold_millicpu``, or the demand-free pods' count spread reaches
    ``pods_threshold`` with a crowded node among the fuller ones): what the pacer's settle
    clock runs on."""
    cap = node_capacity(topology, pool)
    free = free_per_node(topology, pool, pods)
    if spread(free, {n: cap[n] - v for n, v in free.items()}) > constraints.threshold_millicpu:
        return True
    return _count_over(free, idle_pods_per_node(topology, pool, pods), constraints)


def urgent(topology: NumaTopology, pool: CpuSet, pods: Mapping[str, SpreadPod],
           constraints: RespreadConstraints) -> bool:
    """Whether the CPU spread exceeds ``urgent_millicpu`` (when set): too wide to wait for
    arrivals to fill it (the pacer skips the settle time)."""
    u = int(constraints.urgent_millicpu)
    return u > 0 and cpu_spread(topology, pool, pods) > max(u, constraints.threshold_millicpu)


def _count_over(free: Mapping[int, int], counts: Mapping[int, int], c: RespreadConstraints) -> bool:
    """Some crowded node has ``pods_threshold`` demand-free pods more than another node."""
    least = min(counts.values(), default=0)
    need = max(int(c.pods_threshold), 2)
    return any(k - least >= need and crowded(free.get(n, 0), k, c.idle_share_millicpu) for n, k in counts.items())


# ---------------------------------------------------------------------------- units
@dataclass
class _Unit:
    pods: Tuple[str, ...]
    node: int
    millicpu: int


def why_fixed(pod: str, p: SpreadPod, constraints: RespreadConstraints) -> Optional[str]:
    """None when the pod may move on its own account; otherwise why not."""
    if p.fixed:
        return p.fixed
    if len(p.nodes) != 1:
        return "spans several nodes"
    since = constraints.last_moved.get(pod)
    if since is not None and constraints.now - since < constraints.cooldown:
        return "cooling down after a move"
    return None


def movable_units(topology: NumaTopology, pool: CpuSet, pods: Mapping[str, SpreadPod],
                  groups: Iterable[Iterable[str]], constraints: RespreadConstraints) -> List[_Unit]:
    """The pods that may move, as units: each affinity group whose pods all sit on one node
    with shared CPUs and may all move is one unit; the pods of any other group do not move;
    every other movable pod is a unit of its own. Sorted by pod names."""
    cap = node_capacity(topology, pool)
    parent: Dict[str, str] = {}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for g in groups:   # (overlapping groups are merged: a pod belongs to one unit)
        members = [p for p in g if p in pods]
        for p in members:
            parent.setdefault(p, p)
        for p in members[1:]:
            ra, rb = find(members[0]), find(p)
            if ra != rb:
                parent[max(ra, rb)] = min(ra, rb)
    grouped: Dict[str, List[str]] = {}
    for p in parent:
        grouped.setdefault(find(p), []).append(p)
    units: List[_Unit] = []
    for pod in sorted(pods):
        if pod in parent:
            continue
        p = pods[pod]
        if why_fixed(pod, p, constraints) is None and cap.get(p.nodes[0], 0) > 0:
            units.append(_Unit((pod,), p.nodes[0], max(int(p.millicpu), 0)))
    for members in grouped.values():
        members.sort()
        nodes = {pods[m].nodes for m in members}
        if len(nodes) != 1 or any(why_fixed(m, pods[m], constraints) is not None for m in members):
            continue
        node = next(iter(nodes))[0]
        if cap.get(node, 0) > 0:
            units.append(_Unit(tuple(members), node, sum(max(int(pods[m].millicpu), 0) for m in members)))
    units.sort(key=lambda u: u.pods)
    return units


# ---------------------------------------------------------------------------- the plan
def plan_respread(topology: NumaTopology, pool: CpuSet, pods: Mapping[str, SpreadPod],
                  groups: Iterable[Iterable[str]] = (),
                  constraints: Optional[RespreadConstraints] = None) -> List[RespreadMove]:
    """The moves that bring the nodes back within the thresholds, to be applied in order.

    First the CPU stage (units with a demand, on free milli-CPUs, while the spread exceeds
    ``threshold_millicpu``), then the count stage (demand-free units, on their number per
    node, while that spread is at least ``pods_threshold``, and only off a crowded node
    onto one where the pod gets at least as many free CPUs; they change no node's free
    CPUs). A target must keep room for the unit (free >= its demand, at least 1 milli-CPU),
    as ``PlacementService.move`` requires. No unit moves twice in one plan, and the plan
    moves at most ``max_moves`` pods.
    """
    c = constraints if constraints is not None else RespreadConstraints()
    free = free_per_node(topology, pool, pods)
    load = load_per_node(topology, pool, pods)
    if len(free) < 2:
        return []
    units = movable_units(topology, pool, pods, groups, c)
    budget = max(int(c.max_moves), 0)
    moves: List[RespreadMove] = []
    moved: set = set()

    cpu_units = [u for u in units if u.millicpu > 0]
    budget = _stage(topology, STAGE_CPU, free, free, load, cpu_units, lambda u: u.millicpu,
                    c.threshold_millicpu, budget, moved, moves)
    if budget > 0:
        counts = idle_pods_per_node(topology, pool, apply_respread(pods, moves))
        if not _count_over(free, counts, c):
            return moves
        # "free" for the count stage: minus the count, so that emptier is larger as for CPUs
        neg = {n: -v for n, v in counts.items()}
        share = c.idle_share_millicpu

        def allowed(a: int, b: int, w: int) -> bool:
            # off a crowded node, onto one where each of them gets at least as much
            ka, kb = -neg[a], -neg[b]
            return crowded(free[a], ka, share) and free[b] * ka >= free[a] * (kb + w)

        idle_units = [u for u in units if u.millicpu <= 0]
        _stage(topology, STAGE_COUNT, neg, free, None, idle_units, lambda u: len(u.pods),
               max(int(c.pods_threshold), 2) - 1, budget, moved, moves, allowed)
    return moves


def _stage(topology: NumaTopology, stage: str, value: Dict[int, int], free_cpu: Dict[int, int],
           load: Optional[Dict[int, int]], units: List[_Unit], weight_of: Any, threshold: int, budget: int,
           moved: set, moves: List[RespreadMove], allowed: Any = None) -> int:
    """Greedy moves on ``value`` (larger = emptier) while its spread (over ``load``'s
    loaded nodes, when given) exceeds ``threshold``; ``value``, ``free_cpu`` (for the room
    check) and ``load`` are updated in place; ``allowed(a, b, weight)``, when given, may
    refuse a move. Returns the budget left."""
    nodes = sorted(value)
    while budget > 0:
        now = spread(value, load)
        if now <= threshold:
            break
        sumsq = sum(v * v for v in value.values())
        best_key: Optional[tuple] = None
        best: Optional[Tuple[_Unit, int, int]] = None
        for u in units:
            if u.pods in moved or len(u.pods) > budget:
                continue
            w = weight_of(u)
            a = u.node
            if w <= 0 or a not in value:
                continue
            for b in nodes:
                gap = value[b] - value[a]
                if b == a or w >= gap or free_cpu[b] < max(u.millicpu, 1):
                    continue
                if allowed is not None and not allowed(a, b, w):
                    continue
                after = dict(value)
                after[a] += w
                after[b] -= w
                after_load = None
                if load is not None:
                    after_load = dict(load)
                    after_load[a] -= w
                    after_load[b] += w
                new_spread = spread(after, after_load)
                new_sumsq = sumsq + 2 * w * (w - gap)
                key = (new_spread, new_sumsq, len(u.pods), topology.distance(a, b), u.pods, b)
                if best_key is None or key < best_key:
                    best_key, best = key, (u, b, new_spread)
        if best is None:
            break
        u, b, after_spread = best
        a, w = u.node, weight_of(u)
        moves.append(RespreadMove(pods=u.pods, from_node=a, to_node=b, millicpu=u.millicpu, stage=stage,
                                  spread_before=now, spread_after=after_spread, free_from=value[a],
                                  free_to=value[b]))
        value[a] += w
        value[b] -= w
        if load is not None:
            load[a] -= w
            load[b] += w
        if value is not free_cpu:
            free_cpu[a] += u.millicpu
            free_cpu[b] -= u.millicpu
        moved.add(u.pods)
        budget -= len(u.pods)
    return budget


def apply_respread(pods: Mapping[str, SpreadPod], moves: Iterable[RespreadMove]) -> Dict[str, SpreadPod]:
    """The pods after ``moves`` (a new mapping; the input is not changed)."""
    out = dict(pods)
    for m in moves:
        for pod in m.pods:
            p = out[pod]
            out[pod] = SpreadPod(nodes=(m.to_node,), millicpu=p.millicpu, fixed=p.fixed)
    return out


# ---------------------------------------------------------------------------- pacing
class RespreadPacer:
    """When to plan and how many pods may still move (pure; the caller gives the clock).

    A plan is due once the spread has stayed over the threshold for ``settle`` seconds (the
    caller says at every check whether it is over; arrivals often fill a gap a departure
    left, and then nothing needs to move), at once while it is ``urgent`` (wider than one
    arrival is likely to fill: waiting would keep the node unbalanced for nothing), and then when what the plan depends on changed
    since the last plan (``signature``: the pool, the pods, their nodes and demands) or
    ``interval`` seconds passed (cool-downs end, groups change). At most ``max_moves`` pods
    move within any ``interval`` seconds (a sliding window).
    """

    def __init__(self, interval: float, max_moves: int, settle: float = 0.0) -> None:
        self.interval = float(interval)
        self.max_moves = int(max_moves)
        self.settle = float(settle)
        self._last_plan: Optional[float] = None
        self._signature: Any = None
        self._over_since: Optional[float] = None
        self._moves: Deque[float] = deque()

    def due(self, now: float, signature: Any, over: bool = True, urgent: bool = False) -> Optional[str]:
        """Why a plan is due now ("start", "changed", "periodic"), or None. ``over``: the
        spread exceeds the threshold now; ``urgent``: by so much that the settle time is
        skipped."""
        if not over:
            self._over_since = None
            return None
        if self._over_since is None:
            self._over_since = now
        if now - self._over_since < self.settle and not urgent:
            return None
        if self._last_plan is None:
            return "start"
        if signature != self._signature:
            return "changed"
        if now - self._last_plan >= self.interval:
            return "periodic"
        return None

    def over_for(self, now: float) -> float:
        """Seconds the spread has been over the threshold (0 when it is not)."""
        return 0.0 if self._over_since is None else now - self._over_since

    def planned(self, now: float, signature: Any) -> None:
        self._last_plan = now
        self._signature = signature

    def budget(self, now: float) -> int:
        """Pods that may still move now."""
        while self._moves and now - self._moves[0] >= self.interval:
            self._moves.popleft()
        return max(self.max_moves - len(self._moves), 0)

    def moved(self, now: float, pods: int = 1) -> None:
        for _ in range(pods):
            self._moves.append(now)
