"""The :class:`Splice`: one kubelet connection joined to one containerd connection.

This module holds what a splice is (its state, in one place) and how it starts and ends;
what it does with frames is in the modules beside it, one concern each, joined here into
one class. Why one class and not one object per concern: every frame read runs through
several of them (the frame loop, a direction's handlers, flow control), and each would
otherwise reach the shared state through one more attribute per access; as parts of one
class they read it directly, and the hot path costs what it cost when the splice was one
module.

- :mod:`.framing`: the frame loop (runs forwarded as read, frames cut out for handlers);
- :mod:`.kubelet_frames` / :mod:`.containerd_frames`: each direction's frame handlers;
- :mod:`.header_blocks`: HEADERS/CONTINUATION gathered and decoded;
- :mod:`.flow`: flow-control windows, credit, the send queue and the memory budget;
- :mod:`.intercepted`: held requests, the pipeline's decisions, our own answers;
- :mod:`.goodbye`: the graceful GOAWAY at shutdown and the drain.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import OrderedDict, deque
from typing import Any, Deque, Dict, List, Optional, Protocol, Set

from anolisnuma.transport import h2
from anolisnuma.transport.budget import MemoryBudget
from anolisnuma.transport.headers import HeaderBlockDecoder
from anolisnuma.transport.splice.containerd_frames import ContainerdFrames
from anolisnuma.transport.splice.flow import FlowControl
from anolisnuma.transport.splice.framing import FramePump, FrameReader
from anolisnuma.transport.splice.goodbye import Goodbye
from anolisnuma.transport.splice.intercepted import InterceptedCalls, InterceptedStream
from anolisnuma.transport.splice.kubelet_frames import KubeletFrames

# After the relay closes a kubelet connection, how long the kubelet may take to read what
# was written (a GOAWAY, last replies) before the connection is aborted.
CLOSE_LINGER_SECONDS = 2.0

_conn_ids = itertools.count(1)


class SpliceOwner(Protocol):
    """What a splice needs of whoever accepted its connection (the relay; a test's harness):
    the interceptor and limits it runs with, the shared budget its own is drawn from, and
    its reports. Defined here, on the splice's side, so that the splice can be read and
    tested without the relay, which imports the splice and is never imported back."""

    interceptor: Any             # the pipeline (anolisnuma.pipeline.interceptor.Interceptor)
    max_message_bytes: int
    budget_per_connection: int
    budget: MemoryBudget         # the daemon-wide budget, parent of each splice's own

    def forget(self, splice: "Splice") -> None:
        """The splice closed both its connections."""

    def connection_failed(self, splice: "Splice", code: int, why: str) -> None:
        """The splice ends its connection with HTTP/2 error ``code``: it cannot follow it."""

    def call_refused(self, splice: "Splice", call: Any, message: str) -> None:
        """The splice answered ``call`` RESOURCE_EXHAUSTED (a budget was spent)."""

    def connection_busy(self, splice: "Splice") -> None:
        """The connection's first call opened (it had none open)."""

    def connection_idle(self, splice: "Splice") -> None:
        """The connection's last open call ended."""


class Splice(KubeletFrames, ContainerdFrames, InterceptedCalls, FlowControl, Goodbye, FramePump):
    """One kubelet connection joined to one containerd connection.

    All of its state is declared here, grouped by the part that keeps it; the parts it is
    made of (the classes above, one module each) hold the code of one concern and read that
    state directly (the module's docstring says why)."""

    def __init__(self, owner: SpliceOwner, down: asyncio.Transport) -> None:
        self.owner = owner
        self.interceptor = owner.interceptor
        self.max_message_bytes = owner.max_message_bytes
        self.cid = next(_conn_ids)
        self.budget = MemoryBudget(owner.budget_per_connection, parent=owner.budget)
        self.down = down                      # kubelet side
        self.up: Optional[asyncio.Transport] = None
        self.k2c = FrameReader(expect_preface=True)
        self.c2k = FrameReader(expect_preface=False)
        self.k2c_hpack = HeaderBlockDecoder()
        self.c2k_hpack = HeaderBlockDecoder()
        self.streams: Dict[int, InterceptedStream] = {}
        self.open_streams: Dict[int, str] = {}   # stream id -> method path, until it ends
        self.max_sid = 0
        self.goaway_sid: Optional[int] = None   # set when we told the kubelet to go away
        self.draining = False                   # shutdown: the goodbye is wanted (see announce_shutdown)
        self.goodbye = 0                        # 1: first GOAWAY and PING sent; 2: last GOAWAY sent
        self.goodbye_reason = b""               # the GOAWAYs' debug data: why we asked it to go
        self.settled = False                    # containerd's SETTINGS reached the kubelet
        self.refused: "OrderedDict[int, None]" = OrderedDict()  # whose DATA we drop
        self.silenced: "OrderedDict[int, None]" = OrderedDict()  # answered by us: containerd's frames dropped
        # containerd's side of flow control, as we follow it
        self.up_stream_window = h2.DEFAULT_WINDOW   # its initial stream window
        self.up_window = h2.DEFAULT_WINDOW          # its connection window left
        self.up_queue: Deque[tuple] = deque()       # (frame, flow, charge, ours) awaiting it
        self.up_queue_bytes = 0
        self.conn_debt = 0                          # credit containerd returns that the kubelet had
        # the kubelet's side: what it may still send us on the connection
        self.down_window = h2.DEFAULT_WINDOW
        self.down_credit = 0                        # connection credit to give at the next flush
        self.down_stream_credit: Dict[int, int] = {}
        self.up_out: List[Any] = []
        self.down_out: List[Any] = []
        self.paused: Set[str] = set()               # why the kubelet is not being read
        self.closed = False
        self.idle_waiters: List[asyncio.Future] = []
        # _pump's per-direction arguments, bound once rather than on every read
        self._k2c_pump = (self.k2c, self._send_up, self._k2c_frame, self._k2c_classify, self._k2c_fold)
        self._c2k_pump = (self.c2k, self._send_down, self._c2k_frame, self._c2k_classify, self._c2k_fold)

    @property
    def greeted(self) -> bool:
        """Whether the kubelet sent the HTTP/2 preface."""
        return not self.k2c.need_preface

    # ---------------------------------------------------------------- wiring
    def upstream_connected(self, up: asyncio.Transport) -> None:
        self.up = up
        self.down.resume_reading()
        if self.k2c.buf:  # bytes that arrived before containerd answered
            self.from_kubelet(b"")

    def close(self, why: str = "") -> None:
        """Close both connections and end every intercepted call still open.

        containerd's side is aborted: nobody waits for what it would still read or write,
        and a close that waits for a full buffer to drain would leak the connection. The
        kubelet's side gets a moment to read what was written (a GOAWAY), then is aborted.
        """
        if self.closed:
            return
        self.closed = True
        if self.up is not None:
            self.up.abort()
        if self.down_out:
            self.down.write(b"".join(self.down_out))
            self.down_out.clear()
        self.down.close()
        if self.down.get_write_buffer_size():
            asyncio.get_running_loop().call_later(CLOSE_LINGER_SECONDS, self.down.abort)
        for st in list(self.streams.values()):
            if not st.done:
                self._finish(st, aborted=why or "connection closed")
        self.streams.clear()
        self.open_streams.clear()
        self.up_queue.clear()
        self.budget.release_all()
        self._wake_idle()
        self.owner.forget(self)

    def _call_ended(self) -> None:
        """A call's stream ended or was reset: with none left open the connection is idle
        (its owner may shed it), and a drain may be over."""
        if not self.open_streams and not self.closed:
            self.owner.connection_idle(self)
        self._wake_idle()

    def fail(self, code: int, why: str) -> None:
        """End the connection because it cannot be followed: GOAWAY to the kubelet (when
        a frame may be put in its stream now), then close."""
        if self.closed:
            return
        self.owner.connection_failed(self, code, why)
        if self.c2k.passing == 0:
            self.down_out.append(h2.goaway(self.max_sid, code, why.encode("utf-8", "replace")[:256]))
        self.close(f"connection ended by the relay: {why}")
