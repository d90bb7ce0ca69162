"""Header blocks: HEADERS and CONTINUATION frames gathered into blocks and decoded.

Why every block is decoded, even of calls relayed unread: HPACK state is per connection and
per direction, so a block skipped would leave the decoder unable to read the next one; and
the method each new stream calls is learnt from its request headers. The splice asks both
peers for header blocks without a dynamic table (:func:`without_header_table`), so that
each block stands alone: a repeated call's headers are a look-up, and a block the kubelet
must not see (of a call the relay answered itself) can be dropped.
"""

from __future__ import annotations

from typing import Optional

from anolisnuma.transport import h2
from anolisnuma.transport.headers import MAX_HEADER_BLOCK_BYTES, HeaderBlockDecoder, HeaderBlockError, HeaderList
from anolisnuma.transport.splice.framing import ConnectionFault, FrameReader

_PADDED_OR_PRIORITY = h2.FLAG_PADDED | h2.FLAG_PRIORITY


def header_fragment(r: FrameReader, decoder: HeaderBlockDecoder, ftype: int, flags: int, sid: int,
                    payload: bytes) -> Optional[HeaderList]:
    """Add a HEADERS or CONTINUATION payload to the block; the decoded headers once the
    block is complete, else None."""
    try:
        if ftype == h2.HEADERS and flags & h2.FLAG_END_HEADERS:  # the usual: a block in one frame
            r.header_sid = sid
            r.header_end_stream = bool(flags & h2.FLAG_END_STREAM)
            block = bytes(h2.strip_padding(flags, payload, h2.HEADERS) if flags & _PADDED_OR_PRIORITY
                          else payload)
            r.in_header_block = False
            try:
                return decoder.decode(block)
            except HeaderBlockError as e:
                raise ConnectionFault(e.code, str(e)) from None
        if ftype == h2.HEADERS:
            r.block.clear()
            r.header_sid = sid
            r.header_end_stream = bool(flags & h2.FLAG_END_STREAM)
            r.block += h2.strip_padding(flags, payload, h2.HEADERS)
        else:
            r.block += payload
    except ValueError as e:
        raise ConnectionFault(h2.PROTOCOL_ERROR, f"malformed HEADERS frame: {e}") from None
    if not flags & h2.FLAG_END_HEADERS:
        r.in_header_block = True
        if len(r.block) > MAX_HEADER_BLOCK_BYTES:
            raise ConnectionFault(h2.ENHANCE_YOUR_CALM,
                                  f"header block over {MAX_HEADER_BLOCK_BYTES} bytes")
        return None
    r.in_header_block = False
    block = bytes(r.block)
    r.block.clear()
    try:
        return decoder.decode(block)
    except HeaderBlockError as e:
        raise ConnectionFault(e.code, str(e)) from None


def check_header_block(r: FrameReader, ftype: int, sid: int) -> None:
    """Raise ConnectionFault for a frame a header block's rules forbid here: anything but
    its own CONTINUATION inside a block, a CONTINUATION outside one, or a PUSH_PROMISE."""
    if r.in_header_block:
        if ftype != h2.CONTINUATION or sid != r.header_sid:
            raise ConnectionFault(h2.PROTOCOL_ERROR, "a frame inside a header block")
    elif ftype == h2.CONTINUATION:
        raise ConnectionFault(h2.PROTOCOL_ERROR, "CONTINUATION without HEADERS")
    elif ftype == h2.PUSH_PROMISE:
        raise ConnectionFault(h2.PROTOCOL_ERROR, "PUSH_PROMISE on a gRPC connection")


def without_header_table(settings: list) -> bytes:
    """A SETTINGS frame with the peer's settings, asking for no dynamic HPACK table."""
    return h2.settings_frame([(i, v) for i, v in settings if i != h2.SETTINGS_HEADER_TABLE_SIZE]
                             + [(h2.SETTINGS_HEADER_TABLE_SIZE, 0)])
