"""Counters of what the pipeline did (hook outcomes, refusals), logged at shutdown and on
demand; call and hook latencies by label, read by the metrics endpoint at scrape time."""

from __future__ import annotations

import bisect
import threading
from collections import Counter
from typing import Dict, List, Sequence, Tuple


class Counters:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._c: Counter = Counter()

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._c[name] += n

    def snapshot(self) -> Dict[str, int]:
        with self._lock:
            return dict(self._c)

    def __getitem__(self, name: str) -> int:
        with self._lock:
            return self._c[name]


# Upper bounds (seconds) of the latency buckets: a StartContainer takes ~10 ms, a
# RunPodSandbox with networking up to seconds; a hook call is usually under a millisecond.
LATENCY_BUCKETS: Tuple[float, ...] = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                      1.0, 2.5, 5.0, 10.0, 30.0)


class LatencyStats:
    """Counts and latency histograms per label tuple (e.g. ``(method, code)``).

    :meth:`observe` is on the call path: one lock, a bisect and three additions; nothing
    is formatted until someone reads :meth:`snapshot` (a metrics scrape)."""

    def __init__(self, buckets: Sequence[float] = LATENCY_BUCKETS) -> None:
        self.buckets = tuple(buckets)
        self._lock = threading.Lock()
        self._series: Dict[Tuple[str, ...], List[float]] = {}   # labels -> [count, sum, per-bucket counts...]

    def observe(self, labels: Tuple[str, ...], seconds: float) -> None:
        i = bisect.bisect_left(self.buckets, seconds)
        with self._lock:
            s = self._series.get(labels)
            if s is None:
                s = self._series[labels] = [0, 0.0] + [0] * (len(self.buckets) + 1)
            s[0] += 1
            s[1] += seconds
            s[2 + i] += 1

    def snapshot(self) -> Dict[Tuple[str, ...], Tuple[int, float, List[int]]]:
        """labels -> (count, sum of seconds, cumulative counts per bucket and +Inf)."""
        with self._lock:
            series = {k: list(v) for k, v in self._series.items()}
        out = {}
        for labels, s in series.items():
            cumulative, running = [], 0
            for n in s[2:]:
                running += n
                cumulative.append(int(running))
            out[labels] = (int(s[0]), s[1], cumulative)
        return out
