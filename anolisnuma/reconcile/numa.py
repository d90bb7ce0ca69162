"""Applies NUMA placements that no kubelet call will carry to containerd.

Containers adopted at start-up without our pinning, or whose edited CreateContainer never
reached containerd, are listed by ``NumaHook.pending_updates()``; this loop sends each an
UpdateContainerResources with the cpuset the placement wants (the other resources are
left as they are: containerd only changes the fields that are set).
"""

from __future__ import annotations

import threading
from typing import Any, Optional

import structlog

log = structlog.get_logger("anolisnuma.numa")


class CpusetRepinner:
    def __init__(self, hook: Any, client: Any, interval_seconds: float = 5.0) -> None:
        self.hook = hook
        self.client = client
        self.interval = interval_seconds
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.runs = 0       # passes made; placements applied and refused, summed (metrics)
        self.applied_total = 0
        self.failed_total = 0

    def run_once(self) -> int:
        """Apply every pending placement; returns how many were applied."""
        from cri_proto import api_pb2

        applied = 0
        for container_id, cpus, mems in self.hook.pending_updates():
            res = api_pb2.LinuxContainerResources(cpuset_cpus=cpus, cpuset_mems=mems)
            try:
                self.client.update_container_resources(container_id, res)
            except Exception as e:  # gone, or containerd down: try again next round
                self.failed_total += 1
                log.warning("cannot apply NUMA placement", container_id=container_id, cpus=cpus,
                            mems=mems, error=str(e).splitlines()[0][:300] if str(e) else repr(e))
                continue
            self.hook.mark_applied(container_id)
            applied += 1
            log.info("NUMA placement applied to a running container", container_id=container_id,
                     cpus=cpus, mems=mems)
        self.runs += 1
        self.applied_total += applied
        return applied

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="numa-repin", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception as e:
                log.error("NUMA repin pass failed", error=repr(e))
            self._stop.wait(self.interval)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.client.close()
