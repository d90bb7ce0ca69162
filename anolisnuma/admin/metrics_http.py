"""The metrics endpoint's HTTP server, on the daemon's event loop, bounded in everything a
client can make it hold or do.

It used to be wsgiref with a thread per connection and no timeout: 3,000 half-sent
requests from an unprivileged local user (loopback is no wall against local users) held
3,000 threads and fds of the root daemon until its fd limit was reached, and then new
kubelet connections and QoS writes failed with EMFILE. Here a connection costs one fd
and a few hundred bytes until it is done, and a connection cannot last or grow:

- at most :data:`MAX_CONNECTIONS` are served at once; one more is answered 503 at once
  and closed, from the accepting callback (no task, no buffer);
- the listening socket is accepted from at most :data:`ACCEPTS_PER_SECOND` times a
  second (bursts of :data:`ACCEPT_BURST`); past that it is not watched until the rate
  allows again, so a connect flood waits in the kernel's backlog and costs the event
  loop nothing (scrapers see a slow connect, never an error of ours). A refusal is
  ~0.4 ms of the daemon's CPU, kernel included (loopback TCP is processed by the sender):
  at 100 a second a slowloris flood cost it 4 % of a CPU, at 20 it costs 1 %, and 20
  scrapes a second is far beyond what Prometheus servers ask of a node;
- the request head must arrive within :data:`HEAD_TIMEOUT` seconds and
  :mod:`~anolisnuma.admin.httphead`'s size limits (414/431), else it is dropped;
- only ``GET``/``HEAD /metrics`` (405 for other methods, 404 for other paths); one
  request per connection;
- the answer must be taken within :data:`WRITE_TIMEOUT` seconds, else the connection is
  dropped with what it had not read;
- the body comes from :class:`~anolisnuma.admin.scrape.ScrapeCache`: collected at most
  once a second on one worker thread whoever scrapes, so a flood of scrapes costs
  copies of bytes, not walks of the daemon's structures.

Why the event loop rather than a small pool of threads: a held connection must cost no
thread at all (a pool of 16 threads is 16 connections that a slow client can hold, and
its queue is the unbounded wait this replaces), timeouts are timers instead of blocking
socket options, and parsing a 300-byte head is microseconds. The one heavy part, the
collection, runs on the worker thread.
"""

from __future__ import annotations

import asyncio
import errno
import socket
import time
from http import HTTPStatus
from typing import Any, Callable, Dict, Iterator, Optional, Set, Tuple

import structlog
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import CollectorRegistry

from anolisnuma.admin.httphead import MAX_LINE_BYTES, ClientGone, HttpError, read_request, response
from anolisnuma.admin.metrics import P
from anolisnuma.admin.scrape import SCRAPE_INTERVAL, Form, ScrapeCache, content_headers
from anolisnuma.workers import WorkerPool

log = structlog.get_logger("anolisnuma.admin")

MAX_CONNECTIONS = 16
ACCEPTS_PER_SECOND = 20.0
ACCEPT_BURST = 32
ACCEPTS_PER_WAKE = 8       # then the event loop runs other callbacks before accepting more
BACKLOG = 64
HEAD_TIMEOUT = 3.0
WRITE_TIMEOUT = 5.0
BODY_TIMEOUT = 10.0        # a collection that takes longer is answered 503
ACCEPT_RETRY = 1.0         # after accept() failed for want of fds or memory

# What became of a connection (the values of anolisnuma_metrics_connections_total's label).
OUTCOMES = ("served", "busy", "rejected", "head_timeout", "closed_early", "write_timeout", "failed")

_BUSY = response(HTTPStatus.SERVICE_UNAVAILABLE, [("Retry-After", "1")],
                 b"busy: the metrics endpoint serves as many connections as it can; retry\n")
_OUT_OF_FDS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class MetricsServer:
    """``await MetricsServer(host, port, collector).start()`` binds (OSError when it
    cannot) and serves on the running event loop; ``address``/``url`` say where (port 0
    is given a free one); ``await stop()`` closes the socket and every connection.
    The keyword arguments are the module's limits, for tests."""

    def __init__(self, host: str, port: int, collector: Any, *, max_connections: int = MAX_CONNECTIONS,
                 head_timeout: float = HEAD_TIMEOUT, write_timeout: float = WRITE_TIMEOUT,
                 body_timeout: float = BODY_TIMEOUT, accepts_per_second: float = ACCEPTS_PER_SECOND,
                 accept_burst: int = ACCEPT_BURST, scrape_interval: float = SCRAPE_INTERVAL) -> None:
        self.host = host
        self.port = port
        self.max_connections = max_connections
        self.head_timeout = head_timeout
        self.write_timeout = write_timeout
        self.body_timeout = body_timeout
        self.counts: Dict[str, int] = dict.fromkeys(OUTCOMES, 0)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        ProcessCollector(registry=self.registry)   # the daemon's RSS, CPU time, open fds
        self.registry.register(_EndpointCollector(self))
        # one thread, started now: a scrape never needs a new one (anolisnuma.workers)
        self.executor = WorkerPool(1, "metrics-collect")
        self.scrapes = ScrapeCache(self.registry, self.executor, scrape_interval)
        self._rate = _TokenBucket(accepts_per_second, accept_burst)
        self._sock: Optional[socket.socket] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._watching = False
        self._resume: Optional[asyncio.TimerHandle] = None
        self._serving: Set["asyncio.Task[None]"] = set()

    async def start(self) -> "MetricsServer":
        """Bind and serve; OSError when the address cannot be bound."""
        self._loop = asyncio.get_running_loop()
        self._sock = _listening_socket(self.host, self.port)
        self._watch()
        return self

    @property
    def address(self) -> Tuple[str, int]:
        assert self._sock is not None
        return self.host, self._sock.getsockname()[1]

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://[{host}]:{port}/metrics" if ":" in host else f"http://{host}:{port}/metrics"

    async def stop(self) -> None:
        sock, self._sock = self._sock, None
        if sock is None:
            return
        self._unwatch(sock)
        if self._resume is not None:
            self._resume.cancel()
            self._resume = None
        sock.close()
        serving = list(self._serving)
        for task in serving:
            task.cancel()
        if serving:
            await asyncio.gather(*serving, return_exceptions=True)
        self.executor.shutdown(wait=False)   # a collection under way ends by itself

    # ---------------------------------------------------------------- accepting
    def _watch(self) -> None:
        if self._sock is not None and not self._watching:
            assert self._loop is not None
            self._loop.add_reader(self._sock.fileno(), self._on_acceptable)
            self._watching = True

    def _unwatch(self, sock: socket.socket) -> None:
        if self._watching:
            assert self._loop is not None
            self._loop.remove_reader(sock.fileno())
            self._watching = False

    def _pause(self, seconds: float) -> None:
        assert self._sock is not None and self._loop is not None
        self._unwatch(self._sock)
        self._resume = self._loop.call_later(seconds, self._resumed)

    def _resumed(self) -> None:
        self._resume = None
        self._watch()

    def _on_acceptable(self) -> None:
        assert self._sock is not None
        for _ in range(ACCEPTS_PER_WAKE):
            if not self._rate.available():
                self._pause(self._rate.wait())
                return
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:   # gone before it was accepted
                continue
            except OSError as e:
                if e.errno not in _OUT_OF_FDS:
                    raise
                # The connection stays in the backlog: retrying now would spin.
                log.warning("metrics endpoint cannot accept; retrying", error=str(e), retry_seconds=ACCEPT_RETRY)
                self._pause(ACCEPT_RETRY)
                return
            self._rate.spend()
            if len(self._serving) >= self.max_connections:
                self._refuse(conn)
            else:
                self._admit(conn)

    def _refuse(self, conn: socket.socket) -> None:
        self.counts["busy"] += 1
        try:
            conn.setblocking(False)
            conn.send(_BUSY)   # a fresh socket's send buffer takes these ~150 bytes whole
        except OSError:
            pass
        conn.close()

    def _admit(self, conn: socket.socket) -> None:
        assert self._loop is not None
        task = self._loop.create_task(self._serve(conn))
        self._serving.add(task)
        task.add_done_callback(self._serving.discard)

    # ---------------------------------------------------------------- one connection
    async def _serve(self, conn: socket.socket) -> None:
        conn.setblocking(False)
        try:
            reader, writer = await asyncio.open_connection(sock=conn, limit=MAX_LINE_BYTES)
        except OSError:
            conn.close()
            self.counts["failed"] += 1
            return
        outcome = "failed"
        try:
            answer, outcome = await self._answer(reader)
            if answer:
                writer.write(answer)
                await asyncio.wait_for(writer.drain(), self.write_timeout)
        except asyncio.TimeoutError:
            outcome = "write_timeout"
        except ConnectionError:
            outcome = "closed_early"
        finally:
            self.counts[outcome] += 1
            _close(writer)

    async def _answer(self, reader: asyncio.StreamReader) -> Tuple[bytes, str]:
        """(what to write, the connection's outcome)."""
        try:
            request = await asyncio.wait_for(read_request(reader), self.head_timeout)
        except asyncio.TimeoutError:
            return b"", "head_timeout"
        except ClientGone:
            return b"", "closed_early"
        except HttpError as e:
            return e.answer(), "rejected"
        if request.method not in ("GET", "HEAD"):
            return HttpError(HTTPStatus.METHOD_NOT_ALLOWED, f"{request.method}: use GET or HEAD",
                             [("Allow", "GET, HEAD")]).answer(), "rejected"
        if request.path != "/metrics":
            return HttpError(HTTPStatus.NOT_FOUND, "the metrics are at /metrics").answer(), "rejected"
        form = Form.of(request.headers.get("accept", ""), request.headers.get("accept-encoding", ""))
        try:
            body = await asyncio.wait_for(self.scrapes.body(form), self.body_timeout)
        except asyncio.TimeoutError:
            return _unavailable(f"no metrics collected within {self.body_timeout:g}s"), "failed"
        except Exception as e:   # a collector's bug must cost the scrape, not the daemon
            log.warning("metrics collection failed", error=repr(e))
            return response(HTTPStatus.INTERNAL_SERVER_ERROR, [], b"metrics collection failed\n"), "failed"
        return response(HTTPStatus.OK, content_headers(form), body, send_body=request.method == "GET"), "served"


class _EndpointCollector:
    """The endpoint's own counters, served with the daemon's."""

    def __init__(self, server: MetricsServer) -> None:
        self.server = server

    def collect(self) -> Iterator[Metric]:
        connections = CounterMetricFamily(P + "metrics_connections", "connections to the metrics endpoint, by what "
                                                                     "became of them", labels=["outcome"])
        for outcome in OUTCOMES:
            connections.add_metric([outcome], self.server.counts[outcome])
        yield connections
        yield CounterMetricFamily(P + "metrics_collections", "times the daemon's state was collected for scrapes "
                                                             "(at most once per interval, however many scrape)",
                                  value=self.server.scrapes.collections)


class _TokenBucket:
    """``spend()`` after ``available()`` at most ``rate`` times a second on average,
    ``burst`` times at once."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = float(burst)
        self.clock = clock
        self.tokens = self.burst
        self.last = clock()

    def available(self) -> bool:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
        self.last = now
        return self.tokens >= 1

    def spend(self) -> None:
        self.tokens -= 1

    def wait(self) -> float:
        """Seconds until ``available()`` is true again."""
        return max(0.0, 1 - self.tokens) / self.rate


def _listening_socket(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def _unavailable(why: str) -> bytes:
    return response(HTTPStatus.SERVICE_UNAVAILABLE, [("Retry-After", "1")], (why + "\n").encode())


def _close(writer: asyncio.StreamWriter) -> None:
    if writer.transport.get_write_buffer_size():
        writer.transport.abort()   # never wait on a client that does not read
    else:
        writer.close()


__all__ = ["MetricsServer", "MAX_CONNECTIONS", "HEAD_TIMEOUT", "WRITE_TIMEOUT", "ACCEPTS_PER_SECOND"]
