"""Traffic affinity: which pods talk to each other, and which of them to move where.

Two pure pieces, no I/O:

- :class:`AffinityGraph` keeps a weight per pod pair, in bytes per second, smoothed with an
  exponentially weighted moving average (EWMA) of the rates an observer measures each
  sample. Pairs that are not seen decay and are forgotten. A pair is *affine* once its
  smoothed weight has stayed at or above a threshold for ``confirm_samples`` samples in a
  row (hysteresis: traffic that flaps around the threshold never qualifies). Affine pairs
  joined by a common pod form a group (:func:`affinity_groups`).
- :func:`plan_moves` turns (topology with distances, where every pod is and what it
  demands, the affine pairs, constraints) into a list of :class:`Move`\\ s that bring affine
  pods onto one NUMA node, or closer, following the seed's decision table (docs/numa.md,
  "Traffic affinity").

Capacity is in milli-CPUs, as in :mod:`.balance`. ``MoveConstraints.free`` is each node's
shared-pool capacity (exclusive CPUs are not in it) minus *every* allocation on the node,
the moving pods' own included: "node 0 has 16 free CPUs" while pod A (8 CPUs) runs there
means 16 CPUs beside A's. A pod that moves away gives its demand back to its old node for
the moves after it, so the moves are meant to be applied in list order.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Deque, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from anolisnuma.policies.numa.balance import node_capacity
from anolisnuma.policies.numa.cpuset import CpuSet
from anolisnuma.policies.numa.topology import LOCAL_DISTANCE, NumaTopology

Pair = Tuple[str, str]

KIND_JOIN = "join"          # one pod moves onto its partner's node
KIND_TOGETHER = "together"  # several pods of a group move onto one node
KIND_CLOSER = "closer"      # no node holds them together: one pod moves nearer its partner


def pair_key(a: str, b: str) -> Pair:
    """The canonical (sorted) form of an unordered pod pair."""
    return (a, b) if a <= b else (b, a)


# ---------------------------------------------------------------------------- the graph
@dataclass
class _Edge:
    weight: float = 0.0
    history: Deque[float] = field(default_factory=deque)


class AffinityGraph:
    """Pod-pair traffic weights in bytes per second, smoothed over samples.

    ``update(rates, elapsed)`` folds one sample in: for every pair, ``weight += alpha *
    (rate - weight)``, with ``rate = 0`` for known pairs the sample did not mention (so
    they decay). ``alpha`` is fixed when given; otherwise it follows from ``half_life``:
    ``1 - 0.5 ** (elapsed / half_life)`` (``elapsed`` and ``half_life`` in the same unit,
    seconds or samples), so a pair that stops talking loses half its weight every
    ``half_life``. A new pair starts from 0: one burst does not make it heavy. Pairs whose
    weight falls below ``forget_below`` and that were not seen are dropped.
    """

    def __init__(self, half_life: float = 30.0, alpha: Optional[float] = None, confirm_samples: int = 3,
                 forget_below: float = 1.0) -> None:
        if alpha is not None and not 0.0 < alpha <= 1.0:
            raise ValueError("alpha must be in (0, 1]")
        if not half_life > 0:
            raise ValueError("half_life must be positive")
        if confirm_samples < 1:
            raise ValueError("confirm_samples must be at least 1")
        self.half_life = float(half_life)
        self.alpha = alpha
        self.confirm_samples = int(confirm_samples)
        self.forget_below = float(forget_below)
        self._edges: Dict[Pair, _Edge] = {}

    def _alpha(self, elapsed: float) -> float:
        if self.alpha is not None:
            return self.alpha
        return 1.0 - 0.5 ** (elapsed / self.half_life)

    def update(self, rates: Mapping[Tuple[str, str], float], elapsed: float = 1.0) -> None:
        """Fold in one sample: bytes per second per pod pair over the last ``elapsed``.

        Both directions of a pair may be given ((a, b) and (b, a)); they are added. A pod
        paired with itself is ignored. Raises ValueError for a negative or non-finite rate
        or a non-positive ``elapsed``.
        """
        if not elapsed > 0 or not math.isfinite(elapsed):
            raise ValueError("elapsed must be a positive number")
        seen: Dict[Pair, float] = {}
        for (a, b), rate in rates.items():
            if not math.isfinite(rate) or rate < 0:
                raise ValueError(f"rate of {a}<->{b} must be a finite number >= 0, not {rate!r}")
            if a == b:
                continue
            key = pair_key(a, b)
            seen[key] = seen.get(key, 0.0) + float(rate)
        alpha = self._alpha(elapsed)
        for key in seen:
            if key not in self._edges:
                self._edges[key] = _Edge(history=deque(maxlen=self.confirm_samples))
        for key, edge in list(self._edges.items()):
            rate = seen.get(key, 0.0)
            edge.weight += alpha * (rate - edge.weight)
            edge.history.append(edge.weight)
            if key not in seen and edge.weight < self.forget_below:
                del self._edges[key]

    def forget_pod(self, pod: str) -> None:
        """Drop every pair of a pod that is gone."""
        for key in [k for k in self._edges if pod in k]:
            del self._edges[key]

    def weight(self, a: str, b: str) -> float:
        edge = self._edges.get(pair_key(a, b))
        return edge.weight if edge is not None else 0.0

    def weights(self) -> Dict[Pair, float]:
        """Every known pair's smoothed weight."""
        return {k: e.weight for k, e in self._edges.items()}

    def affine_pairs(self, threshold: float) -> Dict[Pair, float]:
        """Pairs whose smoothed weight was >= ``threshold`` in each of the last
        ``confirm_samples`` samples, heaviest first, with their current weight."""
        out = [(k, e.weight) for k, e in self._edges.items()
               if len(e.history) >= self.confirm_samples and min(e.history) >= threshold]
        out.sort(key=lambda kv: (-kv[1], kv[0]))
        return dict(out)

    def groups(self, threshold: float) -> List["AffinityGroup"]:
        """The affinity groups of :meth:`affine_pairs`."""
        return affinity_groups(self.affine_pairs(threshold))

    def __len__(self) -> int:
        return len(self._edges)


@dataclass(frozen=True)
class AffinityGroup:
    """Pods joined by affine pairs (a connected component of the affine graph)."""

    pods: Tuple[str, ...]
    pairs: Mapping[Pair, float]

    @property
    def weight(self) -> float:
        return sum(self.pairs.values())

    @property
    def heaviest(self) -> float:
        return max(self.pairs.values()) if self.pairs else 0.0


def affinity_groups(pairs: Mapping[Tuple[str, str], float]) -> List[AffinityGroup]:
    """Connected components of the pairs with a positive weight, heaviest pair first (then
    the heavier total, then the pods' names)."""
    clean = _clean_pairs(pairs)
    parent: Dict[str, str] = {}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in clean:
        parent.setdefault(a, a)
        parent.setdefault(b, b)
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    members: Dict[str, List[str]] = {}
    for pod in parent:
        members.setdefault(find(pod), []).append(pod)
    edges: Dict[str, Dict[Pair, float]] = {}
    for key, w in clean.items():
        edges.setdefault(find(key[0]), {})[key] = w
    groups = [AffinityGroup(pods=tuple(sorted(members[r])), pairs=edges[r]) for r in members]
    groups.sort(key=lambda g: (-g.heaviest, -g.weight, g.pods))
    return groups


def _clean_pairs(pairs: Mapping[Tuple[str, str], float]) -> Dict[Pair, float]:
    out: Dict[Pair, float] = {}
    for (a, b), w in pairs.items():
        if a == b or not (w > 0) or not math.isfinite(w):
            continue
        key = pair_key(a, b)
        out[key] = out.get(key, 0.0) + float(w)
    return out


# ---------------------------------------------------------------------------- distances
def pair_distance(topology: NumaTopology, nodes_a: Sequence[int], nodes_b: Sequence[int]) -> float:
    """The distance between two pods: the mean node distance over their nodes (10 when
    both sit on the same single node)."""
    if not nodes_a or not nodes_b:
        raise ValueError("a pod without nodes has no distance")
    dist = topology.distance
    total = sum(dist(a, b) for a in nodes_a for b in nodes_b)
    return total / (len(nodes_a) * len(nodes_b))


def cross_node_share(topology: NumaTopology, nodes_of: Mapping[str, Sequence[int]],
                     pairs: Mapping[Tuple[str, str], float]) -> float:
    """The share of affine traffic that crosses NUMA nodes, distance-weighted:
    ``sum(w * (d - 10) / (dmax - 10)) / sum(w)`` over the pairs whose pods are both in
    ``nodes_of``. 0 when every pair shares a node, 1 when every pair sits as far apart as
    the machine allows; 0 on a one-node machine or without traffic."""
    dmax = max(topology.distances.values(), default=LOCAL_DISTANCE)
    total = 0.0
    crossing = 0.0
    for (a, b), w in _clean_pairs(pairs).items():
        if a not in nodes_of or b not in nodes_of:
            continue
        total += w
        if dmax > LOCAL_DISTANCE:
            crossing += w * (pair_distance(topology, nodes_of[a], nodes_of[b]) - LOCAL_DISTANCE) / (
                dmax - LOCAL_DISTANCE)
    return crossing / total if total > 0 else 0.0


# ---------------------------------------------------------------------------- decisions
@dataclass(frozen=True)
class PodPlacement:
    """Where a pod is and what it demands.

    ``millicpu`` is its demand (as :mod:`.balance` counts it). A pod named by a placement
    rule (``rule_pinned``), a pod with kubelet-exclusive CPUs (``exclusive``) and a pod on
    several nodes never move; they still attract their partners.
    """

    nodes: Tuple[int, ...]
    millicpu: int = 0
    rule_pinned: bool = False
    exclusive: bool = False


@dataclass(frozen=True)
class MoveConstraints:
    """What bounds the moves of one interval.

    ``free``: milli-CPUs free per node in the shared pool (capacity minus every allocation,
    the pods' own included); a node that is missing has no room. ``max_moves``: pods moved
    per call. ``min_improvement``: a plan must remove at least this share of the
    distance-weighted traffic cost (``w * (d - 10)``) of the pairs its pods belong to.
    ``cooldown``: a pod moved at ``last_moved[pod]`` stays put until ``now - last_moved >=
    cooldown`` (same clock, seconds).
    """

    free: Mapping[int, int] = field(default_factory=dict)
    max_moves: int = 2
    min_improvement: float = 0.2
    cooldown: float = 300.0
    now: float = 0.0
    last_moved: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class MoveReason:
    """Why a pod moves: the pair that gains most from it, its weight, and the pair's
    distance before and after the plan the move belongs to."""

    pair: Pair
    bytes_per_second: float
    distance_before: float
    distance_after: float
    kind: str
    group: Tuple[str, ...] = ()


@dataclass(frozen=True)
class Move:
    """Re-pin ``pod`` from ``from_nodes`` to ``to_nodes``. Moves with the same ``plan``
    number belong together (e.g. A and B both to node 2)."""

    pod: str
    from_nodes: Tuple[int, ...]
    to_nodes: Tuple[int, ...]
    millicpu: int
    reason: MoveReason
    plan: int = 0

    def describe(self) -> str:
        r = self.reason
        text = (f"move {self.pod} ({self.millicpu / 1000:g} CPUs) from node {_nodes(self.from_nodes)} to node "
                f"{_nodes(self.to_nodes)}: {r.kind}, {r.pair[0]}<->{r.pair[1]} {r.bytes_per_second:.0f} B/s, "
                f"distance {r.distance_before:g} -> {r.distance_after:g}")
        if len(r.group) > 2:
            text += f" (group of {len(r.group)})"
        return text


def _nodes(nodes: Sequence[int]) -> str:
    return ",".join(str(n) for n in nodes)


def movable(pod: str, placement: PodPlacement, constraints: MoveConstraints) -> Optional[str]:
    """None when the pod may move; otherwise why not."""
    if placement.rule_pinned:
        return "pinned by a placement rule"
    if placement.exclusive:
        return "has kubelet-exclusive CPUs"
    if len(placement.nodes) != 1:
        return "spans several nodes"
    since = constraints.last_moved.get(pod)
    if since is not None and constraints.now - since < constraints.cooldown:
        return "cooling down after a move"
    return None


@dataclass
class _Plan:
    home: int
    movers: List[str]
    gain: float


_Distance = Callable[[Tuple[int, ...], Tuple[int, ...]], float]


def plan_moves(topology: NumaTopology, placements: Mapping[str, PodPlacement],
               affine_pairs: Mapping[Tuple[str, str], float],
               constraints: Optional[MoveConstraints] = None) -> List[Move]:
    """The moves that bring affine pods together this interval, to be applied in order.

    Groups are handled heaviest pair first. For a group, every node with room is a
    candidate home; its plan moves the group's movable pods onto it one by one (the pod
    whose move gains most first) while they fit, and the best prefix is kept. Gain is the
    drop in ``sum(w * (d - 10))`` over the group's pairs. The plan with the most gain wins;
    on equal gain the one that disturbs least: fewer pods, fewer CPUs, colder pods (less
    affine traffic), and, all else equal, the pair's first pod stays (the seed's table keeps
    A in place). A plan must gain at least ``min_improvement`` of its pods' pairs' cost and
    fit in the remaining ``max_moves``; every pod it moves ends nearer at least one
    partner. A group gets further plans while it gains. No pod moves twice in one call, and
    no node's free capacity goes below zero at any point of the list.
    """
    c = constraints if constraints is not None else MoveConstraints()
    # a pod without nodes (not placed yet) has no distance to anyone: leave it out
    where: Dict[str, Tuple[int, ...]] = {pod: tuple(p.nodes) for pod, p in placements.items() if p.nodes}
    demand = {pod: max(int(p.millicpu), 0) for pod, p in placements.items()}
    can_move: Set[str] = {pod for pod, p in placements.items() if pod in where and movable(pod, p, c) is None}
    free: Dict[int, int] = {n.id: int(c.free.get(n.id, 0)) for n in topology.nodes if n.has_cpus}
    pairs = {k: w for k, w in _clean_pairs(affine_pairs).items() if k[0] in where and k[1] in where}
    adjacency: Dict[str, Dict[str, float]] = {}
    for (a, b), w in pairs.items():
        adjacency.setdefault(a, {})[b] = w
        adjacency.setdefault(b, {})[a] = w
    heat = {pod: sum(nbrs.values()) for pod, nbrs in adjacency.items()}
    dist_cache: Dict[Tuple[Tuple[int, ...], Tuple[int, ...]], float] = {}

    def dist(x: Tuple[int, ...], y: Tuple[int, ...]) -> float:
        key = (x, y)
        d = dist_cache.get(key)
        if d is None:
            d = dist_cache[key] = pair_distance(topology, x, y)
        return d

    budget = max(int(c.max_moves), 0)
    moves: List[Move] = []
    plan_no = 0
    for group in affinity_groups(pairs):
        scale = group.heaviest
        # "the pair's first pod stays": later pods (by name) come first among equals.
        rank = {pod: i for i, pod in enumerate(sorted(group.pods, reverse=True))}
        while budget > 0:
            plan = _best_plan(group, where, demand, can_move, free, adjacency, heat, rank, dist, budget, scale,
                              c.min_improvement)
            if plan is None:
                break
            before = dict(where)
            for pod in plan.movers:
                for n in where[pod]:
                    free[n] = free.get(n, 0) + demand[pod]
                free[plan.home] -= demand[pod]
                where[pod] = (plan.home,)
                can_move.discard(pod)
            for pod in plan.movers:
                moves.append(Move(pod=pod, from_nodes=before[pod], to_nodes=(plan.home,), millicpu=demand[pod],
                                  reason=_reason(pod, plan, before, where, adjacency, dist, group), plan=plan_no))
            budget -= len(plan.movers)
            plan_no += 1
        if budget <= 0:
            break
    return moves


def _q(value: float, scale: float) -> float:
    """Gains rounded relative to the group's heaviest pair, so that sums taken in a
    different order compare equal."""
    return round(value / scale, 9) if scale > 0 else 0.0


def _best_plan(group: AffinityGroup, where: Dict[str, Tuple[int, ...]], demand: Mapping[str, int],
               can_move: Set[str], free: Mapping[int, int], adjacency: Mapping[str, Mapping[str, float]],
               heat: Mapping[str, float], rank: Mapping[str, int], dist: _Distance, budget: int,
               scale: float, min_improvement: float) -> Optional[_Plan]:
    """The best plan for one group, or None when no plan gains enough."""
    candidates = [p for p in group.pods if p in can_move]
    if not candidates:
        return None

    def cost_of(movers: Sequence[str]) -> float:
        touched = set(movers)
        return sum(w * (dist(where[a], where[b]) - LOCAL_DISTANCE)
                   for (a, b), w in group.pairs.items() if a in touched or b in touched)

    best: Optional[_Plan] = None
    best_key: Optional[tuple] = None
    for home in sorted(free):
        room = free[home]
        if room <= 0:     # full, overcommitted, or no shared CPU (all exclusive): never a target
            continue
        loc = {p: where[p] for p in group.pods}
        remaining = [p for p in candidates if loc[p] != (home,)]
        chosen: List[str] = []
        total = 0.0
        prefixes: List[Tuple[float, List[str]]] = []
        while remaining and len(chosen) < budget:
            options = []
            for p in remaining:
                if room <= 0 or demand[p] > room:
                    continue
                g = sum(w * (dist(loc[p], loc[v]) - dist((home,), loc[v])) for v, w in adjacency[p].items())
                options.append((-_q(g, scale), demand[p], heat[p], rank[p], p, g))
            if not options:
                break
            pick = min(options)
            p, g = pick[4], pick[5]
            loc[p] = (home,)
            room -= demand[p]
            remaining.remove(p)
            chosen.append(p)
            total += g
            if (_q(total, scale) > 0 and total >= min_improvement * cost_of(chosen)
                    and _every_mover_nearer(chosen, where, loc, adjacency, dist)):
                prefixes.append((total, list(chosen)))
        if not prefixes:
            continue
        gain, movers = max(prefixes, key=lambda t: (_q(t[0], scale), -len(t[1])))
        key = (-_q(gain, scale), len(movers), sum(demand[p] for p in movers), sum(heat[p] for p in movers),
               sorted(rank[p] for p in movers), home)
        if best_key is None or key < best_key:
            best_key = key
            best = _Plan(home=home, movers=movers, gain=gain)
    return best


def _every_mover_nearer(movers: Iterable[str], before: Mapping[str, Tuple[int, ...]],
                        after: Mapping[str, Tuple[int, ...]], adjacency: Mapping[str, Mapping[str, float]],
                        dist: _Distance) -> bool:
    for p in movers:
        if not any(dist(after[p], after[v]) < dist(before[p], before[v]) for v in adjacency[p]):
            return False
    return True


def _reason(pod: str, plan: _Plan, before: Mapping[str, Tuple[int, ...]], after: Mapping[str, Tuple[int, ...]],
            adjacency: Mapping[str, Mapping[str, float]], dist: _Distance, group: AffinityGroup) -> MoveReason:
    best = None
    for v, w in adjacency[pod].items():
        d0, d1 = dist(before[pod], before[v]), dist(after[pod], after[v])
        key = (w * (d0 - d1), w, v)
        if d1 < d0 and (best is None or key > best[0]):
            best = (key, v, w, d0, d1)
    assert best is not None   # _every_mover_nearer held for the plan
    _, partner, w, d0, d1 = best
    if d1 > LOCAL_DISTANCE:
        kind = KIND_CLOSER
    elif len(plan.movers) > 1:
        kind = KIND_TOGETHER
    else:
        kind = KIND_JOIN
    return MoveReason(pair=pair_key(pod, partner), bytes_per_second=w, distance_before=d0, distance_after=d1,
                      kind=kind, group=group.pods)


# ---------------------------------------------------------------------------- helpers
def free_millicpu(topology: NumaTopology, pool: CpuSet, placements: Mapping[str, PodPlacement],
                  other_load: Optional[Mapping[int, int]] = None) -> Dict[int, int]:
    """Free milli-CPUs per node: shared-pool capacity (exclusive CPUs are outside ``pool``)
    minus the pods' demands (a pod on several nodes counts in proportion to its pool CPUs
    there) minus ``other_load``. Negative when a node is overcommitted."""
    cap = node_capacity(topology, pool)
    free = {n: v - int((other_load or {}).get(n, 0)) for n, v in cap.items()}
    for p in placements.values():
        nodes = [n for n in p.nodes if n in cap]
        weights = [cap[n] for n in nodes]
        total = sum(weights)
        if not nodes:
            continue
        if total <= 0:
            weights, total = [1] * len(nodes), len(nodes)
        left = p.millicpu
        for i, n in enumerate(nodes):
            share = left if i == len(nodes) - 1 else p.millicpu * weights[i] // total
            free[n] -= share
            left -= share
    return free


def apply_moves(placements: Mapping[str, PodPlacement], moves: Iterable[Move]) -> Dict[str, PodPlacement]:
    """The placements after ``moves`` (a new mapping; the input is not changed)."""
    out = dict(placements)
    for m in moves:
        p = out[m.pod]
        out[m.pod] = PodPlacement(nodes=tuple(m.to_nodes), millicpu=p.millicpu, rule_pinned=p.rule_pinned,
                                  exclusive=p.exclusive)
    return out

