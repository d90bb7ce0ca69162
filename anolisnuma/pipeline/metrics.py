"""Counters of what the pipeline did (hook outcomes, refusals), logged at shutdown and on demand."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Dict


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
