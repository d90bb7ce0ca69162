"""The HTTP/2 splice: one kubelet connection relayed frame by frame to one containerd connection.

Why a splice and not a gRPC server plus a gRPC client: a Python gRPC server and client pair
adds ~450 µs to every call and imposes its own message limits, deadlines and method
tables. Here the two HTTP/2 connections are joined end to end, so SETTINGS, flow control,
PING, deadlines (``grpc-timeout``), metadata, status codes, unknown methods, streams and
message sizes all pass as the peers sent them. The relay only:

- decodes every header block (HPACK state must be followed in both directions) to learn
  which method each new stream calls and, for intercepted calls, the reply's status;
- holds the request DATA of intercepted calls until the pipeline decided (other streams
  keep flowing), then forwards the original or the edited body, or answers the call itself
  with a status (trailers-only, coded without touching the peer's HPACK table);
- copies the reply DATA of intercepted calls for the post-hooks while passing it on;
- keeps connection-level flow control consistent when an edit changes the body length.

When containerd cannot be reached the kubelet's connection is closed at once, which the
kubelet's gRPC client reports as UNAVAILABLE, exactly as if containerd's own socket were
gone; when containerd's connection drops, the kubelet's is closed with it and the kubelet
reconnects (to us, and we to the restarted containerd).
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any, Callable, Dict, List, Optional

import hpack
import structlog

from anolisnuma.pipeline.decision import Decision
from anolisnuma.transport import h2

log = structlog.get_logger("anolisnuma.transport")

# Holding more than this much request data of one stream could exhaust the kubelet's
# HTTP/2 window towards containerd (65535 bytes at minimum) and deadlock the call, so a
# larger intercepted request is forwarded unchanged instead (and that is logged).
MAX_HELD_BYTES = 32 * 1024

_conn_ids = itertools.count(1)


class _Stream:
    """Per-stream state of an intercepted call (pass-through streams carry none)."""

    __slots__ = ("sid", "call", "held", "held_flow", "holding", "answered", "reply", "reply_overflow",
                 "status", "status_message", "done")

    def __init__(self, sid: int, call: Any) -> None:
        self.sid = sid
        self.call = call
        self.held: List[bytes] = []
        self.held_flow = 0
        self.holding = True
        self.answered = False       # we answered the kubelet ourselves
        self.reply: List[bytes] = []
        self.reply_overflow = False
        self.status: Optional[int] = None
        self.status_message = ""
        self.done = False


class _Reader:
    """Incremental frame reader for one direction of a connection.

    Large DATA frames of pass-through streams are forwarded as their bytes arrive; every
    other frame is handed over whole. ``inject`` queues frames of our own until the reader
    stands between frames and outside a header block, where HTTP/2 allows inserting them.
    """

    def __init__(self, expect_preface: bool) -> None:
        self.buf = bytearray()
        self.need_preface = expect_preface
        self.passing = 0            # bytes of the current frame still to forward as-is
        self.in_header_block = False
        self.pending: List[bytes] = []
        self.tail: Optional[tuple] = None   # (type, flags, stream) of a frame still streaming

    @property
    def at_boundary(self) -> bool:
        return self.passing == 0 and not self.in_header_block


class Splice:
    """One kubelet connection joined to one containerd connection."""

    def __init__(self, relay: "Relay", down: asyncio.Transport) -> None:
        self.relay = relay
        self.interceptor = relay.interceptor
        self.cid = next(_conn_ids)
        self.down = down                      # kubelet side
        self.up: Optional[asyncio.Transport] = None
        self.k2c = _Reader(expect_preface=True)
        self.c2k = _Reader(expect_preface=False)
        self.k2c_hpack = hpack.Decoder()
        self.c2k_hpack = hpack.Decoder()
        for d in (self.k2c_hpack, self.c2k_hpack):
            # Enforcing table limits is the peers' business; we only follow their state.
            d.max_allowed_table_size = 1 << 30
            d.max_header_list_size = 1 << 30
        self.header_block = {True: bytearray(), False: bytearray()}
        self.header_sid = {True: 0, False: 0}
        self.header_end_stream = {True: False, False: False}
        self.streams: Dict[int, _Stream] = {}
        self.open_streams: set = set()
        self.max_sid = 0
        self.goaway_sid: Optional[int] = None   # set when we told the kubelet to go away
        self.refused_sids: set = set()
        self.up_max_frame = h2.DEFAULT_MAX_FRAME_SIZE
        self.conn_debt = 0                    # conn-window credit containerd will give that the kubelet must not get
        self.blind = False                    # HPACK state lost: relay frames unread, intercept nothing
        self.raw = False                      # not HTTP/2 at all: relay bytes
        self.closed = False
        self.idle_waiters: List[asyncio.Future] = []

    # ---------------------------------------------------------------- wiring
    def upstream_connected(self, up: asyncio.Transport) -> None:
        self.up = up
        self.down.resume_reading()
        if self.k2c.buf:  # bytes that arrived before containerd answered
            self.from_kubelet(b"")

    def close(self, why: str = "") -> None:
        if self.closed:
            return
        self.closed = True
        for t in (self.down, self.up):
            if t is not None:
                t.close()
        for st in self.streams.values():
            if not st.done:
                self.interceptor.on_abort(st.call, why or "connection closed")
        self.streams.clear()
        self.open_streams.clear()
        self._wake_idle()
        self.relay.forget(self)

    # ---------------------------------------------------------------- kubelet → containerd
    def from_kubelet(self, data: bytes) -> None:
        if self.closed:
            return
        r = self.k2c
        if self.up is None:  # reading is paused until then, but an event loop may deliver one read
            r.buf += data
            return
        if self.raw:
            self.up.write(bytes(r.buf) + data if r.buf else data)
            r.buf.clear()
            return
        r.buf += data
        out: List[bytes] = []
        try:
            if r.need_preface:
                if len(r.buf) < len(h2.PREFACE):
                    return
                if bytes(r.buf[:len(h2.PREFACE)]) != h2.PREFACE:
                    log.error("client did not start with the HTTP/2 preface; relaying its bytes unread",
                              conn=self.cid)
                    self.raw = True
                    self.up.write(bytes(r.buf))
                    r.buf.clear()
                    return
                out.append(h2.PREFACE)
                del r.buf[:len(h2.PREFACE)]
                r.need_preface = False
            self._pump(r, out, self._k2c_frame, self._k2c_streamable)
        finally:
            if out and not self.closed:
                self.up.write(b"".join(out))

    def _k2c_streamable(self, ftype: int, sid: int) -> bool:
        return ftype == h2.DATA and sid not in self.streams and sid not in self.refused_sids

    def _k2c_frame(self, ftype: int, flags: int, sid: int, payload: bytes, raw: bytes, out: List[bytes]) -> None:
        if ftype in (h2.HEADERS, h2.CONTINUATION):
            out.append(raw)
            self._header_fragment(True, ftype, flags, sid, payload)
            return
        st = self.streams.get(sid)
        if ftype == h2.DATA:
            if sid in self.refused_sids:
                if payload:  # never reaches containerd: give the kubelet its window back
                    self._inject_down(h2.window_update(0, len(payload)))
                return
            if st is not None and st.holding:
                self._hold(st, flags, payload, raw, out)
                return
            out.append(raw)
            return
        if ftype == h2.RST_STREAM:
            self.open_streams.discard(sid)
            if st is not None:
                if st.holding and st.held_flow:
                    self._inject_down(h2.window_update(0, st.held_flow))
                st.holding = False
                st.held = []
                self._finish(st, aborted="cancelled by the kubelet")
            out.append(raw)
            self._wake_idle()
            return
        out.append(raw)

    def _hold(self, st: _Stream, flags: int, payload: bytes, raw: bytes, out: List[bytes]) -> None:
        try:
            content = h2.strip_padding(flags, payload, h2.DATA)
        except ValueError:
            content = b""
        st.held.append(content)
        st.held_flow += len(payload)
        if st.held_flow > MAX_HELD_BYTES:
            # Too big to hold safely: release what we have unchanged and stop intercepting
            # the request (the reply is still observed).
            log.warning("intercepted request too large to hold; forwarded unchanged",
                        method=getattr(st.call, "method", "?"), bytes=st.held_flow)
            body = b"".join(st.held)
            st.holding = False
            st.held = []
            out.extend(h2.data_frames(st.sid, body, self.up_max_frame, bool(flags & h2.FLAG_END_STREAM)))
            self._settle_flow(st.held_flow, len(body))
            self.interceptor.on_request_skipped(st.call, "request larger than the hold limit")
            return
        if not flags & h2.FLAG_END_STREAM:
            return
        body = b"".join(st.held)
        st.held = []
        outcome = self.interceptor.on_request(st.call, body)
        if isinstance(outcome, Decision):
            self._apply_decision(st, outcome, body, out)
        else:
            outcome.add_done_callback(lambda fut, st=st, body=body: self._decided(st, fut, body))

    def _decided(self, st: _Stream, fut: "asyncio.Future[Decision]", body: bytes) -> None:
        if self.closed or not st.holding or st.done:
            return
        try:
            decision = fut.result()
        except BaseException as e:  # the pipeline never fails a call by accident
            log.error("interception failed; forwarding the request unchanged", error=repr(e))
            decision = Decision.forward(body)
        out: List[bytes] = []
        self._apply_decision(st, decision, body, out)
        if out:
            self._inject_up(b"".join(out))

    def _apply_decision(self, st: _Stream, d: Decision, original: bytes, out: List[bytes]) -> None:
        st.holding = False
        if d.status:
            # Containerd saw the HEADERS but no message: cancelling the stream makes its
            # handler return without running the call.
            out.append(h2.rst_stream(st.sid, h2.CANCEL))
            if st.held_flow:
                self._inject_down(h2.window_update(0, st.held_flow))
            st.answered = True
            st.status, st.status_message = d.status, d.message
            self._inject_down(h2.frame(h2.HEADERS, h2.FLAG_END_HEADERS | h2.FLAG_END_STREAM, st.sid,
                                       h2.trailers_only_block(d.status, d.message)))
            self.open_streams.discard(st.sid)
            self._finish(st)
            self._wake_idle()
            return
        body = original if d.body is None else d.body
        out.extend(h2.data_frames(st.sid, body, self.up_max_frame, True))
        self._settle_flow(st.held_flow, len(body))

    def _settle_flow(self, received: int, sent: int) -> None:
        """Keep the kubelet's connection window equal to containerd's after an edit."""
        if sent < received:
            self._inject_down(h2.window_update(0, received - sent))
        elif sent > received:
            self.conn_debt += sent - received

    # ---------------------------------------------------------------- containerd → kubelet
    def from_containerd(self, data: bytes) -> None:
        if self.closed:
            return
        r = self.c2k
        if self.raw:
            self.down.write(bytes(r.buf) + data if r.buf else data)
            r.buf.clear()
            return
        r.buf += data
        out: List[bytes] = []
        try:
            self._pump(r, out, self._c2k_frame, self._c2k_streamable)
        finally:
            if out and not self.closed:
                self.down.write(b"".join(out))

    def _c2k_streamable(self, ftype: int, sid: int) -> bool:
        return ftype == h2.DATA and sid not in self.streams

    def _c2k_frame(self, ftype: int, flags: int, sid: int, payload: bytes, raw: bytes, out: List[bytes]) -> None:
        if ftype in (h2.HEADERS, h2.CONTINUATION):
            out.append(raw)
            self._header_fragment(False, ftype, flags, sid, payload)
            if flags & h2.FLAG_END_HEADERS and self.header_end_stream[False]:  # whole trailers read
                self._server_done(self.header_sid[False])
            return
        st = self.streams.get(sid)
        if ftype == h2.DATA:
            if st is not None and st.answered:
                # We already answered this call; containerd's bytes must not reach the
                # kubelet, but its window must not shrink for them either.
                if payload:
                    self._inject_up(h2.window_update(0, len(payload)))
                return
            out.append(raw)
            if st is not None and not st.reply_overflow:
                try:
                    st.reply.append(h2.strip_padding(flags, payload, h2.DATA))
                except ValueError:
                    pass
                if sum(map(len, st.reply)) > self.relay.max_message_bytes:
                    st.reply_overflow = True
                    st.reply = []
            if flags & h2.FLAG_END_STREAM:
                self._server_done(sid)
            return
        if ftype == h2.WINDOW_UPDATE and sid == 0 and self.conn_debt and len(payload) == 4:
            inc = int.from_bytes(payload, "big") & 0x7FFFFFFF
            taken = min(inc, self.conn_debt)
            self.conn_debt -= taken
            if inc - taken:
                out.append(h2.window_update(0, inc - taken))
            return
        if ftype == h2.SETTINGS and not flags & h2.FLAG_ACK:
            for ident, value in h2.parse_settings(payload):
                if ident == h2.SETTINGS_MAX_FRAME_SIZE:
                    self.up_max_frame = value
            out.append(raw)
            return
        if ftype == h2.RST_STREAM:
            if st is not None and st.answered:
                return
            out.append(raw)
            self.open_streams.discard(sid)
            if st is not None:
                self._finish(st, aborted="reset by containerd")
            self._wake_idle()
            return
        out.append(raw)

    def _server_done(self, sid: int) -> None:
        self.open_streams.discard(sid)
        st = self.streams.get(sid)
        if st is not None and not st.answered:
            if st.holding:
                # containerd answered before it got the request (e.g. UNIMPLEMENTED): the
                # held bytes will never be sent, so the kubelet gets its window back.
                st.holding = False
                st.held = []
                if st.held_flow:
                    self._inject_down(h2.window_update(0, st.held_flow))
            self._finish(st)
        self._wake_idle()

    # ---------------------------------------------------------------- header blocks
    def _header_fragment(self, k2c: bool, ftype: int, flags: int, sid: int, payload: bytes) -> None:
        reader = self.k2c if k2c else self.c2k
        block = self.header_block[k2c]
        try:
            if ftype == h2.HEADERS:
                block.clear()
                self.header_sid[k2c] = sid
                self.header_end_stream[k2c] = bool(flags & h2.FLAG_END_STREAM)
                block += h2.strip_padding(flags, payload, h2.HEADERS)
            else:
                block += payload
        except ValueError:
            self._go_blind("malformed HEADERS frame")
            return
        if not flags & h2.FLAG_END_HEADERS:
            reader.in_header_block = True
            return
        reader.in_header_block = False
        sid = self.header_sid[k2c]
        try:
            headers = (self.k2c_hpack if k2c else self.c2k_hpack).decode(bytes(block), raw=True)
        except Exception as e:  # HPACK state lost: never guess, relay blindly from now on
            self._go_blind(f"cannot decode a header block: {e!r}")
            return
        if k2c:
            self._request_headers(sid, headers)
        else:
            self._reply_headers(sid, headers)

    def _request_headers(self, sid: int, headers: list) -> None:
        if sid <= self.max_sid:
            return  # trailers of a client stream
        self.max_sid = sid
        if self.goaway_sid is not None and sid > self.goaway_sid:
            # Opened after we announced shutdown: containerd must not run it.
            self.refused_sids.add(sid)
            self._inject_up(h2.rst_stream(sid, h2.CANCEL))
            self._inject_down(h2.rst_stream(sid, h2.REFUSED_STREAM))
            return
        self.open_streams.add(sid)
        path = ""
        for name, value in headers:
            if name == b":path":
                path = value.decode("latin-1")
                break
        if self.header_end_stream[True]:
            return  # no request body will follow: nothing to intercept
        call = self.interceptor.begin(path)
        if call is not None:
            self.streams[sid] = _Stream(sid, call)

    def _reply_headers(self, sid: int, headers: list) -> None:
        st = self.streams.get(sid)
        if st is None:
            return
        for name, value in headers:
            if name == b"grpc-status":
                try:
                    st.status = int(value)
                except ValueError:
                    st.status = 2
            elif name == b"grpc-message":
                st.status_message = value.decode("utf-8", "replace")

    def _finish(self, st: _Stream, aborted: str = "") -> None:
        if st.done:
            return
        st.done = True
        self.streams.pop(st.sid, None)
        if aborted:
            self.interceptor.on_abort(st.call, aborted)
            return
        reply = None if st.reply_overflow else b"".join(st.reply)
        self.interceptor.on_reply(st.call, reply, st.status if st.status is not None else 0,
                                  st.status_message, answered_by_proxy=st.answered)

    # ---------------------------------------------------------------- framing machinery
    def _pump(self, r: _Reader, out: List[bytes], on_frame: Callable, streamable: Callable) -> None:
        buf = r.buf
        pos = 0
        n = len(buf)
        while pos < n and not self.closed:
            if r.passing:
                take = min(r.passing, n - pos)
                out.append(bytes(buf[pos:pos + take]))
                pos += take
                r.passing -= take
                if r.passing == 0 and r.tail is not None:
                    ftype, flags, sid = r.tail
                    r.tail = None
                    self._after_passed_frame(r, ftype, flags, sid)
                continue
            if n - pos < h2.FRAME_HEADER_LEN:
                break
            length, ftype, flags, sid = h2.parse_frame_header(buf, pos)
            if self.blind or streamable(ftype, sid):
                # Forward as it comes: the header now, the payload as it arrives.
                out.append(bytes(buf[pos:pos + h2.FRAME_HEADER_LEN]))
                pos += h2.FRAME_HEADER_LEN
                r.passing = length
                if length == 0:
                    self._after_passed_frame(r, ftype, flags, sid)
                else:
                    take = min(length, n - pos)
                    out.append(bytes(buf[pos:pos + take]))
                    pos += take
                    r.passing -= take
                    if r.passing == 0:
                        self._after_passed_frame(r, ftype, flags, sid)
                    else:
                        r.tail = (ftype, flags, sid)
                continue
            end = pos + h2.FRAME_HEADER_LEN + length
            if end > n:
                break
            raw = bytes(buf[pos:end])
            on_frame(ftype, flags, sid, raw[h2.FRAME_HEADER_LEN:], raw, out)
            pos = end
            if r.pending and r.at_boundary:
                out.extend(r.pending)
                r.pending.clear()
        del buf[:pos]
        if r.pending and r.at_boundary:
            out.extend(r.pending)
            r.pending.clear()

    def _after_passed_frame(self, r: _Reader, ftype: int, flags: int, sid: int) -> None:
        """Bookkeeping for a streamed frame once all of it went through."""
        if self.blind:
            # Frames are no longer read; only know where header blocks end, so that our own
            # frames are never put inside one.
            if ftype in (h2.HEADERS, h2.CONTINUATION):
                r.in_header_block = not flags & h2.FLAG_END_HEADERS
            return
        if flags & h2.FLAG_END_STREAM and r is self.c2k:
            self._server_done(sid)

    def _inject(self, r: _Reader, t: Optional[asyncio.Transport], data: bytes) -> None:
        if self.closed or t is None:
            return
        if r.at_boundary and not r.pending:
            t.write(data)
        else:
            r.pending.append(data)

    def _inject_up(self, data: bytes) -> None:
        """Send frames of our own to containerd at the next frame boundary."""
        self._inject(self.k2c, self.up, data)

    def _inject_down(self, data: bytes) -> None:
        """Send frames of our own to the kubelet at the next frame boundary."""
        self._inject(self.c2k, self.down, data)

    def _go_blind(self, why: str) -> None:
        """Stop reading this connection's frames and stop intercepting; keep relaying them.

        Only reached if a header block cannot be decoded, which means our HPACK state no
        longer matches the peers'. Framing is still followed, so frames stay whole.
        """
        log.error("HTTP/2 header state lost; relaying this connection without interception",
                  conn=self.cid, reason=why)
        self.blind = True
        for st in list(self.streams.values()):
            if st.holding:  # release the held request unchanged so the call is not lost
                st.holding = False
                self._inject_up(b"".join(h2.data_frames(st.sid, b"".join(st.held), self.up_max_frame, True)))
            self._finish(st, aborted="connection relayed without interception")
        self.open_streams.clear()
        self._wake_idle()

    # ---------------------------------------------------------------- shutdown
    def announce_shutdown(self) -> None:
        """Tell the kubelet to open no new streams here (GOAWAY), keep the open ones."""
        if self.closed or self.goaway_sid is not None or self.k2c.need_preface:
            return
        self.goaway_sid = self.max_sid
        self._inject_down(h2.goaway(self.max_sid, h2.NO_ERROR, b"anolisnuma shutting down"))

    @property
    def busy(self) -> bool:
        return bool(self.open_streams)

    def _wake_idle(self) -> None:
        if not self.open_streams or self.closed:
            waiters, self.idle_waiters = self.idle_waiters, []
            for w in waiters:
                if not w.done():
                    w.set_result(None)

    async def wait_idle(self) -> None:
        if not self.busy or self.closed:
            return
        fut = asyncio.get_running_loop().create_future()
        self.idle_waiters.append(fut)
        await fut


class _KubeletSide(asyncio.Protocol):
    def __init__(self, relay: "Relay") -> None:
        self.relay = relay
        self.splice: Optional[Splice] = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.pause_reading()  # nothing is read until containerd is connected
        self.splice = Splice(self.relay, transport)  # type: ignore[arg-type]
        self.relay.adopt(self.splice)

    def data_received(self, data: bytes) -> None:
        self.splice.from_kubelet(data)

    def eof_received(self) -> Optional[bool]:
        self.splice.close("kubelet closed the connection")
        return None

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.splice.close("kubelet connection lost")

    def pause_writing(self) -> None:
        if self.splice.up is not None:
            self.splice.up.pause_reading()

    def resume_writing(self) -> None:
        if self.splice.up is not None and not self.splice.closed:
            self.splice.up.resume_reading()


class _ContainerdSide(asyncio.Protocol):
    def __init__(self, splice: Splice) -> None:
        self.splice = splice

    def data_received(self, data: bytes) -> None:
        self.splice.from_containerd(data)

    def eof_received(self) -> Optional[bool]:
        self.splice.close("containerd closed the connection")
        return None

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.splice.close("containerd connection lost")

    def pause_writing(self) -> None:
        self.splice.down.pause_reading()

    def resume_writing(self) -> None:
        if not self.splice.closed:
            self.splice.down.resume_reading()


class Relay:
    """Accepts kubelet connections and splices each onto a new containerd connection."""

    def __init__(self, upstream: str, interceptor: Any, connect_timeout: float = 1.0,
                 max_message_bytes: int = 16 << 20) -> None:
        self.upstream = upstream
        self.interceptor = interceptor
        self.connect_timeout = connect_timeout
        self.max_message_bytes = max_message_bytes
        self.splices: set = set()
        self._tasks: set = set()
        self._last_unreachable_log = 0.0

    def protocol(self) -> asyncio.Protocol:
        return _KubeletSide(self)

    def adopt(self, splice: Splice) -> None:
        self.splices.add(splice)
        task = asyncio.ensure_future(self._connect(splice))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def forget(self, splice: Splice) -> None:
        self.splices.discard(splice)

    async def _connect(self, splice: Splice) -> None:
        loop = asyncio.get_running_loop()
        try:
            up, _ = await asyncio.wait_for(
                loop.create_unix_connection(lambda: _ContainerdSide(splice), self.upstream),
                self.connect_timeout)
        except (OSError, asyncio.TimeoutError) as e:
            now = loop.time()
            if now - self._last_unreachable_log > 5:
                self._last_unreachable_log = now
                log.warning("containerd unreachable; kubelet connection closed (calls fail UNAVAILABLE)",
                            endpoint=self.upstream, error=str(e) or type(e).__name__)
            splice.close("containerd unreachable")
            return
        if splice.closed:
            up.close()
            return
        splice.upstream_connected(up)  # type: ignore[arg-type]

    async def drain(self, grace: float) -> int:
        """Announce shutdown on every connection and wait up to ``grace`` seconds for
        in-flight calls; returns how many connections still had calls open."""
        for s in list(self.splices):
            s.announce_shutdown()
        busy = [s for s in self.splices if s.busy]
        if busy:
            await asyncio.wait([asyncio.ensure_future(s.wait_idle()) for s in busy], timeout=grace)
        left = sum(1 for s in self.splices if s.busy)
        for s in list(self.splices):
            s.close("proxy shutting down")
        return left
