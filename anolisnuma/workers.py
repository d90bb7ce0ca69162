"""Thread pools whose threads all exist from the start, and a census of the daemon's threads.

A plain ``ThreadPoolExecutor`` starts a thread when work arrives and none is idle. When the
process cannot start one then (its pids cgroup is full, memory is short), ``submit`` raises,
and the work item stays queued anyway, to run whenever a thread does start: a hook call that
failed now would run later, on a call already answered. Any local user who can exhaust the
node's threads could then pick the moment. A :class:`WorkerPool` starts all its threads
with the daemon, so it never needs a new one: whatever exhausts threads later, the hooks
keep theirs, and the daemon's thread count is bounded by construction.
"""

from __future__ import annotations

import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, Iterable

import structlog

log = structlog.get_logger("anolisnuma.workers")

# How long the start of a pool waits for its threads to be running.
PRESTART_TIMEOUT = 30.0


class WorkerPool(ThreadPoolExecutor):
    """A ThreadPoolExecutor of ``size`` threads named ``<name>_<n>``, all started by the
    constructor. A thread that cannot be started is logged (the pool runs with those it
    has: a node that cannot start a handful of threads must still get its runtime)."""

    def __init__(self, size: int, name: str) -> None:
        super().__init__(max_workers=size, thread_name_prefix=name)
        self.name = name
        self.size = size
        self._prestart()

    def _prestart(self) -> None:
        # Each submission finds every started thread blocked on the barrier, so it starts a
        # new one; once all are in, the barrier lets them go idle together.
        barrier = threading.Barrier(self.size + 1)
        try:
            for _ in range(self.size):
                self.submit(barrier.wait, PRESTART_TIMEOUT)
            barrier.wait(PRESTART_TIMEOUT)
        except (RuntimeError, threading.BrokenBarrierError) as e:
            barrier.abort()   # the threads that did start go idle
            log.error("worker pool started short of threads", pool=self.name, wanted=self.size,
                      started=self.threads, error=repr(e))

    @property
    def threads(self) -> int:
        return len(self._threads)

    def status(self) -> Dict[str, int]:
        return {"threads": self.threads, "size": self.size}


_NUMBERED = re.compile(r"_\d+$")


def census(pools: Iterable[WorkerPool] = ()) -> Dict[str, Any]:
    """The process's threads: how many the kernel counts (every thread, Python's or not),
    Python's by name (a pool's numbered threads counted under the pool's name), the others
    by the name the kernel has for them (``native``: grpc's C core runs ``grpc_global_tim``,
    ``event_engine`` and ``lifeguard`` threads while a channel to containerd is open), and
    each pool's threads against its size."""
    by_name: Dict[str, int] = {}
    python_tids = set()
    for t in threading.enumerate():
        name = _NUMBERED.sub("", t.name)
        by_name[name] = by_name.get(name, 0) + 1
        python_tids.add(t.native_id)
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        tids = []
    native: Dict[str, int] = {}
    for tid in tids:
        if int(tid) in python_tids:
            continue
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                comm = f.read().strip()
        except OSError:   # ended meanwhile
            continue
        native[comm] = native.get(comm, 0) + 1
    total = len(tids) or sum(by_name.values())
    return {"total": total, "by_name": dict(sorted(by_name.items())), "native": dict(sorted(native.items())),
            "pools": {p.name: p.status() for p in pools}}


__all__ = ["WorkerPool", "census"]
