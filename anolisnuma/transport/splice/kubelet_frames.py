"""The kubelet's side: what the splice does with each frame the kubelet sends.

Most frames go to containerd as they came; the splice follows the kubelet's flow-control
window, learns each new stream's method from its request headers, hands an intercepted
call's request to :mod:`.intercepted` (held until the pipeline decided, or copied as it
streams through), rewrites the kubelet's SETTINGS (no dynamic header table, see
:mod:`.header_blocks`) and drops what it sends on streams the relay refused.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from anolisnuma.transport import h2
from anolisnuma.transport.headers import HeaderList
from anolisnuma.transport.splice.framing import FOLD, PASS, STREAM, WHOLE, ConnectionFault, data_content
from anolisnuma.transport.splice.goodbye import DRAIN_PING
from anolisnuma.transport.splice.header_blocks import check_header_block, header_fragment, without_header_table
from anolisnuma.transport.splice.intercepted import STREAM_OVERHEAD_BYTES, InterceptedStream, remember

log = structlog.get_logger("anolisnuma.transport")


class KubeletFrames:
    """Kubelet → containerd for :class:`~anolisnuma.transport.splice.Splice` (a part of it:
    the state is the splice's, see ``Splice.__init__``)."""

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
            check_header_block(r, ftype, sid)
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
        headers = header_fragment(r, self.k2c_hpack, ftype, flags, sid, payload)
        if headers is not None:
            self._request_headers(r.header_sid, headers, r.header_end_stream)
        return True

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
                raw = without_header_table(settings)
            self._send_up(raw, ordered=False)
            return
        if ftype == h2.RST_STREAM and sid in self.refused:
            del self.refused[sid]  # containerd had its RST_STREAM from us when we refused
            return
        self._send_up(raw)
        if ftype in (h2.HEADERS, h2.CONTINUATION):
            headers = header_fragment(self.k2c, self.k2c_hpack, ftype, flags, sid, payload)
            if headers is not None:
                self._request_headers(self.k2c.header_sid, headers, self.k2c.header_end_stream)
        elif ftype == h2.RST_STREAM:
            self.open_streams.pop(sid, None)
            st = self.streams.get(sid)
            if st is not None:
                self._finish(st, aborted="cancelled by the kubelet")
            self._call_ended()

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
        content = data_content(flags, payload)
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

    def _observe(self, call: Any, body: bytes) -> None:
        try:
            self.interceptor.on_forwarded(call, body)
        except Exception as e:  # bookkeeping must never take the relay down
            log.error("recording a forwarded request failed", conn=self.cid, error=repr(e))

    def _request_headers(self, sid: int, headers: HeaderList, end_stream: bool) -> None:
        if sid <= self.max_sid:
            return  # trailers of a client stream
        self.max_sid = sid
        if self.goaway_sid is not None and sid > self.goaway_sid:
            # Opened after we announced shutdown: containerd must not run it.
            if not end_stream:
                remember(self.refused, sid)
            self._inject_up(h2.rst_stream(sid, h2.CANCEL))
            self._inject_down(h2.rst_stream(sid, h2.REFUSED_STREAM))
            return
        path = headers.path
        if not self.open_streams:
            self.owner.connection_busy(self)
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
        st = InterceptedStream(sid, call, holding=call.holds_request, up_window=self.up_stream_window)
        self.streams[sid] = st
        if not self.budget.try_take(STREAM_OVERHEAD_BYTES):
            self._refuse(st, self._budget_message(STREAM_OVERHEAD_BYTES))
            return
        st.charged = STREAM_OVERHEAD_BYTES
