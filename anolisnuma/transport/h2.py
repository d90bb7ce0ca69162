"""HTTP/2 and gRPC wire facts the splice relay needs (RFC 7540, gRPC over HTTP/2).

Only framing is handled here; header blocks are coded by the ``hpack`` library.
"""

from __future__ import annotations

import struct
from typing import List, Tuple
from urllib.parse import quote

import hpack

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME_HEADER_LEN = 9
DEFAULT_MAX_FRAME_SIZE = 16384
DEFAULT_WINDOW = 65535

# frame types
DATA = 0x0
HEADERS = 0x1
PRIORITY = 0x2
RST_STREAM = 0x3
SETTINGS = 0x4
PUSH_PROMISE = 0x5
PING = 0x6
GOAWAY = 0x7
WINDOW_UPDATE = 0x8
CONTINUATION = 0x9

# flags
FLAG_END_STREAM = 0x1
FLAG_ACK = 0x1
FLAG_END_HEADERS = 0x4
FLAG_PADDED = 0x8
FLAG_PRIORITY = 0x20

# settings identifiers
SETTINGS_HEADER_TABLE_SIZE = 0x1
SETTINGS_INITIAL_WINDOW_SIZE = 0x4
SETTINGS_MAX_FRAME_SIZE = 0x5

DEFAULT_HEADER_TABLE_SIZE = 4096
MAX_WINDOW = 2**31 - 1

# error codes
NO_ERROR = 0x0
PROTOCOL_ERROR = 0x1
FLOW_CONTROL_ERROR = 0x3
FRAME_SIZE_ERROR = 0x6
REFUSED_STREAM = 0x7
CANCEL = 0x8
COMPRESSION_ERROR = 0x9
ENHANCE_YOUR_CALM = 0xB

ERROR_NAMES = {
    NO_ERROR: "NO_ERROR", PROTOCOL_ERROR: "PROTOCOL_ERROR", FLOW_CONTROL_ERROR: "FLOW_CONTROL_ERROR",
    FRAME_SIZE_ERROR: "FRAME_SIZE_ERROR", REFUSED_STREAM: "REFUSED_STREAM", CANCEL: "CANCEL",
    COMPRESSION_ERROR: "COMPRESSION_ERROR", ENHANCE_YOUR_CALM: "ENHANCE_YOUR_CALM",
}

_HEADER = struct.Struct(">BHBBL")  # 24-bit length split as 8 + 16 bits
FRAME_HEADER_STRUCT = _HEADER
_U32 = struct.Struct(">L")

def parse_frame_header(buf, offset: int = 0) -> Tuple[int, int, int, int]:
    """(payload length, type, flags, stream id) of the 9-byte header at ``offset``."""
    hi, lo, ftype, flags, sid = _HEADER.unpack_from(buf, offset)
    return (hi << 16) | lo, ftype, flags, sid & 0x7FFFFFFF


def frame(ftype: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return _HEADER.pack(n >> 16, n & 0xFFFF, ftype, flags, stream_id) + payload


def data_frames(stream_id: int, body: bytes, max_frame_size: int, end_stream: bool) -> List[bytes]:
    """``body`` as DATA frames no larger than the peer allows; END_STREAM on the last."""
    if not body:
        return [frame(DATA, FLAG_END_STREAM if end_stream else 0, stream_id)]
    frames = []
    for start in range(0, len(body), max_frame_size):
        chunk = body[start:start + max_frame_size]
        last = start + max_frame_size >= len(body)
        frames.append(frame(DATA, FLAG_END_STREAM if (last and end_stream) else 0, stream_id, chunk))
    return frames


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(increment & 0x7FFFFFFF))


def rst_stream(stream_id: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream_id, _U32.pack(code))


def goaway(last_stream_id: int, code: int = NO_ERROR, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, _U32.pack(last_stream_id) + _U32.pack(code) + debug)


def strip_padding(flags: int, payload: bytes, ftype: int) -> bytes:
    """The content of a DATA or HEADERS payload without padding and priority fields."""
    start, end = 0, len(payload)
    if flags & FLAG_PADDED:
        if not payload:
            raise ValueError("padded frame without pad length")
        end -= payload[0]
        start = 1
    if ftype == HEADERS and flags & FLAG_PRIORITY:
        start += 5
    if end < start:
        raise ValueError("padding longer than the frame")
    return payload[start:end]


def parse_settings(payload: bytes) -> List[Tuple[int, int]]:
    return [struct.unpack_from(">HL", payload, i) for i in range(0, len(payload) - len(payload) % 6, 6)]


def settings_frame(settings: List[Tuple[int, int]]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(struct.pack(">HL", ident, value) for ident, value in settings))


def trailers_only_block(status: int, message: str, response_started: bool = False) -> bytes:
    """A header block answering a call with only a status (gRPC "Trailers-Only"); or, when
    the peer's response headers already went out (``response_started``), the trailers that
    end that response (no pseudo-header may stand in trailers).

    It is coded with literal "never indexed" fields referring only to the static table, so
    it neither reads nor changes the peer's dynamic table: it can be put between header
    blocks that containerd's own encoder made without disturbing the kubelet's decoder.
    """
    encoder = hpack.Encoder()
    headers = [] if response_started else [
        hpack.NeverIndexedHeaderTuple(":status", "200"),
        hpack.NeverIndexedHeaderTuple("content-type", "application/grpc"),
    ]
    headers.append(hpack.NeverIndexedHeaderTuple("grpc-status", str(status)))
    if message:
        headers.append(hpack.NeverIndexedHeaderTuple("grpc-message", quote(message, safe=" !#$&'()*+,/:;=?@[]~")))
    return encoder.encode(headers)
