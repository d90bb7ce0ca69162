"""The graceful goodbye (at shutdown, or to shed an idle connection): two GOAWAYs with a
PING between, then the drain.

Why two: a GOAWAY carries the last stream id the server will serve, and one sent with the
last id seen may cross a call the kubelet is opening, which it would then have to retry.
The first GOAWAY (highest id) and its PING stop new calls without refusing any in flight;
the second, once the PING's ACK came back, names the last stream really opened.
"""

from __future__ import annotations

import asyncio
from typing import List

from anolisnuma.transport import h2

# The graceful goodbye at shutdown: the PING sent after the first GOAWAY, and how long its
# ACK is waited for before the second GOAWAY goes anyway.
DRAIN_PING = b"anolisnm"
DRAIN_PING_TIMEOUT_SECONDS = 1.0
MAX_STREAM_ID = (1 << 31) - 1
# Streams that never end by themselves (event watches): a shutdown does not wait for them;
# they end when the connection closes, after the other calls, and the client opens them
# again on its new connection (the kubelet does, and relists).
WATCH_PATH_ENDS = ("/GetContainerEvents", "/containerd.services.events.v1.Events/Subscribe")


class Goodbye:
    """Shutdown of :class:`~anolisnuma.transport.splice.Splice` (a part of it: the state is
    the splice's, see ``Splice.__init__``)."""

    def announce_shutdown(self, reason: bytes = b"anolisnuma restarting") -> None:
        """The graceful goodbye of HTTP/2 (RFC 9113 section 6.8): a GOAWAY with the highest
        stream id and a PING; once the PING's ACK shows the kubelet read that GOAWAY (it opens
        no stream here after it), a second GOAWAY with the last stream id it really opened.
        Calls that raced the first GOAWAY are served, not refused; the open ones finish; the
        kubelet's next call goes on a new connection. A connection still in its handshake
        is told once both prefaces have passed (a GOAWAY before the server's SETTINGS would
        be a protocol error). ``reason`` goes in the GOAWAYs' debug data."""
        self.draining = True
        self.goodbye_reason = reason
        self._first_goaway(flush=True)

    def _first_goaway(self, flush: bool) -> None:
        if self.closed or self.goodbye or self.k2c.need_preface or not self.settled:
            return
        self.goodbye = 1
        self._inject_down(h2.goaway(MAX_STREAM_ID, h2.NO_ERROR, self.goodbye_reason))
        self._inject_down(h2.frame(h2.PING, 0, 0, DRAIN_PING))
        if flush:
            self._flush()
        asyncio.get_running_loop().call_later(DRAIN_PING_TIMEOUT_SECONDS, self._last_goaway)

    def _last_goaway(self, flush: bool = True) -> None:
        if self.closed or self.goodbye != 1:
            return
        self.goodbye = 2
        self.goaway_sid = self.max_sid
        self._inject_down(h2.goaway(self.max_sid, h2.NO_ERROR, self.goodbye_reason))
        if flush:
            self._flush()
        self._wake_idle()

    @property
    def busy(self) -> bool:
        return bool(self.open_streams)

    @property
    def drained(self) -> bool:
        """Closed, or told to go away for good with no call left open but event watches."""
        return self.closed or (self.goodbye == 2 and not self.open_methods())

    def open_methods(self) -> List[str]:
        """The paths of the calls open, event watches left out."""
        return sorted(p for p in self.open_streams.values() if not p.endswith(WATCH_PATH_ENDS))

    def open_watches(self) -> int:
        return sum(1 for p in self.open_streams.values() if p.endswith(WATCH_PATH_ENDS))

    def _wake_idle(self) -> None:
        if self.idle_waiters and self.drained:
            waiters, self.idle_waiters = self.idle_waiters, []
            for w in waiters:
                if not w.done():
                    w.set_result(None)

    async def wait_drained(self) -> None:
        """Until :attr:`drained` (after :meth:`announce_shutdown`)."""
        if self.drained:
            return
        fut = asyncio.get_running_loop().create_future()
        self.idle_waiters.append(fut)
        await fut
