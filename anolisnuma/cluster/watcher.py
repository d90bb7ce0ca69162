"""``OenumaWatcher``: the ``cluster-watch`` loop, the Oenuma CRs of the API server kept
current by list and watch.

One pass is one session: a full list (paginated) when there is no resourceVersion to go on
from, then one watch from that resourceVersion with bookmarks, until the server ends it
(``timeoutSeconds``, jittered so that a cluster's nodes do not come back all at once) or it
fails. Each event updates the :class:`~anolisnuma.cluster.oenumas.OenumaSet` and, when a
CR naming this node changed, wakes the rules loop; nothing is queued, so a flood of events
costs CPU on this thread and no memory. A watch answered with 410 Gone (the
resourceVersion is older than the server keeps) is followed at once by a relist. Any other
failure (refused, cut, timed out, silent past the idle limit, garbage) keeps the last CRs
seen, so the rules stay in force, and the session is tried again after a delay that
doubles from 0.5 s up to ``backoff_max_seconds``, give or take 20 %.
"""

from __future__ import annotations

import random
import time
import urllib.parse
from typing import Any, Callable, Dict, List, Optional

import structlog

from anolisnuma.cluster.api import ApiClient, ApiError, WatchStream
from anolisnuma.cluster.oenumas import OenumaSet, resource_version
from anolisnuma.controller import Controller
from anolisnuma.policies.numa.rules import OENUMA_API_VERSION

log = structlog.get_logger("anolisnuma.cluster")

OENUMAS_PATH = f"/apis/{OENUMA_API_VERSION}/oenumas"
LIST_PAGE = 500
BACKOFF_FIRST = 0.5
# A watch that ends this soon without an event counts as a failure (a server that ends
# every watch at once must not make the loop spin).
SHORT_WATCH_SECONDS = 1.0


class OenumaWatcher(Controller):
    """``OenumaWatcher(client, crs, on_change, watch_timeout, backoff_max)``; ``on_change()``
    is called (on this thread) when a CR naming this node was added, changed or removed."""

    name = "cluster-watch"

    def __init__(self, client: ApiClient, crs: OenumaSet, on_change: Callable[[], None],
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
        self._stream: Optional[WatchStream] = None

    # ------------------------------------------------------------------ one session
    def run_once(self) -> None:
        try:
            if not self.resource_version:
                self._list()
            self._watch()
        except ApiError as e:
            self._failed(e)
            return
        self.failures_in_a_row = 0
        self.interval = 0.01 if self.resource_version else BACKOFF_FIRST

    def _list(self) -> None:
        items: List[Any] = []
        cont = ""
        while True:
            query = {"limit": str(LIST_PAGE)}
            if cont:
                query["continue"] = cont
            try:
                page = self.client.request("GET", f"{OENUMAS_PATH}?{urllib.parse.urlencode(query)}")
            except ApiError as e:
                if e.gone and cont:   # the continue token expired: the list starts again
                    items, cont = [], ""
                    continue
                raise
            if not isinstance(page, dict) or not isinstance(page.get("items"), list):
                raise ApiError(200, "Garbage", "the list reply has no items")
            items.extend(page["items"])
            meta = page.get("metadata") if isinstance(page.get("metadata"), dict) else {}
            cont = meta.get("continue") or ""
            if not cont:
                rv = meta.get("resourceVersion")
                break
        if not isinstance(rv, str) or not rv:
            raise ApiError(200, "Garbage", "the list reply has no resourceVersion")
        changed = self.crs.replace(items)
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
        query = {"watch": "1", "allowWatchBookmarks": "true", "resourceVersion": self.resource_version,
                 "timeoutSeconds": str(timeout)}
        stream = self.client.watch(f"{OENUMAS_PATH}?{urllib.parse.urlencode(query)}", idle_timeout=timeout + 30)
        self._stream = stream
        self.watches += 1
        started = time.monotonic()
        try:
            if self._stopping:
                return
            for event in stream:
                self._event(event)
                if not self.resource_version:
                    return   # 410 Gone: relist at once
        finally:
            self._stream = None
            stream.close()
        if stream.events == 0 and time.monotonic() - started < SHORT_WATCH_SECONDS and not self._stopping:
            raise ApiError(200, "WatchEnded", "the server ended the watch at once")

    def _event(self, event: Dict[str, Any]) -> None:
        kind, obj = event.get("type"), event.get("object")
        if kind == "ERROR":
            status = obj if isinstance(obj, dict) else {}
            if status.get("code") == 410:
                self.gone += 1
                log.info("Oenuma watch expired (410 Gone); listing again", resource_version=self.resource_version,
                         message=str(status.get("message") or "")[:300])
                self.resource_version = ""
                return
            raise ApiError(int(status.get("code") or 0), str(status.get("reason") or "WatchError"),
                           str(status.get("message") or "")[:300])
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
        self.client.close()

    # ------------------------------------------------------------------ the loop
    def stop(self, timeout: float = 5.0) -> None:
        self._stopping = True
        stream = self._stream
        if stream is not None:
            stream.abort()   # the watch's blocked read returns at once
        super().stop(timeout)

    def closed(self) -> None:
        self.client.close()

    def counts(self) -> Dict[str, int]:
        return {"lists": self.lists, "watches": self.watches, "events": self.events, "bookmarks": self.bookmarks,
                "gone": self.gone, "failures": self.failures, "crs_seen": self.crs.seen}

    def connection(self) -> Dict[str, Any]:
        """The API server connection, for ``anolisnuma-ctl status``."""
        return {"server": self.client.credentials.server, "state": self.state, "last_error": self.last_error or None,
                "last_sync": self.last_sync or None, "last_event": self.last_event or None,
                "resource_version": self.resource_version or None, "crs_seen": self.crs.seen,
                "retry_in_seconds": round(self.interval, 2) if self.state in ("down", "refused") else None,
                **{k: v for k, v in self.counts().items() if k != "crs_seen"}}
