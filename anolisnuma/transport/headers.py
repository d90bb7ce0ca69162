"""Reading HPACK header blocks in bounded, linear time.

The relay must follow each peer's HPACK state (RFC 7541) to learn a new stream's
``:path`` and an intercepted reply's ``grpc-status``. It decodes with the ``hpack``
library, which has two properties a relay on the kubelet's only path cannot accept as
they are:

- its decoder copies the rest of the block for every literal field, so a block of many
  small literals costs time quadratic in its length (1 MiB of empty literals took 14 s);
- it accepts any block size it is given, and a flood of CONTINUATION frames grows the
  block without end.

:class:`HeaderBlockDecoder` caps the block (:data:`MAX_HEADER_BLOCK_BYTES`, far above the few hundred bytes of
a CRI call's headers) and the decoded header list, and feeds the library the block in pieces cut at field boundaries,
so every copy it makes is at most one piece long. A block over a cap cannot be skipped
without losing the HPACK state the next block depends on, so it ends the connection
(:class:`HeaderBlockError` carries the HTTP/2 error code to send).
"""

from __future__ import annotations

from typing import Dict, List, Tuple

import hpack

from anolisnuma.transport import h2

#: Largest header block (HEADERS + CONTINUATION payloads) the relay accepts.
MAX_HEADER_BLOCK_BYTES = 256 * 1024
#: Largest decoded header list (RFC 7541 sizes: name + value + 32 per field). At 32 bytes
#: a field this also bounds a block to 8,192 fields, a few ms of decoding.
MAX_HEADER_LIST_BYTES = 256 * 1024
# Blocks up to this size go to the library in one call; larger ones in pieces of about
# this size, so the library's copy-the-rest costs at most a piece per field.
_PIECE_BYTES = 1024
# Decoded blocks remembered by their bytes (see HeaderBlockDecoder.decode); the cache is
# emptied when full, so a peer sending ever-new blocks costs one dict of this size.
CACHE_ENTRIES = 512

Headers = List[Tuple[bytes, bytes]]


class HeaderList(list):
    """A decoded block's (name, value) pairs, with its ``:path`` as text ("" if none).

    The path is found when the block is decoded, not per call: a repeated call's block
    comes from the cache, and the relay then learns its method without reading a field.
    """

    __slots__ = ("path",)

    def __init__(self, fields: Headers) -> None:
        super().__init__(fields)
        self.path = ""
        for name, value in fields:
            if name == b":path":
                self.path = value.decode("latin-1")
                break


class HeaderBlockError(Exception):
    """The block cannot be followed; the connection must end with ``code``."""

    def __init__(self, code: int, why: str) -> None:
        super().__init__(why)
        self.code = code


class HeaderBlockDecoder:
    """One direction's HPACK decoder state, with the caps above."""

    def __init__(self) -> None:
        self._decoder = hpack.Decoder()
        self._decoder.max_header_list_size = MAX_HEADER_LIST_BYTES
        self.allow_table_size(h2.DEFAULT_HEADER_TABLE_SIZE)
        self._cache: Dict[bytes, Headers] = {}
        self._cache_table_size = self._decoder.header_table.maxsize   # what the cache was made under

    def allow_table_size(self, size: int) -> None:
        """The receiving peer advertised ``size`` (SETTINGS_HEADER_TABLE_SIZE): the encoder
        may grow its table up to it. Never shrunk below the default, which the encoder may
        use until it has seen the setting."""
        self._decoder.max_allowed_table_size = max(size, h2.DEFAULT_HEADER_TABLE_SIZE)

    @property
    def stateless(self) -> bool:
        """No entry in the dynamic table: every block so far stood alone."""
        return not self._decoder.header_table.dynamic_entries

    def decode(self, block: bytes) -> HeaderList:
        """The block's header fields as raw (name, value) pairs (shared: do not change them).

        Both peers are asked to code without a dynamic table (SETTINGS_HEADER_TABLE_SIZE =
        0), so their blocks soon stand alone: a block decoded while the table is empty, that
        left it empty and holds no table size update, decodes the same every time the table
        is empty and of the same size, and is remembered by its bytes for as long as it is.
        (Not beyond: a field "with incremental indexing" is evicted at once from a table of
        size 0 but stays in a larger one.) A repeated call's headers are then one look-up.

        Raises HeaderBlockError when the block is over a cap or cannot be decoded.
        """
        if len(block) > MAX_HEADER_BLOCK_BYTES:
            raise HeaderBlockError(h2.ENHANCE_YOUR_CALM,
                                   f"header block of {len(block)} bytes (limit {MAX_HEADER_BLOCK_BYTES})")
        table = self._decoder.header_table
        cacheable = bool(block) and block[0] & 0xE0 != 0x20 and not table.dynamic_entries
        if cacheable:
            if table.maxsize != self._cache_table_size:
                self._cache.clear()
                self._cache_table_size = table.maxsize
            known = self._cache.get(block)
            if known is not None:
                return known
        headers = HeaderList(self._decode(block))
        if cacheable and not table.dynamic_entries and table.maxsize == self._cache_table_size:
            if len(self._cache) >= CACHE_ENTRIES:
                self._cache.clear()
            self._cache[block] = headers
        return headers

    def _decode(self, block: bytes) -> Headers:
        try:
            if len(block) <= _PIECE_BYTES:
                return self._decoder.decode(block, raw=True)
            headers: Headers = []
            listed = 0
            for piece in _pieces(block):
                decoded = self._decoder.decode(piece, raw=True)
                for name, value in decoded:
                    listed += len(name) + len(value) + 32
                if listed > MAX_HEADER_LIST_BYTES:
                    raise HeaderBlockError(h2.ENHANCE_YOUR_CALM,
                                           f"header list over {MAX_HEADER_LIST_BYTES} bytes")
                headers.extend(decoded)
            return headers
        except hpack.OversizedHeaderListError:
            raise HeaderBlockError(h2.ENHANCE_YOUR_CALM,
                                   f"header list over {MAX_HEADER_LIST_BYTES} bytes") from None
        except (hpack.HPACKError, IndexError, ValueError) as e:
            raise HeaderBlockError(h2.COMPRESSION_ERROR, f"undecodable header block: {e!r}") from None


def _pieces(block: bytes):
    """Cut ``block`` at field boundaries into pieces of about _PIECE_BYTES (a single field
    may be longer). A table size update is only allowed before the first field."""
    start = pos = 0
    n = len(block)
    seen_field = False
    while pos < n:
        first = block[pos]
        if first & 0xE0 == 0x20:  # dynamic table size update
            if seen_field:
                raise HeaderBlockError(h2.COMPRESSION_ERROR, "table size update after a header field")
            pos = _int_end(block, pos, 5)
        else:
            seen_field = True
            pos = _field_end(block, pos, first)
        if pos > n:
            raise HeaderBlockError(h2.COMPRESSION_ERROR, "truncated header block")
        if pos - start >= _PIECE_BYTES:
            yield block[start:pos]
            start = pos
    if start < n:
        yield block[start:n]


def _field_end(block: bytes, pos: int, first: int) -> int:
    if first & 0x80:               # indexed field
        return _int_end(block, pos, 7)
    prefix = 6 if first & 0x40 else 4   # literal with / without (or never) indexing
    name_indexed = first & ((1 << prefix) - 1)
    pos = _int_end(block, pos, prefix)
    if not name_indexed:
        pos = _string_end(block, pos)
    return _string_end(block, pos)


def _string_end(block: bytes, pos: int) -> int:
    if pos >= len(block):
        raise HeaderBlockError(h2.COMPRESSION_ERROR, "truncated header block")
    value, after = _int_value(block, pos, 7)
    return after + value


def _int_end(block: bytes, pos: int, prefix: int) -> int:
    return _int_value(block, pos, prefix)[1]


def _int_value(block: bytes, pos: int, prefix: int) -> Tuple[int, int]:
    """An HPACK integer at ``pos``: (value, position after it)."""
    limit = (1 << prefix) - 1
    value = block[pos] & limit
    pos += 1
    if value < limit:
        return value, pos
    shift = 0
    n = len(block)
    while True:
        if pos >= n or shift > 28:
            raise HeaderBlockError(h2.COMPRESSION_ERROR, "malformed integer in header block")
        byte = block[pos]
        pos += 1
        value += (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos
