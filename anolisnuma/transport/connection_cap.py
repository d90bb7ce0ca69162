"""How many kubelet connections the relay keeps, and which one gives way to a new one.

containerd (1.6 and 2.x) has no connection cap: grpc-go serves every connection its
descriptors allow, and real clients use that: the CRI conformance suite holds more than
128 connections open at once, most of them idle. A proxy that refuses connection N+1 at a
small N fails such a client where containerd would not. So:

- the cap is what the process's descriptors allow (each relayed connection costs two: the
  kubelet's side and containerd's), after a reserve for the daemon's own files, and at most
  :data:`AUTO_CEILING` (each connection also costs memory, here and in containerd); an
  explicit ``server.max_connections`` replaces it, within the same descriptor bound;
- when the cap is reached, the connection **idle longest** (no call open, none for the
  longest time) is asked to go with HTTP/2's graceful GOAWAY (a gRPC client opens a new
  connection for its next call, transparently) and closed once it drained, and the new
  connection is taken;
- a new connection is refused only when no connection is idle (every one has a call or a
  watch open). Connections being shed are bounded (:attr:`ConnectionCap.max_shedding`,
  within the descriptor reserve): past that, the one shed longest ago that has no call
  open is closed at once, its goodbye cut short, so that a flood cannot make the daemon
  hold descriptors beyond its reserve, nor make a well-behaved new client wait.

This module keeps the arithmetic and the idle order; the relay acts on them.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Generic, Hashable, List, Optional, TypeVar

# Above this many connections the cost is memory rather than descriptors: an idle relayed
# connection costs the daemon about 8 KiB and containerd about 70 KiB (measured with
# scripts/bench_connections.py, docs/benchmarks.md), so 16384 of them are about 1.2 GiB on
# the node, most of it containerd's. Far above any real client (a kubelet keeps one or two;
# the conformance suite a few hundred).
AUTO_CEILING = 16384
# Descriptors kept for everything else the daemon opens (logs, state files, cgroup files,
# the admin and metrics sockets, netlink, its own gRPC channel to containerd): a fixed part
# and a sixteenth of the limit, which also covers connections being shed (see may_shed).
FIXED_RESERVE = 256
FLOOR = 16


def descriptor_bound(open_files: int) -> int:
    """The most connections ``open_files`` descriptors carry, after the reserve."""
    reserve = FIXED_RESERVE + open_files // 16
    return max(FLOOR, (open_files - reserve) // 2)


def connection_cap(configured: int, open_files: int) -> int:
    """The cap: ``configured`` (0: automatic) within what ``open_files`` carries."""
    bound = descriptor_bound(open_files)
    if configured <= 0:
        return min(bound, AUTO_CEILING)
    return min(configured, bound)


Conn = TypeVar("Conn", bound=Hashable)


class ConnectionCap(Generic[Conn]):
    """The cap, and the connections with no call open in the order they became idle.

    The relay tells it when a connection is taken (idle: it has no call yet), when its
    first call opens (busy) and its last ends (idle again), and when it is gone. All on
    the event loop: no lock."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._idle: "OrderedDict[Conn, None]" = OrderedDict()
        self._shedding: "OrderedDict[Conn, None]" = OrderedDict()   # in the order they were asked to go

    @property
    def max_shedding(self) -> int:
        """Connections being shed at once, at most: a sixteenth of the cap (within the
        descriptor reserve), at least 4."""
        return max(4, self.limit // 16)

    @property
    def shedding(self) -> int:
        return len(self._shedding)

    def idle(self, conn: Conn) -> None:
        if conn not in self._idle and conn not in self._shedding:
            self._idle[conn] = None

    def busy(self, conn: Conn) -> None:
        self._idle.pop(conn, None)

    def gone(self, conn: Conn) -> None:
        self._idle.pop(conn, None)
        self._shedding.pop(conn, None)

    def has_room(self, connections: int) -> bool:
        """Whether ``connections`` (every one open) leave room for one more: those being
        shed have given up their place."""
        return connections - len(self._shedding) < self.limit

    def may_shed(self) -> bool:
        return len(self._shedding) < self.max_shedding

    def take_idlest(self) -> Optional[Conn]:
        """The connection idle longest, now counted as being shed; None when none is idle."""
        if not self._idle:
            return None
        conn, _ = self._idle.popitem(last=False)
        self._shedding[conn] = None
        return conn

    def oldest_shed(self, without_calls: Callable[[Conn], bool]) -> Optional[Conn]:
        """The connection asked to go longest ago for which ``without_calls`` holds."""
        for conn in self._shedding:
            if without_calls(conn):
                return conn
        return None

    def idle_count(self) -> int:
        return len(self._idle)

    def idle_order(self) -> List[Conn]:
        """Idle connections, idle longest first."""
        return list(self._idle)
