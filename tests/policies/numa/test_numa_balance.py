"""Balance placement as pure functions: (topology, loads, shared pool, pod) -> decision."""

import pytest

from anolisnuma.policies.numa.balance import (
    MEMORY_OFF, MEMORY_STRICT, MEMORY_WIDEN, NodeLoad, NoPlacement, PodRequest, balance, free_capacity,
    memory_nodes, millicpu_of, pin)
from anolisnuma.policies.numa.cpuset import CpuSet
from anolisnuma.policies.numa.ledger import Allocation, Ledger
from anolisnuma.policies.numa.topology import NumaTopology
from anolisnuma.testing import fake_sysfs as F

GIB = F.GIB


@pytest.fixture(scope="module")
def seed(tmp_path_factory):
    return F.seed_16cpu().topology(str(tmp_path_factory.mktemp("seed")))


@pytest.fixture(scope="module")
def kunpeng(tmp_path_factory):
    return F.kunpeng920().topology(str(tmp_path_factory.mktemp("kp")))


@pytest.fixture(scope="module")
def memnode(tmp_path_factory):
    return F.with_cpuless_node().topology(str(tmp_path_factory.mktemp("mem")))


def place_all(topo, pool, requests):
    """Place pods one after the other, recording each in a ledger; the placements."""
    ledger = Ledger(topo, pool)
    out = []
    for i, req in enumerate(requests):
        p = balance(topo, pool, ledger.loads(), req)
        ledger.add(Allocation(f"uid{i}", "ns", f"pod{i}", f"sb{i}", p.nodes, p.home, p.mems, pod_millicpu=req.millicpu))
        out.append(p)
    return out, ledger


def test_millicpu_from_limits_then_requests():
    assert millicpu_of(100000, 250000, 2048) == 2500        # limit wins
    assert millicpu_of(100000, 33333, 0) == 334             # rounded up
    assert millicpu_of(0, 0, 1024) == 1000                  # request: shares / 1024
    assert millicpu_of(0, 0, 512) == 500
    assert millicpu_of(100000, -1, 2) == 0                  # best effort
    assert millicpu_of(0, 0, 0) == 0


def test_seed_four_pods_without_resources_get_one_node_each(seed):
    """The seed's example: 4 pods, 16 CPUs, 4 nodes -> 0-3, 4-7, 8-11, 12-15."""
    placements, _ = place_all(seed, seed.cpus, [PodRequest()] * 4)
    assert [str(p.cpus) for p in placements] == ["0-3", "4-7", "8-11", "12-15"]
    assert [str(p.mems) for p in placements] == ["0", "1", "2", "3"]


def test_pods_without_resources_keep_spreading_evenly(seed):
    placements, ledger = place_all(seed, seed.cpus, [PodRequest()] * 10)
    counts = [load.pods for load in ledger.loads().values()]
    assert max(counts) - min(counts) <= 1


def test_balance_spreads_where_the_kubelet_packs(kunpeng):
    """Kubelet static packing fills NUMA-0 first; balance sends each pod to the emptiest node."""
    placements, ledger = place_all(kunpeng, kunpeng.cpus, [PodRequest(8000)] * 8)
    assert [p.nodes[0] for p in placements] == [0, 1, 2, 3, 0, 1, 2, 3]
    free = free_capacity(kunpeng, kunpeng.cpus, ledger.loads())
    assert max(free.values()) - min(free.values()) == 0


def test_shared_pool_is_the_budget_design_example(kunpeng):
    """With the design.md checkpoint (1-22 and 32-33 exclusive), nodes 0 and 1 have fewer
    shared CPUs, so the first pods go to nodes 2 and 3, and never onto exclusive CPUs."""
    pool = CpuSet.parse("0,23-31,34-127")
    placements, _ = place_all(kunpeng, pool, [PodRequest(4000)] * 3)
    assert [p.nodes for p in placements] == [(2,), (3,), (1,)]
    assert str(placements[2].cpus) == "34-63"
    assert all(p.cpus.issubset(pool) for p in placements)


def test_ties_go_to_the_node_nearest_the_pods_previous_nodes(kunpeng):
    p = balance(kunpeng, kunpeng.cpus, {}, PodRequest(1000, near=(3,)))
    assert p.nodes == (3,)
    p = balance(kunpeng, kunpeng.cpus, {3: NodeLoad(1000, 1)}, PodRequest(1000, near=(3,)))
    assert p.nodes == (2,)            # distance(3,2)=16 beats node 0 (33) and node 1 (32)
    p = balance(kunpeng, kunpeng.cpus, {}, PodRequest(1000))
    assert p.nodes == (0,)            # no preference: lowest id


def test_a_pod_larger_than_a_node_spans_the_nearest_nodes(kunpeng):
    p = balance(kunpeng, kunpeng.cpus, {}, PodRequest(40000))
    assert p.nodes == (0, 1) and str(p.cpus) == "0-63" and str(p.mems) == "0-1"
    loads = {0: NodeLoad(30000, 3), 1: NodeLoad(30000, 3)}
    p = balance(kunpeng, kunpeng.cpus, loads, PodRequest(40000))
    assert p.nodes == (2, 3)          # starts at the emptiest node, adds its nearest neighbour
    p = balance(kunpeng, kunpeng.cpus, {}, PodRequest(200000))
    assert p.nodes == (0, 1, 2, 3)    # larger than the machine: everything


def test_a_pod_that_fits_a_node_stays_on_one_even_when_overcommitted(seed):
    loads = {i: NodeLoad(3500, 1) for i in range(4)}
    p = balance(seed, seed.cpus, loads, PodRequest(2000))
    assert len(p.nodes) == 1


def test_nodes_whose_shared_cpus_are_all_exclusive_are_not_candidates(seed):
    pool = CpuSet.parse("4-15")
    placements, _ = place_all(seed, pool, [PodRequest()] * 3)
    assert 0 not in {p.nodes[0] for p in placements}
    with pytest.raises(NoPlacement):
        balance(seed, CpuSet(), {}, PodRequest())


def test_memory_widens_to_the_nearest_nodes_when_the_limit_does_not_fit(kunpeng):
    assert str(balance(kunpeng, kunpeng.cpus, {}, PodRequest(1000, 64 * GIB)).mems) == "0"
    p = balance(kunpeng, kunpeng.cpus, {}, PodRequest(1000, 200 * GIB))
    assert p.nodes == (0,) and str(p.mems) == "0-1"             # node 1 is nearest to node 0
    p = balance(kunpeng, kunpeng.cpus, {}, PodRequest(1000, 200 * GIB), memory_pinning=MEMORY_STRICT)
    assert str(p.mems) == "0"
    p = balance(kunpeng, kunpeng.cpus, {}, PodRequest(1000, 200 * GIB), memory_pinning=MEMORY_OFF)
    assert not p.mems


def test_memory_widening_counts_what_other_pods_reserved(kunpeng):
    loads = {0: NodeLoad(0, 1, 100 * GIB)}
    assert memory_nodes(kunpeng, [0], 40 * GIB, loads, MEMORY_WIDEN) == CpuSet([0, 1])
    assert memory_nodes(kunpeng, [0], 20 * GIB, loads, MEMORY_WIDEN) == CpuSet([0])


def test_memory_may_widen_onto_a_cpuless_node(memnode):
    p = balance(memnode, memnode.cpus, {}, PodRequest(1000, 24 * GIB))
    assert p.nodes == (0,) and str(p.cpus) == "0-7"
    assert str(p.mems) == "0-1"                                  # node 1 (20) before node 2 (30)
    p = balance(memnode, memnode.cpus, {}, PodRequest(1000, 40 * GIB))
    assert str(p.mems) == "0-2"


def test_cpuless_node_is_never_a_cpu_candidate(memnode):
    placements, _ = place_all(memnode, memnode.cpus, [PodRequest()] * 6)
    assert {p.nodes[0] for p in placements} == {0, 1}


def test_rule_pin_wins_and_stays_within_the_pool(kunpeng):
    pool = CpuSet.parse("0-63,70-127")
    p = pin(kunpeng, pool, {}, [2], PodRequest(1000), reason="rule")
    assert p.nodes == (2,) and str(p.cpus) == "70-95" and str(p.home) == "64-95"
    p = pin(kunpeng, pool, {}, [2], PodRequest(1000), cpus=CpuSet.parse("70-73"), mems=CpuSet([2, 3]))
    assert str(p.cpus) == "70-73" and str(p.mems) == "2-3"
    with pytest.raises(NoPlacement):
        pin(kunpeng, pool, {}, [2], PodRequest(), cpus=CpuSet.parse("64-69"))


def test_one_node_machine_is_trivial(tmp_path):
    topo = F.single_node().topology(str(tmp_path))
    placements, _ = place_all(topo, topo.cpus, [PodRequest(500), PodRequest(), PodRequest(4000)])
    assert all(str(p.cpus) == "0-1" for p in placements)


def test_offline_cpus_are_never_handed_out(tmp_path):
    topo = F.with_offline_cpus().topology(str(tmp_path))
    placements, _ = place_all(topo, topo.cpus, [PodRequest(2000)] * 4)
    assert all(p.cpus.issubset(topo.online) for p in placements)
    assert {str(p.cpus) for p in placements} == {"0-4,7", "8-11"}


def test_decision_is_pure():
    topo = NumaTopology.build({0: "0-3", 1: "4-7"})
    loads = {0: NodeLoad(1000, 1)}
    before = dict(loads)
    a = balance(topo, topo.cpus, loads, PodRequest(500))
    b = balance(topo, topo.cpus, loads, PodRequest(500))
    assert a == b and loads == before


def test_x86_smt_pods_get_whole_cores_of_their_socket(tmp_path):
    topo = F.x86_two_socket().topology(str(tmp_path))
    placements, _ = place_all(topo, topo.cpus, [PodRequest(4000), PodRequest(4000)])
    assert [str(p.cpus) for p in placements] == ["0-11,24-35", "12-23,36-47"]
    for p in placements:        # both hardware threads of every core come together
        assert all(g.issubset(p.cpus) or g.isdisjoint(p.cpus) for g in topo.smt_groups)
