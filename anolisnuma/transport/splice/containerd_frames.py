"""containerd's side: what the splice does with each frame containerd sends.

Replies of calls relayed unread go to the kubelet as they come; of an intercepted call the
reply is copied for the post-hooks (within the budget) and its status read from the
trailers. Frames of a call the relay answered itself are dropped (the kubelet's stream is
over), and containerd's SETTINGS and window updates are followed, since the relay sends
bodies of its own within them.
"""

from __future__ import annotations

from typing import Optional
from urllib.parse import unquote

from anolisnuma.transport import h2
from anolisnuma.transport.splice.framing import FOLD, PASS, STREAM, WHOLE, ConnectionFault, data_content
from anolisnuma.transport.splice.header_blocks import check_header_block, header_fragment, without_header_table


class ContainerdFrames:
    """containerd → kubelet for :class:`~anolisnuma.transport.splice.Splice` (a part of it:
    the state is the splice's, see ``Splice.__init__``)."""

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
            check_header_block(r, ftype, sid)
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
        if header_fragment(r, self.c2k_hpack, ftype, flags, sid, payload) is not None \
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
            self._send_down(without_header_table(settings))
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
                content = data_content(flags, payload)
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
            headers = header_fragment(self.c2k, self.c2k_hpack, ftype, flags, sid, payload)
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
            self._call_ended()
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
            self._end_silenced_block(header_fragment(self.c2k, self.c2k_hpack, ftype, flags, sid, payload))
            return True
        elif ftype == h2.CONTINUATION:
            self.c2k.silenced_block.append(raw)
            self._end_silenced_block(header_fragment(self.c2k, self.c2k_hpack, ftype, flags, sid, payload))
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
        self._call_ended()

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
