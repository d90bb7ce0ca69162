"""The in-memory store of pods and containers, persisted atomically on every change.

Keyed by containerd's sandbox and container IDs, because the ID-only calls (StartContainer,
UpdateContainerResources, Stop*/Remove*) are only meaningful with what RunPodSandbox and
CreateContainer told us. Writes go to disk from one background loop (:class:`StoreWriter`,
woken by every change) so the relay never waits for fsync; the newest snapshot always wins,
and a ``kill -9`` loses at most the last change, which the resync with containerd restores.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from typing import Any, Dict, List, Optional, Tuple

import structlog

from anolisnuma.controller import Controller
from anolisnuma.state.persist import StateFormatTooNew, atomic_write_bytes, load_json_state
from anolisnuma.state.records import ContainerRecord, PodRecord, decode_list
from anolisnuma.state.write_behind import GATHER_SECONDS

log = structlog.get_logger("anolisnuma.state")

STORE_FILE = "store.json"
FORMAT_VERSION = 1


class Store:
    def __init__(self, state_dir: Optional[str] = None) -> None:
        self._lock = threading.Lock()
        self._pods: Dict[str, PodRecord] = {}
        self._containers: Dict[str, ContainerRecord] = {}
        # Each record's JSON text, made when it changes: a snapshot is then one join, so
        # the writer thread holds the GIL for microseconds even with thousands of pods.
        self._pod_json: Dict[str, str] = {}
        self._container_json: Dict[str, str] = {}
        self._path = os.path.join(state_dir, STORE_FILE) if state_dir else None
        self._saved = threading.Condition()
        self._version = 0
        self._saved_version = 0
        self.writer = StoreWriter(self)

    # ---------------------------------------------------------------- queries
    def pod(self, sandbox_id: str) -> Optional[PodRecord]:
        return self._pods.get(sandbox_id)

    def container(self, container_id: str) -> Optional[ContainerRecord]:
        return self._containers.get(container_id)

    def pods(self) -> List[PodRecord]:
        with self._lock:
            return list(self._pods.values())

    def containers(self, sandbox_id: Optional[str] = None) -> List[ContainerRecord]:
        with self._lock:
            return [c for c in self._containers.values() if sandbox_id is None or c.sandbox_id == sandbox_id]

    # ---------------------------------------------------------------- changes
    def put_pod(self, pod: PodRecord) -> None:
        text = _encode(pod.to_json())
        with self._lock:
            self._pods[pod.sandbox_id] = pod
            self._pod_json[pod.sandbox_id] = text
        self._changed()

    def put_container(self, container: ContainerRecord) -> None:
        text = _encode(container.to_json())
        with self._lock:
            self._containers[container.container_id] = container
            self._container_json[container.container_id] = text
        self._changed()

    def set_cpuset(self, container_id: str, cpus: str, mems: str) -> None:
        """A cpuset the daemon itself applied to a known container (its re-pins): the
        record must say what containerd has, or a later resync would see drift that is
        not there (and miss drift that is)."""
        with self._lock:
            old = self._containers.get(container_id)
        if old is None:
            return
        res = dataclasses.replace(old.resources, cpuset_cpus=cpus, cpuset_mems=mems or old.resources.cpuset_mems)
        self.put_container(dataclasses.replace(old, resources=res))

    def remove_container(self, container_id: str) -> Optional[ContainerRecord]:
        with self._lock:
            gone = self._containers.pop(container_id, None)
            self._container_json.pop(container_id, None)
        if gone is not None:
            self._changed()
        return gone

    def remove_pod(self, sandbox_id: str) -> Optional[PodRecord]:
        with self._lock:
            gone = self._pods.pop(sandbox_id, None)
            self._pod_json.pop(sandbox_id, None)
            for cid in [c.container_id for c in self._containers.values() if c.sandbox_id == sandbox_id]:
                del self._containers[cid]
                self._container_json.pop(cid, None)
        if gone is not None:
            self._changed()
        return gone

    # ---------------------------------------------------------------- persistence
    def load(self) -> bool:
        """Read the state file; False when there was none or it was unusable (moved aside
        with a log line: the store starts empty and the start-up resync fills it)."""
        if not self._path:
            return False
        try:
            loaded = load_json_state(self._path, FORMAT_VERSION, _decode)
        except StateFormatTooNew as e:
            # Written by a newer anolisnuma: never overwritten by this one, which keeps its
            # records in memory (the start-up resync fills them from containerd).
            log.error("state file of a newer anolisnuma; not read and never written by this one: "
                      "pod records are kept in memory only", path=self._path, error=str(e))
            self._path = None
            return False
        if loaded is None:
            return False
        pods, containers = loaded
        with self._lock:
            self._pods = {p.sandbox_id: p for p in pods}
            self._containers = {c.container_id: c for c in containers}
            self._pod_json = {p.sandbox_id: _encode(p.to_json()) for p in pods}
            self._container_json = {c.container_id: _encode(c.to_json()) for c in containers}
        return True

    def start(self) -> None:
        """Start the writer loop (the daemon registers it with its controllers)."""
        if self._path:
            self.writer.start()

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until everything changed so far is on disk (or written synchronously when
        the writer thread is not running)."""
        if not self._path:
            return True
        if not self.writer.running:
            self._write_once()
            return True
        with self._saved:
            target = self._version
        self.writer.hurry()
        with self._saved:
            return self._saved.wait_for(lambda: self._saved_version >= target, timeout)

    @property
    def dirty(self) -> bool:
        """Changes not on disk yet (its writer gathers them: see StoreWriter)."""
        with self._saved:
            return bool(self._path) and self._saved_version < self._version

    def close(self) -> None:
        self.flush()
        self.writer.stop()

    def _changed(self) -> None:
        with self._saved:
            self._version += 1
        self.writer.wake()

    def _snapshot(self) -> bytes:
        with self._lock:
            pods = ",".join(self._pod_json.values())
            containers = ",".join(self._container_json.values())
        return ('{"containers":[%s],"pods":[%s],"version":%d}' % (containers, pods, FORMAT_VERSION)).encode()

    def write(self) -> None:
        """Write the snapshot now (a store without a state directory has nothing to write)."""
        if self._path:
            self._write_once()

    def _write_once(self) -> None:
        with self._saved:
            version = self._version
        try:
            atomic_write_bytes(self._path, self._snapshot())
        except OSError as e:
            log.error("cannot write the state file", path=self._path, error=str(e))
        with self._saved:
            self._saved_version = max(self._saved_version, version)
            self._saved.notify_all()


class StoreWriter(Controller):
    """Writes the store's snapshot whenever it changed (woken by each change; the changes
    of ``gather_seconds`` are one write: the newest snapshot wins)."""

    name = "store-writer"
    interval = 0.0
    gather_seconds = GATHER_SECONDS

    def __init__(self, store: Store) -> None:
        super().__init__()
        self.store = store

    def run_once(self) -> None:
        self.store.write()

    def counts(self) -> dict:
        return {"dirty": int(self.store.dirty)}


def _decode(data: Dict[str, Any]) -> Tuple[List[PodRecord], List[ContainerRecord]]:
    return (decode_list(PodRecord, data.get("pods", []), "pods"),
            decode_list(ContainerRecord, data.get("containers", []), "containers"))


def _encode(record: dict) -> str:
    return json.dumps(record, separators=(",", ":"), sort_keys=True)
