"""gRPC message framing and status codes (gRPC over HTTP/2, "Length-Prefixed-Message")."""

from __future__ import annotations

import struct
from typing import List, Optional, Tuple

_PREFIX = struct.Struct(">BL")

STATUS_CODES = {
    "OK": 0, "CANCELLED": 1, "UNKNOWN": 2, "INVALID_ARGUMENT": 3, "DEADLINE_EXCEEDED": 4,
    "NOT_FOUND": 5, "ALREADY_EXISTS": 6, "PERMISSION_DENIED": 7, "RESOURCE_EXHAUSTED": 8,
    "FAILED_PRECONDITION": 9, "ABORTED": 10, "OUT_OF_RANGE": 11, "UNIMPLEMENTED": 12,
    "INTERNAL": 13, "UNAVAILABLE": 14, "DATA_LOSS": 15, "UNAUTHENTICATED": 16,
}
STATUS_NAMES = {v: k for k, v in STATUS_CODES.items()}


def split_messages(body: bytes) -> Optional[List[Tuple[bool, bytes]]]:
    """Split a gRPC body into (compressed, message) pairs; None when it is malformed."""
    out = []
    pos = 0
    while pos < len(body):
        if len(body) - pos < 5:
            return None
        compressed, length = _PREFIX.unpack_from(body, pos)
        pos += 5
        if len(body) - pos < length:
            return None
        out.append((bool(compressed), body[pos:pos + length]))
        pos += length
    return out


def frame_message(message: bytes) -> bytes:
    """One uncompressed length-prefixed message."""
    return _PREFIX.pack(0, len(message)) + message
