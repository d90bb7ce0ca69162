"""Frame by frame: how the splice reads one direction of a connection and forwards it.

Why a pump of runs and not a frame parser: nearly every byte the splice reads goes on
unchanged, so what is forwarded as it was read goes out as slices of the read (one send per
run of frames, no copy); only the frames the splice must act on (intercepted calls, window
updates it accounts for, SETTINGS) are cut out and handed to the direction's handlers
(:mod:`.kubelet_frames`, :mod:`.containerd_frames`). This loop runs for every read of every
connection: it reads the splice's state directly (no accessor, no per-frame indirection),
which is why it is a method of the splice, kept whole in one place.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional

from anolisnuma.transport import h2

# How _pump treats a frame (what a direction's ``classify`` answers):
WHOLE = 0    # read whole, then handed to the direction's frame handler
STREAM = 1   # pass-through DATA: forwarded as its bytes arrive
FOLD = 2     # forwarded unchanged in the run of bytes around it, once its ``fold`` handler
             # (which may decline) has done its bookkeeping; no frame of ours goes out meanwhile
PASS = 3     # as FOLD for a frame with no bookkeeping to do (PING, SETTINGS ACK, ...)
_HEADER = h2.FRAME_HEADER_STRUCT
_HLEN = h2.FRAME_HEADER_LEN


class ConnectionFault(Exception):
    """The connection can no longer be followed and must end with ``code``."""

    def __init__(self, code: int, why: str) -> None:
        super().__init__(why)
        self.code = code


class FrameReader:
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



class FramePump:
    """The frame loop of :class:`~anolisnuma.transport.splice.Splice` (a part of it: the
    state it reads is the splice's, see ``Splice.__init__``)."""

    def _pump(self, data: Any, r: FrameReader, send: Callable, on_frame: Callable, classify: Callable,
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
    def _flush_pending(r: FrameReader, send: Callable) -> None:
        pending, r.pending = r.pending, []
        for item in pending:
            send(*item)


def data_content(flags: int, payload: bytes) -> bytes:
    """A DATA payload without its padding; bad padding is a connection error."""
    try:
        return h2.strip_padding(flags, payload, h2.DATA)
    except ValueError as e:
        raise ConnectionFault(h2.PROTOCOL_ERROR, f"malformed DATA frame: {e}") from None
