"""Applies NUMA placements that no kubelet call will carry to containerd.

Containers adopted at start-up without our pinning, or whose edited CreateContainer never
reached containerd, are listed by ``PlacementService.pending_updates()``; this loop sends
each an UpdateContainerResources with the cpuset the placement wants (the other resources
are left as they are: containerd only changes the fields that are set). Live moves
(``PlacementService.move``, traffic affinity) are applied the same way; a move whose
re-pin fails is rolled back by the service (``apply_failed``), other failures are retried,
but a container containerd answers NOT_FOUND for is gone for good (IDs are never re-used):
its share is released at once, as its RemoveContainer would have, rather than tried and
logged every pass until the resync notices. A client that says it is not ready
(``client.ready()`` false: the NRI plugin not registered yet) is waited for: the pass leaves
everything pending, and the client wakes the loop when it is.
``run_once`` may be called from another thread (the affinity controller applies its moves
at once): passes are serialized.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, Optional

import structlog

from anolisnuma.controller import Controller

log = structlog.get_logger("anolisnuma.numa")


class CpusetRepinner(Controller):
    """``CpusetRepinner(placement, client, applied=None)``: ``placement`` is the
    :class:`~anolisnuma.placement.service.PlacementService`, ``client`` a CriClient,
    ``applied(container_id, cpus, mems)`` told of each cpuset containerd took."""

    name = "numa-repin"
    run_at_start = True   # placements adopted at start-up are applied before the resync is done

    def __init__(self, placement: Any, client: Any, interval_seconds: float = 5.0,
                 applied: Optional[Callable[[str, str, str], None]] = None) -> None:
        super().__init__()
        self.placement = placement
        self.client = client
        self.applied = applied
        self.interval = interval_seconds
        self._pass = threading.Lock()
        self.applied_total = 0   # placements applied and refused, summed (metrics)
        self.failed_total = 0
        self.gone_total = 0      # containers found gone (NOT_FOUND) and released
        self.deferred_total = 0   # passes that waited for the client (NRI not registered yet)

    def run_once(self) -> int:
        """Apply every pending placement; returns how many were applied."""
        with self._pass:
            return self._run_once()

    def _run_once(self) -> int:
        from cri_proto import api_pb2

        ready = getattr(self.client, "ready", None)
        if ready is not None and not ready():
            pending = len(self.placement.pending_updates())
            if pending:
                self.deferred_total += 1
                log.info("NUMA re-pins wait for the NRI plugin's registration", pending=pending)
            return 0
        applied = 0
        todo = list(self.placement.pending_updates())
        failed_now = set()
        while todo:
            container_id, cpus, mems = todo.pop(0)
            res = api_pb2.LinuxContainerResources(cpuset_cpus=cpus, cpuset_mems=mems)
            try:
                self.client.update_container_resources(container_id, res)
            except Exception as e:  # gone, or containerd down: try again next round
                if _not_found(e):
                    self.gone_total += 1
                    nodes = self.placement.release_container(container_id)
                    log.info("container gone before its NUMA re-pin; its share released", container_id=container_id,
                             nodes=list(nodes) if nodes is not None else None)
                    continue
                self.failed_total += 1
                error = str(e).splitlines()[0][:300] if str(e) else repr(e)
                log.warning("cannot apply NUMA placement", container_id=container_id, cpus=cpus,
                            mems=mems, error=error)
                failed_now.add(container_id)
                if self.placement.apply_failed(container_id, error):
                    # a live move was rolled back: its other containers are no longer to be
                    # moved, and those already moved are to be moved back
                    todo = [u for u in self.placement.pending_updates() if u[0] not in failed_now]
                continue
            if self.applied is not None:
                self.applied(container_id, cpus, mems)
            self.placement.mark_applied(container_id, cpus, mems)
            applied += 1
            log.info("NUMA placement applied to a running container", container_id=container_id,
                     cpus=cpus, mems=mems)
        self.applied_total += applied
        return applied

    def counts(self) -> Dict[str, int]:
        return {"applied": self.applied_total, "failed": self.failed_total, "gone": self.gone_total,
                "deferred": self.deferred_total}

    def closed(self) -> None:
        self.client.close()


def _not_found(error: BaseException) -> bool:
    """containerd said the container does not exist (a gRPC NOT_FOUND)."""
    code = getattr(error, "code", None)
    try:
        return callable(code) and getattr(code(), "name", "") == "NOT_FOUND"
    except Exception:
        return False
