"""Bounded logging of events a peer can repeat at will (resets, refusals, connection errors).

One log line per event lets a hostile or broken client fill the disk (200k reset streams
wrote 47 MB). :class:`EventSummary` logs the first event of each kind at once, with all its
fields, then only counts the like events that follow; when the interval is over it writes
one summary line with the counts::

    aborts = EventSummary(log, "intercepted call ended without a reply")
    aborts.note(("CreateContainer", "stream reset by the client"), method="CreateContainer", pod_name="web-0")
    ...
    aborts.flush()   # at shutdown: the counts noted so far

It needs no thread. The summary is written by the first :meth:`~EventSummary.note` that
finds the interval over, and, when ``note`` runs on an asyncio event loop, by a timer of
that loop (``call_later``), so that the tail of a burst is reported even if nothing
follows it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Dict, Hashable, List, Optional

# Distinct keys tracked in one interval; the events of any further key are counted
# together under OTHER_KEY, without a line of their own. Keys are meant to be few
# (a method and a reason, an error class), never a pod or a peer.
MAX_KEYS = 64
OTHER_KEY = "other"


class EventSummary:
    """Log the first event of each key per interval at once; count and summarise the rest.

    ``logger`` is a structlog (or stdlib-style) logger, ``message`` the message of every
    line; ``level`` the name of the logger method used (``"warning"``, ``"info"``...).
    An interval starts with the first event noted while none is open and lasts
    ``interval_seconds`` by ``clock``. Within it, the first event of each ``key`` is logged
    at once with its fields; the others are counted. At its end, if anything was counted,
    one line ``"<message>: N more in <interval>s"`` is logged with ``suppressed`` (N) and
    ``counts`` (by key; a tuple key is written ``"a/b"``). The next event opens a new
    interval and is logged at once again. So a flood costs at most one line per key and one
    summary line per interval.

    Safe to call from any thread; the timer is only set when ``note`` runs on an event loop.
    """

    def __init__(self, logger: Any, message: str, interval_seconds: float = 10.0,
                 clock: Callable[[], float] = time.monotonic, level: str = "warning") -> None:
        if interval_seconds <= 0:
            raise ValueError("interval_seconds must be > 0")
        self.logger = logger
        self.message = message
        self.interval = float(interval_seconds)
        self.clock = clock
        self.level = level
        self._lock = threading.Lock()
        self._started: Optional[float] = None     # start of the open interval, None when idle
        self._seen: Dict[Hashable, int] = {}      # key -> events counted, not logged
        self._generation = 0                      # which interval a pending timer belongs to
        self._timer: Optional[asyncio.TimerHandle] = None

    def note(self, key: Hashable, **fields: Any) -> None:
        """One event of kind ``key``: logged now with ``fields`` if it is the first of its
        kind in the interval, otherwise counted."""
        now = self.clock()
        with self._lock:
            if self._started is not None and now - self._started >= self.interval:
                self._close()
            if self._started is None:
                self._started = now
                self._generation += 1
                self._schedule()
            if key not in self._seen and len(self._seen) >= MAX_KEYS:
                self._seen[OTHER_KEY] = self._seen.get(OTHER_KEY, 0) + 1
                return
            if key in self._seen:
                self._seen[key] += 1
                return
            self._seen[key] = 0
            self._log(self.message, fields)

    def flush(self) -> None:
        """Write the summary of the open interval now (at shutdown) and close it."""
        with self._lock:
            self._close()

    @property
    def pending(self) -> int:
        """Events counted in the open interval and not reported yet."""
        with self._lock:
            return sum(self._seen.values())

    # ------------------------------------------------------------------ internals
    def _close(self) -> None:
        """Log the summary of the open interval, if anything was counted; go idle."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        counts = {_key_text(k): n for k, n in self._seen.items() if n}
        self._started = None
        self._seen = {}
        if counts:
            total = sum(counts.values())
            self._log(f"{self.message}: {total} more in {self.interval:g}s",
                      {"suppressed": total, "counts": counts, "interval_seconds": self.interval})

    def _schedule(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not on an event loop: the next note() or flush() reports
            return
        self._timer = loop.call_later(self.interval, self._on_timer, self._generation)

    def _on_timer(self, generation: int) -> None:
        with self._lock:
            if generation == self._generation and self._started is not None:
                self._timer = None
                self._close()

    def _log(self, message: str, fields: Dict[str, Any]) -> None:
        getattr(self.logger, self.level)(message, **fields)


def _key_text(key: Hashable) -> str:
    if isinstance(key, tuple):
        return "/".join(str(k) for k in key)
    return str(key)


class FirstTime:
    """Which keys were seen already: a per-pod condition (a pod outside ``kubepods``, a bad
    annotation) is logged at warning the first time and at debug on every later call of the
    same pod. Bounded: past ``max_keys`` the least recently seen key is forgotten (and
    would be warned about once more). Thread-safe (hooks run in worker threads)::

        level = log.warning if seen.first((uid, "cgroup_parent")) else log.debug
    """

    def __init__(self, max_keys: int = 4096) -> None:
        self.max_keys = max_keys
        self._lock = threading.Lock()
        self._seen: "OrderedDict[Hashable, None]" = OrderedDict()

    def first(self, key: Hashable) -> bool:
        """True the first time ``key`` is asked about (until forgotten)."""
        with self._lock:
            if key in self._seen:
                self._seen.move_to_end(key)
                return False
            self._seen[key] = None
            if len(self._seen) > self.max_keys:
                self._seen.popitem(last=False)
            return True

    def owners(self) -> List[Hashable]:
        """The first item of every tuple key (the pods something was seen for)."""
        with self._lock:
            return list({k[0] for k in self._seen if isinstance(k, tuple) and k})

    def __len__(self) -> int:
        with self._lock:
            return len(self._seen)

    def forget(self, owner: Hashable) -> None:
        """Forget every key ``(owner, ...)`` (the pod is gone)."""
        with self._lock:
            for key in [k for k in self._seen if isinstance(k, tuple) and k and k[0] == owner]:
                del self._seen[key]
