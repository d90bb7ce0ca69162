"""A socket-free harness for the HTTP/2 splice: both peers are ``h2`` state machines.

The property tests (``tests/transport/test_splice_properties.py``) drive a real
:class:`~anolisnuma.transport.splice.Splice` with byte streams written by two independent
HTTP/2 implementations and cut at arbitrary points:

- :class:`Kubelet`, an ``h2`` client that writes like grpc-go: every call is one
  length-prefixed gRPC message, DATA frames of at most 16 KiB, one frame per stream in turn
  within the connection and stream windows, and window credit given back on receipt
  (at once, or in batches like grpc-go's quarter-of-a-window threshold);
- :class:`Containerd`, an ``h2`` server that reads each request, gives the window back the
  same way and answers each complete request with headers, a reply message and trailers
  (``grpc-status: 0``), or answers at once (trailers-only ``UNIMPLEMENTED``) when told to;
- :class:`FakeInterceptor`, the pipeline's interface to the relay with a scripted decision
  per call path (pass-through, streamed through and copied, held then forwarded, edited,
  refused, or a pipeline failure), decided at once or through a Future resolved later;
- :class:`FakeTransport` for each side of the splice, which records what the splice
  wrote and whether it paused reading.

:class:`Exchange` moves bytes between them in rounds until nothing moves any more: in each
round the kubelet and containerd write what they can, the splice reads both byte streams
in chunks cut where the scenario says (interleaving the two directions as it says), each
peer reads what the splice wrote (or leaves it for a later round, as told), pending
decisions come due, and the event loop runs the callbacks the splice scheduled. Both
``h2`` peers check everything the splice writes them (frame sizes, flow-control windows,
stream states) and raise on a violation; the exchange additionally fails when a peer had
to answer the splice with RST_STREAM or GOAWAY, when either peer was ever credited more
window than the other offered, when the splice closes the connection, and when the
exchange stalls (bytes left unread while nothing else moves) or does not settle.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Set, Tuple

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import h2.stream

from anolisnuma.cri import grpcwire
from anolisnuma.pipeline.decision import Decision
from anolisnuma.transport import h2 as wire
from anolisnuma.transport.relay import Relay
from anolisnuma.transport.splice import Splice

GRPC_FRAME = 16384          # grpc-go writes DATA frames of at most 16 KiB
DEFAULT_WINDOW = 65535
UNIMPLEMENTED = grpcwire.STATUS_CODES["UNIMPLEMENTED"]
OK_TRAILERS = [(b"grpc-status", b"0"), (b"grpc-message", b"")]
EARLY_TRAILERS = [(b"grpc-status", str(UNIMPLEMENTED).encode()), (b"grpc-message", b"unknown method")]

# What the pipeline does with a call (FakeInterceptor):
PASS = "pass"          # begin() returns None: the call is not intercepted
COPY = "copy"          # intercepted, no pre-hook: streams through, copied for the record
FORWARD = "forward"    # held, then forwarded unchanged
EDIT = "edit"          # held, then forwarded edited (another valid gRPC message)
REFUSE = "refuse"      # held, then answered with a status by the relay
FAIL = "fail"          # held, the pipeline fails (raises): forwarded unchanged
HELD_KINDS = (FORWARD, EDIT, REFUSE, FAIL)
KINDS = (PASS, COPY) + HELD_KINDS


@dataclass
class CallPlan:
    """One call of the kubelet and what everyone does with it."""

    size: int                       # request message bytes (the body is 5 bytes more)
    kind: str = PASS
    later: bool = False             # the decision is a Future resolved ``delay`` rounds later
    delay: int = 0
    keep: int = 100                 # EDIT: percent of the message kept ...
    extra: int = 0                  # ... and bytes appended to it
    status: int = 7                 # REFUSE: the gRPC status
    reply: int = 0                  # reply message bytes
    early: bool = False             # containerd answers UNIMPLEMENTED on the headers: trailers
                                    # only when ``reply`` is 0, else after the reply message
    cancel_after: Optional[int] = None  # the kubelet resets the stream after that many DATA frames
    start: int = 0                  # round in which the kubelet opens the stream


@dataclass
class ServerSettings:
    """Settings containerd advertises beyond the defaults, in round ``at`` (0: with its
    first SETTINGS), applied at once the way grpc-go does (not when acknowledged)."""

    at: int = 0
    initial_window: int = 1 << 20
    max_frame: int = 32768
    connection_bonus: int = 0       # extra connection window (WINDOW_UPDATE on stream 0)


def message_bytes(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


def grpc_body(message: bytes) -> bytes:
    return grpcwire.frame_message(message)


def call_path(index: int) -> str:
    return f"/anolisnuma.test.Splice/Call{index}"


def edited_body(plan: CallPlan, body: bytes, index: int) -> bytes:
    message = body[5:]
    kept = message[:len(message) * plan.keep // 100]
    return grpc_body(kept + message_bytes(10_000 + index, plan.extra))


def request_headers(path: str) -> List[Tuple[bytes, bytes]]:
    return [(b":method", b"POST"), (b":scheme", b"http"), (b":path", path.encode()),
            (b":authority", b"containerd"), (b"content-type", b"application/grpc"),
            (b"te", b"trailers"), (b"grpc-timeout", b"2S")]


def header_value(headers: Optional[List[Tuple[bytes, bytes]]], name: bytes) -> Optional[bytes]:
    for k, v in headers or ():
        if k == name:
            return v
    return None


class HarnessError(AssertionError):
    """The exchange broke a rule (a peer objected, the splice closed, it stalled)."""


# ---------------------------------------------------------------------------- transports
class FakeTransport:
    """What an asyncio transport is to the splice: records writes and reading state."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.out = bytearray()
        self.paused = False
        self.closed = False
        self.aborted = False
        self.written = 0
        self.unread_rounds = 0     # rounds the peer has left ``out`` unread (Exchange)

    def write(self, data) -> None:
        if self.closed:
            raise HarnessError(f"the splice wrote to the closed {self.name} transport")
        self.out += data          # copies: the splice may hand over views of its read buffer
        self.written += len(data)

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = self.aborted = True

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        return 0

    def take(self) -> bytes:
        data = bytes(self.out)
        self.out.clear()
        return data


# ---------------------------------------------------------------------------- interceptor
class FakeCall:
    __slots__ = ("index", "path", "method", "holds_request")

    def __init__(self, index: int, path: str, holds_request: bool) -> None:
        self.index = index
        self.path = path
        self.method = path.rsplit("/", 1)[-1]
        self.holds_request = holds_request


@dataclass
class CallRecord:
    """What the relay told the pipeline about one intercepted call."""

    begun: int = 0
    requests: List[bytes] = field(default_factory=list)    # on_request bodies
    forwarded: List[bytes] = field(default_factory=list)   # on_forwarded bodies
    replies: List[tuple] = field(default_factory=list)     # (body, status, message, answered)
    aborts: List[str] = field(default_factory=list)

    @property
    def endings(self) -> int:
        return len(self.replies) + len(self.aborts)


class FakeInterceptor:
    """The relay's interception interface, scripted per call path."""

    def __init__(self, plans: List[CallPlan]) -> None:
        self.by_path = {call_path(i): (i, p) for i, p in enumerate(plans)}
        self.records: Dict[int, CallRecord] = {}
        self.pending: List[list] = []   # [future, decision or exception, rounds left]
        self.unknown_paths: List[str] = []

    def begin(self, path: str) -> Optional[FakeCall]:
        if path not in self.by_path:
            self.unknown_paths.append(path)
            return None
        index, plan = self.by_path[path]
        if plan.kind == PASS:
            return None
        self.records.setdefault(index, CallRecord()).begun += 1
        return FakeCall(index, path, holds_request=plan.kind in HELD_KINDS)

    def on_request(self, call: FakeCall, body: bytes):
        index, plan = self.by_path[call.path]
        self.records[index].requests.append(bytes(body))
        outcome: object
        if plan.kind == FORWARD:
            outcome = Decision.forward(body)
        elif plan.kind == EDIT:
            outcome = Decision.forward(edited_body(plan, body, index))
        elif plan.kind == REFUSE:
            outcome = Decision.refuse(plan.status, f"refused call {index} by policy")
        else:  # FAIL
            outcome = RuntimeError(f"pipeline failure in call {index}")
        if not plan.later:
            if isinstance(outcome, Exception):
                raise outcome
            return outcome
        fut = asyncio.get_running_loop().create_future()
        # The relay drops a decision that comes after the call ended; keep asyncio from
        # logging "exception never retrieved" for those.
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())
        self.pending.append([fut, outcome, plan.delay])
        return fut

    def failed(self, call: FakeCall, body: bytes, error: BaseException) -> Decision:
        return Decision.forward(body)   # the pipeline's answer with every failure policy "ignore"

    def on_forwarded(self, call: FakeCall, body: bytes) -> None:
        self.records[call.index].forwarded.append(bytes(body))

    def on_reply(self, call: FakeCall, body: Optional[bytes], status: int, message: str,
                 answered: bool = False) -> None:
        self.records[call.index].replies.append((None if body is None else bytes(body), status, message, answered))

    def on_abort(self, call: FakeCall, why: str) -> None:
        self.records[call.index].aborts.append(why)

    def tick(self) -> bool:
        """One round passed: resolve the Futures that are due. True if any was."""
        due = [p for p in self.pending if p[2] <= 0]
        for p in self.pending:
            p[2] -= 1
        self.pending = [p for p in self.pending if p[2] >= 0]
        for fut, outcome, _ in due:
            if isinstance(outcome, Exception):
                fut.set_exception(outcome)
            else:
                fut.set_result(outcome)
        return bool(due)


# ---------------------------------------------------------------------------- peers
def _frames(data: bytes):
    """(type, flags, stream, payload) of whole frames (what an h2 peer writes)."""
    pos = 0
    while pos < len(data):
        length, ftype, flags, sid = wire.parse_frame_header(data, pos)
        yield ftype, flags, sid, data[pos + 9:pos + 9 + length]
        pos += 9 + length


class Credit:
    """How a peer gives received bytes back (WINDOW_UPDATE): at once ("eager"), or the way
    grpc-go does ("quarter"): once a quarter of the connection's or the stream's window is
    owed. A stream's credit is not given once the stream ended."""

    def __init__(self, conn: h2.connection.H2Connection, quarter: bool, conn_window: Callable[[], int]) -> None:
        self.conn = conn
        self.quarter = quarter
        self.conn_window = conn_window
        self.owed = 0                       # connection bytes received, not credited yet
        self.owed_stream: Dict[int, int] = {}
        # DATA on a stream this peer has closed (it crossed our RST_STREAM) yields no event;
        # h2 hands its size to the connection's window manager, which would give it back
        # only in large batches. Like grpc-go, give it back with the rest. (The manager sees
        # no other bytes: acknowledge_received_data is never called.)
        conn._inbound_flow_control_window_manager.process_bytes = self._orphan_data

    def _orphan_data(self, n: int) -> None:
        self._connection(n)
        return None

    def _connection(self, n: int) -> None:
        self.owed += n
        if self.owed and self.owed >= (self.conn_window() // 4 if self.quarter else 1):
            self.conn.increment_flow_control_window(self.owed)
            self.owed = 0

    def received(self, sid: int, n: int) -> None:
        if not n:
            return
        self._connection(n)
        stream = self.conn.streams.get(sid)
        if stream is None or stream.closed or stream.state_machine.state in _RECEIVE_DONE:
            self.owed_stream.pop(sid, None)  # it ended (perhaps by a later frame of this read)
            return
        owed = self.owed_stream.get(sid, 0) + n
        if owed >= (self.conn.local_settings.initial_window_size // 4 if self.quarter else 1):
            self.conn.increment_flow_control_window(owed, sid)
            owed = 0
        self.owed_stream[sid] = owed


_RECEIVE_DONE = (h2.stream.StreamState.HALF_CLOSED_REMOTE, h2.stream.StreamState.CLOSED)


class KubeletStream:
    def __init__(self, index: int, plan: CallPlan, body: bytes) -> None:
        self.index = index
        self.plan = plan
        self.path = call_path(index)
        self.body = body
        self.sid: Optional[int] = None
        self.sent = 0
        self.frames = 0
        self.send_done = False         # END_STREAM sent
        self.reset_sent: Optional[int] = None
        self.headers: Optional[list] = None
        self.trailers: Optional[list] = None
        self.data = bytearray()
        self.ended = False             # END_STREAM received
        self.reset_code: Optional[int] = None

    @property
    def sending(self) -> bool:
        return (self.sid is not None and not self.send_done and self.reset_sent is None
                and self.reset_code is None)

    @property
    def complete(self) -> bool:
        """The call is over for the kubelet: answered, reset by either side."""
        return self.ended or self.reset_code is not None or self.reset_sent is not None

    @property
    def status(self) -> Optional[int]:
        v = header_value(self.trailers, b"grpc-status") or header_value(self.headers, b"grpc-status")
        return None if v is None else int(v)

    @property
    def message(self) -> str:
        v = header_value(self.trailers, b"grpc-message") or header_value(self.headers, b"grpc-message")
        return "" if v is None else v.decode("latin-1")


class Kubelet:
    """The kubelet: an h2 client writing the way grpc-go does."""

    def __init__(self, plans: List[CallPlan], bodies: List[bytes], quarter_credit: bool,
                 reset_on_early_end: bool) -> None:
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        self.conn.initiate_connection()
        self.streams = [KubeletStream(i, p, b) for i, (p, b) in enumerate(zip(plans, bodies))]
        self.by_sid: Dict[int, KubeletStream] = {}
        self.credit = Credit(self.conn, quarter_credit, lambda: DEFAULT_WINDOW)
        self.reset_on_early_end = reset_on_early_end  # grpc-go: RST_STREAM(NO_ERROR) when answered early
        self.resets: Set[Tuple[int, int]] = set()

    def _reset(self, s: KubeletStream, code: int) -> None:
        self.conn.reset_stream(s.sid, code)
        s.reset_sent = code
        self.resets.add((s.sid, code))

    def act(self, rnd: int) -> bytes:
        for s in self.streams:
            if s.sid is None and s.plan.start <= rnd:
                s.sid = self.conn.get_next_available_stream_id()
                self.conn.send_headers(s.sid, request_headers(s.path))
                self.by_sid[s.sid] = s
        progress = True
        while progress:  # one DATA frame per stream in turn, like grpc-go's loopy writer
            progress = False
            for s in self.streams:
                if not s.sending:
                    continue
                if s.plan.cancel_after is not None and s.frames >= s.plan.cancel_after:
                    self._reset(s, h2.errors.ErrorCodes.CANCEL)
                    progress = True
                    continue
                left = len(s.body) - s.sent
                n = min(GRPC_FRAME, left, self.conn.local_flow_control_window(s.sid),
                        self.conn.max_outbound_frame_size)
                if n <= 0:
                    continue
                end = n == left
                self.conn.send_data(s.sid, s.body[s.sent:s.sent + n], end_stream=end)
                s.sent += n
                s.frames += 1
                s.send_done = end
                progress = True
        return self.conn.data_to_send()

    def receive(self, data: bytes) -> None:
        if not data:
            return
        for ev in _receive("kubelet", self.conn, data):
            if isinstance(ev, h2.events.ResponseReceived):
                self.by_sid[ev.stream_id].headers = list(ev.headers)
            elif isinstance(ev, h2.events.TrailersReceived):
                self.by_sid[ev.stream_id].trailers = list(ev.headers)
            elif isinstance(ev, h2.events.DataReceived):
                self.by_sid[ev.stream_id].data += ev.data
                self.credit.received(ev.stream_id, ev.flow_controlled_length)
            elif isinstance(ev, h2.events.StreamEnded):
                s = self.by_sid[ev.stream_id]
                s.ended = True
                stream = self.conn.streams.get(ev.stream_id)
                if s.sending and self.reset_on_early_end and stream is not None and not stream.closed:
                    self._reset(s, h2.errors.ErrorCodes.NO_ERROR)
            elif isinstance(ev, h2.events.StreamReset):
                self.by_sid[ev.stream_id].reset_code = ev.error_code
            elif isinstance(ev, h2.events.ConnectionTerminated):
                raise HarnessError(f"the kubelet got GOAWAY from the splice: {ev}")
            elif not isinstance(ev, (h2.events.WindowUpdated, h2.events.RemoteSettingsChanged,
                                     h2.events.SettingsAcknowledged, h2.events.PingAckReceived,
                                     h2.events.PingReceived)):
                raise HarnessError(f"the kubelet got an unexpected event: {ev!r}")


class ContainerdStream:
    def __init__(self, sid: int, path: str) -> None:
        self.sid = sid
        self.path = path
        self.data = bytearray()
        self.ended = False             # the request's END_STREAM arrived
        self.early = False             # to be answered UNIMPLEMENTED without reading it
        self.reset_codes: List[int] = []
        self.reply = b""
        self.replying = False
        self.reply_pos = 0
        self.headers_sent = False
        self.done = False              # we sent END_STREAM


class Containerd:
    """containerd: an h2 server that answers each complete request."""

    def __init__(self, replies: Dict[str, Tuple[bytes, bool]], quarter_credit: bool,
                 settings: Optional[ServerSettings]) -> None:
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
        self.conn.initiate_connection()
        self.replies = replies
        self.credit = Credit(self.conn, quarter_credit, lambda: self.window_granted)
        self.settings = settings
        self.settings_applied = settings is None
        self.streams: Dict[int, ContainerdStream] = {}
        self.by_path: Dict[str, ContainerdStream] = {}
        self.window_granted = DEFAULT_WINDOW   # the connection window it ever offered

    def _apply_settings(self) -> None:
        s = self.settings
        codes = h2.settings.SettingCodes
        self.conn.update_settings({codes.INITIAL_WINDOW_SIZE: s.initial_window,
                                   codes.MAX_FRAME_SIZE: s.max_frame})
        # grpc-go applies what it advertises when it sends it; h2 would wait for the ACK.
        self.conn._local_settings_acked()
        if s.connection_bonus:
            self.conn.increment_flow_control_window(s.connection_bonus)
            self.window_granted += s.connection_bonus
        self.settings_applied = True

    def act(self, rnd: int) -> bytes:
        if not self.settings_applied and self.settings.at <= rnd:
            self._apply_settings()
        for s in self.streams.values():
            if s.early and not s.reply and not s.done and not s.reset_codes:
                self.conn.send_headers(s.sid, [(b":status", b"200"), (b"content-type", b"application/grpc")]
                                       + EARLY_TRAILERS, end_stream=True)
                s.done = True
        progress = True
        while progress:
            progress = False
            for s in self.streams.values():
                if not s.replying or s.done or s.reset_codes:
                    continue
                if not s.headers_sent:
                    self.conn.send_headers(s.sid, [(b":status", b"200"), (b"content-type", b"application/grpc")])
                    s.headers_sent = True
                    progress = True
                left = len(s.reply) - s.reply_pos
                if left:
                    n = min(GRPC_FRAME, left, self.conn.local_flow_control_window(s.sid),
                            self.conn.max_outbound_frame_size)
                    if n > 0:
                        self.conn.send_data(s.sid, s.reply[s.reply_pos:s.reply_pos + n])
                        s.reply_pos += n
                        progress = True
                    continue
                self.conn.send_headers(s.sid, EARLY_TRAILERS if s.early else OK_TRAILERS, end_stream=True)
                s.done = True
                progress = True
        return self.conn.data_to_send()

    def receive(self, data: bytes) -> None:
        if not data:
            return
        for ev in _receive("containerd", self.conn, data):
            if isinstance(ev, h2.events.RequestReceived):
                path = header_value(ev.headers, b":path").decode()
                s = ContainerdStream(ev.stream_id, path)
                if path in self.by_path:
                    raise HarnessError(f"containerd got {path} twice")
                self.streams[ev.stream_id] = self.by_path[path] = s
                reply, early = self.replies[path]
                s.reply = reply
                s.early = s.replying = early  # an unknown method: answered on the headers (in act())
                if ev.stream_ended is not None:
                    raise HarnessError(f"containerd got {path} without a body")
            elif isinstance(ev, h2.events.DataReceived):
                s = self.streams[ev.stream_id]
                if s.ended:
                    raise HarnessError(f"containerd got DATA after END_STREAM on stream {ev.stream_id}")
                s.data += ev.data
                self.credit.received(ev.stream_id, ev.flow_controlled_length)
            elif isinstance(ev, h2.events.StreamEnded):
                s = self.streams[ev.stream_id]
                s.ended = True
                if not s.early:
                    s.replying = True
            elif isinstance(ev, h2.events.StreamReset):
                self.streams[ev.stream_id].reset_codes.append(ev.error_code)
            elif isinstance(ev, h2.events.ConnectionTerminated):
                raise HarnessError(f"containerd got GOAWAY from the splice: {ev}")
            elif not isinstance(ev, (h2.events.WindowUpdated, h2.events.RemoteSettingsChanged,
                                     h2.events.SettingsAcknowledged, h2.events.PingAckReceived,
                                     h2.events.PingReceived)):
                raise HarnessError(f"containerd got an unexpected event: {ev!r}")


# ---------------------------------------------------------------------------- the exchange
class Cutter:
    """Chunk sizes for one direction, cycled; 0 means "all that is there". After
    ``max_cuts`` cuts the rest goes whole, which bounds the work of tiny cut sizes."""

    def __init__(self, sizes: List[int], max_cuts: int = 1500) -> None:
        self.sizes = list(sizes) or [0]
        self.i = 0
        self.cuts = 0
        self.max_cuts = max_cuts

    def next(self, available: int) -> int:
        if self.cuts >= self.max_cuts:
            return available
        size = self.sizes[self.i % len(self.sizes)]
        self.i += 1
        if size == 0 or size >= available:
            return available
        self.cuts += 1
        return size


def _error_name(code: int) -> str:
    try:
        return h2.errors.ErrorCodes(code).name
    except ValueError:
        return str(code)


def _receive(peer: str, conn: h2.connection.H2Connection, data: bytes) -> list:
    """What ``data`` means to ``conn``; the splice's fault when h2 rejects it."""
    try:
        return conn.receive_data(data)
    except h2.exceptions.ProtocolError as e:
        raise HarnessError(f"the {peer}'s HTTP/2 stack rejected what the splice sent: {e!r}") from e


def _pick(pattern: List[bool], i: int) -> bool:
    return pattern[i % len(pattern)] if pattern else True


@dataclass
class Scenario:
    plans: List[CallPlan]
    k2c_cuts: List[int] = field(default_factory=list)
    c2k_cuts: List[int] = field(default_factory=list)
    order: List[bool] = field(default_factory=list)   # per chunk: True = kubelet's side first
    kubelet_quarter_credit: bool = False    # see Credit
    containerd_quarter_credit: bool = False
    reset_on_early_end: bool = True
    kubelet_reads: List[bool] = field(default_factory=list)     # per round, cycled: read or not
    containerd_reads: List[bool] = field(default_factory=list)
    server_settings: Optional[ServerSettings] = None
    budget_per_connection: int = 32 << 20
    budget_total: int = 64 << 20
    max_message_bytes: int = 16 << 20


class Exchange:
    """A kubelet, a splice and a containerd, moved in rounds until nothing moves."""

    IDLE_ROUNDS = 3
    MAX_UNREAD_ROUNDS = 2
    MAX_ROUNDS = 4000

    def __init__(self, scenario: Scenario, check: Optional[Callable[["Exchange"], None]] = None) -> None:
        self.scenario = scenario
        sc = scenario
        self.bodies = [grpc_body(message_bytes(i, p.size)) for i, p in enumerate(sc.plans)]
        self.reply_bodies = [grpc_body(message_bytes(20_000 + i, p.reply)) for i, p in enumerate(sc.plans)]
        self.interceptor = FakeInterceptor(sc.plans)
        self.relay = Relay("unused.sock", self.interceptor, max_message_bytes=sc.max_message_bytes,
                           budget_per_connection=sc.budget_per_connection, budget_total=sc.budget_total)
        self.down = FakeTransport("kubelet")
        self.up = FakeTransport("containerd")
        self.kubelet = Kubelet(sc.plans, self.bodies, sc.kubelet_quarter_credit, sc.reset_on_early_end)
        self.containerd = Containerd({call_path(i): (self.reply_for(i), p.early) for i, p in enumerate(sc.plans)},
                                     sc.containerd_quarter_credit, sc.server_settings)
        self.k2c = bytearray()     # written by the kubelet, not yet read by the splice
        self.c2k = bytearray()
        self.k2c_cuts = Cutter(sc.k2c_cuts)
        self.c2k_cuts = Cutter(sc.c2k_cuts)
        self.order_i = 0
        self.check = check
        self.splice: Optional[Splice] = None
        self.rounds = 0
        self.steps = 0
        self.peak_used = 0

    def reply_for(self, i: int) -> bytes:
        """What containerd answers call ``i`` with (nothing: trailers only)."""
        p = self.scenario.plans[i]
        return b"" if p.early and not p.reply else self.reply_bodies[i]

    async def run(self) -> "Exchange":
        self.splice = Splice(self.relay, self.down)  # type: ignore[arg-type]
        self.splice.upstream_connected(self.up)  # type: ignore[arg-type]
        last_open = max(p.start for p in self.scenario.plans) if self.scenario.plans else 0
        idle = 0
        for rnd in range(self.MAX_ROUNDS):
            self.rounds = rnd + 1
            moved = False
            out = self.kubelet.act(rnd)
            self._peer_wrote(out, self.kubelet)
            self.k2c += out
            out = self.containerd.act(rnd)
            self._peer_wrote(out, self.containerd)
            self.c2k += out
            moved |= self._feed()
            # A peer may leave what the splice wrote unread for a round or two (it is busy),
            # but reads when nothing else would move.
            to_up = self._read(self.up, self.scenario.containerd_reads, rnd, moved)
            to_down = self._read(self.down, self.scenario.kubelet_reads, rnd, moved)
            moved |= bool(to_up or to_down or self.up.out or self.down.out)
            self.containerd.receive(to_up)
            self.kubelet.receive(to_down)
            self._check_windows()
            moved |= self.interceptor.tick()
            for _ in range(4):  # on_reply, on_forwarded and Future callbacks run from the loop
                await asyncio.sleep(0)
            self._after_step()
            if moved or rnd < last_open or self.interceptor.pending or not self.containerd.settings_applied:
                idle = 0
                continue
            if self.k2c or self.c2k:
                raise HarnessError(f"stalled: {len(self.k2c)} kubelet bytes unread (kubelet paused: "
                                   f"{self.down.paused}, why: {sorted(self.splice.paused)}), "
                                   f"{len(self.c2k)} containerd bytes unread")
            idle += 1
            if idle >= self.IDLE_ROUNDS:
                return self
        raise HarnessError(f"the exchange did not settle in {self.MAX_ROUNDS} rounds")

    def _read(self, transport: FakeTransport, pattern: List[bool], rnd: int, moved: bool) -> bytes:
        if _pick(pattern, rnd) or not moved or transport.unread_rounds >= self.MAX_UNREAD_ROUNDS:
            transport.unread_rounds = 0
            return transport.take()
        transport.unread_rounds += 1
        return b""

    def _check_windows(self) -> None:
        """Nobody was credited more than its peer ever offered: the kubelet's connection
        window is at most what containerd granted, each of its stream windows at most
        containerd's initial stream window (the relay credits held bytes itself and must
        then keep containerd's credit for them), and the other way round."""
        k, c = self.kubelet.conn, self.containerd.conn
        if k.outbound_flow_control_window > self.containerd.window_granted:
            raise HarnessError(f"the kubelet's connection window is {k.outbound_flow_control_window}, "
                               f"containerd granted {self.containerd.window_granted}")
        if c.outbound_flow_control_window > DEFAULT_WINDOW:
            raise HarnessError(f"containerd's connection window is {c.outbound_flow_control_window}")
        for peer, conn in ((self.kubelet, k), (self.containerd, c)):
            limit = conn.remote_settings.initial_window_size
            for sid, stream in conn.streams.items():
                if not stream.closed and stream.outbound_flow_control_window > limit:
                    raise HarnessError(f"{type(peer).__name__}'s window for stream {sid} is "
                                       f"{stream.outbound_flow_control_window}, over the {limit} its peer offers")

    def _peer_wrote(self, data: bytes, peer) -> None:
        """A peer answers a protocol error of the splice's with RST_STREAM or GOAWAY."""
        for ftype, flags, sid, payload in _frames(data):
            if ftype == wire.GOAWAY:
                raise HarnessError(f"{type(peer).__name__} sent GOAWAY "
                                   f"{_error_name(int.from_bytes(payload[4:8], 'big'))} {payload[8:]!r}")
            if ftype == wire.RST_STREAM:
                code = _error_name(int.from_bytes(payload, "big"))
                # The kubelet may answer frames that crossed its own RST_STREAM with another.
                if peer is self.containerd or not any(sid == r[0] for r in self.kubelet.resets):
                    raise HarnessError(f"{type(peer).__name__} reset stream {sid} with {code}: "
                                       f"it objected to what the splice sent")

    def _feed(self) -> bool:
        moved = False
        while True:
            can_k = bool(self.k2c) and not self.down.paused
            can_c = bool(self.c2k) and not self.up.paused
            if not (can_k or can_c):
                return moved
            first_k = _pick(self.scenario.order, self.order_i)
            self.order_i += 1
            if can_k and (first_k or not can_c):
                n = self.k2c_cuts.next(len(self.k2c))
                chunk = bytes(self.k2c[:n])
                del self.k2c[:n]
                self.splice.from_kubelet(chunk)
            else:
                n = self.c2k_cuts.next(len(self.c2k))
                chunk = bytes(self.c2k[:n])
                del self.c2k[:n]
                self.splice.from_containerd(chunk)
            moved = True
            self._after_step()

    def _after_step(self) -> None:
        self.steps += 1
        s = self.splice
        if s.closed or self.down.closed or self.up.closed:
            raise HarnessError(f"the splice closed the connection (kubelet side closed: {self.down.closed}, "
                               f"containerd side: {self.up.closed})")
        self.peak_used = max(self.peak_used, self.relay.budget.used)
        if self.check is not None:
            self.check(self)


def run(scenario: Scenario, check: Optional[Callable[[Exchange], None]] = None) -> Exchange:
    """Run one exchange on a new event loop."""
    async def main() -> Exchange:
        return await Exchange(scenario, check).run()
    return asyncio.run(main())
