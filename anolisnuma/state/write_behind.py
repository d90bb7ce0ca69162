"""Write-behind persistence of one state file: changes are marked, one thread writes.

The caller marks a change (:meth:`WriteBehind.mark`, cheap, under its own lock) and goes
on; the writer thread takes a snapshot under the caller's lock and writes it outside it
(the write's fsync is what the kubelet's calls must not wait for). Marks that come while a
write runs are one next write: the newest snapshot always wins. A write that fails is
logged once (and once more when writing works again) and retried every
:data:`RETRY_SECONDS` while it fails.

Until the thread is started, and once it is stopped, :meth:`WriteBehind.mark` writes at
once in the caller's thread (the start-up resync, a process without the daemon's loops,
anything after the daemon's shutdown flush): then nothing marked is ever left unwritten.

Why losing the last few changes to a crash is safe for the NUMA ledger (what makes a
placement durable): see docs/restarts.md, "What a crash can lose".
"""

from __future__ import annotations

import threading
from typing import Any, Callable, ContextManager, Generic, TypeVar

import structlog

from anolisnuma.controller import Controller

log = structlog.get_logger("anolisnuma.state")

T = TypeVar("T")

RETRY_SECONDS = 1.0   # a write that failed (disk full, read-only) is tried again this often
# The changes of this long are one write (a pod start changes the ledger two or three times,
# and pods start in bursts): the writer wakes and fsyncs at most every two seconds, not once
# per change. Each write costs its writer ~1 ms of CPU woken cold (temp file, fsync, rename,
# directory fsync): at half a second that was a fifth of a pod start's CPU in NRI mode
# (scripts/bench_nri.py). What a crash can lose by it: docs/restarts.md.
GATHER_SECONDS = 2.0


class WriteBehind(Controller, Generic[T]):
    """``WriteBehind(name, lock, snapshot, write, path, what)``: ``snapshot()`` is called
    with ``lock`` held and returns what ``write(snapshot)`` puts on disk (without the lock);
    ``write`` raises OSError when it cannot (``what`` and ``path`` name the file in the log
    lines). ``lock`` must be reentrant when :meth:`mark` is called under it: without the
    thread, :meth:`mark` takes it again to write.
    A :class:`~anolisnuma.controller.Controller`: the daemon starts and stops it with its
    other loops; :meth:`stop` writes what is still marked before it returns."""

    interval = 0.0
    gather_seconds = GATHER_SECONDS

    def __init__(self, name: str, lock: ContextManager[Any], snapshot: Callable[[], T],
                 write: Callable[[T], None], path: str, what: str = "state") -> None:
        super().__init__()
        self.name = name
        self.path = path
        self.what = what
        self._lock = lock                    # the owner's: snapshots see a consistent state
        self._snapshot = snapshot
        self._write = write
        self._write_lock = threading.Lock()  # one write at a time, in the order of their snapshots
        self._versions = threading.Condition()
        self._marked = 0      # changes marked so far
        self._tried = 0       # the newest change a finished write (good or failed) covered
        self._written = 0     # the newest change on disk
        self.failed = False   # the last write failed (logged)
        self.writes = 0
        self.write_errors = 0

    # ------------------------------------------------------------------ the owner's side
    def mark(self) -> None:
        """A change to write. Returns at once while the writer thread runs; otherwise
        writes now (a failure is logged, never raised)."""
        with self._versions:
            self._marked += 1
        if self.running:
            self.wake()
        else:
            self._write_now()

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every change marked before the call was written (in this thread when
        the writer thread does not run). True when it is on disk; False when the write
        failed (logged; retried) or ``timeout`` seconds passed first."""
        with self._versions:
            target = self._marked
            if self._written >= target:
                return True
        if not self.running:
            self._write_now()
        else:
            self.hurry()
            with self._versions:
                self._versions.wait_for(lambda: self._tried >= target or not self.running, timeout)
            if self._tried < target and not self.running:   # stopped meanwhile: its close wrote, or we do
                self._write_now()
        with self._versions:
            return self._written >= target

    @property
    def dirty(self) -> bool:
        """Changes marked that are not on disk yet."""
        with self._versions:
            return self._written < self._marked

    # ------------------------------------------------------------------ the thread
    def run_once(self) -> None:
        if self.dirty:
            self._write_now()

    def wait_seconds(self) -> float:
        return RETRY_SECONDS if self.failed and self.dirty else 0.0

    def closed(self) -> None:
        """The loop ended (the daemon stops): what is still marked is written now."""
        if self.dirty:
            self._write_now()

    def counts(self) -> dict:
        return {"writes": self.writes, "write_errors": self.write_errors, "dirty": int(self.dirty)}

    def _write_now(self) -> None:
        # Order of locks: the owner's, then the write lock (as a caller of mark() holding
        # the owner's lock takes them), so that a snapshot and the write lock are taken
        # together and writes land in the order of their snapshots; the owner's lock is let
        # go before the write itself.
        with self._lock:
            with self._versions:
                version = self._marked     # (read before the snapshot: it covers at least this)
            self._write_lock.acquire()
            try:
                data = self._snapshot()
            except BaseException:
                self._write_lock.release()
                raise
        try:
            try:
                self._write(data)
            except OSError as e:
                self.write_errors += 1
                if not self.failed:
                    log.error(f"cannot save {self.what}; going on in memory", path=self.path, error=str(e),
                              retry_seconds=RETRY_SECONDS)
                self.failed = True
                ok = False
            else:
                self.writes += 1
                if self.failed:
                    log.info(f"{self.what} saved again", path=self.path)
                self.failed = False
                ok = True
        finally:
            self._write_lock.release()
        with self._versions:
            self._tried = max(self._tried, version)
            if ok:
                self._written = max(self._written, version)
            self._versions.notify_all()
