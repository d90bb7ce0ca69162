"""Header blocks: decoded as the hpack library would, in pieces, within the caps."""

from __future__ import annotations

import hpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from anolisnuma.transport import h2
from anolisnuma.transport.headers import (MAX_HEADER_BLOCK_BYTES, MAX_HEADER_LIST_BYTES, HeaderBlockDecoder,
                                          HeaderBlockError)

names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=20)
values = st.text(min_size=0, max_size=3000)
header_lists = st.lists(st.tuples(names, values), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(blocks=st.lists(header_lists, min_size=1, max_size=6), huffman=st.booleans())
def test_blocks_decode_as_the_encoder_wrote_them_across_the_dynamic_table(blocks, huffman):
    encoder, decoder = hpack.Encoder(), HeaderBlockDecoder()
    for headers in blocks:
        block = encoder.encode(headers, huffman=huffman)
        got = decoder.decode(block)
        assert [(n.decode(), v.decode()) for n, v in got] == headers


def test_a_table_size_update_is_allowed_first_only():
    encoder = hpack.Encoder()
    fields = encoder.encode([("x-" + str(i), "v" * 40) for i in range(40)])  # > one piece
    update = b"\x3f\xe1\x1f"  # dynamic table size update to 4096
    assert HeaderBlockDecoder().decode(update + fields)
    with pytest.raises(HeaderBlockError) as e:
        HeaderBlockDecoder().decode(fields + update)
    assert e.value.code == h2.COMPRESSION_ERROR


@pytest.mark.parametrize("block", [
    b"\x00\x01x\x84\xff\xff\xff\xff",       # Huffman string holding EOS
    b"\x00\x05abc",                         # name longer than the block
    b"\xff\xff\xff\xff\xff\xff\xff\xff",    # integer that never ends
    b"\xbe",                                # dynamic index that does not exist
    b"\x00\x00\x00" * 400 + b"\x00\x7f\x90\x80\x80\x80\x10",  # long block, absurd length
])
def test_undecodable_blocks_are_compression_errors(block):
    with pytest.raises(HeaderBlockError) as e:
        HeaderBlockDecoder().decode(block)
    assert e.value.code == h2.COMPRESSION_ERROR


def test_blocks_over_the_caps_are_refused():
    with pytest.raises(HeaderBlockError) as e:
        HeaderBlockDecoder().decode(b"\x00\x00\x00" * (MAX_HEADER_BLOCK_BYTES // 3 + 1))
    assert e.value.code == h2.ENHANCE_YOUR_CALM
    fields = MAX_HEADER_LIST_BYTES // 32 + 1   # empty literals: 32 bytes each in the list
    with pytest.raises(HeaderBlockError) as e:
        HeaderBlockDecoder().decode(b"\x00\x00\x00" * fields)
    assert e.value.code == h2.ENHANCE_YOUR_CALM
    assert len(HeaderBlockDecoder().decode(b"\x00\x00\x00" * (fields - 1))) == fields - 1


def test_the_table_may_grow_only_to_what_the_peer_allowed():
    grow = b"\x3f\xe1\x3f"  # size update to 8192
    with pytest.raises(HeaderBlockError):
        HeaderBlockDecoder().decode(grow)
    d = HeaderBlockDecoder()
    d.allow_table_size(8192)
    assert d.decode(grow) == []


def test_blocks_that_stand_alone_are_decoded_once():
    encoder = hpack.Encoder()
    encoder.header_table_size = 0  # what the relay asks both peers for
    decoder = HeaderBlockDecoder()
    first = encoder.encode([(":path", "/runtime.v1.RuntimeService/Version"), ("te", "trailers")])
    assert first[0] & 0xE0 == 0x20  # the size update is not cached...
    assert decoder.decode(first) == [(b":path", b"/runtime.v1.RuntimeService/Version"), (b"te", b"trailers")]
    again = encoder.encode([(":path", "/runtime.v1.RuntimeService/Version"), ("te", "trailers")])
    assert again[0] & 0xE0 != 0x20
    assert decoder.decode(again) is decoder.decode(bytes(again))  # ...the blocks after it are


def test_blocks_that_use_the_dynamic_table_are_never_taken_from_the_cache():
    encoder, decoder = hpack.Encoder(), HeaderBlockDecoder()  # a peer that kept its table
    for value in ("a", "b", "a"):
        block = encoder.encode([("x-key", value)])
        assert decoder.decode(block) == [(b"x-key", value.encode())]
    assert not decoder.stateless


def test_a_cached_block_is_not_reused_after_the_table_size_changed():
    """A block with a literal "with incremental indexing" adds nothing while the table
    size is 0, but adds its field once the encoder grew the table again: reused from
    the cache then, the decoder would miss the entry the encoder has (and every later
    reference to it)."""
    encoder, decoder = hpack.Encoder(), HeaderBlockDecoder()
    encoder.header_table_size = 0
    assert decoder.decode(encoder.encode([("x-key", "a")])) == [(b"x-key", b"a")]   # carries the update
    indexed = encoder.encode([("x-key", "b")])   # indexed, then evicted at once: stands alone
    assert decoder.decode(indexed) == [(b"x-key", b"b")] and decoder.stateless
    encoder.header_table_size = 4096
    assert decoder.decode(encoder.encode([(":method", "POST")])) == [(b":method", b"POST")]
    assert decoder.stateless   # the table may grow again, and is empty
    assert encoder.encode([("x-key", "b")]) == indexed   # the same bytes: now they add an entry
    assert decoder.decode(indexed) == [(b"x-key", b"b")]
    assert not decoder.stateless
    reference = encoder.encode([("x-key", "b")])   # the encoder now points at its entry
    assert len(reference) == 1
    assert decoder.decode(reference) == [(b"x-key", b"b")]
