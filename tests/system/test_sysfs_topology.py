"""Reading NUMA topology from (fake) sysfs trees."""

import os

import pytest

from anolisnuma.policies.numa.cpuset import CpuSet
from anolisnuma.policies.numa.topology import NumaTopology, TopologyError
from anolisnuma.system.sysfs_topology import SysfsTopologyError, read_sysfs_topology
from anolisnuma.testing import fake_sysfs as F


def read(root):
    return NumaTopology.from_raw(read_sysfs_topology(str(root)))


def test_kunpeng920_four_nodes_of_32_cpus(tmp_path):
    topo = read(F.kunpeng920().write(str(tmp_path)))
    assert topo.node_ids == (0, 1, 2, 3)
    assert [str(n.cpus) for n in topo.nodes] == ["0-31", "32-63", "64-95", "96-127"]
    assert topo.distance(0, 1) == 16 and topo.distance(0, 3) == 33 and topo.distance(2, 2) == 10
    assert topo.node(2).memory_bytes == 128 * F.GIB
    assert str(topo.online) == "0-127"
    assert len(topo.smt_groups) == 128          # no SMT: every CPU is its own core
    assert topo.nearest([0]) == [1, 2, 3]
    assert topo.problems == ()


def test_x86_two_sockets_with_smt_siblings(tmp_path):
    topo = read(F.x86_two_socket().write(str(tmp_path)))
    assert str(topo.node(0).cpus) == "0-11,24-35"
    assert str(topo.node(1).cpus) == "12-23,36-47"
    assert topo.distance(0, 1) == 21
    assert len(topo.smt_groups) == 24
    assert CpuSet.parse("0,24") in topo.smt_groups
    assert topo.node_of_cpu(36) == 1


def test_single_node_like_this_machine(tmp_path):
    topo = read(F.single_node().write(str(tmp_path)))
    assert topo.node_ids == (0,) and str(topo.cpus) == "0-1"


def test_offline_cpus_are_not_placed_on(tmp_path):
    topo = read(F.with_offline_cpus().write(str(tmp_path)))
    assert str(topo.online) == "0-4,7-11"
    assert str(topo.node(0).cpus) == "0-4,7" and str(topo.node(0).offline_cpus) == "5-6"
    assert str(topo.node(1).cpus) == "8-11" and str(topo.node(1).offline_cpus) == "12-15"
    assert all(g.issubset(topo.online) for g in topo.smt_groups)


def test_cpuless_memory_node(tmp_path):
    topo = read(F.with_cpuless_node().write(str(tmp_path)))
    assert topo.node_ids == (0, 1, 2)
    assert not topo.node(2).has_cpus and topo.node(2).memory_bytes == 64 * F.GIB
    assert topo.distance(0, 2) == 30
    assert topo.nodes_of_cpus(CpuSet.parse("0-15")) == (0, 1)


def test_missing_distance_falls_back_to_10_20(tmp_path):
    root = F.seed_16cpu().write(str(tmp_path))
    os.unlink(os.path.join(root, "devices/system/node/node1/distance"))
    topo = read(root)
    assert topo.distance(0, 1) == 20 and topo.distance(1, 1) == 10
    assert any("distance" in p for p in topo.problems)


def test_no_node_directory_means_one_node(tmp_path):
    root = F.single_node(4).write(str(tmp_path))
    import shutil
    shutil.rmtree(os.path.join(root, "devices/system/node"))
    topo = read(root)
    assert topo.node_ids == (0,) and str(topo.node(0).cpus) == "0-3"


def test_garbled_cpulist_is_an_error(tmp_path):
    root = F.seed_16cpu().write(str(tmp_path))
    with open(os.path.join(root, "devices/system/node/node0/cpulist"), "w") as f:
        f.write("0-3,zz\n")
    with pytest.raises(TopologyError):
        read(root)


def test_overlapping_nodes_are_an_error(tmp_path):
    spec = F.seed_16cpu()
    spec.node_cpus[1] = "3-7"
    with pytest.raises(TopologyError):
        read(spec.write(str(tmp_path)))


def test_empty_root_is_an_error(tmp_path):
    with pytest.raises(SysfsTopologyError):
        read_sysfs_topology(str(tmp_path))


def test_build_from_literals():
    topo = NumaTopology.build({0: "0-1", 1: "2-3"}, [[10, 12], [12, 10]], {0: 100, 1: 200}, online="0-2")
    assert str(topo.node(1).cpus) == "2" and topo.distance(1, 0) == 12 and topo.memory_of([0, 1]) == 300
