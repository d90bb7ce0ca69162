"""A reply's ``Content-Encoding`` undone below the size bounds, so that they count what the
daemon will hold, not what crossed the wire.

The daemon asks for ``Accept-Encoding: identity`` (``bounded_transport.py``): the API
server then sends JSON as it is (it gzips a reply past 128 KiB only when asked, and a list
of Oenumas compresses about 100 to 1: 67 MiB of JSON came as 1.2 MiB of gzip). A server
(or a proxy in front of it) that compresses all the same is decoded here, in pieces of at
most :data:`PIECE` bytes however much one chunk of the wire inflates to, and each piece is
counted by the bounds above this layer. ``gzip`` (and ``x-gzip``) and ``deflate``, one
layer of them, are what HTTP servers send; any other encoding, or several, was not asked
for and is refused (:class:`ReplyEncoding`) rather than decoded with a library the daemon
does not bound.
"""

from __future__ import annotations

import zlib
from typing import Any, Iterator, Tuple

from lightkube.core.generic_client import httpx  # (httpx or httpx2, as lightkube imports it)

PIECE = 64 * 1024   # the most one step of decoding makes, however small its input
_WBITS = {"gzip": zlib.MAX_WBITS | 16, "x-gzip": zlib.MAX_WBITS | 16, "deflate": zlib.MAX_WBITS}


class ReplyEncoding(httpx.TransportError):
    """A reply in an encoding the daemon did not ask for and does not decode, or whose
    compressed data is corrupt."""


def decoded(headers: Any, stream: Any) -> Tuple[Any, Any]:
    """A reply's headers and byte stream as they are once decoded: the same when it is not
    encoded; otherwise a :class:`Decoded` stream, and the headers without
    ``Content-Encoding`` (httpx decodes nothing again) and ``Content-Length`` (the
    wire's). Raises :class:`ReplyEncoding` for an encoding not decoded here, or several."""
    values = headers.get_list("content-encoding", split_commas=True)
    codings = [v.strip().lower() for v in values if v.strip() and v.strip().lower() != "identity"]
    if not codings:
        return headers, stream
    if len(codings) > 1:
        raise ReplyEncoding(f"a reply in Content-Encoding {', '.join(codings)[:80]!r}, which the daemon does not "
                            "ask for")
    body = Decoded(stream, codings[0])
    out = httpx.Headers(headers)
    for name in ("content-encoding", "content-length"):
        if name in out:
            del out[name]
    return out, body


class Decoded(httpx.SyncByteStream):
    """``Decoded(inner, coding)``: the bytes of ``inner`` (a byte stream in ``coding``,
    one of gzip, x-gzip, deflate) decoded, in pieces of at most :data:`PIECE` bytes.
    Raises :class:`ReplyEncoding` for any other coding (at once) or corrupt data (when
    met)."""

    def __init__(self, inner: Any, coding: str) -> None:
        if coding not in _WBITS:
            raise ReplyEncoding(f"a reply in Content-Encoding {coding[:40]!r}, which the daemon does not ask for")
        self._inner = inner
        self._coding = coding

    def __iter__(self) -> Iterator[bytes]:
        z = zlib.decompressobj(_WBITS[self._coding])
        first = True
        try:
            for chunk in self._inner:
                try:
                    yield from _pieces(z, chunk)
                except zlib.error:
                    if not (first and self._coding == "deflate"):
                        raise
                    z = zlib.decompressobj(-zlib.MAX_WBITS)   # (some send deflate without its zlib header)
                    yield from _pieces(z, chunk)
                first = first and not chunk
            tail = z.flush()   # (every input was decoded in bounded pieces: little is left)
        except zlib.error as e:
            raise ReplyEncoding(f"a {self._coding} reply that does not decode: {e}") from e
        if not z.eof and not first:   # (zlib takes a stream cut short without a word; an empty body is none)
            raise ReplyEncoding(f"a {self._coding} reply that does not decode: it ends before its compressed data")
        if tail:
            yield tail

    def close(self) -> None:
        self._inner.close()


def _pieces(z: Any, data: bytes) -> Iterator[bytes]:
    out = z.decompress(data, PIECE)
    while out:
        yield out
        out = z.decompress(z.unconsumed_tail, PIECE)
