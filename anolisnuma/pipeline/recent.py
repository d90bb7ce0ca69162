"""``RecentCalls``: the pods, sandboxes and containers the kubelet's calls named lately.

A resync with containerd works from a listing, and calls keep passing while it is taken and
applied: a pod stopped, a container created or removed after the listing would be
"resurrected" or "dropped" by it. So the pipeline notes every ID an intercepted call names
(pod UID, sandbox ID, container ID; at the request and again at the reply), and a resync
leaves alone whatever a call named since the window before its listing began: the calls are
newer than the listing, and they are right.

Two windows are kept (the current one and the one before), so a call that began just before
a listing and ends after it is still covered. IDs leave after two resyncs.
"""

from __future__ import annotations

import threading
from typing import Set


class RecentCalls:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current: Set[str] = set()
        self._previous: Set[str] = set()
        self._before: Set[str] = set()
        self._enabled = True

    def note(self, *ids: str) -> None:
        with self._lock:
            if self._enabled:
                self._current.update(i for i in ids if i)

    def new_window(self) -> None:
        """A listing begins: what was noted before it stays for this resync and the next."""
        with self._lock:
            self._before = self._previous
            self._previous = self._current
            self._current = set()

    def listing_failed(self) -> None:
        """The listing begun by the last :meth:`new_window` did not happen: undo the turn,
        so retries do not age what calls named before the first attempt."""
        with self._lock:
            self._current = self._previous | self._current
            self._previous = self._before

    def set_enabled(self, enabled: bool) -> None:
        """Off when no resync will come (``resync_interval_seconds = 0``): nothing would
        ever turn the windows, so nothing is noted (and what was, is dropped)."""
        with self._lock:
            self._enabled = enabled
            if not enabled:
                self._current, self._previous, self._before = set(), set(), set()

    def __contains__(self, ident: object) -> bool:
        with self._lock:
            return ident in self._current or ident in self._previous

    def __len__(self) -> int:
        with self._lock:
            return len(self._current | self._previous)
