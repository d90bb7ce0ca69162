"""``QosReconciler``: keeping the kernel at the QoS values decided for each pod.

A periodic pass (:meth:`QosReconciler.run_once`) over the pods of the QoS service
(:class:`~anolisnuma.qos.service.QosService`, which decides, keeps and writes) that has it
re-apply drifted values, re-create resctrl groups and re-sweep container threads into them
(threads started later by ``exec`` do not inherit the group), and forgets pods whose
cgroup is gone.

A pass over pods where nothing drifted costs one small read per managed file and one
``tasks`` read per container and per resctrl group; no writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Set

import structlog

from anolisnuma.controller import Controller

_LOG = "anolisnuma.qos"


@dataclass
class ReconcileCounts:
    """What one reconciler pass did."""

    pods: int = 0
    checked: int = 0          # files read and compared
    rewritten: int = 0        # files written (or that a dry run would write)
    tasks_moved: int = 0
    forgotten: int = 0
    errors: int = 0


class QosReconciler(Controller):
    """``QosReconciler(service, interval_seconds, log=None)``: periodic re-apply over every
    pod of the QoS service; see the module docstring."""

    name = "qos-reconcile"

    def __init__(self, service: Any, interval_seconds: float, log: Any = None) -> None:
        super().__init__()
        self.service = service   # the QosService (duck-typed, as the NUMA loops take theirs)
        self.interval = interval_seconds
        self.log = log if log is not None else structlog.get_logger(_LOG)
        self.last: Optional[ReconcileCounts] = None
        self.total = ReconcileCounts()     # the passes' counts summed (metrics)

    def run_once(self) -> ReconcileCounts:
        counts = ReconcileCounts()
        s = self.service
        report = s.reapply_globals()
        counts.checked += report.checked
        counts.rewritten += report.written
        counts.errors += len(report.errors)
        members: Dict[str, Set[str]] = {}   # each resctrl group's threads, read once a pass
        for pod, containers in s.snapshot():
            counts.pods += 1
            r = s.reapply_pod(pod)
            counts.checked += r.checked
            counts.rewritten += r.written
            counts.errors += len(r.errors)
            if r.gone:
                s.forget_pod(pod)
                counts.forgotten += 1
                self.log.info("pod cgroup gone; pod forgotten", pod=pod.ref, path=pod.cgroup.rel)
                continue
            for ctr in containers:
                r = s.reapply_container(pod, ctr)
                counts.checked += r.checked
                counts.rewritten += r.written
                counts.errors += len(r.errors)
                if r.gone:
                    if ctr.applied:   # it existed and is gone now: stopped and removed
                        s.forget_container(ctr.container_id)
                    continue
                counts.tasks_moved += s.sweep(pod, ctr, members)
        self.last = counts
        self._add_to_total(counts)
        return counts

    def _add_to_total(self, counts: ReconcileCounts) -> None:
        t = self.total
        self.total = ReconcileCounts(
            pods=counts.pods, checked=t.checked + counts.checked, rewritten=t.rewritten + counts.rewritten,
            tasks_moved=t.tasks_moved + counts.tasks_moved, forgotten=t.forgotten + counts.forgotten,
            errors=t.errors + counts.errors)

    # ------------------------------------------------------------------ controller
    def counts(self) -> Dict[str, int]:
        t = self.total
        return {"checked": t.checked, "rewritten": t.rewritten, "tasks_moved": t.tasks_moved,
                "forgotten": t.forgotten, "write_errors": t.errors}

    def passed(self, c: ReconcileCounts) -> None:
        level = self.log.info if (c.rewritten or c.forgotten or c.tasks_moved or c.errors) else self.log.debug
        level("qos reconcile pass", pods=c.pods, checked=c.checked, rewritten=c.rewritten,
              tasks_moved=c.tasks_moved, forgotten=c.forgotten, errors=c.errors,
              ms=round(self.last_pass_seconds * 1000, 2))
