"""``BoundedTransport``: what lightkube's HTTP client does not bound, bounded.

lightkube reads whole replies and watch lines as the server sends them, with httpx's
per-operation timeouts and no read timeout at all on a watch. An API server (or what sits
in front of it) that sends garbage must not grow the daemon's memory nor hold a thread
forever, so this transport, between httpx's client and its connection pool, wraps every
response's byte stream:

- every request asks for ``Accept-Encoding: identity``, and a reply compressed all the
  same is decoded below the bounds (``reply_encoding.py``): the bounds count the bytes the
  daemon will hold, not the wire's (a gzipped list is about 100 times smaller);
- a reply but a watch's is at most ``max_reply_bytes`` and complete within
  ``request_timeout`` of the request (httpx bounds each read, not the whole reply);
- a watch's lines are each at most ``max_event_bytes`` (one event: an object etcd took,
  JSON-escaped), and a watch silent for ``watch_idle_timeout`` seconds fails (the server
  ends a watch after its ``timeoutSeconds``: silence past that is a dead connection);
- a watch the server ended ends with :class:`WatchEnded`: lightkube would make the next
  watch at once by itself, and the watcher's session ends there instead (a new
  ``timeoutSeconds``, jittered; a server that ends every watch at once makes the watcher
  back off, not spin);
- a watch asks for bookmarks (``allowWatchBookmarks``: lightkube's watch has no
  parameter for it in 0.x nor 1.x), so a quiet watch still moves its resourceVersion on;
- :meth:`abort` (from any thread) cuts the open watches' connections: a read blocked in
  one returns at once (closing a socket does not wake a thread blocked reading it; a
  shutdown does).

The ``httpx`` module is the one the installed lightkube is built on: ``httpx`` for
lightkube 0.x, ``httpx2`` for 1.x.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, Iterator, Optional, Set

from lightkube.core.generic_client import httpx  # (httpx or httpx2, as lightkube imports it)

from anolisnuma.cluster.reply_encoding import ReplyEncoding, decoded


class ReplyTooLarge(httpx.TransportError):
    """A reply or one watch event over its bound."""


class WatchEnded(httpx.TransportError):
    """The server ended a watch (its last line was read)."""


def is_watch(request: Any) -> bool:
    return request.url.params.get("watch") in ("true", "1")


class BoundedTransport(httpx.BaseTransport):
    """``BoundedTransport(inner, ...)``: ``inner`` is the transport that connects
    (``httpx.HTTPTransport`` with the cluster's TLS context)."""

    def __init__(self, inner: Any, max_reply_bytes: int, max_event_bytes: int, request_timeout: float,
                 watch_idle_timeout: float, user_agent: str = "") -> None:
        self.inner = inner
        self.user_agent = user_agent
        self.max_reply_bytes = max_reply_bytes
        self.max_event_bytes = max_event_bytes
        self.request_timeout = request_timeout
        self.watch_idle_timeout = watch_idle_timeout
        self._lock = threading.Lock()
        self._watches: Set[_WatchLines] = set()
        self._cut = False      # abort() came: a watch opened meanwhile is cut too
        self.requests = 0

    def __deepcopy__(self, memo: Any) -> "BoundedTransport":
        # lightkube 0.x deep-copies its connection parameters, this transport among them:
        # a pool of connections (and a TLS context) is not copied, it is shared
        return self

    def handle_request(self, request: Any) -> Any:
        self.requests += 1
        if self.user_agent:
            request.headers["User-Agent"] = self.user_agent
        # (httpx asks for gzip by default, and decodes above this transport: the bounds
        # below would count the compressed bytes)
        request.headers["Accept-Encoding"] = "identity"
        watch = is_watch(request)
        if watch:
            request.url = request.url.copy_merge_params({"allowWatchBookmarks": "true"})
            timeout = dict(request.extensions.get("timeout") or {})
            timeout["read"] = self.watch_idle_timeout
            request.extensions = dict(request.extensions, timeout=timeout)
        started = time.monotonic()
        response = self.inner.handle_request(request)
        try:
            headers, body = decoded(response.headers, response.stream)
        except ReplyEncoding:
            response.close()
            raise
        if watch and response.status_code == 200:
            stream: Any = _WatchLines(self, body, response.extensions, self.max_event_bytes)
            with self._lock:
                self._watches.add(stream)
                cut = self._cut
            if cut:
                stream.abort()
        else:
            stream = _Bounded(body, self.max_reply_bytes, started + self.request_timeout)
        return httpx.Response(status_code=response.status_code, headers=headers, stream=stream,
                              extensions=response.extensions, request=request)

    def abort(self) -> None:
        """Cut every open watch (from any thread), and one being opened, until
        :meth:`close_watches`."""
        with self._lock:
            self._cut = True
            watches = list(self._watches)
        for w in watches:
            w.abort()

    def close_watches(self) -> None:
        """Close every open watch (lightkube's sync watch leaves a failed one open)."""
        with self._lock:
            watches, self._watches = list(self._watches), set()
            self._cut = False
        for w in watches:
            w.close()

    def _closed(self, watch: "_WatchLines") -> None:
        with self._lock:
            self._watches.discard(watch)

    def close(self) -> None:
        self.close_watches()
        self.inner.close()


class _Bounded(httpx.SyncByteStream):
    def __init__(self, inner: Any, limit: int, deadline: float) -> None:
        self._inner = inner
        self._limit = limit
        self._deadline = deadline

    def __iter__(self) -> Iterator[bytes]:
        size = 0
        for chunk in self._inner:
            size += len(chunk)
            if size > self._limit:
                self.close()
                raise ReplyTooLarge(f"reply larger than {self._limit} bytes (decoded)")
            if time.monotonic() > self._deadline:
                self.close()
                raise httpx.ReadTimeout("reply not complete within the request timeout")
            yield chunk

    def close(self) -> None:
        self._inner.close()


class _WatchLines(httpx.SyncByteStream):
    def __init__(self, owner: BoundedTransport, body: Any, extensions: Any, limit: int) -> None:
        self._owner = owner
        self._inner = body
        self._stream = extensions.get("network_stream")
        self._limit = limit
        self.aborted = False

    def __iter__(self) -> Iterator[bytes]:
        line = 0          # bytes of the line being read, so far
        lines = 0         # (at least)
        limit = self._limit
        try:
            for chunk in self._inner:
                first = chunk.find(b"\n")
                if first < 0:
                    line += len(chunk)
                else:
                    too_long = line + first > limit or (
                        # (a chunk larger than the bound may hold a long line between two newlines)
                        len(chunk) > limit and any(len(part) > limit for part in chunk.split(b"\n")[1:-1]))
                    if too_long:
                        raise ReplyTooLarge(f"a watch event larger than {limit} bytes")
                    lines += 1
                    line = len(chunk) - chunk.rfind(b"\n") - 1
                if line > limit:
                    raise ReplyTooLarge(f"a watch event larger than {limit} bytes")
                yield chunk
        finally:
            self.close()
        if self.aborted:
            raise httpx.ReadError("the watch was cut")
        raise WatchEnded(f"the server ended the watch after {lines} events")

    def abort(self) -> None:
        self.aborted = True
        sock: Optional[socket.socket] = self._stream.get_extra_info("socket") if self._stream is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self._owner._closed(self)
        self._inner.close()
