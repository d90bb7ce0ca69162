"""The metrics endpoint's HTTP server on its own, on asyncio's loop and on uvloop's (the
daemon's): what it answers, the limits a client meets, and one collection shared by the
scrapes of an interval."""

from __future__ import annotations

import asyncio
import gzip
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Awaitable, Callable, Dict, Iterator, List, Tuple

import pytest
from prometheus_client.core import GaugeMetricFamily

from anolisnuma.admin.metrics_http import MetricsServer, _TokenBucket
from anolisnuma.admin.scrape import Form, ScrapeCache

Answer = Tuple[int, Dict[str, str], bytes]


class Gauges:
    """A collector of ``n`` samples, counting its collections; ``gate`` holds them."""

    def __init__(self, n: int = 3) -> None:
        self.n = n
        self.collections = 0
        self.gate = threading.Event()
        self.gate.set()

    def collect(self) -> Iterator[Any]:
        self.gate.wait(10)
        self.collections += 1
        g = GaugeMetricFamily("test_gauge", "a gauge", labels=["i"])
        for i in range(self.n):
            g.add_metric([str(i)], i)
        yield g


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: Any) -> Callable[[Awaitable[Any]], Any]:
    def runner(coro: Awaitable[Any]) -> Any:
        if request.param == "uvloop":
            uvloop = pytest.importorskip("uvloop")
            loop = uvloop.new_event_loop()
        else:
            loop = asyncio.new_event_loop()
        try:
            return loop.run_until_complete(asyncio.wait_for(coro, 30))
        finally:
            loop.close()
    return runner


async def serving(collector: Any = None, **limits: Any) -> MetricsServer:
    return await MetricsServer("127.0.0.1", 0, collector or Gauges(), **limits).start()


async def exchange(server: MetricsServer, request: bytes) -> Answer:
    """Send ``request``, read to the end: (status, headers, body)."""
    reader, writer = await asyncio.open_connection(*server.address)
    writer.write(request)
    data = await reader.read()
    writer.close()
    return parse(data)


def parse(data: bytes) -> Answer:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


def get(path: str = "/metrics", method: str = "GET", *headers: str) -> bytes:
    return "\r\n".join([f"{method} {path} HTTP/1.1", "Host: x"] + list(headers) + ["", ""]).encode()


# ---------------------------------------------------------------- answers

def test_get_and_head_of_metrics_in_text_openmetrics_or_gzip(run):
    async def story() -> List[Answer]:
        server = await serving()
        try:
            return [await exchange(server, get()),
                    await exchange(server, get("/metrics?name[]=x", "HEAD")),
                    await exchange(server, get("/metrics", "GET", "Accept: application/openmetrics-text; version=1.0.0")),
                    await exchange(server, get("/metrics", "GET", "Accept-Encoding: gzip"))]
        finally:
            await server.stop()

    text, head, om, gz = run(story())
    assert text[0] == 200 and text[1]["Content-Type"].startswith("text/plain") and text[1]["Connection"] == "close"
    assert b'test_gauge{i="2"} 2.0' in text[2]
    assert head[0] == 200 and head[2] == b"" and int(head[1]["Content-Length"]) == len(text[2])
    assert om[1]["Content-Type"].startswith("application/openmetrics-text") and om[2].endswith(b"# EOF\n")
    assert gz[1]["Content-Encoding"] == "gzip" and gzip.decompress(gz[2]) == text[2]


@pytest.mark.parametrize("request_bytes, status", [
    (get("/metrics", "POST"), 405),
    (get("/metrics", "OPTIONS"), 405),
    (get("/"), 404),
    (get("/favicon.ico"), 404),
    (b"GET /" + b"m" * 5000 + b" HTTP/1.1\r\n\r\n", 414),
    (get("/metrics", "GET", "X-Big: " + "y" * 5000), 431),
    (get("/metrics", "GET", *[f"X-{i}: {'y' * 200}" for i in range(40)]), 431),
    (get("/metrics", "GET", *[f"X-{i}: 1" for i in range(100)]), 431),
    (b"GET /metrics\r\n\r\n", 400),
    (b"GET /metrics HTTP/2.0\r\n\r\n", 400),
    (get("/metrics", "GET", "no colon here"), 400),
])
def test_what_is_not_a_scrape_is_answered_and_closed(run, request_bytes, status):
    async def story() -> Tuple[Answer, Dict[str, int], int]:
        collector = Gauges()
        server = await serving(collector)
        try:
            return await exchange(server, request_bytes), dict(server.counts), collector.collections
        finally:
            await server.stop()

    (code, headers, _), counts, collections = run(story())
    assert code == status
    assert counts["rejected"] == 1 and collections == 0
    if status == 405:
        assert headers["Allow"] == "GET, HEAD"


# ---------------------------------------------------------------- limits

def test_a_connection_over_the_cap_is_answered_503_at_once(run):
    async def story() -> Tuple[Answer, Answer, Dict[str, int]]:
        server = await serving(max_connections=2)
        held = []
        try:
            for _ in range(2):
                _, w = await asyncio.open_connection(*server.address)
                w.write(b"GET /metrics HTTP/1.1\r\n")   # and nothing more
                held.append(w)
            while len(server._serving) < 2:
                await asyncio.sleep(0.01)
            refused = await exchange(server, get())
            for w in held:
                w.close()
            while server._serving:
                await asyncio.sleep(0.01)
            return refused, await exchange(server, get()), dict(server.counts)
        finally:
            await server.stop()

    refused, served, counts = run(story())
    assert refused[0] == 503 and refused[1]["Retry-After"] == "1"
    assert served[0] == 200
    assert counts["busy"] == 1 and counts["closed_early"] == 2 and counts["served"] == 1


def test_a_request_head_not_sent_in_time_is_dropped(run):
    async def story() -> Tuple[bytes, Dict[str, int]]:
        server = await serving(head_timeout=0.2)
        try:
            reader, writer = await asyncio.open_connection(*server.address)
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            data = await reader.read()      # the server's close, not ours
            writer.close()
            return data, dict(server.counts)
        finally:
            await server.stop()

    data, counts = run(story())
    assert data == b"" and counts["head_timeout"] == 1


def test_an_answer_not_taken_in_time_is_dropped(run):
    async def story() -> Dict[str, int]:
        server = await serving(Gauges(n=200_000), write_timeout=0.2)   # ~5 MB: more than socket buffers
        try:
            reader, writer = await asyncio.open_connection(*server.address, limit=1 << 16)
            writer.write(get())
            while not server.counts["write_timeout"]:
                await asyncio.sleep(0.05)
            writer.transport.abort()
            return dict(server.counts)
        finally:
            await server.stop()

    counts = run(story())
    assert counts["write_timeout"] == 1 and counts["served"] == 0


def test_accepts_beyond_the_rate_wait_for_tokens():
    now = [0.0]
    bucket = _TokenBucket(rate=10, burst=3, clock=lambda: now[0])
    spent = 0
    while bucket.available():
        bucket.spend()
        spent += 1
    assert spent == 3 and bucket.wait() == pytest.approx(0.1)
    now[0] += 0.25
    assert bucket.available() and bucket.tokens == pytest.approx(2.5)
    now[0] += 100
    assert bucket.tokens <= 3 and bucket.available() and bucket.tokens == 3


# ---------------------------------------------------------------- one collection per interval

class Registry:
    def __init__(self) -> None:
        self.collector = Gauges()

    def collect(self) -> Iterator[Any]:
        return self.collector.collect()


def test_scrapes_of_one_interval_share_one_collection(run):
    now = [100.0]

    async def story() -> List[int]:
        registry = Registry()
        with ThreadPoolExecutor(max_workers=1) as executor:
            cache = ScrapeCache(registry, executor, interval=1.0, clock=lambda: now[0])
            registry.collector.gate.clear()          # a collection that takes its time
            waiting = [asyncio.ensure_future(cache.body(Form(False, False))) for _ in range(50)]
            waiting += [asyncio.ensure_future(cache.body(Form(True, True))) for _ in range(50)]
            await asyncio.sleep(0.05)
            now[0] += 5                              # past the interval while collecting: joined
            late = asyncio.ensure_future(cache.body(Form(False, False)))
            registry.collector.gate.set()
            bodies = await asyncio.gather(*waiting, late)
            seen = [cache.collections, cache.encodings, len(set(bodies))]
            now[0] += 0.5
            await cache.body(Form(False, False))      # within the interval after it ended
            seen.append(cache.collections)
            now[0] += 1.0
            await cache.body(Form(False, False))      # stale now: collected again
            seen += [cache.collections, registry.collector.collections]
            return seen

    collections, encodings, distinct, within, after, walked = run(story())
    assert (collections, encodings, distinct) == (1, 2, 2)
    assert within == 1 and after == 2 and walked == 2


def test_a_failed_collection_fails_its_scrapes_and_is_not_retried_within_the_interval(run):
    now = [0.0]

    class Broken:
        calls = 0

        def collect(self) -> Iterator[Any]:
            Broken.calls += 1
            raise RuntimeError("a collector's bug")

    async def story() -> Tuple[List[Any], int]:
        with ThreadPoolExecutor(max_workers=1) as executor:
            cache = ScrapeCache(Broken(), executor, interval=1.0, clock=lambda: now[0])
            results = await asyncio.gather(*[cache.body(Form(False, False)) for _ in range(10)],
                                           return_exceptions=True)
            again = await asyncio.gather(cache.body(Form(False, False)), return_exceptions=True)
            return results + again, Broken.calls

    results, calls = run(story())
    assert all(isinstance(r, RuntimeError) for r in results) and calls == 1


def test_a_failed_collection_is_answered_500(run):
    class Broken:
        def collect(self) -> Iterator[Any]:
            raise RuntimeError("a collector's bug")
            yield  # pragma: no cover

    async def story() -> Tuple[Answer, Answer]:
        server = await serving(Broken())
        try:
            return await exchange(server, get()), await exchange(server, get())
        finally:
            await server.stop()

    first, second = run(story())
    assert first[0] == 500 and second[0] == 500
