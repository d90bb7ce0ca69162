"""Persistence of NUMA allocations: which pod is placed where, with what demand.

One JSON file, ``<state_dir>/numa.json``, rewritten atomically (temp file, fsync, rename,
fsync of the directory) on every change, before the edited request is forwarded to
containerd. After a crash or ``kill -9`` it holds either the old or the new set of
allocations; the start-up resync with containerd repairs the difference. Records use plain
strings and numbers (CPU lists in the kernel format) so this layer needs nothing above it.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import structlog

from anolisnuma.state.persist import atomic_write_bytes, atomic_write_json, load_json_state

log = structlog.get_logger("anolisnuma.numa")

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
    def from_json(cls, data: Dict[str, Any]) -> "AllocationRecord":
        """Raises ValueError/TypeError when ``data`` is not an allocation record."""
        if not isinstance(data, dict) or not isinstance(data.get("pod_uid"), str):
            raise ValueError("not an allocation record")
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in names}
        for key in ("containers", "pending"):
            raw = kwargs.get(key) or {}
            if not isinstance(raw, dict):
                raise ValueError(f"{key} is not an object")
            kwargs[key] = {str(k): _share(v) for k, v in raw.items()}
        nodes = kwargs.get("nodes") or []
        if not isinstance(nodes, list) or not all(isinstance(n, int) and not isinstance(n, bool) for n in nodes):
            raise ValueError("nodes is not a list of integers")
        for key in ("namespace", "name", "sandbox_id", "home", "mems", "source"):
            if key in kwargs and not isinstance(kwargs[key], str):
                raise ValueError(f"{key} is not a string")
        for key in ("pod_millicpu", "pod_memory_bytes"):
            if key in kwargs and (not isinstance(kwargs[key], int) or isinstance(kwargs[key], bool)):
                raise ValueError(f"{key} is not an integer")
        return cls(**kwargs)


def _share(data: Any) -> ContainerShareRecord:
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        raise ValueError("not a container share record")
    millicpu = data.get("millicpu", 0)
    memory = data.get("memory_bytes", 0)
    if not isinstance(millicpu, int) or not isinstance(memory, int):
        raise ValueError("container share demand is not an integer")
    return ContainerShareRecord(name=data["name"], millicpu=millicpu, memory_bytes=memory)


class NumaStateFile:
    """``<state_dir>/numa.json``: load once at start, save on every change."""

    def __init__(self, state_dir: str, filename: str = NUMA_STATE_FILE) -> None:
        self.path = os.path.join(state_dir, filename)

    def load(self) -> Optional[List[AllocationRecord]]:
        """The saved allocations; None when there is no file or it was unusable (a corrupt
        file is moved aside with a log line; the caller rebuilds from containerd)."""
        data = load_json_state(self.path)
        if data is None:
            return None
        try:
            if not isinstance(data, dict) or data.get("version") != FORMAT_VERSION:
                raise ValueError(f"unknown format version {data.get('version') if isinstance(data, dict) else None!r}")
            items = data.get("allocations")
            if not isinstance(items, list):
                raise ValueError("allocations is not a list")
            return [AllocationRecord.from_json(item) for item in items]
        except (ValueError, TypeError) as e:
            aside = f"{self.path}.corrupt-{int(time.time())}"
            try:
                os.replace(self.path, aside)
            except OSError:
                aside = "(could not move it aside)"
            log.error("NUMA state file has unexpected content; moved aside, rebuilding from containerd",
                      path=self.path, moved_to=aside, error=str(e))
            return None

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
