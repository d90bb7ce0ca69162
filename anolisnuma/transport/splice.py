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
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple
from urllib.parse import unquote

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

    __slots__ = ("sid", "call", "held", "held_flow", "holding", "copy", "copy_len", "answered",
                 "reply", "reply_len", "reply_overflow", "status", "status_message", "done")

    def __init__(self, sid: int, call: Any) -> None:
        self.sid = sid
        self.call = call
        self.held: List[bytes] = []
        self.held_flow = 0
        self.holding = True
        self.copy: Optional[List[bytes]] = None  # request too big to hold: copied as it passes
        self.copy_len = 0
        self.answered = False       # we answered the kubelet ourselves
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
        self.pending: List[Tuple[bytes, int]] = []   # (frame, flow-controlled length)
        self.tail: Optional[tuple] = None   # (type, flags, stream) of a frame still streaming

    @property
    def at_boundary(self) -> bool:
        return self.passing == 0 and not self.in_header_block


class Splice:
    """One kubelet connection joined to one containerd connection.

    Flow control: the kubelet spends containerd's connection window; as long as requests
    pass unchanged, both see the same bytes and agree on it. An edit that makes a request
    larger spends more of containerd's window than the kubelet counted, so the relay keeps
    its own count of containerd's window (``up_window``): DATA that would overrun it waits
    in ``up_queue`` until containerd grants more, and the extra credit containerd then
    returns is kept from the kubelet (``conn_debt``) so the two counts meet again. An edit
    that makes a request smaller is given back to the kubelet with a WINDOW_UPDATE.
    """

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
        self.up_stream_window = h2.DEFAULT_WINDOW   # containerd's initial stream window
        self.up_window = h2.DEFAULT_WINDOW          # containerd's connection window left
        self.up_queue: Deque[Tuple[bytes, int]] = deque()
        self.conn_debt = 0                    # credit containerd will give that the kubelet must not get
        self.up_out: List[bytes] = []
        self.down_out: List[bytes] = []
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

    # ---------------------------------------------------------------- sending
    def _send_up(self, data: bytes, flow: int = 0, ordered: bool = True) -> None:
        """Queue ``data`` for containerd; ``flow`` is what it costs of containerd's window.
        Frames that carry no ordering with DATA (``ordered=False``) never wait."""
        if (ordered and self.up_queue) or flow > self.up_window:
            self.up_queue.append((data, flow))
            return
        self.up_window -= flow
        self.up_out.append(data)

    def _drain_up(self) -> None:
        q = self.up_queue
        while q and q[0][1] <= self.up_window:
            data, flow = q.popleft()
            self.up_window -= flow
            self.up_out.append(data)

    def _send_down(self, data: bytes, flow: int = 0) -> None:
        self.down_out.append(data)

    def _flush(self) -> None:
        if self.closed:
            return
        if self.up_out and self.up is not None:
            self.up.write(self.up_out[0] if len(self.up_out) == 1 else b"".join(self.up_out))
            self.up_out.clear()
        if self.down_out:
            self.down.write(self.down_out[0] if len(self.down_out) == 1 else b"".join(self.down_out))
            self.down_out.clear()

    def _inject_up(self, data: bytes, flow: int = 0) -> None:
        """Send a frame of our own to containerd at the next frame boundary."""
        r = self.k2c
        if r.at_boundary and not r.pending:
            self._send_up(data, flow)
        else:
            r.pending.append((data, flow))

    def _inject_down(self, data: bytes) -> None:
        """Send a frame of our own to the kubelet at the next frame boundary."""
        r = self.c2k
        if r.at_boundary and not r.pending:
            self._send_down(data)
        else:
            r.pending.append((data, 0))

    def _body_up(self, sid: int, body: bytes, end_stream: bool) -> None:
        for f in h2.data_frames(sid, body, self.up_max_frame, end_stream):
            self._inject_up(f, len(f) - h2.FRAME_HEADER_LEN)

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
        try:
            if r.need_preface:
                r.buf += data
                if len(r.buf) < len(h2.PREFACE):
                    return
                if bytes(r.buf[:len(h2.PREFACE)]) != h2.PREFACE:
                    log.error("client did not start with the HTTP/2 preface; relaying its bytes unread",
                              conn=self.cid)
                    self.raw = True
                    self.up.write(bytes(r.buf))
                    r.buf.clear()
                    return
                self._send_up(h2.PREFACE)
                data = bytes(r.buf[len(h2.PREFACE):])
                r.buf.clear()
                r.need_preface = False
            self._pump(r, data, self._send_up, self._k2c_frame, self._k2c_streamable)
        finally:
            self._flush()

    def _k2c_streamable(self, ftype: int, sid: int, length: int) -> bool:
        if self.up_queue or (ftype == h2.DATA and length > self.up_window):
            return False  # waits for containerd's window: read whole, then queued
        if self.blind:
            return True
        return ftype == h2.DATA and sid not in self.streams and sid not in self.refused_sids

    def _k2c_frame(self, ftype: int, flags: int, sid: int, payload: bytes, raw: bytes) -> None:
        if ftype == h2.DATA:
            flow = len(payload)
            st = self.streams.get(sid)
            if self.blind or st is None:
                if sid in self.refused_sids and not self.blind:
                    if flow:  # never reaches containerd: give the kubelet its window back
                        self._inject_down(h2.window_update(0, flow))
                    return
                self._send_up(raw, flow)
            elif st.holding:
                self._hold(st, flags, payload)
            else:
                self._send_up(raw, flow)
                if st.copy is not None:
                    self._copy(st, flags, payload)
            return
        if ftype in (h2.WINDOW_UPDATE, h2.PING, h2.SETTINGS, h2.GOAWAY):
            self._send_up(raw, ordered=False)
            return
        self._send_up(raw)
        if self.blind:
            if ftype in (h2.HEADERS, h2.CONTINUATION):
                self.k2c.in_header_block = not flags & h2.FLAG_END_HEADERS
            return
        if ftype in (h2.HEADERS, h2.CONTINUATION):
            self._header_fragment(True, ftype, flags, sid, payload)
        elif ftype == h2.RST_STREAM:
            self.open_streams.discard(sid)
            st = self.streams.get(sid)
            if st is not None:
                if st.holding and st.held_flow:
                    self._inject_down(h2.window_update(0, st.held_flow))
                st.holding = False
                st.held = []
                self._finish(st, aborted="cancelled by the kubelet")
            self._wake_idle()

    def _hold(self, st: _Stream, flags: int, payload: bytes) -> None:
        try:
            content = h2.strip_padding(flags, payload, h2.DATA)
        except ValueError:
            content = b""
        st.held.append(content)
        st.held_flow += len(payload)
        end = bool(flags & h2.FLAG_END_STREAM)
        if st.held_flow > MAX_HELD_BYTES:
            # Too big to hold safely: release it unchanged and let it flow; a copy is still
            # decoded at its end so the call is recorded and logged (without pre-hooks).
            body = b"".join(st.held)
            st.holding = False
            st.held = []
            self._body_up(st.sid, body, end)
            self._settle_flow(st.held_flow, len(body))
            st.copy, st.copy_len = [body], len(body)
            if end:
                self._observe(st)
            return
        if not end:
            return
        body = b"".join(st.held)
        st.held = []
        try:
            outcome = self.interceptor.on_request(st.call, body)
        except Exception as e:  # a bug above must never lose the kubelet's call
            log.error("interception failed; forwarding the request unchanged", error=repr(e))
            outcome = Decision.forward(body)
        if isinstance(outcome, Decision):
            self._apply_decision(st, outcome, body)
        else:
            outcome.add_done_callback(lambda fut, st=st, body=body: self._decided(st, fut, body))

    def _copy(self, st: _Stream, flags: int, payload: bytes) -> None:
        try:
            content = h2.strip_padding(flags, payload, h2.DATA)
        except ValueError:
            content = b""
        st.copy_len += len(content)
        if st.copy is not None and st.copy_len <= self.relay.max_message_bytes:
            st.copy.append(content)
        else:
            st.copy = []  # too big even to record: keep the marker, drop the bytes
        if flags & h2.FLAG_END_STREAM:
            self._observe(st)

    def _observe(self, st: _Stream) -> None:
        body = b"".join(st.copy or []) if st.copy_len <= self.relay.max_message_bytes else b""
        st.copy = None
        try:
            self.interceptor.on_request(st.call, body, may_edit=False)
        except Exception as e:
            log.error("recording a large request failed", error=repr(e))

    def _decided(self, st: _Stream, fut: "asyncio.Future[Decision]", body: bytes) -> None:
        if self.closed or not st.holding or st.done:
            return
        try:
            decision = fut.result()
        except BaseException as e:  # the pipeline never fails a call by accident
            log.error("interception failed; forwarding the request unchanged", error=repr(e))
            decision = Decision.forward(body)
        self._apply_decision(st, decision, body)
        self._flush()

    def _apply_decision(self, st: _Stream, d: Decision, original: bytes) -> None:
        st.holding = False
        if d.status:
            # Containerd saw the HEADERS but no message: cancelling the stream makes its
            # handler return without running the call.
            self._inject_up(h2.rst_stream(st.sid, h2.CANCEL))
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
        if len(body) > self.up_stream_window and body is not original:
            log.warning("edited request exceeds containerd's stream window; forwarding the original",
                        method=getattr(st.call, "method", "?"), bytes=len(body), window=self.up_stream_window)
            body = original
        self._body_up(st.sid, body, True)
        self._settle_flow(st.held_flow, len(body))

    def _settle_flow(self, received: int, sent: int) -> None:
        """Bring the kubelet's count of containerd's window back to the real one."""
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
        try:
            self._pump(r, data, self._send_down, self._c2k_frame, self._c2k_streamable)
        finally:
            self._flush()

    def _c2k_streamable(self, ftype: int, sid: int, length: int) -> bool:
        if self.blind:
            return ftype != h2.WINDOW_UPDATE and ftype != h2.SETTINGS
        return ftype == h2.DATA and sid not in self.streams

    def _c2k_frame(self, ftype: int, flags: int, sid: int, payload: bytes, raw: bytes) -> None:
        if ftype == h2.WINDOW_UPDATE and sid == 0 and len(payload) == 4:
            inc = int.from_bytes(payload, "big") & 0x7FFFFFFF
            self.up_window += inc
            self._drain_up()
            taken = min(inc, self.conn_debt)
            self.conn_debt -= taken
            if inc - taken:
                self._send_down(raw if not taken else h2.window_update(0, inc - taken))
            return
        if ftype == h2.SETTINGS and not flags & h2.FLAG_ACK:
            for ident, value in h2.parse_settings(payload):
                if ident == h2.SETTINGS_MAX_FRAME_SIZE:
                    self.up_max_frame = value
                elif ident == h2.SETTINGS_INITIAL_WINDOW_SIZE:
                    self.up_stream_window = value
            self._send_down(raw)
            return
        if self.blind:
            self._send_down(raw)
            return
        st = self.streams.get(sid)
        if ftype == h2.DATA:
            if st is not None and st.answered:
                # We already answered this call; containerd's bytes must not reach the
                # kubelet, but containerd's window must not shrink for them either.
                if payload:
                    self._inject_up(h2.window_update(0, len(payload)))
                return
            self._send_down(raw)
            if st is not None and not st.reply_overflow:
                try:
                    content = h2.strip_padding(flags, payload, h2.DATA)
                except ValueError:
                    content = b""
                st.reply.append(content)
                st.reply_len += len(content)
                if st.reply_len > self.relay.max_message_bytes:
                    st.reply_overflow = True
                    st.reply = []
            if flags & h2.FLAG_END_STREAM:
                self._server_done(sid)
            return
        if ftype in (h2.HEADERS, h2.CONTINUATION):
            self._send_down(raw)
            self._header_fragment(False, ftype, flags, sid, payload)
            if flags & h2.FLAG_END_HEADERS and self.header_end_stream[False]:  # whole trailers read
                self._server_done(self.header_sid[False])
            return
        if ftype == h2.RST_STREAM:
            if st is not None and st.answered:
                return
            self._send_down(raw)
            self.open_streams.discard(sid)
            if st is not None:
                self._finish(st, aborted="reset by containerd")
            self._wake_idle()
            return
        self._send_down(raw)

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
            reader.in_header_block = not flags & h2.FLAG_END_HEADERS
            return
        if not flags & h2.FLAG_END_HEADERS:
            reader.in_header_block = True
            return
        reader.in_header_block = False
        sid = self.header_sid[k2c]
        try:
            headers = (self.k2c_hpack if k2c else self.c2k_hpack).decode(bytes(block), raw=True)
        except Exception as e:  # HPACK state lost: never guess, relay unread from now on
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
        if self.header_end_stream[True]:
            return  # no request body will follow: nothing to intercept
        path = ""
        for name, value in headers:
            if name == b":path":
                path = value.decode("latin-1")
                break
        try:
            call = self.interceptor.begin(path)
        except Exception as e:
            log.error("interception failed; relaying the call unread", path=path, error=repr(e))
            call = None
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
                st.status_message = unquote(value.decode("utf-8", "replace"))

    def _finish(self, st: _Stream, aborted: str = "") -> None:
        if st.done:
            return
        st.done = True
        self.streams.pop(st.sid, None)
        if aborted:
            self.interceptor.on_abort(st.call, aborted)
            return
        reply = None if st.reply_overflow else b"".join(st.reply)
        # After the reply's bytes went out: bookkeeping must not delay the kubelet. The
        # kubelet's next call needs a round trip, so it is read after this has run.
        asyncio.get_running_loop().call_soon(
            self.interceptor.on_reply, st.call, reply, st.status if st.status is not None else 0,
            st.status_message, st.answered)

    # ---------------------------------------------------------------- framing machinery
    def _pump(self, r: _Reader, data: bytes, send: Callable, on_frame: Callable, streamable: Callable) -> None:
        """Forward the frames in ``r.buf + data``: runs of pass-through bytes go out as
        slices of what was read (no copy), other frames are handed to ``on_frame`` whole,
        and an incomplete frame at the end waits in ``r.buf`` for the next read."""
        if r.buf:
            r.buf += data
            data = bytes(r.buf)
            r.buf.clear()
        view = memoryview(data)
        n = len(data)
        pos = 0
        run = -1  # start of the pending run of pass-through bytes
        k2c = r is self.k2c
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
                    ftype, flags, sid = r.tail
                    r.tail = None
                    self._after_passed_frame(r, ftype, flags, sid)
                continue
            if n - pos < h2.FRAME_HEADER_LEN:
                break
            length, ftype, flags, sid = h2.parse_frame_header(data, pos)
            if streamable(ftype, sid, length):
                # Forwarded as it comes; DATA is charged to containerd's window up front.
                if k2c and ftype == h2.DATA:
                    self.up_window -= length
                if run < 0:
                    run = pos
                end = pos + h2.FRAME_HEADER_LEN + length
                needs_after = self.blind or (not k2c and flags & h2.FLAG_END_STREAM)
                if end <= n:
                    pos = end
                    if needs_after:
                        send(view[run:pos])
                        run = -1
                        self._after_passed_frame(r, ftype, flags, sid)
                else:
                    r.passing = end - n
                    pos = n
                    if needs_after:
                        r.tail = (ftype, flags, sid)
                continue
            if run >= 0:
                send(view[run:pos])
                run = -1
            end = pos + h2.FRAME_HEADER_LEN + length
            if end > n:
                break
            raw = data[pos:end]
            on_frame(ftype, flags, sid, raw[h2.FRAME_HEADER_LEN:], raw)
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
        for data, flow in pending:
            send(data, flow)

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

    def _go_blind(self, why: str) -> None:
        """Stop reading this connection's frames and stop intercepting; keep relaying them.

        Only reached if a header block cannot be decoded, which means our HPACK state no
        longer matches the peers'. Framing and flow control are still followed.
        """
        log.error("HTTP/2 header state lost; relaying this connection without interception",
                  conn=self.cid, reason=why)
        self.blind = True
        for st in list(self.streams.values()):
            if st.holding:  # release the held request unchanged so the call is not lost
                st.holding = False
                self._body_up(st.sid, b"".join(st.held), True)
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
        self._flush()

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
