"""The node's files as text: decoded so that every byte survives the round trip
(``surrogateescape``: an edit never re-encodes what it did not touch), split into lines
that keep their offsets, hashed as the backup manifest compares them, and a quoted value
unquoted.
"""

from __future__ import annotations

import hashlib
from typing import Iterator, Optional, Tuple


def as_text(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


def as_bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def sha256_hex(data: Optional[bytes]) -> Optional[str]:
    return None if data is None else hashlib.sha256(data).hexdigest()


def text_lines(text: str) -> Iterator[Tuple[int, str, int]]:
    """(start, line without its newline, end after the newline) for every line."""
    pos = 0
    n = len(text)
    while pos < n:
        nl = text.find("\n", pos)
        end = n if nl < 0 else nl + 1
        yield pos, text[pos:end].rstrip("\n"), end
        pos = end


def unquote(v: str) -> str:
    return v[1:-1] if len(v) >= 2 and v[0] == v[-1] and v[0] in "\"'" else v
