"""Persistence of NUMA allocations: which pod is placed where, with what demand.

One JSON file, ``<state_dir>/numa.json``, rewritten atomically (temp file, fsync, rename,
fsync of the directory) by the placement service's writer thread
(:mod:`anolisnuma.state.write_behind`) behind the changes. After a crash or ``kill -9`` it
holds one whole set of allocations, maybe without the last changes; the start-up resync with
containerd repairs the difference (docs/restarts.md, "What a crash can lose"). Records use plain
strings and numbers (CPU lists in the kernel format) so this layer needs nothing above it.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from anolisnuma.state.persist import atomic_write_bytes, atomic_write_json, load_json_state
from anolisnuma.state.records import decode, decode_list

NUMA_STATE_FILE = "numa.json"
FORMAT_VERSION = 1


@dataclass
class ContainerShareRecord:
    name: str
    millicpu: int = 0
    memory_bytes: int = 0


@dataclass
class AllocationRecord:
    pod_uid: str
    namespace: str = ""
    name: str = ""
    sandbox_id: str = ""
    nodes: List[int] = field(default_factory=list)
    home: str = ""            # CPU list the pod may use before the shared pool is applied
    mems: str = ""            # memory node list ("" = memory not pinned)
    pod_millicpu: int = 0     # pod-level demand the kubelet declared (0 = unknown)
    pod_memory_bytes: int = 0
    containers: Dict[str, ContainerShareRecord] = field(default_factory=dict)   # by container id
    pending: Dict[str, ContainerShareRecord] = field(default_factory=dict)      # by container name
    source: str = "balance"

    def to_json(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> "AllocationRecord":
        """Raises ValueError naming the field when ``data`` is not an allocation record."""
        return decode(cls, data)


class NumaStateFile:
    """``<state_dir>/numa.json``: load once at start, save (whole) after changes."""

    def __init__(self, state_dir: str, filename: str = NUMA_STATE_FILE) -> None:
        self.path = os.path.join(state_dir, filename)

    def load(self) -> Optional[List[AllocationRecord]]:
        """The saved allocations; None when there is no file or it was unusable (moved
        aside with a log line; the caller rebuilds from containerd)."""
        return load_json_state(self.path, FORMAT_VERSION,
                               lambda data: decode_list(AllocationRecord, data.get("allocations"), "allocations"))

    def save(self, records: List[AllocationRecord]) -> None:
        """Replace the file atomically and durably (raises OSError when it cannot)."""
        self.save_json([r.to_json() for r in sorted(records, key=lambda r: r.pod_uid)])

    def save_json(self, allocations: List[Dict[str, Any]]) -> None:
        """Like :meth:`save`, from records already in JSON form (``AllocationRecord.to_json``)."""
        atomic_write_json(self.path, {"version": FORMAT_VERSION, "allocations": allocations})

    def save_encoded(self, allocations: List[str]) -> None:
        """Like :meth:`save`, from records already encoded as JSON texts. The caller keeps
        the texts of unchanged allocations, so nothing is encoded twice."""
        text = '{"allocations":[' + ",".join(allocations) + '],"version":%d}' % FORMAT_VERSION
        atomic_write_bytes(self.path, text.encode("utf-8"))
