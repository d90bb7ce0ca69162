"""Fake sysfs trees for NUMA topology tests.

A :class:`FakeTopology` describes a machine (nodes with CPU lists and memory, a distance
matrix, online CPUs, SMT sibling groups); :meth:`FakeTopology.write` lays it out under a
directory the way the kernel does under ``/sys``, so
:func:`anolisnuma.system.sysfs_topology.read_sysfs_topology` can read it back. Ready-made
machines: :func:`kunpeng920`, :func:`x86_two_socket`, :func:`single_node`,
:func:`seed_16cpu`, :func:`with_offline_cpus`, :func:`with_cpuless_node`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from anolisnuma.policies.numa.cpuset import CpuSet, union_all
from anolisnuma.policies.numa.topology import NumaTopology
from anolisnuma.system.sysfs_topology import read_sysfs_topology

GIB = 1 << 30


@dataclass
class FakeTopology:
    name: str
    node_cpus: Dict[int, str]                   # node id -> cpulist as the kernel lists it
    distances: List[List[int]]                  # in node id order
    memory_bytes: Dict[int, int] = field(default_factory=dict)
    online: Optional[str] = None                # None: every listed CPU is online
    smt: List[str] = field(default_factory=list)  # sibling groups; [] = no SMT

    @property
    def all_cpus(self) -> CpuSet:
        return union_all(CpuSet.parse(c) for c in self.node_cpus.values())

    def write(self, root: str) -> str:
        """Write the tree under ``root`` (the fake ``sys_root``) and return ``root``."""
        node_root = os.path.join(root, "devices", "system", "node")
        cpu_root = os.path.join(root, "devices", "system", "cpu")
        os.makedirs(node_root, exist_ok=True)
        os.makedirs(cpu_root, exist_ok=True)
        ids = sorted(self.node_cpus)
        online = CpuSet.parse(self.online) if self.online is not None else self.all_cpus
        for row, nid in zip(self.distances, ids):
            d = os.path.join(node_root, f"node{nid}")
            os.makedirs(d, exist_ok=True)
            _put(os.path.join(d, "cpulist"), self.node_cpus[nid] + "\n")
            _put(os.path.join(d, "distance"), " ".join(str(x) for x in row) + "\n")
            kb = self.memory_bytes.get(nid, 0) // 1024
            _put(os.path.join(d, "meminfo"),
                 f"Node {nid} MemTotal:       {kb} kB\nNode {nid} MemFree:        {kb // 2} kB\n")
        _put(os.path.join(node_root, "online"), str(CpuSet(ids)) + "\n")
        _put(os.path.join(node_root, "possible"), str(CpuSet(ids)) + "\n")
        _put(os.path.join(cpu_root, "online"), str(online) + "\n")
        _put(os.path.join(cpu_root, "possible"), str(self.all_cpus) + "\n")
        offline = self.all_cpus - online
        _put(os.path.join(cpu_root, "offline"), str(offline) + "\n")
        groups = {}
        for g in self.smt:
            gs = CpuSet.parse(g)
            for cpu in gs:
                groups[cpu] = gs
        for cpu in self.all_cpus:
            d = os.path.join(cpu_root, f"cpu{cpu}")
            os.makedirs(d, exist_ok=True)
            if cpu in offline:
                # the kernel removes topology/ of an offline CPU
                _put(os.path.join(d, "online"), "0\n")
                continue
            _put(os.path.join(d, "online"), "1\n")
            t = os.path.join(d, "topology")
            os.makedirs(t, exist_ok=True)
            _put(os.path.join(t, "thread_siblings_list"), str(groups.get(cpu, CpuSet([cpu]))) + "\n")
        return root

    def topology(self, root: str) -> NumaTopology:
        """Write the tree under ``root`` and read it back the way the daemon does."""
        return NumaTopology.from_raw(read_sysfs_topology(self.write(root)))


def _put(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _uniform_distances(n: int, remote: int = 20) -> List[List[int]]:
    return [[10 if a == b else remote for b in range(n)] for a in range(n)]


def kunpeng920() -> FakeTopology:
    """Kunpeng 920 (2 sockets x 2 dies): 4 nodes x 32 CPUs, no SMT, 10/16/32-style distances."""
    return FakeTopology(
        name="kunpeng920-4n-128c",
        node_cpus={0: "0-31", 1: "32-63", 2: "64-95", 3: "96-127"},
        distances=[[10, 16, 32, 33], [16, 10, 25, 32], [32, 25, 10, 16], [33, 32, 16, 10]],
        memory_bytes={i: 128 * GIB for i in range(4)},
    )


def x86_two_socket(cores_per_socket: int = 12) -> FakeTopology:
    """Two sockets with SMT: CPU i and i + 2*cores are siblings; node 0 holds the first
    half of each thread bank (the usual Intel enumeration)."""
    c = cores_per_socket
    total = 2 * c
    return FakeTopology(
        name=f"x86-2s-{2 * total}c-smt",
        node_cpus={0: f"0-{c - 1},{total}-{total + c - 1}", 1: f"{c}-{total - 1},{total + c}-{2 * total - 1}"},
        distances=[[10, 21], [21, 10]],
        memory_bytes={0: 192 * GIB, 1: 192 * GIB},
        smt=[f"{i},{i + total}" for i in range(total)],
    )


def single_node(cpus: int = 2) -> FakeTopology:
    """One node, like the 2-CPU machine the tests run on."""
    return FakeTopology(name=f"1n-{cpus}c", node_cpus={0: f"0-{cpus - 1}"}, distances=[[10]],
                        memory_bytes={0: 4 * GIB})


def two_nodes_over(cpus: Sequence[int]) -> FakeTopology:
    """Two NUMA nodes over real CPUs: the first half of ``cpus`` node 0, the rest node 1 (at
    least two). Over CPUs 0 and 1 it is the machine the e2e tests place pods on (node 0 =
    CPU 0, node 1 = CPU 1, ``2n-2c-e2e``): the cpusets it leads to exist on this machine,
    its memory nodes do not (so memory is not pinned over it)."""
    if len(cpus) < 2:
        raise ValueError("two nodes need two CPUs")
    half = len(cpus) // 2
    name = "2n-2c-e2e" if list(cpus) == [0, 1] else f"2n-{len(cpus)}c"
    return FakeTopology(name=name, node_cpus={0: str(CpuSet(cpus[:half])), 1: str(CpuSet(cpus[half:]))},
                        distances=[[10, 20], [20, 10]], memory_bytes={0: 2 * GIB, 1: 2 * GIB})


def seed_16cpu() -> FakeTopology:
    """The seed's example machine: 4 nodes x 4 CPUs."""
    return FakeTopology(
        name="seed-4n-16c",
        node_cpus={0: "0-3", 1: "4-7", 2: "8-11", 3: "12-15"},
        distances=[[10, 16, 32, 32], [16, 10, 32, 32], [32, 32, 10, 16], [32, 32, 16, 10]],
        memory_bytes={i: 8 * GIB for i in range(4)},
    )


def with_offline_cpus() -> FakeTopology:
    """2 nodes x 8 CPUs with CPUs 5-6 and 12-15 offline (node 1 keeps 8-11 only)."""
    return FakeTopology(
        name="2n-16c-offline",
        node_cpus={0: "0-7", 1: "8-15"},
        distances=[[10, 20], [20, 10]],
        memory_bytes={0: 16 * GIB, 1: 16 * GIB},
        online="0-4,7-11",
    )


def with_cpuless_node() -> FakeTopology:
    """2 nodes x 8 CPUs plus node 2: memory only (CXL / persistent memory), farther away."""
    return FakeTopology(
        name="2n-16c+mem-node",
        node_cpus={0: "0-7", 1: "8-15", 2: ""},
        distances=[[10, 20, 30], [20, 10, 30], [30, 30, 10]],
        memory_bytes={0: 16 * GIB, 1: 16 * GIB, 2: 64 * GIB},
    )


ALL_FIXTURES = (kunpeng920, x86_two_socket, single_node, seed_16cpu, with_offline_cpus, with_cpuless_node)


def write_cpu_manager_state(path: str, policy: str = "static", default_cpuset: str = "",
                            entries: Optional[Dict[str, Dict[str, str]]] = None,
                            checksum: int = 0) -> None:
    """Write a kubelet ``cpu_manager_state`` file the way the kubelet does (temp + rename)."""
    import json
    data = {"policyName": policy, "defaultCpuSet": default_cpuset}
    if entries:
        data["entries"] = entries
    data["checksum"] = checksum
    tmp = path + ".tmp"
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def sibling_groups(spec: FakeTopology) -> Sequence[CpuSet]:
    return [CpuSet.parse(g) for g in spec.smt]
