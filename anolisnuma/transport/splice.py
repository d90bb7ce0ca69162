"""The HTTP/2 splice: one kubelet connection relayed frame by frame to one containerd connection.

Why a splice and not a gRPC server plus a gRPC client: a Python gRPC server and client pair
adds ~450 µs to every call and imposes its own message limits, deadlines and method
tables. Here the two HTTP/2 connections are joined end to end, so SETTINGS, PING,
deadlines (``grpc-timeout``), metadata, status codes, unknown methods, streams and message
sizes all pass as the peers sent them. The relay:

- decodes every header block (HPACK state must be followed in both directions) to learn
  which method each new stream calls and, for intercepted calls, the reply's status;
- holds the request of an intercepted call whose pre-hooks need it until the pipeline
  decided, then sends the original or the edited body, or answers the call itself with a
  status (trailers-only, coded without touching the peer's HPACK table); an intercepted
  call no pre-hook needs streams through and is copied for the record;
- copies the reply of intercepted calls for the post-hooks while passing it on.

Flow control. What the relay holds it has received on the kubelet's behalf, so it credits
the kubelet at once (connection and stream WINDOW_UPDATE) and charges the bytes to a
memory budget (:mod:`~anolisnuma.transport.budget`); a held call never blocks the other
calls of its connection, whatever its size. Bytes the relay sends itself (held bodies,
edits) are metered within containerd's connection and stream windows, which the relay
follows; the credit containerd later returns for them is kept from the kubelet
(``conn_debt``), since the kubelet had it already. When a budget is spent, the newest held
calls are refused with RESOURCE_EXHAUSTED, never stalled and never passed unpoliced.

No bypass. A connection whose frames or header blocks the relay cannot follow (a bad
frame size, an undecodable or oversized header block, a flow-control overrun, a client
that does not speak HTTP/2) is ended with GOAWAY, never relayed unread: the kubelet
reconnects at once, and every call on the new connection is read again.

When containerd cannot be reached the kubelet's connection is closed at once, which the
kubelet's gRPC client reports as UNAVAILABLE, exactly as if containerd's own socket were
gone; when containerd's connection drops, the kubelet's is closed with it and the kubelet
reconnects (to us, and we to the restarted containerd).
"""

from __future__ import annotations

import asyncio
import itertools
from collections import OrderedDict, deque
from typing import TYPE_CHECKING, Any, Callable, Deque, Dict, List, Optional, Set
from urllib.parse import unquote

import structlog

from anolisnuma.cri import grpcwire
from anolisnuma.pipeline.decision import Decision
from anolisnuma.transport import h2
from anolisnuma.transport.budget import MemoryBudget
from anolisnuma.transport.headers import MAX_HEADER_BLOCK_BYTES, HeaderBlockDecoder, HeaderBlockError, HeaderList

if TYPE_CHECKING:
    from anolisnuma.transport.relay import Relay

log = structlog.get_logger("anolisnuma.transport")

RESOURCE_EXHAUSTED = grpcwire.STATUS_CODES["RESOURCE_EXHAUSTED"]

# Charged per intercepted stream for its bookkeeping, so that a flood of streams that
# send nothing is bounded by the budget as well.
STREAM_OVERHEAD_BYTES = 1024
# Bytes waiting for containerd's connection window past which the kubelet is not read
# until they drain to half of it (frames without flow control, e.g. HEADERS, queue too).
QUEUE_PAUSE_BYTES = 1 << 20
# Bytes written to the kubelet and not yet taken by it past which the kubelet is not read:
# what it sends makes us write (credits, refusals), so a client that never reads cannot
# make the relay buffer without end.
DOWN_BACKLOG_PAUSE_BYTES = 4 << 20
# Refused streams whose remaining DATA is still dropped; older ones are forgotten (their
# late DATA then reaches containerd, which ignores data of a cancelled stream).
MAX_REFUSED_REMEMBERED = 4096
# After the relay closes a kubelet connection, how long the kubelet may take to read what
# was written (a GOAWAY, last replies) before the connection is aborted.
CLOSE_LINGER_SECONDS = 2.0
# The graceful goodbye at shutdown: the PING sent after the first GOAWAY, and how long its
# ACK is waited for before the second GOAWAY goes anyway.
DRAIN_PING = b"anolisnm"
DRAIN_PING_TIMEOUT_SECONDS = 1.0
MAX_STREAM_ID = (1 << 31) - 1
# Streams that never end by themselves (event watches): a shutdown does not wait for them;
# they end when the connection closes, after the other calls, and the client opens them
# again on its new connection (the kubelet does, and relists).
WATCH_PATH_ENDS = ("/GetContainerEvents", "/containerd.services.events.v1.Events/Subscribe")

_conn_ids = itertools.count(1)

# How _pump treats a frame (what a direction's ``classify`` answers):
WHOLE = 0    # read whole, then handed to the direction's frame handler
STREAM = 1   # pass-through DATA: forwarded as its bytes arrive
FOLD = 2     # forwarded unchanged in the run of bytes around it, once its ``fold`` handler
             # (which may decline) has done its bookkeeping; no frame of ours goes out meanwhile
PASS = 3     # as FOLD for a frame with no bookkeeping to do (PING, SETTINGS ACK, ...)
_HEADER = h2.FRAME_HEADER_STRUCT
_PADDED_OR_PRIORITY = h2.FLAG_PADDED | h2.FLAG_PRIORITY
_HLEN = h2.FRAME_HEADER_LEN


class ConnectionFault(Exception):
    """The connection can no longer be followed and must end with ``code``."""

    def __init__(self, code: int, why: str) -> None:
        super().__init__(why)
        self.code = code


class _Stream:
    """Per-stream state of an intercepted call (pass-through streams carry none)."""

    __slots__ = ("sid", "call", "holding", "held", "held_len", "request_done", "copy", "copy_len",
                 "charged", "up_window", "outbox", "outbox_pos", "sends_own_body", "answered", "reply_started",
                 "reply", "reply_len", "reply_overflow", "status", "status_message", "done")

    def __init__(self, sid: int, call: Any, holding: bool, up_window: int) -> None:
        self.sid = sid
        self.call = call
        self.holding = holding        # request DATA kept until the pipeline decided
        self.held: List[bytes] = []
        self.held_len = 0
        self.request_done = False     # the kubelet sent END_STREAM
        self.copy: Optional[List[bytes]] = None if holding else []  # streamed through: copied
        self.copy_len = 0
        self.charged = 0              # bytes of the budget this stream holds
        self.up_window = up_window    # containerd's window for this stream (bodies we send)
        self.outbox = b""             # decided body waiting for containerd's stream window
        self.outbox_pos = 0
        self.sends_own_body = holding  # containerd's stream credit is ours, not the kubelet's
        self.answered = False         # we answered the kubelet ourselves
        self.reply_started = False    # containerd's response headers went to the kubelet
        self.reply: List[bytes] = []
        self.reply_len = 0
        self.reply_overflow = False
        self.status: Optional[int] = None
        self.status_message = ""
        self.done = False


class _Reader:
    """Incremental frame reader for one direction of a connection.

    Large DATA frames of pass-through streams are forwarded as their bytes arrive; every
    other frame is handed over whole. Frames of our own wait in ``pending`` until the reader
    stands between frames and outside a header block, where HTTP/2 allows inserting them.
    """

    def __init__(self, expect_preface: bool) -> None:
        self.buf = bytearray()
        self.need_preface = expect_preface
        self.passing = 0            # bytes of the current frame still to forward as-is
        self.in_header_block = False
        self.header_sid = 0
        self.header_end_stream = False
        self.block = bytearray()
        self.max_frame = h2.DEFAULT_MAX_FRAME_SIZE   # what the receiving peer accepts
        self.pending: List[tuple] = []    # frames of ours waiting for a frame boundary
        self.tail: Optional[int] = None   # stream whose END_STREAM frame is still streaming
        self.silenced_block: List[bytes] = []  # frames of a header block we may drop
        self.whole_pending = False        # the frame at the head of ``buf`` is read whole
        self.folding = False              # a frame joining the run is being looked at

    @property
    def at_boundary(self) -> bool:
        # while a frame is folded its bytes are not out yet: frames of ours wait for it
        return self.passing == 0 and not self.in_header_block and not self.folding


class Splice:
    """One kubelet connection joined to one containerd connection."""

    def __init__(self, relay: "Relay", down: asyncio.Transport) -> None:
        self.relay = relay
        self.interceptor = relay.interceptor
        self.max_message_bytes = relay.max_message_bytes
        self.cid = next(_conn_ids)
        self.budget = MemoryBudget(relay.budget_per_connection, parent=relay.budget)
        self.down = down                      # kubelet side
        self.up: Optional[asyncio.Transport] = None
        self.k2c = _Reader(expect_preface=True)
        self.c2k = _Reader(expect_preface=False)
        self.k2c_hpack = HeaderBlockDecoder()
        self.c2k_hpack = HeaderBlockDecoder()
        self.streams: Dict[int, _Stream] = {}
        self.open_streams: Dict[int, str] = {}   # stream id -> method path, until it ends
        self.max_sid = 0
        self.goaway_sid: Optional[int] = None   # set when we told the kubelet to go away
        self.draining = False                   # shutdown: the goodbye is wanted (see announce_shutdown)
        self.goodbye = 0                        # 1: first GOAWAY and PING sent; 2: last GOAWAY sent
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
        self.relay.forget(self)

    def fail(self, code: int, why: str) -> None:
        """End the connection because it cannot be followed: GOAWAY to the kubelet (when
        a frame may be put in its stream now), then close."""
        if self.closed:
            return
        self.relay.connection_failed(self, code, why)
        if self.c2k.passing == 0:
            self.down_out.append(h2.goaway(self.max_sid, code, why.encode("utf-8", "replace")[:256]))
        self.close(f"connection ended by the relay: {why}")

    # ---------------------------------------------------------------- sending
    def _send_up(self, data: Any, flow: int = 0, charge: int = 0, ours: bool = False,
                 ordered: bool = True) -> None:
        """Send ``data`` to containerd, or queue it until containerd's connection window
        takes ``flow`` bytes. ``charge``: budget bytes the frame carries (given back when it
        goes out); ``ours``: a frame of ours whose credit the kubelet already had. Frames
        that carry no ordering with DATA (``ordered=False``) never wait."""
        if (ordered and self.up_queue) or flow > self.up_window:
            if isinstance(data, memoryview):  # of the read buffer, which the next read overwrites
                data = bytes(data)
            if not charge:  # pass-through bytes: bounded by flow control, counted anyway
                charge = len(data)
                self.budget.take(charge)
            self.up_queue.append((data, flow, charge, ours))
            self.up_queue_bytes += len(data)
            if self.up_queue_bytes > QUEUE_PAUSE_BYTES:
                self.pause_kubelet("queue")
            return
        if flow:
            self._spend_up_window(flow, ours)
        self.up_out.append(data)
        if charge:
            self.budget.give(charge)

    def _spend_up_window(self, flow: int, ours: bool) -> None:
        self.up_window -= flow
        if ours:
            self.conn_debt += flow

    def _drain_up(self) -> None:
        q = self.up_queue
        while q and q[0][1] <= self.up_window:
            data, flow, charge, ours = q.popleft()
            self.up_queue_bytes -= len(data)
            self._spend_up_window(flow, ours)
            self.up_out.append(data)
            if charge:
                self.budget.give(charge)
        if self.up_queue_bytes <= QUEUE_PAUSE_BYTES // 2:
            self.resume_kubelet("queue")

    def _send_down(self, data: Any, flow: int = 0) -> None:
        self.down_out.append(data)

    def _flush(self) -> None:
        if self.closed:
            return
        if self.down_credit or self.down_stream_credit:
            self._give_credit()
        if self.up_out and self.up is not None:
            self.up.write(self.up_out[0] if len(self.up_out) == 1 else b"".join(self.up_out))
            self.up_out.clear()
        if self.down_out:
            self.down.write(self.down_out[0] if len(self.down_out) == 1 else b"".join(self.down_out))
            self.down_out.clear()
            if self.down.get_write_buffer_size() > DOWN_BACKLOG_PAUSE_BYTES:
                self.pause_kubelet("kubelet not reading")

    def _inject_up(self, data: bytes, flow: int = 0, charge: int = 0, ours: bool = False) -> None:
        """Send a frame of our own to containerd at the next frame boundary."""
        r = self.k2c
        if r.at_boundary and not r.pending:
            self._send_up(data, flow, charge, ours)
        else:
            r.pending.append((data, flow, charge, ours))

    def _inject_down(self, data: bytes) -> None:
        """Send a frame of our own to the kubelet at the next frame boundary."""
        r = self.c2k
        if r.at_boundary and not r.pending:
            self._send_down(data)
        else:
            r.pending.append((data,))

    def _credit_kubelet(self, sid: int, flow: int, stream_too: bool) -> None:
        """The kubelet's ``flow`` bytes were taken off its hands: give the window back (at
        the next flush, one WINDOW_UPDATE per connection and stream)."""
        if not flow:
            return
        self.down_credit += flow
        if stream_too:
            self.down_stream_credit[sid] = self.down_stream_credit.get(sid, 0) + flow

    def _give_credit(self) -> None:
        if self.down_credit:
            self._inject_down(h2.window_update(0, self.down_credit))
            self.down_window += self.down_credit
            self.down_credit = 0
        if self.down_stream_credit:
            for sid, n in self.down_stream_credit.items():
                if sid in self.streams:
                    self._inject_down(h2.window_update(sid, n))
            self.down_stream_credit.clear()

    def pause_kubelet(self, why: str) -> None:
        if not self.paused and not self.closed:
            self.down.pause_reading()
        self.paused.add(why)

    def resume_kubelet(self, why: str) -> None:
        if why not in self.paused:
            return
        self.paused.discard(why)
        if not self.paused and not self.closed and self.up is not None:
            self.down.resume_reading()

    # ---------------------------------------------------------------- kubelet → containerd
    def from_kubelet(self, data: bytes) -> None:
        if self.closed:
            return
        r = self.k2c
        if self.up is None:  # reading is paused until then, but an event loop may deliver one read
            r.buf += data
            return
        try:
            if r.need_preface:
                r.buf += data
                if len(r.buf) < len(h2.PREFACE):
                    if not h2.PREFACE.startswith(bytes(r.buf)):
                        raise ConnectionFault(h2.PROTOCOL_ERROR, "the client does not speak HTTP/2")
                    return
                if bytes(r.buf[:len(h2.PREFACE)]) != h2.PREFACE:
                    raise ConnectionFault(h2.PROTOCOL_ERROR, "the client does not speak HTTP/2")
                self._send_up(h2.PREFACE)
                data = bytes(r.buf[len(h2.PREFACE):])
                r.buf.clear()
                r.need_preface = False
                if self.draining:
                    self._first_goaway(flush=False)
            self._pump(data, *self._k2c_pump)
        except ConnectionFault as e:
            self.fail(e.code, str(e))
            return
        self._flush()

    def _k2c_classify(self, ftype: int, flags: int, sid: int, length: int) -> int:
        """How a kubelet frame is relayed (WHOLE, STREAM, FOLD or PASS; see _pump)."""
        r = self.k2c
        if length > r.max_frame:
            raise ConnectionFault(h2.FRAME_SIZE_ERROR,
                                  f"frame of {length} bytes over the {r.max_frame} allowed")
        if r.in_header_block or ftype == h2.CONTINUATION or ftype == h2.PUSH_PROMISE:
            self._check_header_block(r, ftype, sid)
        if ftype != h2.DATA:
            # Frames that carry no ordering with DATA jump containerd's queue (_send_up
            # ordered=False): only with the queue empty is the run the same thing.
            if self.up_queue:
                return WHOLE
            if ftype == h2.HEADERS or ftype == h2.CONTINUATION:
                return FOLD
            if ftype == h2.WINDOW_UPDATE or (ftype == h2.PING and not self.draining) \
                    or (ftype == h2.SETTINGS and flags & h2.FLAG_ACK):
                return PASS
            return WHOLE
        self.down_window -= length
        if self.down_window < 0:
            raise ConnectionFault(h2.FLOW_CONTROL_ERROR, "the client sent more than its window")
        if self.up_queue or length > self.up_window or sid in self.streams or sid in self.refused:
            return WHOLE
        self.up_window -= length  # forwarded as it comes: charged to containerd's window now
        return STREAM

    def _k2c_fold(self, ftype: int, flags: int, sid: int, payload: memoryview) -> bool:
        r = self.k2c   # (HEADERS or CONTINUATION)
        headers = self._header_fragment(r, self.k2c_hpack, ftype, flags, sid, payload)
        if headers is not None:
            self._request_headers(r.header_sid, headers, r.header_end_stream)
        return True

    @staticmethod
    def _check_header_block(r: _Reader, ftype: int, sid: int) -> None:
        if r.in_header_block:
            if ftype != h2.CONTINUATION or sid != r.header_sid:
                raise ConnectionFault(h2.PROTOCOL_ERROR, "a frame inside a header block")
        elif ftype == h2.CONTINUATION:
            raise ConnectionFault(h2.PROTOCOL_ERROR, "CONTINUATION without HEADERS")
        elif ftype == h2.PUSH_PROMISE:
            raise ConnectionFault(h2.PROTOCOL_ERROR, "PUSH_PROMISE on a gRPC connection")

    def _k2c_frame(self, ftype: int, flags: int, sid: int, payload: bytes, raw: bytes) -> None:
        if ftype == h2.DATA:
            self._k2c_data(flags, sid, payload, raw)
            return
        if ftype == h2.PING and flags & h2.FLAG_ACK and payload == DRAIN_PING:
            self._last_goaway(flush=False)   # the ACK of our goodbye PING: not containerd's
            return
        if ftype in (h2.WINDOW_UPDATE, h2.PING, h2.GOAWAY):
            self._send_up(raw, ordered=False)
            return
        if ftype == h2.SETTINGS:
            if not flags & h2.FLAG_ACK:
                settings = h2.parse_settings(payload)
                for ident, value in settings:
                    if ident == h2.SETTINGS_MAX_FRAME_SIZE:
                        self.c2k.max_frame = max(value, h2.DEFAULT_MAX_FRAME_SIZE)
                    elif ident == h2.SETTINGS_HEADER_TABLE_SIZE:
                        self.c2k_hpack.allow_table_size(value)
                # containerd is asked to code its header blocks without a dynamic table, so
                # that each block stands alone: one the kubelet must not see can be dropped.
                raw = _without_header_table(settings)
            self._send_up(raw, ordered=False)
            return
        if ftype == h2.RST_STREAM and sid in self.refused:
            del self.refused[sid]  # containerd had its RST_STREAM from us when we refused
            return
        self._send_up(raw)
        if ftype in (h2.HEADERS, h2.CONTINUATION):
            headers = self._header_fragment(self.k2c, self.k2c_hpack, ftype, flags, sid, payload)
            if headers is not None:
                self._request_headers(self.k2c.header_sid, headers, self.k2c.header_end_stream)
        elif ftype == h2.RST_STREAM:
            self.open_streams.pop(sid, None)
            st = self.streams.get(sid)
            if st is not None:
                self._finish(st, aborted="cancelled by the kubelet")
            self._wake_idle()

    def _k2c_data(self, flags: int, sid: int, payload: bytes, raw: bytes) -> None:
        flow = len(payload)
        end = bool(flags & h2.FLAG_END_STREAM)
        st = self.streams.get(sid)
        if st is None:
            if sid in self.refused:  # never reaches containerd: the kubelet gets its window back
                self._credit_kubelet(sid, flow, stream_too=False)
                if end:
                    del self.refused[sid]
                return
            self._send_up(raw, flow)
            return
        content = _content(flags, payload)
        if st.holding:
            if self._keep(st, content, held=True):
                st.held.append(content)
                st.held_len += len(content)
                self._credit_kubelet(sid, flow, stream_too=not end)
                if end:
                    st.request_done = True
                    self._decide(st)
            else:
                self._credit_kubelet(sid, flow, stream_too=False)
            return
        if not self._keep(st, content, held=False):
            self._credit_kubelet(sid, flow, stream_too=False)
            return
        st.copy.append(content)
        st.copy_len += len(content)
        self._send_up(raw, flow)
        if end:
            st.request_done = True
            body = b"".join(st.copy)
            st.copy = None
            self._release(st, st.copy_len)
            asyncio.get_running_loop().call_soon(self._observe, st.call, body)

    def _keep(self, st: _Stream, content: bytes, held: bool) -> bool:
        """Charge ``content`` of an intercepted request to the budget. When it does not fit,
        newer held calls of this connection are refused to make room (the older ones are
        closer to done); failing that, this call is. False: the call was refused."""
        size = (st.held_len if held else st.copy_len) + len(content)
        if size > self.max_message_bytes:
            self._refuse(st, f"request of more than {self.max_message_bytes} bytes "
                             f"(server.max_message_bytes)")
            return False
        n = len(content)
        if self.budget.try_take(n):
            st.charged += n
            return True
        # Streams are added in the order of their ids, which only grow: newest last.
        for victim in list(itertools.takewhile(lambda s: s.sid > st.sid, reversed(self.streams.values()))):
            if not victim.holding:
                continue
            self._refuse(victim, self._budget_message(n))
            if self.budget.try_take(n):
                st.charged += n
                return True
        self._refuse(st, self._budget_message(n))
        return False

    def _budget_message(self, wanted: int) -> str:
        """Which budget had no room for ``wanted`` more bytes, for the caller and the log."""
        if self.budget.used + wanted > self.budget.limit:
            which = f"this connection's relay buffer budget ({self.budget.limit} bytes)"
        else:
            which = f"the relay's buffer budget ({self.relay.budget.limit} bytes)"
        return f"anolisnuma: {which} is spent; retry"

    def _release(self, st: _Stream, n: int) -> None:
        st.charged -= n
        self.budget.give(n)

    def _observe(self, call: Any, body: bytes) -> None:
        try:
            self.interceptor.on_forwarded(call, body)
        except Exception as e:  # bookkeeping must never take the relay down
            log.error("recording a forwarded request failed", conn=self.cid, error=repr(e))

    # ---------------------------------------------------------------- decisions
    def _decide(self, st: _Stream) -> None:
        body = b"".join(st.held)
        st.held = []
        try:
            outcome = self.interceptor.on_request(st.call, body)
        except Exception as e:  # a failure above must never lose the kubelet's call
            outcome = self._after_failure(st, body, e)
        if isinstance(outcome, Decision):
            self._apply_decision(st, outcome, body)
        else:
            outcome.add_done_callback(lambda fut, st=st, body=body: self._decided(st, fut, body))

    def _decided(self, st: _Stream, fut: "asyncio.Future[Decision]", body: bytes) -> None:
        try:  # read even when the call is over, so that no failure goes unreported
            decision: Optional[Decision] = fut.result()
            error: Optional[BaseException] = None
        except BaseException as e:
            decision, error = None, e
        if self.closed or st.done or not st.holding:
            if error is not None:
                log.error("interception failed after the call had ended", error=repr(error))
            return
        if decision is None:  # the pipeline never fails a call by accident
            decision = self._after_failure(st, body, error)
        self._apply_decision(st, decision, body)
        self._flush()

    def _after_failure(self, st: _Stream, body: bytes, error: Optional[BaseException]) -> Decision:
        """The pipeline failed on a held request: its failure policy decides (refused or
        forwarded); forwarded when even that cannot be asked."""
        try:
            return self.interceptor.failed(st.call, body, error)
        except Exception as e:
            log.error("interception failed; forwarding the request unchanged", error=repr(error), then=repr(e))
            return Decision.forward(body)

    def _apply_decision(self, st: _Stream, d: Decision, original: bytes) -> None:
        st.holding = False
        if d.status:
            self._answer(st, d.status, d.message)
            self._finish(st)
            return
        body = original if d.body is None else d.body
        # The held bytes become the outbox: same charge, adjusted to the edited size.
        if len(body) > st.held_len:
            self.budget.take(len(body) - st.held_len)
        else:
            self.budget.give(st.held_len - len(body))
        st.charged += len(body) - st.held_len
        st.outbox, st.outbox_pos = body, 0
        self._send_outbox(st)

    def _send_outbox(self, st: _Stream) -> None:
        """Send the decided body within containerd's window for the stream; the rest waits
        for its WINDOW_UPDATE."""
        body = st.outbox
        if not body:
            self._inject_up(h2.frame(h2.DATA, h2.FLAG_END_STREAM, st.sid), ours=True)
            st.outbox = None
            return
        n = len(body)
        while st.outbox_pos < n and st.up_window > 0:
            size = min(self.k2c.max_frame, st.up_window, n - st.outbox_pos)
            start = st.outbox_pos
            st.outbox_pos += size
            last = st.outbox_pos == n
            st.up_window -= size
            st.charged -= size  # the charge moves with the frame
            self._inject_up(h2.frame(h2.DATA, h2.FLAG_END_STREAM if last else 0, st.sid, body[start:start + size]),
                            flow=size, charge=size, ours=True)
        if st.outbox_pos == n:
            st.outbox = None

    def _refuse(self, st: _Stream, message: str) -> None:
        """Answer an intercepted call RESOURCE_EXHAUSTED before containerd ran it."""
        if st.done:
            return
        self.relay.call_refused(self, st.call, message)
        if not st.request_done:
            _remember(self.refused, st.sid)
        self._answer(st, RESOURCE_EXHAUSTED, message)
        self._finish(st, aborted=f"refused: {message}")

    def _answer(self, st: _Stream, status: int, message: str) -> None:
        """Answer the call ourselves (trailers-only); containerd, which saw its HEADERS but
        not all of its message, is told to drop it, so its handler never runs."""
        st.holding = False
        self._inject_up(h2.rst_stream(st.sid, h2.CANCEL))
        st.answered = True
        st.status, st.status_message = status, message
        self._inject_down(h2.frame(h2.HEADERS, h2.FLAG_END_HEADERS | h2.FLAG_END_STREAM, st.sid,
                                   h2.trailers_only_block(status, message, st.reply_started)))
        # containerd may have answered already, its frames crossing our RST_STREAM: the
        # kubelet's stream is over, so they are dropped (see _c2k_frame)
        _remember(self.silenced, st.sid)
        self.open_streams.pop(st.sid, None)
        self._wake_idle()

    # ---------------------------------------------------------------- containerd → kubelet
    def from_containerd(self, data: bytes) -> None:
        if self.closed:
            return
        try:
            self._pump(data, *self._c2k_pump)
        except ConnectionFault as e:
            self.fail(e.code, f"containerd: {e}")
            return
        self._flush()

    def _c2k_classify(self, ftype: int, flags: int, sid: int, length: int) -> int:
        r = self.c2k
        if length > r.max_frame:
            raise ConnectionFault(h2.FRAME_SIZE_ERROR,
                                  f"frame of {length} bytes over the {r.max_frame} allowed")
        if r.in_header_block or ftype == h2.CONTINUATION or ftype == h2.PUSH_PROMISE:
            self._check_header_block(r, ftype, sid)
        if ftype == h2.DATA:
            return STREAM if sid not in self.streams and sid not in self.silenced else WHOLE
        if ftype == h2.HEADERS or ftype == h2.CONTINUATION:
            # a pass-through call's reply headers or trailers: read, never changed
            return FOLD if sid not in self.streams and sid not in self.silenced else WHOLE
        if ftype == h2.WINDOW_UPDATE:
            return FOLD
        if ftype == h2.PING or (ftype == h2.SETTINGS and flags & h2.FLAG_ACK):
            return PASS
        return WHOLE

    def _c2k_fold(self, ftype: int, flags: int, sid: int, payload: memoryview) -> bool:
        """The bookkeeping of a containerd frame the kubelet gets unchanged (False: it is
        not one after all, nothing was done; it goes to _c2k_frame)."""
        if ftype == h2.WINDOW_UPDATE:
            if len(payload) != 4:
                return False
            if sid == 0:
                if self.conn_debt:
                    return False  # part of it is ours: _window_update_from_containerd
                inc = int.from_bytes(payload, "big") & 0x7FFFFFFF
                self.up_window += inc
                self.down_window += inc
                self._drain_up()
                return True
            st = self.streams.get(sid)
            return st is None or not st.sends_own_body
        r = self.c2k   # (HEADERS or CONTINUATION)
        if self._header_fragment(r, self.c2k_hpack, ftype, flags, sid, payload) is not None \
                and r.header_end_stream:
            self._server_done(r.header_sid)
        return True

    def _c2k_frame(self, ftype: int, flags: int, sid: int, payload: bytes, raw: bytes) -> None:
        if ftype == h2.WINDOW_UPDATE and len(payload) == 4:
            self._window_update_from_containerd(sid, int.from_bytes(payload, "big") & 0x7FFFFFFF, raw)
            return
        if ftype == h2.SETTINGS and not flags & h2.FLAG_ACK:
            settings = h2.parse_settings(payload)
            for ident, value in settings:
                if ident == h2.SETTINGS_MAX_FRAME_SIZE:
                    self.k2c.max_frame = max(value, h2.DEFAULT_MAX_FRAME_SIZE)
                elif ident == h2.SETTINGS_INITIAL_WINDOW_SIZE:
                    delta = value - self.up_stream_window
                    self.up_stream_window = value
                    for st in self.streams.values():
                        if st.sends_own_body:
                            st.up_window += delta
                            if st.outbox:
                                self._send_outbox(st)
                elif ident == h2.SETTINGS_HEADER_TABLE_SIZE:
                    self.k2c_hpack.allow_table_size(value)
            # the kubelet too is asked for header blocks that stand alone (see
            # HeaderBlockDecoder.decode: a repeated call's headers are then a look-up)
            self._send_down(_without_header_table(settings))
            if not self.settled:
                self.settled = True
                if self.draining:
                    self._first_goaway(flush=False)
            return
        if sid in self.silenced and self._silence(ftype, flags, sid, payload, raw):
            return
        st = self.streams.get(sid)
        if ftype == h2.DATA:
            self._send_down(raw)
            if st is not None and not st.reply_overflow:
                content = _content(flags, payload)
                if st.reply_len + len(content) <= self.max_message_bytes and self.budget.try_take(len(content)):
                    st.charged += len(content)
                    st.reply.append(content)
                    st.reply_len += len(content)
                else:
                    st.reply_overflow = True
            if flags & h2.FLAG_END_STREAM:
                self._server_done(sid)
            return
        if ftype in (h2.HEADERS, h2.CONTINUATION):
            self._send_down(raw)
            headers = self._header_fragment(self.c2k, self.c2k_hpack, ftype, flags, sid, payload)
            if headers is not None:
                self._reply_headers(self.c2k.header_sid, headers)
                if self.c2k.header_end_stream:  # whole trailers read
                    self._server_done(self.c2k.header_sid)
            return
        if ftype == h2.RST_STREAM:
            self._send_down(raw)
            self.open_streams.pop(sid, None)
            if st is not None:
                self._finish(st, aborted="reset by containerd")
            self._wake_idle()
            return
        self._send_down(raw)

    def _silence(self, ftype: int, flags: int, sid: int, payload: bytes, raw: bytes) -> bool:
        """Drop a frame of containerd's for a call we answered ourselves (the kubelet's
        stream is over: a frame after its END_STREAM is a protocol error). True if dropped."""
        if ftype == h2.DATA:
            if payload:  # the kubelet will never return this credit: we do
                self._inject_up(h2.window_update(0, len(payload)))
        elif ftype == h2.HEADERS:
            # Kept until the block is decoded: only a block that left containerd's dynamic
            # table empty may be dropped without the kubelet's decoder missing an entry.
            self.c2k.silenced_block = [raw]
            self._end_silenced_block(self._header_fragment(self.c2k, self.c2k_hpack, ftype, flags, sid, payload))
            return True
        elif ftype == h2.CONTINUATION:
            self.c2k.silenced_block.append(raw)
            self._end_silenced_block(self._header_fragment(self.c2k, self.c2k_hpack, ftype, flags, sid, payload))
            return True
        elif ftype != h2.RST_STREAM:
            return False
        if ftype == h2.RST_STREAM or flags & h2.FLAG_END_STREAM:
            self.silenced.pop(sid, None)
        return True

    def _end_silenced_block(self, headers: Optional[list]) -> None:
        if headers is None:
            return  # CONTINUATION frames follow
        frames, self.c2k.silenced_block = self.c2k.silenced_block, []
        if not self.c2k_hpack.stateless:
            for f in frames:  # containerd ignored our table size: keep the kubelet in step
                self._send_down(f)
        if self.c2k.header_end_stream:
            self.silenced.pop(self.c2k.header_sid, None)

    def _window_update_from_containerd(self, sid: int, inc: int, raw: bytes) -> None:
        if sid == 0:
            self.up_window += inc
            taken = min(inc, self.conn_debt)
            self.conn_debt -= taken
            if inc - taken:
                self._send_down(raw if not taken else h2.window_update(0, inc - taken))
                self.down_window += inc - taken
            self._drain_up()
            return
        st = self.streams.get(sid)
        if st is not None and st.sends_own_body:
            # The kubelet was credited for this stream when we held its bytes.
            st.up_window += inc
            if st.outbox:
                self._send_outbox(st)
            return
        self._send_down(raw)

    def _server_done(self, sid: int) -> None:
        self.open_streams.pop(sid, None)
        st = self.streams.get(sid)
        if st is not None and not st.answered:
            # containerd may answer before it got the whole request (UNIMPLEMENTED, say):
            # what we still hold is dropped (the kubelet was credited for it already).
            st.holding = False
            st.held = []
            st.outbox = None
            self._finish(st)
        self._wake_idle()

    # ---------------------------------------------------------------- header blocks
    def _header_fragment(self, r: _Reader, decoder: HeaderBlockDecoder, ftype: int, flags: int, sid: int,
                         payload: bytes) -> Optional[HeaderList]:
        """Add a HEADERS or CONTINUATION payload to the block; the decoded headers once the
        block is complete, else None."""
        try:
            if ftype == h2.HEADERS and flags & h2.FLAG_END_HEADERS:  # the usual: a block in one frame
                r.header_sid = sid
                r.header_end_stream = bool(flags & h2.FLAG_END_STREAM)
                block = bytes(h2.strip_padding(flags, payload, h2.HEADERS) if flags & _PADDED_OR_PRIORITY
                              else payload)
                r.in_header_block = False
                try:
                    return decoder.decode(block)
                except HeaderBlockError as e:
                    raise ConnectionFault(e.code, str(e)) from None
            if ftype == h2.HEADERS:
                r.block.clear()
                r.header_sid = sid
                r.header_end_stream = bool(flags & h2.FLAG_END_STREAM)
                r.block += h2.strip_padding(flags, payload, h2.HEADERS)
            else:
                r.block += payload
        except ValueError as e:
            raise ConnectionFault(h2.PROTOCOL_ERROR, f"malformed HEADERS frame: {e}") from None
        if not flags & h2.FLAG_END_HEADERS:
            r.in_header_block = True
            if len(r.block) > MAX_HEADER_BLOCK_BYTES:
                raise ConnectionFault(h2.ENHANCE_YOUR_CALM,
                                      f"header block over {MAX_HEADER_BLOCK_BYTES} bytes")
            return None
        r.in_header_block = False
        block = bytes(r.block)
        r.block.clear()
        try:
            return decoder.decode(block)
        except HeaderBlockError as e:
            raise ConnectionFault(e.code, str(e)) from None

    def _request_headers(self, sid: int, headers: HeaderList, end_stream: bool) -> None:
        if sid <= self.max_sid:
            return  # trailers of a client stream
        self.max_sid = sid
        if self.goaway_sid is not None and sid > self.goaway_sid:
            # Opened after we announced shutdown: containerd must not run it.
            if not end_stream:
                _remember(self.refused, sid)
            self._inject_up(h2.rst_stream(sid, h2.CANCEL))
            self._inject_down(h2.rst_stream(sid, h2.REFUSED_STREAM))
            return
        path = headers.path
        self.open_streams[sid] = path
        if end_stream:
            return  # no request body will follow: nothing to intercept
        try:
            call = self.interceptor.begin(path)
        except Exception as e:
            log.error("interception failed; relaying the call unread", path=path, error=repr(e))
            call = None
        if call is None:
            return
        st = _Stream(sid, call, holding=call.holds_request, up_window=self.up_stream_window)
        self.streams[sid] = st
        if not self.budget.try_take(STREAM_OVERHEAD_BYTES):
            self._refuse(st, self._budget_message(STREAM_OVERHEAD_BYTES))
            return
        st.charged = STREAM_OVERHEAD_BYTES

    def _reply_headers(self, sid: int, headers: list) -> None:
        st = self.streams.get(sid)
        if st is None:
            return
        st.reply_started = True
        for name, value in headers:
            if name == b"grpc-status":
                try:
                    st.status = int(value)
                except ValueError:
                    st.status = 2
            elif name == b"grpc-message":
                st.status_message = unquote(value.decode("utf-8", "replace"))

    def _finish(self, st: _Stream, aborted: str = "") -> None:
        if st.done:
            return
        st.done = True
        self.streams.pop(st.sid, None)
        if st.charged:
            self.budget.give(st.charged)
            st.charged = 0
        st.held = []
        st.outbox = None
        if aborted:
            self.interceptor.on_abort(st.call, aborted)
            return
        # a call we answered ourselves has no reply of containerd's, whatever it began to send
        reply = b"" if st.answered else None if st.reply_overflow else b"".join(st.reply)
        st.reply = []
        # After the reply's bytes went out: bookkeeping must not delay the kubelet. The
        # kubelet's next call needs a round trip, so it is read after this has run.
        asyncio.get_running_loop().call_soon(
            self.interceptor.on_reply, st.call, reply, st.status if st.status is not None else 0,
            st.status_message, st.answered)

    # ---------------------------------------------------------------- framing machinery
    def _pump(self, data: Any, r: _Reader, send: Callable, on_frame: Callable, classify: Callable,
              fold: Callable) -> None:
        """Forward the frames in ``r.buf + data``: runs of bytes forwarded unchanged go out
        as slices of what was read (no copy, one send per run), other frames are handed to
        ``on_frame`` whole, and an incomplete frame at the end waits in ``r.buf`` for the
        next read. ``data`` may be a view of the relay's read buffer, which the next read
        overwrites: what is kept past this call is copied (``on_frame`` gets bytes, runs
        are written, or copied by the connection, before the read ends).

        ``classify(type, flags, stream, length)`` decides once per frame, when its header
        arrives, whether it is read whole (WHOLE), streamed as its bytes arrive (STREAM)
        or, once whole, folded into the run after ``fold(type, flags, stream, payload)``
        did its bookkeeping (FOLD; ``fold`` may decline, then it is handled whole), or
        folded with no bookkeeping at all (PASS); it raises ConnectionFault for a frame the
        connection cannot survive."""
        if r.buf:
            r.buf += data
            data = bytes(r.buf)
            r.buf.clear()
        view = data if type(data) is memoryview else memoryview(data)
        n = len(data)
        pos = 0
        run = -1  # start of the pending run of bytes forwarded unchanged
        c2k = r is self.c2k
        unpack = _HEADER.unpack_from
        while pos < n and not self.closed:
            if r.passing:
                take = min(r.passing, n - pos)
                if run < 0:
                    run = pos
                pos += take
                r.passing -= take
                if r.passing == 0 and r.tail is not None:
                    send(view[run:pos])
                    run = -1
                    sid, r.tail = r.tail, None
                    self._server_done(sid)
                continue
            if n - pos < _HLEN:
                break
            hi, lo, ftype, flags, sid = unpack(data, pos)
            length = (hi << 16) | lo
            sid &= 0x7FFFFFFF
            end = pos + _HLEN + length
            if r.whole_pending:
                r.whole_pending = False  # judged on an earlier read, when it began to arrive
            else:
                kind = classify(ftype, flags, sid, length)
                if kind == STREAM:
                    if run < 0:
                        run = pos
                    ends_call = c2k and flags & h2.FLAG_END_STREAM
                    if end <= n:
                        pos = end
                        if ends_call:
                            send(view[run:pos])
                            run = -1
                            self._server_done(sid)
                    else:
                        r.passing = end - n
                        pos = n
                        if ends_call:
                            r.tail = sid
                    continue
                if kind >= FOLD and end <= n and not r.pending:
                    if kind == PASS:
                        folded = True
                    else:
                        r.folding = True
                        try:
                            folded = fold(ftype, flags, sid, view[pos + _HLEN:end])
                        except ConnectionFault:
                            if run >= 0:  # what came before the faulty frame still goes out
                                send(view[run:pos])
                            raise
                        finally:
                            r.folding = False
                    if folded:
                        if run < 0:
                            run = pos
                        pos = end
                        if r.pending and r.at_boundary:  # frames of ours it caused go right after it
                            send(view[run:pos])
                            run = -1
                            self._flush_pending(r, send)
                        continue
            if run >= 0:
                send(view[run:pos])
                run = -1
            if end > n:
                r.whole_pending = True
                break
            raw = bytes(view[pos:end])  # kept by some handlers: never a view of the read buffer
            on_frame(ftype, flags, sid, raw[_HLEN:], raw)
            pos = end
            if r.pending and r.at_boundary:
                self._flush_pending(r, send)
        if run >= 0:
            send(view[run:pos])
        if pos < n:
            r.buf += view[pos:]
        if r.pending and r.at_boundary:
            self._flush_pending(r, send)

    @staticmethod
    def _flush_pending(r: _Reader, send: Callable) -> None:
        pending, r.pending = r.pending, []
        for item in pending:
            send(*item)

    # ---------------------------------------------------------------- shutdown
    def announce_shutdown(self) -> None:
        """The graceful goodbye of HTTP/2 (RFC 9113 section 6.8): a GOAWAY with the highest
        stream id and a PING; once the PING's ACK shows the kubelet read that GOAWAY (it opens
        no stream here after it), a second GOAWAY with the last stream id it really opened.
        Calls that raced the first GOAWAY are served, not refused; the open ones finish; the
        kubelet's next call goes on a new connection. A connection still in its handshake
        is told once both prefaces have passed (a GOAWAY before the server's SETTINGS would
        be a protocol error)."""
        self.draining = True
        self._first_goaway(flush=True)

    def _first_goaway(self, flush: bool) -> None:
        if self.closed or self.goodbye or self.k2c.need_preface or not self.settled:
            return
        self.goodbye = 1
        self._inject_down(h2.goaway(MAX_STREAM_ID, h2.NO_ERROR, b"anolisnuma restarting"))
        self._inject_down(h2.frame(h2.PING, 0, 0, DRAIN_PING))
        if flush:
            self._flush()
        asyncio.get_running_loop().call_later(DRAIN_PING_TIMEOUT_SECONDS, self._last_goaway)

    def _last_goaway(self, flush: bool = True) -> None:
        if self.closed or self.goodbye != 1:
            return
        self.goodbye = 2
        self.goaway_sid = self.max_sid
        self._inject_down(h2.goaway(self.max_sid, h2.NO_ERROR, b"anolisnuma restarting"))
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


def _without_header_table(settings: list) -> bytes:
    """A SETTINGS frame with the peer's settings, asking for no dynamic HPACK table."""
    return h2.settings_frame([(i, v) for i, v in settings if i != h2.SETTINGS_HEADER_TABLE_SIZE]
                             + [(h2.SETTINGS_HEADER_TABLE_SIZE, 0)])


def _remember(sids: "OrderedDict[int, None]", sid: int) -> None:
    """Add ``sid`` to a bounded set of stream ids, forgetting the oldest past the bound."""
    sids[sid] = None
    if len(sids) > MAX_REFUSED_REMEMBERED:
        sids.popitem(last=False)


def _content(flags: int, payload: bytes) -> bytes:
    """A DATA payload without its padding; bad padding is a connection error."""
    try:
        return h2.strip_padding(flags, payload, h2.DATA)
    except ValueError as e:
        raise ConnectionFault(h2.PROTOCOL_ERROR, f"malformed DATA frame: {e}") from None
