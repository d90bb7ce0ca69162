"""``OenumaWatcher``: the ``cluster-watch`` loop, the Oenuma CRs of the API server kept
current by list and watch.

One pass is one session: a full list (in pages, through lightkube) when there is no
resourceVersion to go on from, then a watch from that resourceVersion with bookmarks
(``kube_client.py``), until the server ends it (``timeoutSeconds``, jittered so that a
cluster's nodes do not come back all at once) or it fails. Each event updates the
:class:`~anolisnuma.cluster.oenumas.OenumaSet` and, when a CR naming this node changed,
wakes the rules loop; nothing is queued, so a flood of events costs CPU on this thread and
no memory. A watch answered with 410 Gone (the resourceVersion is older than the server
keeps) is followed at once by a relist. Any other failure (refused, cut, timed out, silent
past the idle limit, ended at once, garbage of any kind, even a reply the client failed to
map to an ``ApiError``) keeps the last CRs seen, so the rules stay in force, and the session
is tried again after a delay that doubles from 0.5 s up to ``backoff_max_seconds``, give or
take 20 %: never at once, and with one log line, not a traceback per retry.
"""

from __future__ import annotations

import random
import time
from typing import Any, Callable, Dict

import structlog

from anolisnuma.cluster.kube_client import LIST_PAGE, ApiError, KubeClient, api_error
from anolisnuma.cluster.oenumas import OenumaSet, resource_version
from anolisnuma.controller import Controller

log = structlog.get_logger("anolisnuma.cluster")

LIST_RESTARTS = 3      # a list whose continue token expired (410) is started again, this often
BACKOFF_FIRST = 0.5
IDLE_MARGIN = 30.0     # a watch silent this long past its timeoutSeconds is a dead connection
# A watch that ends this soon without an event counts as a failure (a server that ends
# every watch at once must not make the loop spin).
SHORT_WATCH_SECONDS = 1.0


class OenumaWatcher(Controller):
    """``OenumaWatcher(client, crs, on_change, watch_timeout, backoff_max)``; ``on_change()``
    is called (on this thread) when a CR naming this node was added, changed or removed."""

    name = "cluster-watch"

    def __init__(self, client: KubeClient, crs: OenumaSet, on_change: Callable[[], None],
                 watch_timeout: float = 300.0, backoff_max: float = 60.0,
                 jitter: Callable[[], float] = random.random) -> None:
        super().__init__()
        self.client = client
        self.crs = crs
        self.on_change = on_change
        self.watch_timeout = watch_timeout
        self.backoff_max = backoff_max
        self.jitter = jitter
        self.interval = 0.01   # then set after every session: the delay before the next
        self.resource_version = ""      # "" = list first
        self.state = "connecting"
        self.last_error = ""
        self.last_sync = 0.0            # wall time of the last full list
        self.last_event = 0.0           # wall time of the last event or bookmark
        self.failures_in_a_row = 0
        self.lists = 0
        self.watches = 0
        self.events = 0
        self.bookmarks = 0
        self.gone = 0                   # 410 Gone answers, each followed by a relist
        self.failures = 0
        self.watching = False           # a watch is open (or being opened)

    # ------------------------------------------------------------------ one session
    def run_once(self) -> None:
        try:
            if not self.resource_version:
                self._list()
            self._watch()
        except ApiError as e:
            if self._stopping:
                return
            if e.gone and self.resource_version:
                self.gone += 1
                log.info("Oenuma watch expired (410 Gone); listing again", resource_version=self.resource_version,
                         message=e.message[:300])
                self.resource_version = ""
                self.interval = 0.01
                return
            self._failed(e)
            return
        except Exception as e:  # noqa: BLE001 - whatever a reply made the client raise: backed off too
            if self._stopping:
                return
            self._failed(api_error(e, "list or watch oenumas"))
            return
        self.failures_in_a_row = 0
        self.interval = 0.01 if self.resource_version else BACKOFF_FIRST

    def _list(self) -> None:
        for attempt in range(LIST_RESTARTS + 1):
            listing = self.client.list_oenumas(LIST_PAGE)
            try:
                changed = self.crs.replace(listing)   # (replaces nothing unless the whole list was read)
                rv = listing.resource_version
                break
            except ApiError as e:
                if not e.gone or attempt == LIST_RESTARTS:   # (410: the continue token expired)
                    raise
        self.resource_version = rv
        self.lists += 1
        self.last_sync = time.time()
        if self.state != "synced":
            log.info("Oenuma CRs listed from the API server", crs=self.crs.seen, resource_version=rv,
                     after_failures=self.failures_in_a_row or None)
        self.state = "synced"
        self.last_error = ""
        if changed:
            self.on_change()

    def _watch(self) -> None:
        timeout = int(self.watch_timeout * (1 + self.jitter()))
        self.client.transport.watch_idle_timeout = timeout + IDLE_MARGIN
        self.watches += 1
        self.watching = True
        started, events = time.monotonic(), 0
        try:
            if self._stopping:
                return
            for kind, obj in self.client.watch_oenumas(self.resource_version, timeout):
                events += 1
                self._event(kind, obj)
                if self._stopping:
                    return
        finally:
            self.watching = False
        if events == 0 and time.monotonic() - started < SHORT_WATCH_SECONDS and not self._stopping:
            raise ApiError(200, "WatchEnded", "the server ended the watch at once")

    def _event(self, kind: str, obj: Dict[str, Any]) -> None:
        if kind not in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK") or not isinstance(obj, dict):
            raise ApiError(200, "Garbage", f"a watch event of type {str(kind)[:40]!r}")
        self.last_event = time.time()
        rv = resource_version(obj)
        if kind == "BOOKMARK":
            self.bookmarks += 1
        else:
            self.events += 1
            changed = self.crs.delete(obj) if kind == "DELETED" else self.crs.upsert(obj)
            if changed:
                self.on_change()
        if rv:
            self.resource_version = rv

    def _failed(self, e: ApiError) -> None:
        self.failures += 1
        self.failures_in_a_row += 1
        self.last_error = str(e)[:300]
        delay = min(self.backoff_max, BACKOFF_FIRST * 2 ** min(self.failures_in_a_row - 1, 30))
        self.interval = delay * (0.8 + 0.4 * self.jitter())
        was, self.state = self.state, "down"
        if e.status in (401, 403):
            self.state = "refused"
        (log.warning if was != self.state or self.failures_in_a_row == 1 else log.debug)(
            "API server unavailable; the last Oenuma rules stay in force", error=self.last_error,
            retry_in_seconds=round(self.interval, 2), failures_in_a_row=self.failures_in_a_row)

    # ------------------------------------------------------------------ the loop
    def stop(self, timeout: float = 5.0) -> None:
        self._stopping = True
        self.client.abort()   # the watch's blocked read returns at once
        super().stop(timeout)

    def closed(self) -> None:
        self.client.close()

    def counts(self) -> Dict[str, int]:
        return {"lists": self.lists, "watches": self.watches, "events": self.events, "bookmarks": self.bookmarks,
                "gone": self.gone, "failures": self.failures, "crs_seen": self.crs.seen}

    def connection(self) -> Dict[str, Any]:
        """The API server connection, for ``anolisnuma-ctl status``."""
        return {"server": self.client.server, "state": self.state, "last_error": self.last_error or None,
                "last_sync": self.last_sync or None, "last_event": self.last_event or None,
                "resource_version": self.resource_version or None, "crs_seen": self.crs.seen,
                "retry_in_seconds": round(self.interval, 2) if self.state in ("down", "refused") else None,
                **{k: v for k, v in self.counts().items() if k != "crs_seen"}}
