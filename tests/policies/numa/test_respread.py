"""Re-spread as pure functions: (topology, pool, pods, affinity groups, constraints) -> the
few moves that bring the nodes' free capacity back within a threshold; the pacer that says
when to plan and how many pods may still move. Property tests: a plan never breaks a group
or moves a fixed pod, never increases the spread, respects the cap, and is deterministic."""

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from anolisnuma.policies.numa.cpuset import CpuSet
from anolisnuma.policies.numa.respread import (
    STAGE_COUNT, STAGE_CPU, RespreadConstraints, RespreadPacer, SpreadPod, apply_respread, cpu_spread, crowded,
    free_per_node, idle_pods_per_node, load_per_node, movable_units, over_threshold, plan_respread, spread, urgent)
from anolisnuma.policies.numa.topology import NumaTopology
from anolisnuma.testing import fake_sysfs as F

CPU = 1000
KUNPENG = NumaTopology.build(F.kunpeng920().node_cpus, F.kunpeng920().distances)
ALL = KUNPENG.cpus
TWO = NumaTopology.build({0: "0-3", 1: "4-7"})


def pods_on(*layout):
    """pods_on((0, 8), (0, 4), (1, 0)): pod p<i> on node n demanding c CPUs."""
    return {f"p{i}": SpreadPod(nodes=(n, ), millicpu=int(c * CPU)) for i, (n, c) in enumerate(layout)}


def plan(pods, pool=ALL, groups=(), topology=KUNPENG, **kw):
    return plan_respread(topology, pool, pods, groups, RespreadConstraints(**kw))


# ---------------------------------------------------------------------------- measures

def test_free_per_node_is_capacity_minus_demand_and_skips_nodes_without_shared_cpus():
    pods = pods_on((0, 8), (0, 4), (1, 2))
    pods["wide"] = SpreadPod(nodes=(2, 3), millicpu=10 * CPU)
    assert free_per_node(KUNPENG, ALL, pods) == {0: 20 * CPU, 1: 30 * CPU, 2: 27 * CPU, 3: 27 * CPU}
    # node 0's CPUs all exclusive: it is no place to spread to (and not measured)
    pool = ALL - CpuSet.parse("0-31")
    assert set(free_per_node(KUNPENG, pool, pods)) == {1, 2, 3}
    assert spread({0: 5, 1: 9}) == 4 and spread({0: 5}) == 0
    # the least free counts only where something is placed: an empty node is as free as it gets
    assert spread({0: 2, 1: 12, 2: 9}, {0: 0, 1: 20, 2: 23}) == 3
    assert spread({0: 2, 1: 12}, {0: 0, 1: 0}) == 0
    assert load_per_node(KUNPENG, ALL, pods) == {0: 12 * CPU, 1: 2 * CPU, 2: 5 * CPU, 3: 5 * CPU}


def test_a_node_the_kubelet_took_almost_all_of_is_no_reason_to_move():
    # CPUs 0-29 exclusive: node 0 has 2 shared CPUs and nothing placed; the others 12-14 free
    pool = ALL - CpuSet.parse("0-29")
    pods = pods_on((1, 20), (2, 19), (3, 18))
    assert spread(free_per_node(KUNPENG, pool, pods)) == 12 * CPU
    assert cpu_spread(KUNPENG, pool, pods) == 2 * CPU
    assert plan(pods, pool=pool) == []


def test_balanced_nodes_need_no_move():
    pods = pods_on((0, 8), (1, 8), (2, 6), (3, 5))
    assert plan(pods) == []


# ---------------------------------------------------------------------------- the CPU stage

def test_pods_gone_from_three_nodes_one_move_halves_the_gap_and_the_cap_holds():
    # node 0 keeps 4 pods of 6 CPUs, the others emptied: free 8 / 32 / 32 / 32, spread 24
    pods = pods_on((0, 6), (0, 6), (0, 6), (0, 6))
    moves = plan(pods, max_moves=1)
    assert len(moves) == 1
    m = moves[0]
    assert m.stage == STAGE_CPU and m.from_node == 0 and m.pods[0].startswith("p")
    assert m.to_node == 1            # tie on the free values: the nearer node (distance 16)
    assert (m.spread_before, m.spread_after) == (24 * CPU, 18 * CPU)   # 14 / 26 / 32 / 32
    # with a bigger cap, it stops as soon as the spread is within the threshold
    moves = plan(pods, max_moves=10, threshold_millicpu=8 * CPU)
    after = free_per_node(KUNPENG, ALL, apply_respread(pods, moves))
    assert spread(after) <= 8 * CPU
    assert len(moves) == 3 and sorted(m.to_node for m in moves) == [1, 2, 3]


def test_a_move_never_overshoots_so_a_pod_larger_than_the_gap_stays():
    # free 12 / 18 / 18 / 18: a 20-CPU pod moved would widen the gap, 14-CPU ones would swap it
    pods = {"big": SpreadPod((0,), 20 * CPU), "n1": SpreadPod((1,), 14 * CPU), "n2": SpreadPod((2,), 14 * CPU),
            "n3": SpreadPod((3,), 14 * CPU)}
    assert plan(pods, threshold_millicpu=1000, max_moves=5) == []
    pods["small"] = SpreadPod((0,), 2 * CPU)    # 10 / 18 / 18 / 18
    moves = plan(pods, threshold_millicpu=1000, max_moves=5)
    assert [(m.pods, m.to_node, m.spread_after) for m in moves] == [(("small",), 1, 6 * CPU)]


def test_room_on_the_target_is_required():
    # node 0 overcommitted (-4 free), node 1 has 3 free: the 5-CPU pod does not fit there
    pods = {"a": SpreadPod((0,), 5 * CPU), "b": SpreadPod((0,), 3 * CPU), "c": SpreadPod((1,), 1 * CPU)}
    moves = plan(pods, topology=TWO, pool=TWO.cpus, threshold_millicpu=500, max_moves=5)
    assert [(m.pods, m.to_node) for m in moves] == [(("b",), 1)]


def test_the_pool_growing_back_makes_room_that_pods_move_into():
    # a Guaranteed pod owned CPUs 0-23: balance put the shared pods on nodes 1-3
    pods = pods_on((0, 4), (1, 8), (1, 8), (2, 8), (2, 8), (3, 8), (3, 8))
    assert spread(free_per_node(KUNPENG, ALL - CpuSet.parse("0-23"), pods)) == 12 * CPU
    # it left: node 0 has 28 CPUs free, the others 16
    moves = plan(pods, pool=ALL, max_moves=2)
    # one 8-CPU pod comes from the nearest node (distance 16); a second would only swap gaps
    assert [(m.pods, m.from_node, m.to_node) for m in moves] == [(("p1",), 1, 0)]
    assert (moves[0].spread_before, moves[0].spread_after) == (12 * CPU, 8 * CPU)
    assert "from node 1" in moves[0].describe() and "spread 12 -> 8 CPUs" in moves[0].describe()


def test_fixed_pods_count_but_never_move():
    pods = pods_on((0, 8), (0, 8), (0, 8))
    pods = {k: SpreadPod(v.nodes, v.millicpu, fixed="pinned by a placement rule") for k, v in pods.items()}
    assert plan(pods, max_moves=10) == []
    pods["free"] = SpreadPod((0,), 4 * CPU)
    moves = plan(pods, max_moves=10)
    assert [m.pods for m in moves] == [("free",)]


def test_cooling_down_pods_stay_until_the_cooldown_ends():
    pods = pods_on((0, 8), (0, 8))
    kw = dict(max_moves=10, cooldown=600.0, last_moved={"p0": 100.0, "p1": 100.0})
    assert plan(pods, now=699.0, **kw) == []
    assert len(plan(pods, now=700.0, **kw)) == 1


def test_multi_node_pods_do_not_move():
    pods = {"wide": SpreadPod((0, 1), 40 * CPU)}
    assert movable_units(KUNPENG, ALL, pods, (), RespreadConstraints()) == []


# ---------------------------------------------------------------------------- affinity groups

def test_a_colocated_group_moves_as_one_unit_and_costs_its_size():
    two = NumaTopology.build({0: "0-31", 1: "32-63"})
    pods = pods_on((0, 4), (0, 4), (0, 2), (0, 2))     # free 20 / 32
    groups = [("p0", "p1")]
    kw = dict(topology=two, pool=two.cpus, groups=groups, threshold_millicpu=1000)
    moves = plan(pods, max_moves=1, **kw)
    assert [m.pods for m in moves] == [("p2",)]            # the group of 2 does not fit a cap of 1
    moves = plan(pods, max_moves=2, **kw)
    # the group (8 CPUs) closes the gap best: 28 / 24, where a 2-CPU pod leaves 22 / 30
    assert [(m.pods, m.to_node) for m in moves] == [(("p0", "p1"), 1)]
    assert "affinity group p0,p1" in moves[0].describe()


def test_a_split_group_or_one_with_a_fixed_member_does_not_move():
    pods = pods_on((0, 6), (1, 6), (0, 6), (0, 6))
    groups = [("p0", "p1")]
    moves = plan(pods, groups=groups, max_moves=10)
    assert all("p0" not in m.pods and "p1" not in m.pods for m in moves)
    pods = pods_on((0, 6), (0, 6))
    pods["p1"] = SpreadPod((0,), 6 * CPU, fixed="a move of this pod is still being applied")
    assert plan(pods, groups=[("p0", "p1")], max_moves=10) == []


# ---------------------------------------------------------------------------- the count stage

def test_demand_free_pods_are_spread_by_count():
    # the issue's node: two BestEffort pods put on node 1 while node 0's CPU was exclusive
    pods = {"be-a": SpreadPod((1,), 0), "be-b": SpreadPod((1,), 0)}
    topo = NumaTopology.build({0: "0", 1: "1"})
    assert plan(pods, topology=topo, pool=CpuSet.parse("1")) == []     # node 0 has no shared CPU
    moves = plan(pods, topology=topo, pool=CpuSet.parse("0-1"))
    assert [(m.pods, m.from_node, m.to_node, m.stage) for m in moves] == [(("be-a",), 1, 0, STAGE_COUNT)]


def test_count_stage_details():
    topo = NumaTopology.build({0: "0", 1: "1"})
    pods = {"be-a": SpreadPod((1,), 0), "be-b": SpreadPod((1,), 0)}
    (m,) = plan(pods, topology=topo, pool=topo.cpus)
    assert (m.spread_before, m.spread_after) == (2, 0)
    assert "no CPU demand" in m.describe()
    # one more on a node is as even as it gets
    pods = {"be-a": SpreadPod((1,), 0), "be-b": SpreadPod((1,), 0), "be-c": SpreadPod((0,), 0)}
    assert plan(pods, topology=topo, pool=topo.cpus) == []
    # a target without a free milli-CPU is no target (PlacementService.move would refuse)
    pods = {"be-a": SpreadPod((1,), 0), "be-b": SpreadPod((1,), 0), "full": SpreadPod((0,), 1000)}
    assert plan(pods, topology=topo, pool=topo.cpus, threshold_millicpu=5000) == []
    assert idle_pods_per_node(topo, topo.cpus, pods) == {0: 0, 1: 2}


def test_demand_free_pods_with_cpus_to_spare_stay_where_balance_put_them():
    # two BestEffort pods on node 1 with 12 CPUs free beside them, none elsewhere (free
    # 8 / 12 / 10 / 10): balance put them on the freest node, and each has 6 free CPUs: no
    # move (the churn's frequent case, which spreading by count alone moved)
    pods = pods_on((0, 24), (1, 20), (2, 22), (3, 22), (1, 0), (1, 0))
    c = RespreadConstraints(threshold_millicpu=9 * CPU)
    assert not over_threshold(KUNPENG, ALL, pods, c)
    assert plan(pods, threshold_millicpu=9 * CPU) == []
    # node 1 filled up (1.5 CPUs free for the two): crowded; one moves off it
    pods["p1"] = SpreadPod((1,), int(30.5 * CPU))
    assert over_threshold(KUNPENG, ALL, pods, c)
    moves = plan(pods, threshold_millicpu=9 * CPU)
    assert [(m.pods, m.from_node, m.stage) for m in moves] == [(("p4",), 1, STAGE_COUNT)]
    assert moves[0].to_node in (0, 2, 3)
    # the target must give each at least as much as it has now: node 0 has 0.1 each
    for node1, moved in ((3.0, True), (3.9, True), (3.95, False)):   # node 1 free: 1, 0.1, 0.05
        pods = pods_on((0, 3.8), (1, node1), (0, 0), (0, 0))
        moves = plan(pods, topology=TWO, pool=TWO.cpus, threshold_millicpu=8 * CPU)
        assert [(m.from_node, m.to_node) for m in moves] == ([(0, 1)] if moved else []), node1


def test_crowded_and_the_idle_share():
    assert crowded(1000, 2, 1000) and not crowded(2000, 2, 1000) and not crowded(0, 0, 1000)
    assert crowded(-500, 1, 1000) and not crowded(5000, 3, 0)   # 0: never crowded (count stage off)
    pods = {"be-a": SpreadPod((1,), 0), "be-b": SpreadPod((1,), 0)}
    topo = NumaTopology.build({0: "0", 1: "1"})
    assert plan(pods, topology=topo, pool=topo.cpus, idle_share_millicpu=0) == []
    assert len(plan(pods, topology=topo, pool=topo.cpus, idle_share_millicpu=400)) == 0   # 0.5 each: enough
    assert len(plan(pods, topology=topo, pool=topo.cpus, idle_share_millicpu=600)) == 1


def test_urgent_spread_skips_the_settle():
    pods = pods_on((0, 6), (0, 6), (0, 6), (0, 6))        # spread 24 CPUs
    assert urgent(KUNPENG, ALL, pods, RespreadConstraints(threshold_millicpu=8 * CPU, urgent_millicpu=16 * CPU))
    assert not urgent(KUNPENG, ALL, pods, RespreadConstraints(threshold_millicpu=8 * CPU, urgent_millicpu=24 * CPU))
    assert not urgent(KUNPENG, ALL, pods, RespreadConstraints(threshold_millicpu=8 * CPU))   # 0: off
    # never below the threshold: an urgent value under it means "the threshold"
    assert not urgent(KUNPENG, ALL, pods, RespreadConstraints(threshold_millicpu=30 * CPU, urgent_millicpu=CPU))
    p = RespreadPacer(interval=30.0, max_moves=2, settle=60.0)
    assert p.due(0.0, "a", over=True) is None
    assert p.due(1.0, "a", over=True, urgent=True) == "start"
    assert p.due(2.0, "a", over=False, urgent=True) is None    # not over: never due


# ---------------------------------------------------------------------------- the pacer

def test_pacer_waits_for_the_spread_to_stay_over_the_threshold():
    p = RespreadPacer(interval=30.0, max_moves=2, settle=60.0)
    assert p.due(0.0, "a", over=True) is None and p.over_for(10.0) == 10.0
    assert p.due(59.0, "a", over=True) is None
    assert p.due(60.0, "a", over=True) == "start"
    p.planned(60.0, "a")
    assert p.due(70.0, "b", over=False) is None and p.over_for(70.0) == 0.0   # fell back: the clock restarts
    assert p.due(100.0, "b", over=True) is None and p.due(160.0, "b", over=True) == "changed"


def test_pacer_plans_on_change_or_every_interval_and_caps_moves_in_a_sliding_window():
    p = RespreadPacer(interval=30.0, max_moves=2)
    assert p.due(0.0, "a") == "start"
    p.planned(0.0, "a")
    assert p.due(10.0, "a") is None
    assert p.due(10.0, "b") == "changed"
    assert p.due(30.0, "a") == "periodic"
    assert p.budget(0.0) == 2
    p.moved(5.0, 2)
    assert p.budget(20.0) == 0 and p.budget(34.9) == 0 and p.budget(35.0) == 2


# ---------------------------------------------------------------------------- properties

@st.composite
def scenarios(draw):
    """A Kunpeng 920 with some exclusive CPUs, 0-40 pods (some fixed, some multi-node,
    some demand-free), affinity groups over them, a threshold and a cap."""
    excl = draw(st.sets(st.integers(0, 127), max_size=64))
    pool = ALL - CpuSet(sorted(excl))
    n = draw(st.integers(0, 40))
    pods = {}
    for i in range(n):
        wide = draw(st.integers(0, 9)) == 0
        node = draw(st.integers(0, 3))
        nodes = (node, (node + 1) % 4) if wide else (node,)
        milli = draw(st.sampled_from([0, 0, 100, 500, 1000, 2000, 4000, 6000, 8000, 16000]))
        fixed = draw(st.sampled_from(["", "", "", "pinned by a placement rule", "has kubelet-exclusive CPUs"]))
        pods[f"p{i:02d}"] = SpreadPod(nodes=tuple(sorted(nodes)), millicpu=milli, fixed=fixed)
    names = sorted(pods)
    groups = []
    if len(names) >= 2:
        for _ in range(draw(st.integers(0, 4))):
            groups.append(tuple(draw(st.lists(st.sampled_from(names), min_size=2, max_size=4, unique=True))))
    c = RespreadConstraints(threshold_millicpu=draw(st.sampled_from([500, 2000, 4000, 8000])),
                            pods_threshold=draw(st.integers(2, 4)), max_moves=draw(st.integers(0, 12)),
                            idle_share_millicpu=draw(st.sampled_from([0, 500, 1000, 4000, 100000])),
                            cooldown=300.0, now=1000.0,
                            last_moved={p: 900.0 for p in names if draw(st.integers(0, 7)) == 0})
    return pool, pods, groups, c


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_property_a_plan_never_breaks_a_group_or_moves_a_fixed_pod_and_never_widens_the_spread(sc):
    pool, pods, groups, c = sc
    moves = plan_respread(KUNPENG, pool, pods, groups, c)
    moved = [p for m in moves for p in m.pods]
    # the cap, and no pod twice
    assert len(moved) <= c.max_moves and len(moved) == len(set(moved))
    for m in moves:
        for p in m.pods:
            # never a fixed pod, a cooling one, a multi-node one; always from where it is
            assert not pods[p].fixed and len(pods[p].nodes) == 1 and pods[p].nodes == (m.from_node,)
            assert p not in c.last_moved
        assert m.from_node != m.to_node and pool & KUNPENG.node(m.to_node).cpus
    after = apply_respread(pods, moves)
    # groups: every group that shares a pod with a move moved whole, onto one node
    merged = _merge(groups, pods)
    for g in merged:
        touched = [p for p in g if p in moved]
        if touched:
            assert sorted(touched) == sorted(g)
            assert len({after[p].nodes for p in g}) == 1
    # the spread never grows: after every prefix of the plan, for both measures
    before_cpu = cpu_spread(KUNPENG, pool, pods)
    before_cnt = spread(idle_pods_per_node(KUNPENG, pool, pods))
    for k in range(1, len(moves) + 1):
        step = apply_respread(pods, moves[:k])
        assert cpu_spread(KUNPENG, pool, step) <= before_cpu
        assert spread(free_per_node(KUNPENG, pool, step)) <= spread(free_per_node(KUNPENG, pool, pods))
    carried_idle = any(m.stage == STAGE_CPU and any(pods[p].millicpu <= 0 for p in m.pods) for m in moves)
    # (a group moved for its CPUs may carry demand-free pods with it)
    assert spread(idle_pods_per_node(KUNPENG, pool, after)) <= before_cnt or carried_idle
    # the count stage moves a demand-free pod only off a crowded node, onto a node where each
    # gets at least as many free CPUs
    for k, m in enumerate(moves):
        if m.stage != STAGE_COUNT:
            continue
        step = apply_respread(pods, moves[:k])
        f, n = free_per_node(KUNPENG, pool, step), idle_pods_per_node(KUNPENG, pool, step)
        assert crowded(f[m.from_node], n[m.from_node], c.idle_share_millicpu)
        assert f[m.to_node] * n[m.from_node] >= f[m.from_node] * (n[m.to_node] + len(m.pods))
    # room: every move's target had room for it when it was made (as move() checks)
    for k, m in enumerate(moves):
        room = free_per_node(KUNPENG, pool, apply_respread(pods, moves[:k]))[m.to_node]
        assert room >= max(m.millicpu, 1)
    # deterministic, whatever the order of the inputs
    shuffled = dict(sorted(pods.items(), key=lambda kv: random.Random(7).random()))
    assert plan_respread(KUNPENG, pool, shuffled, list(reversed(groups)), c) == moves


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_property_with_no_cap_the_spread_ends_within_the_threshold_or_no_move_is_allowed(sc):
    pool, pods, groups, c = sc
    c = RespreadConstraints(threshold_millicpu=c.threshold_millicpu, pods_threshold=c.pods_threshold,
                            max_moves=10_000, now=c.now, cooldown=c.cooldown, last_moved=c.last_moved)
    moves = plan_respread(KUNPENG, pool, pods, groups, c)
    after = apply_respread(pods, moves)
    free = free_per_node(KUNPENG, pool, after)
    if cpu_spread(KUNPENG, pool, after) <= c.threshold_millicpu:
        return
    moved = {m.pods for m in moves}
    for u in movable_units(KUNPENG, pool, pods, groups, c):
        if u.pods in moved or u.millicpu <= 0:
            continue
        for b, v in free.items():
            gap = v - free[u.node]
            assert not (b != u.node and 0 < u.millicpu < gap and v >= u.millicpu), (u, b, free)


def _merge(groups, pods):
    out = []
    for g in groups:
        g = {p for p in g if p in pods}
        joined = [o for o in out if o & g]
        for o in joined:
            out.remove(o)
            g |= o
        out.append(g)
    return [sorted(g) for g in out if len(g) > 1]


# ---------------------------------------------------------------------------- configuration

def test_numa_respread_section_defaults_and_checks():
    import pytest

    from anolisnuma.configfile import ConfigError, Table
    from anolisnuma.policies.numa.config import NumaConfig

    cfg = NumaConfig.from_table(Table({}, "numa")).respread
    assert cfg.enabled is True and cfg.interval_seconds == 30.0 and cfg.threshold_millicpu == 8000
    assert cfg.settle_seconds == 60.0
    assert (cfg.pods_threshold, cfg.max_moves_per_interval, cfg.cooldown_seconds) == (2, 2, 600.0)
    assert (cfg.urgent_millicpu, cfg.idle_share_millicpu) == (0, 1000)
    c = cfg.constraints(3, 5.0, {"x": 1.0})
    assert (c.threshold_millicpu, c.idle_share_millicpu, c.urgent_millicpu, c.max_moves, c.now) == (8000, 1000, 0, 3, 5.0)
    cfg = NumaConfig.from_table(Table({"respread": {"urgent_cpus": 12, "idle_share_cpus": 0.5}}, "numa")).respread
    assert (cfg.urgent_millicpu, cfg.idle_share_millicpu) == (12000, 500)
    cfg = NumaConfig.from_table(Table({"respread": {"enabled": False, "threshold_cpus": 2.5}}, "numa")).respread
    assert cfg.enabled is False and cfg.threshold_millicpu == 2500
    for bad, key in [({"pods_threshold": 1}, "numa.respread.pods_threshold"),
                     ({"threshold_cpus": 0}, "numa.respread.threshold_cpus"),
                     ({"max_moves": 3}, "numa.respread.max_moves"),
                     ({"urgent_cpus": -1}, "numa.respread.urgent_cpus"),
                     ({"idle_share_cpus": -0.5}, "numa.respread.idle_share_cpus")]:
        with pytest.raises(ConfigError) as e:
            NumaConfig.from_table(Table({"respread": bad}, "numa"))
        assert key in str(e.value)
