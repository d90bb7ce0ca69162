"""The log writer: finished lines from any thread to the destinations, on a thread of its own.

Callers append to a bounded :class:`LineQueue` (a deque: no lock, no wake-up unless the
writer sleeps); the :class:`Writer` thread takes what has queued up and writes it in one
write per destination. Lines that do not fit are dropped and counted, never waited for:
the caller is the event loop that answers the kubelet and containerd.
"""

from __future__ import annotations

import collections
import json
import os
import threading
import time
from typing import Any, List, Optional, Sequence, Tuple

# A missed wake-up (there is none by construction, see LineQueue.take) would cost at most this.
WAKE_SECONDS = 1.0
# After a batch the writer lets lines gather this long before the next: one wake-up of this
# thread per batch rather than per line, whose GIL hand-off and context switch cost the
# event loop more than rendering the line (issue 34). Woken cold, a batch costs this thread
# ~0.3 ms of CPU: at 0.1 s it woke once per pod start in NRI mode, at 0.25 s a line is at
# most a quarter of a second late and a pod start pays a third of that. A flush or a stop
# does not wait for it.
LINGER_SECONDS = 0.25
DROPPED_MESSAGE = "log lines dropped: the log writer fell behind"

_second: Tuple[int, str] = (-1, "")


def iso_utc(when: Optional[float] = None) -> str:
    """``when`` (default: now) as ``2026-12-05T13:23:28.123456Z``, the format of the lines'
    ``timestamp`` since the first release (structlog's ISO UTC stamp); the date and time
    part is made once a second."""
    global _second
    if when is None:
        when = time.time()
    sec = int(when)
    cached = _second
    if cached[0] != sec:
        cached = _second = (sec, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec)))
    return f"{cached[1]}.{int((when - sec) * 1e6):06d}Z"


def dropped_line(n: int) -> str:
    return json.dumps({"timestamp": iso_utc(), "level": "warning", "logger": "anolisnuma.logsetup",
                       "message": DROPPED_MESSAGE, "dropped": n})


class _Control:
    """A queued instruction for the writer (never dropped): flush, reopen, stop."""

    __slots__ = ("kind", "done")

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.done = threading.Event()


class LineQueue:
    """Finished lines waiting for the writer, at most ``limit`` (a few more when threads
    race past the check together); more are dropped and counted, and the count goes out
    as a line of its own before the next line that fits."""

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self._items: "collections.deque[Any]" = collections.deque()
        self._wake = threading.Event()
        self._sleeping = False
        self._closed = False
        self._control = False     # a control item was queued since the writer last took
        self._drop_lock = threading.Lock()
        self.dropped = 0          # not yet reported
        self.dropped_total = 0

    def put(self, line: str) -> None:
        """Queue ``line`` or drop it; never waits. Nothing once closed."""
        if self._closed:
            return
        items = self._items
        if len(items) >= self.limit:
            with self._drop_lock:
                self.dropped += 1
                self.dropped_total += 1
            return
        if self.dropped:
            n = self._take_dropped()
            if n:
                items.append(dropped_line(n))
        items.append(line)
        if self._sleeping:
            self._wake.set()

    def control(self, item: _Control) -> None:
        self._items.append(item)
        self._control = True
        self._wake.set()

    def close(self) -> None:
        """Take no more lines; the drops not yet reported are reported now."""
        self._closed = True
        n = self._take_dropped()
        if n:
            self._items.append(dropped_line(n))

    def _take_dropped(self) -> int:
        with self._drop_lock:
            n, self.dropped = self.dropped, 0
        return n

    def take(self) -> List[Any]:
        """(The writer's) everything queued, waiting until there is something.

        No lost wake-up: the writer says it sleeps before it looks at the queue one last
        time, and a caller looks at that flag after it appended; whichever comes second
        sees the other's step."""
        items = self._items
        while not items:
            self._wake.clear()
            self._sleeping = True
            if not items:
                self._wake.wait(WAKE_SECONDS)
            self._sleeping = False
        self._control = False
        return [items.popleft() for _ in range(len(items))]

    def linger(self, seconds: float) -> None:
        """(The writer's) let lines gather for ``seconds``, without being woken by them; a
        control item (flush, reopen, stop) ends the wait at once (it is queued before its
        flag is set and its flag before the wake-up: whichever of those this sees, it does
        not wait past it)."""
        self._wake.clear()
        if not self._control:
            self._wake.wait(seconds)


class FileOutput:
    """An append-only file, reopened when it was moved or removed (logrotate's ``create``)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._f: Any = None
        self._ident: Tuple[int, int] = (0, 0)
        self._open()

    def _open(self) -> None:
        f = open(self.path, "a", encoding="utf-8", errors="backslashreplace")
        st = os.fstat(f.fileno())
        self._f, self._ident = f, (st.st_dev, st.st_ino)

    def reopen(self) -> None:
        self.close()
        self._open()

    def write(self, data: str) -> None:
        try:
            st = os.stat(self.path)
            moved = (st.st_dev, st.st_ino) != self._ident
        except OSError:
            moved = True
        if moved or self._f is None:
            self.reopen()
        self._f.write(data)
        self._f.flush()

    def flush(self) -> None:
        if self._f is not None:
            self._f.flush()

    def close(self) -> None:
        f, self._f = self._f, None
        if f is not None:
            f.close()


class StreamOutput:
    """A stream the process was given (stderr: journald under systemd)."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, data: str) -> None:
        self.stream.write(data)
        self.stream.flush()

    def flush(self) -> None:
        self.stream.flush()

    def reopen(self) -> None:
        pass

    def close(self) -> None:
        pass


class Writer:
    """The thread that writes a :class:`LineQueue` to its outputs, batch by batch."""

    def __init__(self, lines: LineQueue, outputs: Sequence[Any]) -> None:
        self.lines = lines
        self.outputs = list(outputs)
        self.write_errors = 0
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="log-writer", daemon=True)
        self._thread.start()

    def flush(self, timeout: float) -> bool:
        """Wait until every line queued before this call is written."""
        token = _Control("flush")
        self.lines.control(token)
        return token.done.wait(timeout)

    def reopen(self) -> None:
        self.lines.control(_Control("reopen"))

    def stop_within(self, timeout: float) -> bool:
        """Write out what is queued, then stop and close the outputs; False (the thread left
        behind, a daemon thread) when an output took no line for ``timeout`` seconds."""
        self.lines.control(_Control("stop"))
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                return False
        self._thread = None
        for out in self.outputs:
            try:
                out.close()
            except OSError:
                pass
        return True

    def _run(self) -> None:
        while True:
            text: List[str] = []
            for item in self.lines.take():
                if isinstance(item, str):
                    text.append(item)
                    continue
                self._write(text)
                text = []
                if item.kind == "stop":
                    return
                self._each("reopen" if item.kind == "reopen" else "flush")
                item.done.set()
            self._write(text)
            self.lines.linger(LINGER_SECONDS)

    def _write(self, lines: List[str]) -> None:
        if lines:
            data = "\n".join(lines) + "\n"
            for out in self.outputs:
                try:
                    out.write(data)
                except Exception:   # (a full disk: these lines are lost, the next batch tries again)
                    self.write_errors += 1

    def _each(self, method: str) -> None:
        for out in self.outputs:
            try:
                getattr(out, method)()
            except Exception:
                self.write_errors += 1
