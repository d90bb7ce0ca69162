"""The daemon's own HTTPS client for the API server: list, watch, server-side apply.

Why not a Kubernetes client library: measured beside the CRI relay (scripts/
bench_kubeclient.py, 1,000 CRs listed, 2,000 watch events, Python 3.11, the last releases
that still install on 3.9), the official ``kubernetes`` 35.0.0 adds 44.6 MB of resident
memory and 146 us of CPU per watch event, ``kubernetes-asyncio`` 33.3.0 52.0 MB and 176 us,
``lightkube`` 0.22.0 15.6 MB and 141 us; ``http.client`` and ``json`` from the standard
library 2.7 MB and ~100 us, to a daemon of 35 MB. The daemon makes four kinds of requests,
and needs what none of them bounds: a size limit on every reply and watch event (an API
server sending garbage must not grow memory), a deadline on every request but a watch, an
idle limit on a watch, and a way to cut a blocked read from another thread at shutdown.

One :class:`ApiClient` is used by one thread. Requests are blocking; they run on the
cluster loops' own threads (``watcher.py``, ``sync.py``), never on the CRI event loop.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
import time
from typing import Any, Iterator, Optional

from anolisnuma import __version__
from anolisnuma.cluster.kubeconfig import Credentials, KubeconfigError

MIB = 1 << 20
MAX_REPLY_BYTES = 64 * MIB    # a list page of 500 CRs of the largest size etcd takes (1.5 MiB)
MAX_EVENT_BYTES = 4 * MIB     # one watch event: an object etcd took (1.5 MiB), JSON-escaped
USER_AGENT = f"anolisnuma/{__version__}"


class ApiError(Exception):
    """A request failed: ``status`` is the HTTP status (0 when none came back: refused,
    timed out, cut, garbage), ``reason`` the Kubernetes reason (``Expired``, ``NotFound``...)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status or 'no reply'} {reason}: {message}" if reason else f"{status}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def gone(self) -> bool:
        """410 Gone: the resourceVersion asked for is older than the server keeps."""
        return self.status == 410


def _status_error(status: int, body: bytes) -> ApiError:
    """The API server's ``Status`` reply as an error (any other body as text)."""
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and doc.get("kind") == "Status":
        return ApiError(int(doc.get("code") or status), str(doc.get("reason") or ""),
                        " ".join(str(doc.get("message") or "").split())[:500])
    return ApiError(status, "", " ".join(body[:300].decode(errors="replace").split()))


class ApiClient:
    """``ApiClient(credentials, timeout)``: requests to ``credentials.server``; ``timeout``
    bounds each request but a watch (connect, send, the whole reply)."""

    def __init__(self, credentials: Credentials, timeout: float = 10.0, max_reply_bytes: int = MAX_REPLY_BYTES) -> None:
        self.credentials = credentials
        self.timeout = timeout
        self.max_reply_bytes = max_reply_bytes
        self._ssl: Optional[ssl.SSLContext] = None
        self._conn: Optional[http.client.HTTPSConnection] = None
        self.requests = 0

    def _context(self) -> ssl.SSLContext:
        if self._ssl is None:
            try:
                self._ssl = self.credentials.ssl_context()
            except (ssl.SSLError, OSError, ValueError) as e:
                raise ApiError(0, "BadCredentials", f"{self.credentials.source}: {e}") from e
        return self._ssl

    def _connect(self, timeout: float) -> http.client.HTTPSConnection:
        conn = http.client.HTTPSConnection(self.credentials.host, self.credentials.port, timeout=timeout,
                                           context=self._context())
        try:
            conn.connect()
        except (OSError, ssl.SSLError) as e:
            conn.close()
            raise ApiError(0, "Unreachable", f"{self.credentials.server}: {e}") from e
        return conn

    def _headers(self, content_type: str = "") -> dict:
        try:
            token = self.credentials.bearer()
        except KubeconfigError as e:
            raise ApiError(0, "BadCredentials", str(e)) from e
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        """One request, its JSON reply decoded; raises :class:`ApiError` (non-2xx, no reply
        within the timeout, a reply over the size bound, or not JSON)."""
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        deadline = time.monotonic() + self.timeout
        self.requests += 1
        for attempt in (1, 2):
            reused = self._conn is not None
            conn = self._conn or self._connect(self.timeout)
            self._conn = None
            try:
                conn.sock.settimeout(max(deadline - time.monotonic(), 0.01))
                conn.request(method, path, body=data, headers=self._headers(content_type if data else ""))
                reply = conn.getresponse()
                raw = self._read_all(reply, deadline)
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                if reused and attempt == 1 and time.monotonic() < deadline:
                    continue   # a kept connection the server had closed meanwhile
                raise ApiError(0, "Timeout" if isinstance(e, socket.timeout) else "ConnectionLost",
                               f"{method} {path}: {e or type(e).__name__}") from e
            if reply.will_close:
                conn.close()
            else:
                self._conn = conn
            if not 200 <= reply.status < 300:
                raise _status_error(reply.status, raw)
            try:
                return json.loads(raw)
            except ValueError as e:
                raise ApiError(reply.status, "Garbage", f"{method} {path}: the reply is not JSON") from e
        raise AssertionError("unreachable")

    def _read_all(self, reply: http.client.HTTPResponse, deadline: float) -> bytes:
        chunks = []
        size = 0
        while True:
            # (read, not read1: it marks the reply done at its end, so the connection is
            # kept for the next request)
            chunk = reply.read(256 * 1024)
            if not chunk:
                reply.close()
                return b"".join(chunks)
            size += len(chunk)
            if size > self.max_reply_bytes:
                raise http.client.HTTPException(f"reply larger than {self.max_reply_bytes} bytes")
            if time.monotonic() > deadline:
                raise socket.timeout("reply not complete within the request timeout")
            chunks.append(chunk)

    def watch(self, path: str, idle_timeout: float) -> "WatchStream":
        """Open a watch (``path`` carries ``watch=1`` and its parameters); the stream's
        events are read as they come, each at most :data:`MAX_EVENT_BYTES`, and a stream
        silent for ``idle_timeout`` seconds ends with an error."""
        self.requests += 1
        conn = self._connect(self.timeout)
        try:
            conn.sock.settimeout(self.timeout)
            conn.request("GET", path, headers=self._headers())
            reply = conn.getresponse()
            if reply.status != 200:
                raw = self._read_all(reply, time.monotonic() + self.timeout)
                raise _status_error(reply.status, raw)
            conn.sock.settimeout(idle_timeout)
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise ApiError(0, "ConnectionLost", f"watch {path}: {e or type(e).__name__}") from e
        except ApiError:
            conn.close()
            raise
        return WatchStream(conn, reply)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


class WatchStream:
    """The events of one watch: ``for event in stream`` yields each JSON event (a dict with
    ``type`` and ``object``); the iteration ends when the server ends the watch, and raises
    :class:`ApiError` when the stream breaks, stalls or carries garbage. :meth:`abort` may
    be called from another thread: a blocked read returns at once."""

    def __init__(self, conn: http.client.HTTPSConnection, reply: http.client.HTTPResponse) -> None:
        self._conn = conn
        self._reply = reply
        self._lock = threading.Lock()
        self._aborted = False
        self.events = 0

    def __iter__(self) -> Iterator[Any]:
        try:
            while True:
                try:
                    line = self._reply.readline(MAX_EVENT_BYTES + 1)
                except (OSError, http.client.HTTPException, ValueError) as e:
                    if self._aborted:
                        return
                    kind = "Timeout" if isinstance(e, socket.timeout) else "ConnectionLost"
                    raise ApiError(0, kind, f"watch stream: {e or type(e).__name__}") from e
                if not line:
                    return
                if len(line) > MAX_EVENT_BYTES:
                    raise ApiError(200, "Garbage", f"a watch event larger than {MAX_EVENT_BYTES} bytes")
                if not line.strip():
                    continue
                try:
                    event = json.loads(line)
                except ValueError as e:
                    raise ApiError(200, "Garbage", "a watch event is not JSON") from e
                if not isinstance(event, dict):
                    raise ApiError(200, "Garbage", "a watch event is not a JSON object")
                self.events += 1
                yield event
        finally:
            self.close()

    def abort(self) -> None:
        """Cut the connection (from any thread): the reader's blocked read returns."""
        with self._lock:
            self._aborted = True
            sock = self._conn.sock
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        with self._lock:
            self._conn.close()
