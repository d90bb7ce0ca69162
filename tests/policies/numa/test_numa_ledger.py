"""The allocation ledger: demand accounting, release, persistence records."""

from anolisnuma.policies.numa.balance import NodeLoad, PodRequest, balance
from anolisnuma.policies.numa.cpuset import CpuSet
from anolisnuma.policies.numa.ledger import Allocation, ContainerShare, Ledger
from anolisnuma.policies.numa.topology import NumaTopology
from anolisnuma.state.numa_state import AllocationRecord

TOPO = NumaTopology.build({0: "0-3", 1: "4-7"}, memory_bytes={0: 1000, 1: 1000})


def alloc(uid, nodes=(0,), sandbox="", pod_millicpu=0, home=None):
    home = home if home is not None else TOPO.cpus_of(nodes)
    return Allocation(uid, "ns", uid, sandbox or f"sb-{uid}", tuple(nodes), home, CpuSet(nodes), pod_millicpu=pod_millicpu)


def test_pod_demand_is_the_larger_of_pod_level_and_container_sum():
    ledger = Ledger(TOPO, TOPO.cpus)
    ledger.add(alloc("a", pod_millicpu=1500))
    ledger.set_pending("a", "app", ContainerShare("app", 1000))
    assert ledger.loads()[0].millicpu == 1500
    ledger.add_container("a", "c1", ContainerShare("app", 1000))
    ledger.set_pending("a", "side", ContainerShare("side", 1000))
    assert ledger.loads()[0].millicpu == 2000
    assert ledger.get("a").pending.keys() == {"side"}


def test_release_returns_capacity_and_is_idempotent():
    ledger = Ledger(TOPO, TOPO.cpus)
    ledger.add(alloc("a"))
    ledger.add_container("a", "c1", ContainerShare("x", 700, 100))
    ledger.add_container("a", "c2", ContainerShare("y", 300, 100))
    assert ledger.loads()[0] == NodeLoad(1000, 1, 200)
    ledger.remove_container("c1")
    ledger.remove_container("c1")
    assert ledger.loads()[0] == NodeLoad(300, 1, 100)
    assert ledger.remove("a") is not None and ledger.remove("a") is None
    assert ledger.loads() == {0: NodeLoad(), 1: NodeLoad()}
    assert not ledger.knows_container("c2") and not ledger.knows_sandbox("sb-a")


def test_a_spanning_pod_counts_in_proportion_to_its_cpus_per_node():
    ledger = Ledger(TOPO, CpuSet.parse("0-3,4-5"))
    ledger.add(alloc("a", nodes=(0, 1), pod_millicpu=3000))
    loads = ledger.loads()
    assert (loads[0].millicpu, loads[1].millicpu) == (2000, 1000)
    ledger.set_pool(TOPO.cpus)                      # pool grew: re-split
    loads = ledger.loads()
    assert (loads[0].millicpu, loads[1].millicpu) == (1500, 1500)
    assert ledger.loads() == ledger.recomputed_loads()


def test_a_container_is_never_counted_twice():
    ledger = Ledger(TOPO, TOPO.cpus)
    ledger.add(alloc("a"))
    ledger.add(alloc("b", nodes=(1,)))
    ledger.add_container("a", "c1", ContainerShare("x", 1000))
    ledger.add_container("b", "c1", ContainerShare("x", 1000))
    assert ledger.by_container("c1").pod_uid == "b"
    assert ledger.loads()[0].millicpu == 0 and ledger.loads()[1].millicpu == 1000


def test_records_round_trip():
    ledger = Ledger(TOPO, TOPO.cpus)
    ledger.add(alloc("a", nodes=(0, 1), pod_millicpu=2500))
    ledger.add_container("a", "c1", ContainerShare("x", 1000, 10))
    ledger.set_pending("a", "y", ContainerShare("y", 100))
    records = [AllocationRecord.from_json(r.to_json()) for r in ledger.to_records()]
    again = Ledger(TOPO, TOPO.cpus)
    assert again.load_records(records) == []
    assert again.loads() == ledger.loads()
    assert again.get("a").home == CpuSet.parse("0-7") and again.knows_container("c1")


def test_records_naming_unknown_nodes_are_dropped():
    bad = AllocationRecord(pod_uid="z", nodes=[7], home="0-3", mems="0")
    garbled = AllocationRecord(pod_uid="y", nodes=[0], home="0-x", mems="0")
    problems = Ledger(TOPO, TOPO.cpus).load_records([bad, garbled])
    assert len(problems) == 2


def test_move_replaces_the_placement():
    ledger = Ledger(TOPO, TOPO.cpus)
    ledger.add(alloc("a", pod_millicpu=1000))
    p = balance(TOPO, CpuSet.parse("4-7"), {}, PodRequest(1000))
    ledger.move("a", p)
    assert ledger.get("a").nodes == (1,) and ledger.loads()[1].millicpu == 1000 and ledger.loads()[0].millicpu == 0


def test_a_new_allocation_on_a_reused_sandbox_id_replaces_the_stale_one():
    ledger = Ledger(TOPO, TOPO.cpus)
    ledger.add(alloc("a", sandbox="sb"))
    ledger.add(alloc("b", sandbox="sb"))
    assert "a" not in ledger and ledger.by_sandbox("sb").pod_uid == "b"
