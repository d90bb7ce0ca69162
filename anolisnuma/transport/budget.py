"""Memory budgets for what the relay buffers.

The relay holds intercepted requests until the pipeline decides, copies intercepted
replies for the post-hooks, and queues bytes containerd's flow-control window cannot take
yet. Each connection has its own budget, drawn from one budget for the whole daemon, so
one kubelet connection (or a hostile client) can neither grow the daemon without bound
nor take every byte from the others. Only the event loop touches budgets: no lock.
"""

from __future__ import annotations

from typing import Callable, Optional


class MemoryBudget:
    """Bytes in use against a limit, optionally drawn from a parent budget as well.

    ``peak`` is the most ever in use, ``high_water`` the most since its owner last reset
    it; ``on_empty`` is called whenever what is in use falls back to nothing."""

    __slots__ = ("limit", "used", "parent", "peak", "high_water", "on_empty")

    def __init__(self, limit: int, parent: Optional["MemoryBudget"] = None,
                 on_empty: Optional[Callable[[], None]] = None) -> None:
        self.limit = limit
        self.used = 0
        self.peak = 0
        self.high_water = 0
        self.parent = parent
        self.on_empty = on_empty

    def fits(self, n: int) -> bool:
        if self.used + n > self.limit:
            return False
        return self.parent is None or self.parent.fits(n)

    def try_take(self, n: int) -> bool:
        """Take ``n`` bytes if this budget and its parent both have room; else take nothing."""
        if not self.fits(n):
            return False
        self.take(n)
        return True

    def take(self, n: int) -> None:
        """Take ``n`` bytes even past the limit: for bytes already bounded elsewhere (by
        HTTP/2 flow control), which must be counted but cannot be refused."""
        self.used += n
        if self.used > self.high_water:
            self.high_water = self.used
            if self.used > self.peak:
                self.peak = self.used
        if self.parent is not None:
            self.parent.take(n)

    def give(self, n: int) -> None:
        self.used -= n
        if self.parent is not None:
            self.parent.give(n)
        if not self.used and self.on_empty is not None:
            self.on_empty()

    def release_all(self) -> None:
        """Return everything still taken (the connection is gone)."""
        if self.used:
            self.give(self.used)
