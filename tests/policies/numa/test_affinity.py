"""Traffic affinity as pure functions: the pod graph (EWMA, hysteresis, groups) and the
re-pinning decisions (topology, placements, affine pairs, constraints) -> moves."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from anolisnuma.policies.numa.affinity import (
    KIND_CLOSER, KIND_JOIN, KIND_TOGETHER, AffinityGraph, MoveConstraints, PodPlacement, affinity_groups,
    apply_moves, cross_node_share, free_millicpu, movable, pair_distance, pair_key, plan_moves)
from anolisnuma.policies.numa.cpuset import CpuSet
from anolisnuma.policies.numa.topology import NumaTopology
from anolisnuma.testing import fake_sysfs as F

CPU = 1000          # milli-CPUs
MB = 1_000_000      # bytes per second
NODE_CPUS = {0: "0-31", 1: "32-63", 2: "64-95", 3: "96-127"}

# The seed's machine as its table describes it: 4 nodes x 32 CPUs, d(0,1) = 16, d(0,3) = 32,
# and node 2 "next to A by distance". Two ways to be that machine: a ring 0-1-3-2-0 (node 2 as
# near A as it is to B), and a machine where node 2 is nearer A (25) than B (32).
SEED_RING = NumaTopology.build(NODE_CPUS, [[10, 16, 16, 32], [16, 10, 32, 16], [16, 32, 10, 16], [32, 16, 16, 10]])
SEED_NEAR_A = NumaTopology.build(NODE_CPUS, [[10, 16, 25, 32], [16, 10, 32, 25], [25, 32, 10, 32], [32, 25, 32, 10]])
KUNPENG = NumaTopology.build(F.kunpeng920().node_cpus, F.kunpeng920().distances)

A_AND_B = {"A": PodPlacement(nodes=(0,), millicpu=8 * CPU), "B": PodPlacement(nodes=(3,), millicpu=8 * CPU)}
AB = {("A", "B"): 50 * MB}


def free(**cpus):
    """free(n0=16, n2=10): free CPUs per node (beside every pod already there); others 0."""
    return {int(k[1:]): v * CPU for k, v in cpus.items()}


def plan(topology, free_cpus, placements=A_AND_B, pairs=AB, **kw):
    return plan_moves(topology, placements, pairs, MoveConstraints(free=free_cpus, **kw))


def summary(moves):
    return [(m.pod, m.from_nodes, m.to_nodes) for m in moves]


# ----------------------------------------------------------------------------- the seed's table
SEED_TABLE = [
    # situation                      action
    (free(n0=16),                    [("B", (3,), (0,))]),                       # move B to node 0
    (free(n3=16),                    [("A", (0,), (3,))]),                       # move A to node 3
    (free(n1=7, n2=16),              [("B", (3,), (2,)), ("A", (0,), (2,))]),    # move A and B to node 2
    (free(n1=7, n2=10),              [("B", (3,), (2,))]),                       # move B to node 2 (next to A)
]


@pytest.mark.parametrize("topology", [SEED_RING, SEED_NEAR_A], ids=["ring", "node2-near-A"])
@pytest.mark.parametrize("free_cpus,expected", SEED_TABLE, ids=["n0-16", "n3-16", "n1-7,n2-16", "n1-7,n2-10"])
def test_the_seeds_table_exactly(topology, free_cpus, expected):
    moves = plan(topology, free_cpus)
    assert summary(moves) == expected
    assert len({m.plan for m in moves}) == 1          # one decision, applied together


def test_the_seeds_table_reasons():
    join, = plan(SEED_RING, free(n0=16))
    assert join.reason.kind == KIND_JOIN and join.reason.pair == ("A", "B")
    assert (join.reason.distance_before, join.reason.distance_after) == (32, 10)
    assert join.reason.bytes_per_second == 50 * MB
    assert "move B (8 CPUs) from node 3 to node 0" in join.describe() and "32 -> 10" in join.describe()
    both = plan(SEED_RING, free(n1=7, n2=16))
    assert {m.reason.kind for m in both} == {KIND_TOGETHER}
    closer, = plan(SEED_RING, free(n1=7, n2=10))
    assert closer.reason.kind == KIND_CLOSER and closer.reason.distance_after == 16


def test_first_two_rows_hold_when_other_nodes_have_room_too():
    """Joining the partner (one move, distance 10) beats moving both, and beats a nearer node."""
    assert summary(plan(SEED_RING, free(n0=16, n1=32, n2=32))) == [("B", (3,), (0,))]
    assert summary(plan(SEED_RING, free(n3=16, n1=32, n2=32))) == [("A", (0,), (3,))]


def test_when_both_nodes_have_room_the_pairs_first_pod_stays():
    assert summary(plan(SEED_RING, free(n0=16, n3=16))) == [("B", (3,), (0,))]


def test_the_smaller_pod_is_the_one_that_moves():
    placements = {"A": PodPlacement((0,), 2 * CPU), "B": PodPlacement((3,), 8 * CPU)}
    assert summary(plan(SEED_RING, free(n0=16, n3=16), placements)) == [("A", (0,), (3,))]


def test_kunpeng_920_first_three_rows_as_the_table_fourth_moves_a_next_to_b():
    """On the Kunpeng 920 fixture node 2 is B's die neighbour (d(2,3) = 16) and 32 from A: the
    table's "next to A" does not hold there. Moving A to node 2 ends at 16, moving B at 32."""
    for free_cpus, expected in SEED_TABLE[:3]:
        if free_cpus == free(n1=7, n2=16):
            expected = [("A", (0,), (2,)), ("B", (3,), (2,))]   # same decision, other order
        assert summary(plan(KUNPENG, free_cpus)) == expected
    moves = plan(KUNPENG, free(n1=7, n2=10))
    assert summary(moves) == [("A", (0,), (2,))]
    assert (moves[0].reason.distance_before, moves[0].reason.distance_after) == (33, 16)


def test_kunpeng_when_a_cannot_move_b_does_not_move_for_one_unit_of_distance():
    """B to node 2 would take the pair from 33 to 32: below min_improvement."""
    placements = dict(A_AND_B, A=PodPlacement((0,), 8 * CPU, rule_pinned=True))
    assert plan(KUNPENG, free(n1=7, n2=10), placements) == []
    assert summary(plan(KUNPENG, free(n1=7, n2=10), placements, min_improvement=0.0)) == [("B", (3,), (2,))]


# ----------------------------------------------------------------------------- no room, pins
def test_no_room_anywhere_no_move():
    assert plan(SEED_RING, free()) == []
    assert plan(SEED_RING, free(n0=7, n1=7, n2=7, n3=7)) == []
    assert plan(SEED_RING, {0: -4 * CPU, 1: 0, 2: 0, 3: 0}) == []      # overcommitted nodes


def test_pods_already_together_do_not_move():
    placements = {"A": PodPlacement((2,), 8 * CPU), "B": PodPlacement((2,), 8 * CPU)}
    assert plan(SEED_RING, free(n0=32, n1=32, n3=32), placements) == []


def test_rule_pinned_pods_never_move_but_attract_their_partner():
    pinned_a = dict(A_AND_B, A=PodPlacement((0,), 8 * CPU, rule_pinned=True))
    assert plan(SEED_RING, free(n3=16), pinned_a) == []                   # row 2 would move A
    assert summary(plan(SEED_RING, free(n0=16), pinned_a)) == [("B", (3,), (0,))]
    pinned_b = dict(A_AND_B, B=PodPlacement((3,), 8 * CPU, rule_pinned=True))
    assert plan(SEED_RING, free(n0=16), pinned_b) == []                   # row 1 would move B
    # row 3 would move both; with B pinned, A goes next to B (node 3 itself is full)
    assert summary(plan(SEED_RING, free(n1=7, n2=16), pinned_b)) == [("A", (0,), (2,))]
    assert movable("A", pinned_a["A"], MoveConstraints()) == "pinned by a placement rule"


def test_pods_with_kubelet_exclusive_cpus_never_move():
    excl = dict(A_AND_B, B=PodPlacement((3,), 8 * CPU, exclusive=True))
    assert plan(SEED_RING, free(n0=16), excl) == []
    assert movable("B", excl["B"], MoveConstraints()) == "has kubelet-exclusive CPUs"


def test_a_node_whose_free_cpus_are_exclusive_is_not_a_target():
    """Node 0 has 16 CPUs nobody in the shared pool uses, but the kubelet gave them to a
    Guaranteed container: they are not in the pool, so node 0 has no room for B."""
    others = {0: 8 * CPU, 1: 32 * CPU, 2: 32 * CPU, 3: 24 * CPU}       # other pods' loads
    everything = SEED_RING.cpus
    room = free_millicpu(SEED_RING, everything, A_AND_B, others)
    assert room[0] == 16 * CPU
    assert summary(plan(SEED_RING, room)) == [("B", (3,), (0,))]
    pool = everything - CpuSet.parse("16-31")                            # exclusive to someone else
    room = free_millicpu(SEED_RING, pool, A_AND_B, others)
    assert room[0] == 0
    assert plan(SEED_RING, room) == []


def test_a_node_without_shared_cpus_takes_no_pod_even_without_resources():
    placements = {"A": PodPlacement((0,), 0), "B": PodPlacement((3,), 0)}
    pool = SEED_RING.cpus - SEED_RING.cpus_of([0])                       # node 0 all exclusive
    room = free_millicpu(SEED_RING, pool, placements)
    assert room[0] == 0
    moves = plan(SEED_RING, room, placements)
    assert summary(moves) == [("A", (0,), (3,))]                          # never B onto node 0


def test_a_pod_not_placed_yet_is_left_out():
    placements = dict(A_AND_B, C=PodPlacement(nodes=(), millicpu=CPU))
    pairs = {("A", "C"): 90 * MB, ("A", "B"): 50 * MB}
    assert summary(plan(SEED_RING, free(n0=16), placements, pairs)) == [("B", (3,), (0,))]


def test_pods_on_several_nodes_do_not_move():
    placements = {"A": PodPlacement((0,), 8 * CPU), "big": PodPlacement((2, 3), 48 * CPU)}
    pairs = {("A", "big"): 10 * MB}
    assert movable("big", placements["big"], MoveConstraints()) == "spans several nodes"
    moves = plan(SEED_RING, free(n2=16, n3=16), placements, pairs)
    assert [m.pod for m in moves] == ["A"]
    assert pair_distance(SEED_RING, (2,), (2, 3)) == 13.0


# ----------------------------------------------------------------------------- hysteresis, cool-down, cap
def test_flapping_traffic_never_becomes_affine_and_moves_nothing():
    g = AffinityGraph(alpha=0.5, confirm_samples=3)
    threshold = 10 * MB
    for i in range(40):
        g.update({("A", "B"): 20 * MB if i % 2 == 0 else 0.0})
        assert g.affine_pairs(threshold) == {}
        assert plan(SEED_RING, free(n0=16), pairs=g.affine_pairs(threshold)) == []
    # the smoothed weight keeps crossing the threshold both ways
    assert 0.5 * threshold < g.weight("A", "B") < 2 * threshold


def test_steady_traffic_is_affine_after_confirm_samples():
    g = AffinityGraph(alpha=0.5, confirm_samples=3)
    seen = []
    for _ in range(6):
        g.update({("A", "B"): 40 * MB})
        seen.append(bool(g.affine_pairs(10 * MB)))
    # weights 20, 30, 35, ... MB/s: over 10 MB/s from the first sample, confirmed at the third
    assert seen == [False, False, True, True, True, True]
    assert summary(plan(SEED_RING, free(n0=16), pairs=g.affine_pairs(10 * MB))) == [("B", (3,), (0,))]


def test_one_dip_under_the_threshold_restarts_the_confirmation():
    g = AffinityGraph(alpha=1.0, confirm_samples=3)
    for rate in (20, 20, 5, 20, 20):
        g.update({("A", "B"): rate * MB})
        assert g.affine_pairs(10 * MB) == {}
    g.update({("A", "B"): 20 * MB})
    assert g.affine_pairs(10 * MB) == {("A", "B"): 20 * MB}


def test_ewma_half_life_decay_and_forgetting():
    g = AffinityGraph(half_life=10.0, confirm_samples=1, forget_below=1.0)
    g.update({("B", "A"): 100.0, ("A", "B"): 100.0}, elapsed=10.0)   # both directions add up
    assert g.weight("A", "B") == pytest.approx(100.0)                   # half of 200 in one half-life
    g.update({}, elapsed=10.0)
    assert g.weight("A", "B") == pytest.approx(50.0)                    # not seen: decays
    g.update({}, elapsed=50.0)
    assert g.weight("A", "B") == pytest.approx(50.0 / 32)
    g.update({}, elapsed=10.0)                                          # 0.78 < forget_below
    assert len(g) == 0 and g.weights() == {}
    g.update({("A", "A"): 5.0, ("A", "C"): 0.0})
    assert g.weights() == {("A", "C"): 0.0}                             # self pairs ignored
    g.forget_pod("C")
    assert len(g) == 0


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_a_bad_rate_is_refused(bad):
    with pytest.raises(ValueError):
        AffinityGraph().update({("A", "B"): bad})


def test_graph_parameters_are_checked():
    for kw in ({"alpha": 0.0}, {"alpha": 1.5}, {"half_life": 0}, {"confirm_samples": 0}):
        with pytest.raises(ValueError):
            AffinityGraph(**kw)


def test_cooldown_keeps_a_pod_that_just_moved_in_place():
    recent = {"B": 1000.0}
    assert plan(SEED_RING, free(n0=16), now=1100.0, cooldown=300.0, last_moved=recent) == []
    assert movable("B", A_AND_B["B"], MoveConstraints(now=1100.0, cooldown=300.0, last_moved=recent)) == \
        "cooling down after a move"
    # A is not cooling: with room on node 3 it moves instead
    assert summary(plan(SEED_RING, free(n0=16, n3=16), now=1100.0, cooldown=300.0, last_moved=recent)) == \
        [("A", (0,), (3,))]
    assert summary(plan(SEED_RING, free(n0=16), now=1300.0, cooldown=300.0, last_moved=recent)) == \
        [("B", (3,), (0,))]


def test_cooldown_stops_a_pod_bouncing_between_partners():
    """B talks to A (node 0) and joins it; then B talks to C (node 2). Within its cool-down B
    stays where it is: C comes to B when there is room, or nothing moves."""
    placements = {"A": PodPlacement((0,), 4 * CPU), "B": PodPlacement((3,), 4 * CPU), "C": PodPlacement((2,), 4 * CPU)}
    moves = plan(SEED_RING, free(n0=8, n2=8), placements, {("A", "B"): 10 * MB})
    assert summary(moves) == [("B", (3,), (0,))]
    placements = apply_moves(placements, moves)
    bc = {("B", "C"): 10 * MB}
    kw = dict(now=60.0, last_moved={"B": 0.0}, cooldown=300.0)
    assert plan(SEED_RING, free(n2=8, n3=4), placements, bc, **kw) == []
    assert summary(plan(SEED_RING, free(n0=4, n2=8), placements, bc, **kw)) == [("C", (2,), (0,))]
    # once the cool-down is over, B may go to C (node 2), the one move that joins them
    assert summary(plan(SEED_RING, free(n2=8), placements, bc, now=400.0, last_moved={"B": 0.0})) == \
        [("B", (0,), (2,))]


def test_move_cap_per_interval_heaviest_pairs_first():
    placements = {}
    pairs = {}
    for i in range(5):
        placements[f"a{i}"] = PodPlacement((0,), 1 * CPU)
        placements[f"b{i}"] = PodPlacement((3,), 1 * CPU)
        pairs[(f"a{i}", f"b{i}")] = (i + 1) * MB
    moves = plan(SEED_RING, free(n0=16, n3=16), placements, pairs, max_moves=2)
    assert summary(moves) == [("b4", (3,), (0,)), ("b3", (3,), (0,))]
    assert plan(SEED_RING, free(n0=16), placements, pairs, max_moves=0) == []
    everything = plan(SEED_RING, free(n0=16), placements, pairs, max_moves=10)
    assert [m.pod for m in everything] == ["b4", "b3", "b2", "b1", "b0"]


def test_a_plan_that_needs_more_moves_than_the_cap_allows_moves_one_pod_closer():
    """Row 3 with one move left: B goes to node 2 now; next interval A joins it."""
    first = plan(SEED_RING, free(n1=7, n2=16), max_moves=1)
    assert summary(first) == [("B", (3,), (2,))]
    after = apply_moves(A_AND_B, first)
    second = plan(SEED_RING, free(n1=7, n2=8, n3=8), after, max_moves=1)
    assert summary(second) == [("A", (0,), (2,))]


def test_freed_capacity_is_reused_by_later_moves_in_order():
    """Node 0 is full. The heavier pair moves a off node 0 first; the lighter pair may then
    use the 8 CPUs a left there."""
    placements = {"a": PodPlacement((0,), 8 * CPU), "b": PodPlacement((2,), 8 * CPU),
                  "c": PodPlacement((1,), 8 * CPU), "d": PodPlacement((0,), 2 * CPU)}
    pairs = {("a", "b"): 20 * MB, ("c", "d"): 5 * MB}
    moves = plan(SEED_RING, free(n2=8), placements, pairs, max_moves=4)
    assert summary(moves) == [("a", (0,), (2,)), ("c", (1,), (0,))]
    assert [m.plan for m in moves] == [0, 1]
    assert summary(plan(SEED_RING, free(n2=8), placements, {("c", "d"): 5 * MB})) == []


# ----------------------------------------------------------------------------- groups of three
def test_three_pod_group_outlier_joins_the_heaviest_node():
    placements = {"web": PodPlacement((0,), 4 * CPU), "cache": PodPlacement((0,), 4 * CPU),
                  "db": PodPlacement((3,), 4 * CPU)}
    pairs = {("web", "cache"): 30 * MB, ("web", "db"): 10 * MB, ("cache", "db"): 10 * MB}
    moves = plan(SEED_RING, free(n0=4, n3=8), placements, pairs)
    assert summary(moves) == [("db", (3,), (0,))]
    assert moves[0].reason.group == ("cache", "db", "web")
    assert "group of 3" in moves[0].describe()


def test_three_pods_on_three_nodes_gather_on_the_heaviest():
    placements = {"a": PodPlacement((0,), 2 * CPU), "b": PodPlacement((1,), 2 * CPU),
                  "c": PodPlacement((3,), 2 * CPU)}
    pairs = {("a", "b"): 30 * MB, ("a", "c"): 20 * MB, ("b", "c"): 1 * MB}
    moves = plan(SEED_RING, free(n0=8, n1=8, n2=8, n3=8), placements, pairs)
    assert sorted(summary(moves)) == [("b", (1,), (0,)), ("c", (3,), (0,))]
    assert len({m.plan for m in moves}) == 1


def test_three_pod_group_that_does_not_fit_moves_what_fits():
    placements = {"a": PodPlacement((0,), 8 * CPU), "b": PodPlacement((3,), 8 * CPU),
                  "c": PodPlacement((3,), 8 * CPU)}
    pairs = {("a", "b"): 30 * MB, ("a", "c"): 20 * MB}
    # node 3 has room for a; nothing else fits anywhere
    moves = plan(SEED_RING, free(n3=8), placements, pairs)
    assert summary(moves) == [("a", (0,), (3,))]
    # node 0 has room for only one of b and c: the heavier partner b goes
    moves = plan(SEED_RING, free(n0=8), placements, pairs)
    assert summary(moves) == [("b", (3,), (0,))]


def test_groups_are_connected_components_heaviest_first():
    groups = affinity_groups({("a", "b"): 5.0, ("b", "c"): 1.0, ("x", "y"): 9.0, ("p", "p"): 3.0, ("q", "r"): 0.0})
    assert [g.pods for g in groups] == [("x", "y"), ("a", "b", "c")]
    assert groups[1].weight == 6.0 and groups[1].heaviest == 5.0
    g = AffinityGraph(alpha=1.0, confirm_samples=1)
    g.update({("a", "b"): 5.0, ("c", "b"): 20.0, ("d", "e"): 1.0})
    assert [grp.pods for grp in g.groups(2.0)] == [("a", "b", "c")]


# ----------------------------------------------------------------------------- the metric
def test_cross_node_share_is_distance_weighted():
    pairs = {("A", "B"): 3.0, ("C", "D"): 1.0}
    same = {"A": (0,), "B": (0,), "C": (1,), "D": (1,)}
    assert cross_node_share(KUNPENG, same, pairs) == 0.0
    far = {"A": (0,), "B": (3,), "C": (1,), "D": (1,)}
    assert cross_node_share(KUNPENG, far, pairs) == pytest.approx(0.75)   # (33-10)/(33-10) * 3/4
    near = {"A": (0,), "B": (1,), "C": (1,), "D": (1,)}
    assert cross_node_share(KUNPENG, near, pairs) == pytest.approx(3 * 6 / 23 / 4)
    assert cross_node_share(KUNPENG, {"A": (0,)}, pairs) == 0.0          # unknown pods ignored
    one = NumaTopology.build({0: "0-3"})
    assert cross_node_share(one, {"A": (0,), "B": (0,)}, pairs) == 0.0


# ----------------------------------------------------------------------------- properties
@st.composite
def scenarios(draw):
    n_nodes = draw(st.integers(2, 4))
    cpus_per_node = draw(st.integers(2, 16))
    node_cpus = {i: f"{i * cpus_per_node}-{(i + 1) * cpus_per_node - 1}" for i in range(n_nodes)}
    dist = [[10] * n_nodes for _ in range(n_nodes)]
    for a in range(n_nodes):
        for b in range(a + 1, n_nodes):
            dist[a][b] = dist[b][a] = draw(st.integers(11, 40))
    topo = NumaTopology.build(node_cpus, dist)
    n_pods = draw(st.integers(2, 10))
    placements = {}
    for i in range(n_pods):
        span = draw(st.booleans()) and draw(st.booleans())
        first = draw(st.integers(0, n_nodes - 1))
        nodes = tuple(sorted({first, (first + 1) % n_nodes})) if span else (first,)
        placements[f"p{i}"] = PodPlacement(nodes=nodes, millicpu=draw(st.integers(0, cpus_per_node)) * 500,
                                           rule_pinned=draw(st.integers(0, 5)) == 0,
                                           exclusive=draw(st.integers(0, 7)) == 0)
    names = sorted(placements)
    pairs = {}
    for _ in range(draw(st.integers(0, 12))):
        a, b = draw(st.sampled_from(names)), draw(st.sampled_from(names))
        if a != b:
            pairs[(a, b)] = float(draw(st.integers(1, 1000)))
    free = {i: draw(st.integers(-2, cpus_per_node)) * 1000 for i in range(n_nodes)}
    last = {p: 0.0 for p in names if draw(st.integers(0, 6)) == 0}
    constraints = MoveConstraints(free=free, max_moves=draw(st.integers(0, 6)),
                                  min_improvement=draw(st.sampled_from([0.0, 0.1, 0.5])),
                                  now=10.0, cooldown=100.0, last_moved=last)
    return topo, placements, pairs, constraints


def _cost(topo, where, pairs):
    return sum(w * (pair_distance(topo, where[a], where[b]) - 10) for (a, b), w in pairs.items())


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_moves_respect_capacity_pins_and_always_bring_pairs_closer(scenario):
    topo, placements, pairs, c = scenario
    moves = plan_moves(topo, placements, pairs, c)
    assert len(moves) <= c.max_moves
    assert len({m.pod for m in moves}) == len(moves)                   # nobody moves twice
    free = dict(c.free)
    start = {p: pl.nodes for p, pl in placements.items()}
    where = dict(start)
    before_plan = {}
    for m in moves:
        assert movable(m.pod, placements[m.pod], c) is None            # no immovable pod moved
        assert m.from_nodes == where[m.pod] and len(m.to_nodes) == 1
        target = m.to_nodes[0]
        assert 0 < free[target] and m.millicpu <= free[target]         # capacity never exceeded
        for n in m.from_nodes:
            free[n] += m.millicpu
        free[target] -= m.millicpu
        before_plan.setdefault(m.plan, dict(where))
        where[m.pod] = m.to_nodes
    # every move's pair is nearer once its plan is applied, as its reason says
    for m in moves:
        a, b = m.reason.pair
        assert m.pod in (a, b) and pair_key(a, b) == (a, b)
        assert pairs.get((a, b), 0) + pairs.get((b, a), 0) == pytest.approx(m.reason.bytes_per_second)
        before = before_plan[m.plan]
        after = {p: pl.nodes for p, pl in apply_moves(placements, [x for x in moves if x.plan <= m.plan]).items()}
        assert pair_distance(topo, before[a], before[b]) == pytest.approx(m.reason.distance_before)
        assert pair_distance(topo, after[a], after[b]) == pytest.approx(m.reason.distance_after)
        assert m.reason.distance_after < m.reason.distance_before
    if moves:
        assert _cost(topo, where, pairs) < _cost(topo, start, pairs)
