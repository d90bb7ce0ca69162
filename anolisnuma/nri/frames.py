"""NRI's two framing layers as pure codecs: bytes in, frames out, no I/O.

**Who writes this input.** The bytes come from the NRI socket (``/var/run/nri/nri.sock``),
which containerd creates and which only root can open; the peer is containerd itself
(v2.2.7 vendors NRI v0.11.0 and ttrpc v1.2.7). A bug there, or an impostor listening at
that path, must still not crash or bloat the daemon, so every length is checked against
a bound before anything is buffered, and the decoders raise nothing but
:class:`FrameError`.

**Layer 1, the multiplexer** (NRI ``pkg/net/multiplex/mux.go``). One Unix stream carries
several logical connections as frames: a 4-byte connection id and a 4-byte payload length,
both big-endian, then the payload. Connection 1 carries the plugin's services (the runtime
is the ttrpc client there, the plugin the server), connection 2 the runtime's services (the
plugin is the client). Connection 0 is reserved. Connections are opened implicitly and
without any signalling: each side just starts writing with an id it assumes the other has
opened; NRI's reader silently drops frames for ids it has not opened. Its writer cuts a
write into frames of at most ``10 + 4 MiB`` bytes (a ttrpc header plus ttrpc's largest
message) and writes an empty write as one empty frame; its reader enforces no bound at all
(it allocates whatever length the header says). Here, a frame longer than the writer's
bound or for an id other than 1 and 2 is a :class:`FrameError`: containerd never sends
one, and nobody else should be on this socket.

**Layer 2, ttrpc** (``channel.go``), a byte stream on each logical connection. A 10-byte
header (length u32, stream id u32, type u8, flags u8; big-endian) and ``length`` bytes:
type 1 request, 2 response, 3 data. A message's frames need not line up with the mux
frames: ttrpc writes through a 4 KiB ``bufio.Writer``, so the header and a large payload
can arrive in separate mux frames. A message longer than 4 MiB is not an error that ends
the connection in ttrpc: the reader discards its payload and answers that one stream with
RESOURCE_EXHAUSTED; the sender refuses to send one. :class:`TtrpcDecoder` does the same:
it skips the payload as it arrives, never holding it, and then yields an :class:`Oversized`
item so that the session can answer the stream.

**How a message must be cut into mux frames for containerd to read it.** On each logical
connection ttrpc reads through a 4 KiB ``bufio.Reader``, and NRI's ``conn.Read`` hands over
one whole mux frame per call or fails with ENOMEM when the frame is larger than the buffer
it was given, having already dequeued it: the connection is then broken. bufio passes its
own 4 KiB buffer for every read except one of at least 4 KiB into an empty buffer (the rest
of a large payload), which goes straight into the caller's slice. So a frame that starts a
message may be at most 4096 bytes, and a continuation no longer than the rest of the
message. ttrpc's own writer (a 4 KiB ``bufio.Writer``) produces exactly that: the header
and the first 4086 payload bytes in one frame, the rest in a second. :func:`message_frames`
cuts the same way; never put a message of more than 4096 bytes into one frame.

**Bounds.** A :class:`MuxDecoder` holds at most one partial frame (8 + ``max_frame``
bytes); a :class:`TtrpcDecoder` at most one partial message (10 + ``max_message`` bytes).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import List, Sequence, Tuple, Union

MUX_HEADER_SIZE = 8
TTRPC_HEADER_SIZE = 10
PLUGIN_SERVICE_CONN = 1    # the runtime calls the plugin: the plugin is the ttrpc server
RUNTIME_SERVICE_CONN = 2   # the plugin calls the runtime: the plugin is the ttrpc client
MAX_MESSAGE = 4 << 20      # ttrpc's messageLengthMax
# NRI's writer never puts more than this in one frame (maxPayloadSize in mux.go).
MAX_MUX_PAYLOAD = TTRPC_HEADER_SIZE + MAX_MESSAGE
# The size of ttrpc's bufio reader and writer on a logical connection (Go's default).
GO_BUFIO_SIZE = 4096

REQUEST = 1
RESPONSE = 2
DATA = 3

# ttrpc flags (channel.go); a unary request carries none.
FLAG_REMOTE_CLOSED = 0x1
FLAG_REMOTE_OPEN = 0x2
FLAG_NO_DATA = 0x4

_MUX = struct.Struct(">II")
_TTRPC = struct.Struct(">IIBB")
_U32 = 0xFFFFFFFF


class FrameError(Exception):
    """The byte stream breaks the framing: the connection cannot be trusted any further."""


def mux_frame(conn_id: int, payload: bytes) -> bytes:
    """``payload`` on logical connection ``conn_id``, cut into frames of at most
    :data:`MAX_MUX_PAYLOAD` bytes as NRI's writer cuts it (an empty payload is one empty
    frame)."""
    if not 0 < conn_id <= _U32:
        raise FrameError(f"connection id {conn_id} out of range")
    if len(payload) <= MAX_MUX_PAYLOAD:
        return _MUX.pack(conn_id, len(payload)) + payload
    parts = []
    view = memoryview(payload)
    for pos in range(0, len(payload), MAX_MUX_PAYLOAD):
        chunk = view[pos:pos + MAX_MUX_PAYLOAD]
        parts += [_MUX.pack(conn_id, len(chunk)), chunk]
    return b"".join(parts)


class MuxDecoder:
    """Splits the socket's byte stream into ``(conn_id, payload)`` frames.

    Raises :class:`FrameError` as soon as a header names a connection not in
    ``allowed_conns`` or a length above ``max_frame``, before its payload is read; the
    decoder is then unusable (the stream has lost its framing)."""

    __slots__ = ("allowed", "max_frame", "_buf", "_failed")

    def __init__(self, allowed_conns: Sequence[int] = (PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN),
                 max_frame: int = MAX_MUX_PAYLOAD) -> None:
        self.allowed = frozenset(allowed_conns)
        self.max_frame = max_frame
        self._buf = bytearray()
        self._failed = ""

    @property
    def buffered(self) -> int:
        """Bytes held for the frame not complete yet."""
        return len(self._buf)

    def feed(self, data: bytes) -> List[Tuple[int, bytes]]:
        """The frames that ``data`` completes, in order."""
        if self._failed:
            raise FrameError(self._failed)
        buf = self._buf
        buf += data
        out = []
        pos = 0
        end = len(buf)
        # One pass with an offset and one deletion at the end: a feed of many small frames
        # costs linear time, not a copy of the rest of the buffer per frame.
        while end - pos >= MUX_HEADER_SIZE:
            conn_id, length = _MUX.unpack_from(buf, pos)
            if conn_id not in self.allowed:
                self._fail(f"frame for unknown connection {conn_id}")
            if length > self.max_frame:
                self._fail(f"frame of {length} bytes on connection {conn_id} exceeds {self.max_frame}")
            if end - pos - MUX_HEADER_SIZE < length:
                break
            start = pos + MUX_HEADER_SIZE
            out.append((conn_id, bytes(buf[start:start + length])))
            pos = start + length
        if pos:
            del buf[:pos]
        return out

    def _fail(self, why: str) -> None:
        self._failed = why
        self._buf = bytearray()
        raise FrameError(why)


@dataclass(frozen=True)
class TtrpcMessage:
    """One ttrpc message: its header fields and its payload."""

    stream_id: int
    type: int
    flags: int
    payload: bytes


@dataclass(frozen=True)
class Oversized:
    """A message longer than the decoder's bound, skipped whole: its header, no payload.
    ttrpc answers such a stream with RESOURCE_EXHAUSTED and carries on."""

    stream_id: int
    type: int
    flags: int
    length: int


def ttrpc_frame(stream_id: int, type: int, flags: int, payload: bytes) -> bytes:
    """One ttrpc message. A payload above :data:`MAX_MESSAGE` is refused, as ttrpc's
    sender refuses it (its peer would discard it)."""
    if len(payload) > MAX_MESSAGE:
        raise FrameError(f"message of {len(payload)} bytes exceeds {MAX_MESSAGE}")
    if not 0 <= stream_id <= _U32 or not 0 <= type <= 0xFF or not 0 <= flags <= 0xFF:
        raise FrameError(f"header out of range: stream {stream_id} type {type} flags {flags}")
    return _TTRPC.pack(len(payload), stream_id, type, flags) + payload


def message_frames(conn_id: int, stream_id: int, type: int, flags: int, payload: bytes) -> bytes:
    """One ttrpc message on connection ``conn_id`` as mux frames, cut as ttrpc's writer
    cuts it (see the module docstring): one frame up to :data:`GO_BUFIO_SIZE` bytes, the
    rest of the message in a second."""
    message = ttrpc_frame(stream_id, type, flags, payload)
    if len(message) <= GO_BUFIO_SIZE:
        return mux_frame(conn_id, message)
    view = memoryview(message)
    return mux_frame(conn_id, view[:GO_BUFIO_SIZE]) + mux_frame(conn_id, view[GO_BUFIO_SIZE:])


class TtrpcDecoder:
    """Splits one logical connection's byte stream into :class:`TtrpcMessage` items, and
    :class:`Oversized` items for messages above ``max_message``, whose payload is dropped
    as it arrives (the decoder never holds more than one header's worth of it)."""

    __slots__ = ("max_message", "_buf", "_skip", "_skipped")

    def __init__(self, max_message: int = MAX_MESSAGE) -> None:
        self.max_message = max_message
        self._buf = bytearray()
        self._skip = 0          # payload bytes of an oversized message still to drop
        self._skipped: Union[Oversized, None] = None

    @property
    def buffered(self) -> int:
        """Bytes held for the message not complete yet."""
        return len(self._buf)

    def feed(self, data: bytes) -> List[Union[TtrpcMessage, Oversized]]:
        """The messages (and oversized ones) that ``data`` completes, in order."""
        out: List[Union[TtrpcMessage, Oversized]] = []
        view = memoryview(data)
        pos = 0
        end = len(view)
        buf = self._buf
        while pos < end:
            if self._skip:
                n = min(self._skip, end - pos)
                self._skip -= n
                pos += n
                if not self._skip:
                    out.append(self._skipped)
                    self._skipped = None
                continue
            if buf:
                # Complete the held message from the input, taking no more than it needs.
                need = TTRPC_HEADER_SIZE - len(buf)
                if need > 0:
                    take = min(need, end - pos)
                    buf += view[pos:pos + take]
                    pos += take
                    if len(buf) < TTRPC_HEADER_SIZE or self._oversized(buf, 0):
                        continue
                length = _TTRPC.unpack_from(buf)[0]
                take = min(TTRPC_HEADER_SIZE + length - len(buf), end - pos)
                buf += view[pos:pos + take]
                pos += take
                if len(buf) == TTRPC_HEADER_SIZE + length:
                    out.append(self._message(buf, 0, length))
                    buf.clear()
                continue
            # Nothing held: read whole messages straight from the input.
            if end - pos < TTRPC_HEADER_SIZE:
                buf += view[pos:]
                break
            if self._oversized(view, pos):
                pos += TTRPC_HEADER_SIZE
                continue
            length = _TTRPC.unpack_from(view, pos)[0]
            if end - pos - TTRPC_HEADER_SIZE < length:
                buf += view[pos:]
                break
            out.append(self._message(view, pos, length))
            pos += TTRPC_HEADER_SIZE + length
        return out

    def _oversized(self, header, pos: int) -> bool:
        """Whether the header at ``pos`` announces an oversized message; if so, start
        skipping its payload (never empty: its length is above ``max_message``)."""
        length, stream_id, mtype, flags = _TTRPC.unpack_from(header, pos)
        if length <= self.max_message:
            return False
        self._skip = length
        self._skipped = Oversized(stream_id, mtype, flags, length)
        self._buf.clear()
        return True

    @staticmethod
    def _message(src, pos: int, length: int) -> TtrpcMessage:
        _, stream_id, mtype, flags = _TTRPC.unpack_from(src, pos)
        start = pos + TTRPC_HEADER_SIZE
        return TtrpcMessage(stream_id, mtype, flags, bytes(src[start:start + length]))


__all__ = [
    "DATA", "FLAG_NO_DATA", "GO_BUFIO_SIZE", "FLAG_REMOTE_CLOSED", "FLAG_REMOTE_OPEN", "FrameError", "MAX_MESSAGE",
    "MAX_MUX_PAYLOAD", "MUX_HEADER_SIZE", "MuxDecoder", "Oversized", "PLUGIN_SERVICE_CONN", "REQUEST",
    "RESPONSE", "RUNTIME_SERVICE_CONN", "TTRPC_HEADER_SIZE", "TtrpcDecoder", "TtrpcMessage", "message_frames",
    "mux_frame", "ttrpc_frame",
]
