"""One metrics body per interval, shared by every scraper.

Collecting walks the daemon's structures (every pod's counters, the NUMA ledger, the
controllers) and encoding it is a few milliseconds of CPU. A thread per scrape let
3,000 scrapes that arrived together cost 3,000 collections (160 % CPU for minutes).
Here a collection runs on one worker thread of its own, never on the event loop and
never two at once; every scrape that arrives while it runs, or within
:data:`SCRAPE_INTERVAL` seconds after it ended, is answered from it. So however many
scrape, the daemon collects at most once per (collection time + interval), and encodes
each of the four forms (text or OpenMetrics, gzip or not) at most once per collection.

A value is at most :data:`SCRAPE_INTERVAL` seconds old: invisible next to a
Prometheus scrape interval (15-60 s), and not worth a setting.
"""

from __future__ import annotations

import asyncio
import gzip
import time
from concurrent.futures import Executor
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

from prometheus_client.core import Metric
from prometheus_client.exposition import choose_encoder

SCRAPE_INTERVAL = 1.0

Encoder = Callable[[Any], bytes]
# choose_encoder's answers for the two forms served; an Accept header's other parameters
# (versions, escaping) would each be one more encoding per collection, at a client's will.
_TEXT = choose_encoder("")
_OPENMETRICS = choose_encoder("application/openmetrics-text")


class Form(NamedTuple):
    """How a body is asked for: OpenMetrics or Prometheus text, gzipped or not."""

    openmetrics: bool
    gzip: bool

    @classmethod
    def of(cls, accept: str, accept_encoding: str) -> "Form":
        """The form of a request with these ``Accept`` and ``Accept-Encoding`` headers."""
        wants_om = any(t.split(";")[0].strip() == "application/openmetrics-text" for t in accept.split(","))
        wants_gzip = any(t.split(";")[0].strip().lower() == "gzip" for t in accept_encoding.split(","))
        return cls(wants_om, wants_gzip)

    @property
    def content_type(self) -> str:
        return (_OPENMETRICS if self.openmetrics else _TEXT)[1]


class _Collected:
    """What ``collect()`` returned once, as a registry an encoder can read again."""

    def __init__(self, families: List[Metric]) -> None:
        self.families = families

    def collect(self) -> List[Metric]:
        return self.families


class _Generation:
    """One collection and the bodies encoded from it."""

    def __init__(self, collected: "asyncio.Future[_Collected]") -> None:
        self.collected = collected
        self.finished: Optional[float] = None    # when the collection ended (loop clock)
        self.bodies: Dict[Form, "asyncio.Future[bytes]"] = {}

    def stale(self, now: float, interval: float) -> bool:
        # Never while collecting: a slow collection is joined, not queued behind.
        return self.finished is not None and now - self.finished >= interval


class ScrapeCache:
    """``await cache.body(form)`` -> bytes of the metrics page, at most ``interval``
    seconds old. ``registry.collect()`` and the encoders run on ``executor``, which must
    have one worker; the exception of a failed collection is raised to every scraper of
    its generation (and the failure is kept for ``interval`` too: no retry storm).
    Call from the event loop only."""

    def __init__(self, registry: Any, executor: Executor, interval: float = SCRAPE_INTERVAL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.registry = registry
        self.executor = executor
        self.interval = interval
        self.clock = clock
        self.collections = 0   # how many times the registry was walked
        self.encodings = 0
        self._current: Optional[_Generation] = None

    async def body(self, form: Form) -> bytes:
        generation = self._generation()
        body = generation.bodies.get(form)
        if body is None:
            body = generation.bodies[form] = asyncio.ensure_future(self._encode(generation, form))
        # shielded: a scraper that goes away must not cancel what the others wait for
        return await asyncio.shield(body)

    def _generation(self) -> _Generation:
        current = self._current
        if current is None or current.stale(self.clock(), self.interval):
            current = self._current = self._collect()
        return current

    def _collect(self) -> _Generation:
        self.collections += 1
        loop = asyncio.get_running_loop()
        generation = _Generation(loop.run_in_executor(self.executor, self._walk))
        generation.collected.add_done_callback(lambda _: setattr(generation, "finished", self.clock()))
        return generation

    def _walk(self) -> _Collected:
        return _Collected(list(self.registry.collect()))

    async def _encode(self, generation: _Generation, form: Form) -> bytes:
        collected = await asyncio.shield(generation.collected)
        self.encodings += 1
        encoder: Encoder = (_OPENMETRICS if form.openmetrics else _TEXT)[0]
        return await asyncio.get_running_loop().run_in_executor(self.executor, _encoded, encoder, collected,
                                                                form.gzip)


def _encoded(encoder: Encoder, collected: _Collected, compress: bool) -> bytes:
    body = encoder(collected)
    return gzip.compress(body, compresslevel=6) if compress else body


def content_headers(form: Form) -> List[Tuple[str, str]]:
    headers = [("Content-Type", form.content_type)]
    if form.gzip:
        headers.append(("Content-Encoding", "gzip"))
    return headers


__all__ = ["Form", "SCRAPE_INTERVAL", "ScrapeCache", "content_headers"]
