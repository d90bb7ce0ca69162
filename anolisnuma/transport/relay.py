"""The relay: accepts kubelet connections and splices each onto its own containerd connection.

It owns what the connections share: the daemon-wide buffer budget, the counters of what
the transport refused or ended, and their log lines, summarised so that a client that
repeats a fault at will cannot fill the disk.
"""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Any, List, Optional

import structlog

from anolisnuma.logsummary import EventSummary
from anolisnuma.pipeline.metrics import Counters
from anolisnuma.system.heap import trim_heap
from anolisnuma.transport import h2
from anolisnuma.transport.budget import MemoryBudget
from anolisnuma.transport.conn import Conn, ReadBuffer
from anolisnuma.transport.connection_cap import ConnectionCap
from anolisnuma.transport.splice import Splice

log = structlog.get_logger("anolisnuma.transport")

MIB = 1 << 20
# After the buffers held more than this and are empty again, free heap pages are given
# back to the kernel (a second later, so that a busy stretch trims once, not per call).
TRIM_AFTER_PEAK_BYTES = 4 * MIB
TRIM_DELAY_SECONDS = 1.0
# At shutdown, how long a connection without the client's HTTP/2 preface is waited for (a
# kubelet sends it as it connects).
PREFACE_WAIT_SECONDS = 1.0
# An idle connection asked to go (the connection cap was reached) is closed once it drained
# (the client's PING answer and no call open: milliseconds), or after this long regardless.
SHED_CLOSE_SECONDS = 5.0
SHED_REASON = b"idle connection closed: anolisnuma's connection cap was reached"


class Relay:
    """Accepts kubelet connections and splices each onto a new containerd connection.

    It is each splice's :class:`~anolisnuma.transport.splice.SpliceOwner`: what a splice
    needs of it is that narrow view, so the splice never imports the relay."""

    def __init__(self, upstream: str, interceptor: Any, connect_timeout: float = 1.0,
                 max_message_bytes: int = 16 * MIB, budget_per_connection: int = 32 * MIB,
                 budget_total: int = 64 * MIB, max_connections: int = 128,
                 handshake_timeout: float = 10.0) -> None:
        self.upstream = upstream
        self.interceptor = interceptor
        self.connect_timeout = connect_timeout
        # Each connection costs a containerd connection and two descriptors: a client that
        # opens them without end is bounded by the cap (idle ones give way to new ones, see
        # connection_cap.py), one that opens them and never speaks by the handshake timeout.
        self.cap: ConnectionCap[Splice] = ConnectionCap(max_connections)
        self.handshake_timeout = handshake_timeout
        self.max_message_bytes = max_message_bytes
        self.budget_per_connection = budget_per_connection
        self.budget = MemoryBudget(budget_total, on_empty=self._buffers_empty)
        self._trim: Optional[asyncio.TimerHandle] = None
        self.counters = Counters()
        self.read_buffer = ReadBuffer()   # shared by every connection's reads (one loop)
        self.splices: set = set()
        self._tasks: set = set()
        self._unreachable = EventSummary(
            log, "containerd unreachable; kubelet connection closed (calls fail UNAVAILABLE)", 5.0)
        self._faults = EventSummary(log, "kubelet connection ended: the relay cannot follow it", level="error")
        self._over_cap = EventSummary(log, "kubelet connection refused: the connection cap is reached and "
                                           "every connection has a call open")
        self._shed = EventSummary(log, "idle kubelet connection closed to make room: the connection cap is "
                                       "reached (the client reconnects for its next call)")
        self._silent = EventSummary(log, "kubelet connection closed: no HTTP/2 preface within "
                                         "server.handshake_timeout_seconds")

    def set_budgets(self, per_connection: int, total: int) -> None:
        """New limits (a reload); what is already buffered stays, new takes see them."""
        self.budget_per_connection = per_connection
        self.budget.limit = total
        for splice in self.splices:
            splice.budget.limit = per_connection

    def protocol(self) -> asyncio.Protocol:
        return _Accepted(self)

    @property
    def max_connections(self) -> int:
        return self.cap.limit

    def set_max_connections(self, limit: int) -> None:
        """A new cap (a reload); connections over it are not closed, new ones see it."""
        self.cap.limit = limit

    def admit(self) -> bool:
        """Whether a new connection may be taken: below the cap, or once the connection
        idle longest was asked to go (connection_cap.py). False (counted and logged):
        every connection has a call open."""
        cap = self.cap
        if cap.has_room(len(self.splices)):
            return True
        if cap.idle_count() and not cap.may_shed():
            # Too many goodbyes under way (their clients do not answer): the oldest one
            # without a call is closed now, so descriptors stay within the reserve.
            stale = cap.oldest_shed(lambda s: not s.busy)
            if stale is not None:
                self.counters.add("connections_shed_cut_short")
                stale.close("idle connection shed: its goodbye was cut short (connection cap)")
        idlest = cap.take_idlest() if cap.may_shed() else None
        if idlest is None:
            self.counters.add("connections_refused_over_cap")
            self._over_cap.note("over cap", connections=len(self.splices), max_connections=cap.limit,
                                being_closed=cap.shedding)
            return False
        self._shed_idle(idlest)
        return True

    def _shed_idle(self, splice: Splice) -> None:
        """The graceful goodbye to an idle connection, closed once it drained. A connection
        that has not spoken HTTP/2 yet carries no call and is closed at once."""
        self.counters.add("connections_shed_idle")
        self._shed.note("shed", conn=splice.cid, connections=len(self.splices), max_connections=self.cap.limit)
        if not splice.greeted:
            splice.close("idle connection shed: no HTTP/2 preface yet")
            return
        splice.announce_shutdown(SHED_REASON)
        self._spawn(self._close_when_drained(splice))

    async def _close_when_drained(self, splice: Splice) -> None:
        try:
            await asyncio.wait_for(splice.wait_drained(), SHED_CLOSE_SECONDS)
        except asyncio.TimeoutError:
            pass
        splice.close("idle connection shed: the connection cap was reached")

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def adopt(self, splice: Splice) -> None:
        self.splices.add(splice)
        self.cap.idle(splice)
        self._spawn(self._connect(splice))
        asyncio.get_running_loop().call_later(self.handshake_timeout, self._end_if_silent, splice)

    def _end_if_silent(self, splice: Splice) -> None:
        if splice.closed or splice.greeted:
            return
        self.counters.add("connections_ended_no_preface")
        self._silent.note("no preface", conn=splice.cid, timeout_seconds=self.handshake_timeout)
        splice.close("no HTTP/2 preface in time")

    def forget(self, splice: Splice) -> None:
        self.splices.discard(splice)
        self.cap.gone(splice)

    def connection_busy(self, splice: Splice) -> None:
        self.cap.busy(splice)

    def connection_idle(self, splice: Splice) -> None:
        if not splice.draining:
            self.cap.idle(splice)

    # ---------------------------------------------------------------- what splices report
    def call_refused(self, splice: Splice, call: Any, message: str) -> None:
        """Counted here; logged by the pipeline, whose line for the ended call names the
        pod and carries ``message`` as its reason."""
        self.counters.add("calls_refused_resource_exhausted")

    def connection_failed(self, splice: Splice, code: int, why: str) -> None:
        name = h2.ERROR_NAMES.get(code, str(code))
        self.counters.add(f"connections_ended_{name.lower()}")
        self._faults.note(name, conn=splice.cid, http2_error=name, reason=why)

    def _buffers_empty(self) -> None:
        if self.budget.high_water < TRIM_AFTER_PEAK_BYTES or self._trim is not None:
            return
        self._trim = asyncio.get_running_loop().call_later(TRIM_DELAY_SECONDS, self._trim_heap)

    def _trim_heap(self) -> None:
        self._trim = None
        if self.budget.used:
            return  # busy again: the next time the buffers empty
        self.budget.high_water = 0
        trim_heap()
        self.counters.add("heap_trims")

    # ---------------------------------------------------------------- connections
    async def _connect(self, splice: Splice) -> None:
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            await asyncio.wait_for(loop.sock_connect(sock, self.upstream), self.connect_timeout)
        except (OSError, asyncio.TimeoutError) as e:
            sock.close()
            self.counters.add("containerd_unreachable")
            self._unreachable.note("unreachable", endpoint=self.upstream, error=str(e) or type(e).__name__)
            splice.close("containerd unreachable")
            return
        except BaseException:
            sock.close()
            raise
        if splice.closed:
            sock.close()
            return
        up = Conn(loop, sock, _ContainerdSide(splice), self.read_buffer, splice.from_containerd)
        up.resume_reading()
        splice.upstream_connected(up)  # type: ignore[arg-type]

    async def drain(self, grace: float) -> List[str]:
        """The graceful goodbye on every kubelet connection (Splice.announce_shutdown), then
        up to ``grace`` seconds for the calls in flight; returns the methods of the calls
        still open then, which closing the connections cuts. A connection whose client
        never sent the HTTP/2 preface is not waited for past PREFACE_WAIT_SECONDS: it
        carries no call."""
        for s in list(self.splices):
            s.announce_shutdown()
        waits = [asyncio.ensure_future(self._drained(s)) for s in self.splices if not s.drained]
        if waits:
            _, pending = await asyncio.wait(waits, timeout=grace)
            for task in pending:
                task.cancel()
        cut = [m for s in self.splices for m in s.open_methods()]
        watches = sum(s.open_watches() for s in self.splices)
        if watches:
            log.info("event watches end with their connections; the client opens them again", watches=watches)
        for s in list(self.splices):
            s.close("proxy shutting down")
        for summary in (self._unreachable, self._faults, self._over_cap, self._shed, self._silent):
            summary.flush()
        return cut

    @staticmethod
    async def _drained(splice: Splice) -> None:
        if not splice.greeted:
            try:
                await asyncio.wait_for(splice.wait_drained(), PREFACE_WAIT_SECONDS)
            except asyncio.TimeoutError:
                if not splice.greeted:
                    return
        await splice.wait_drained()


class _Accepted(asyncio.Protocol):
    """What the daemon's asyncio server hands a new kubelet connection to: its socket is
    taken over by a :class:`Conn` (a duplicate of the descriptor), and asyncio's
    transport, which never read a byte, is dropped."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.pause_reading()  # type: ignore[attr-defined]
        if not self.relay.admit():
            transport.abort()
            return
        try:
            fd = os.dup(transport.get_extra_info("socket").fileno())
        except OSError as e:  # out of descriptors: the kubelet sees the connection close
            log.error("cannot take over a kubelet connection", error=str(e))
            transport.abort()
            return
        transport.abort()   # closes asyncio's descriptor only: the connection lives on in ours
        side = _KubeletSide(self.relay)
        conn = Conn(asyncio.get_running_loop(), socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=fd),
                    side, self.relay.read_buffer)
        # nothing is read until containerd is connected
        side.splice = Splice(self.relay, conn)  # type: ignore[arg-type]
        conn.on_data = side.splice.from_kubelet
        self.relay.adopt(side.splice)

    def connection_lost(self, exc: Optional[Exception]) -> None:
        pass  # asyncio's transport only


class _KubeletSide:
    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.splice: Optional[Splice] = None

    def data_received(self, data: memoryview) -> None:  # (Conn calls the splice directly)
        self.splice.from_kubelet(data)

    def eof_received(self) -> Optional[bool]:
        self.splice.close("kubelet closed the connection")
        return None

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.splice.close("kubelet connection lost")

    # The kubelet reads slower than containerd writes: stop reading containerd.
    def pause_writing(self) -> None:
        if self.splice.up is not None:
            self.splice.up.pause_reading()

    def resume_writing(self) -> None:
        s = self.splice
        if s.up is not None and not s.closed:
            s.up.resume_reading()
        s.resume_kubelet("kubelet not reading")


class _ContainerdSide:
    def __init__(self, splice: Splice) -> None:
        self.splice = splice

    def data_received(self, data: memoryview) -> None:  # (Conn calls the splice directly)
        self.splice.from_containerd(data)

    def eof_received(self) -> Optional[bool]:
        self.splice.close("containerd closed the connection")
        return None

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.splice.close("containerd connection lost")

    # containerd reads slower than the kubelet writes: stop reading the kubelet.
    def pause_writing(self) -> None:
        self.splice.pause_kubelet("containerd not reading")

    def resume_writing(self) -> None:
        self.splice.resume_kubelet("containerd not reading")
