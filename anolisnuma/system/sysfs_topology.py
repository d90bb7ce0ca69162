"""Read the NUMA topology from a sysfs tree.

Files read, all under the configured ``sys_root`` (``/sys`` on a real host):

- ``devices/system/node/node<N>/cpulist``  CPUs of node N (empty for a memory-only node)
- ``devices/system/node/node<N>/distance`` distances from N to every node, in node id order
- ``devices/system/node/node<N>/meminfo``  ``Node N MemTotal: <kB> kB``
- ``devices/system/cpu/online``            the online CPUs
- ``devices/system/cpu/cpu<N>/topology/thread_siblings_list``  SMT siblings of CPU N

This module only reads; the strings are returned as they are and validated by
:meth:`anolisnuma.policies.numa.topology.NumaTopology.from_raw`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional

_NODE_DIR = re.compile(r"^node([0-9]+)$")
_CPU_DIR = re.compile(r"^cpu([0-9]+)$")
_MEMTOTAL = re.compile(r"MemTotal:\s*([0-9]+)\s*kB")
_MAX_FILE = 1 << 20


class SysfsTopologyError(OSError):
    """The sysfs tree could not be read at all."""


@dataclass
class RawNode:
    id: int
    cpulist: str = ""
    distances: List[int] = field(default_factory=list)
    memory_bytes: int = 0


@dataclass
class RawTopology:
    nodes: List[RawNode]
    online: Optional[str]              # None when devices/system/cpu/online is missing
    siblings: Dict[int, str]           # cpu -> thread_siblings_list
    problems: List[str] = field(default_factory=list)


def read_sysfs_topology(sys_root: str) -> RawTopology:
    """What sysfs under ``sys_root`` says about NUMA nodes, online CPUs and SMT siblings.

    Missing optional files are recorded in ``problems`` rather than raised; raises
    :class:`SysfsTopologyError` only when neither the node nor the CPU directory exists.
    """
    node_root = os.path.join(sys_root, "devices", "system", "node")
    cpu_root = os.path.join(sys_root, "devices", "system", "cpu")
    if not os.path.isdir(node_root) and not os.path.isdir(cpu_root):
        raise SysfsTopologyError(f"no devices/system/node or devices/system/cpu under {sys_root}")
    problems: List[str] = []
    nodes: List[RawNode] = []
    for name in _listdir(node_root):
        m = _NODE_DIR.match(name)
        if not m:
            continue
        nid = int(m.group(1))
        base = os.path.join(node_root, name)
        cpulist = _read(os.path.join(base, "cpulist"))
        if cpulist is None:
            problems.append(f"{name}/cpulist missing; node has no CPUs")
            cpulist = ""
        distances: List[int] = []
        text = _read(os.path.join(base, "distance"))
        if text is not None:
            try:
                distances = [int(x) for x in text.split()]
            except ValueError:
                problems.append(f"{name}/distance is not a list of numbers: {text.strip()[:80]!r}")
        memory = 0
        text = _read(os.path.join(base, "meminfo"))
        if text is not None:
            mm = _MEMTOTAL.search(text)
            if mm:
                memory = int(mm.group(1)) * 1024
        nodes.append(RawNode(id=nid, cpulist=cpulist.strip(), distances=distances, memory_bytes=memory))
    nodes.sort(key=lambda n: n.id)
    online = _read(os.path.join(cpu_root, "online"))
    siblings: Dict[int, str] = {}
    for name in _listdir(cpu_root):
        m = _CPU_DIR.match(name)
        if not m:
            continue
        text = _read(os.path.join(cpu_root, name, "topology", "thread_siblings_list"))
        if text is not None:
            siblings[int(m.group(1))] = text.strip()
    return RawTopology(nodes=nodes, online=online.strip() if online is not None else None,
                       siblings=siblings, problems=problems)


def _listdir(path: str) -> List[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read(_MAX_FILE)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError:
        return None
