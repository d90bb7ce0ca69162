"""The NRI mux and ttrpc codecs on raw bytes: headers as the Go sources lay them out, every
split of the input, bounds on what is buffered, and garbage that may only ever raise
FrameError."""

from __future__ import annotations

import random
import struct

import pytest

from anolisnuma.nri import frames as fr
from anolisnuma.nri.frames import FrameError, MuxDecoder, Oversized, TtrpcDecoder, TtrpcMessage
from anolisnuma.testing.nri_runtime import GoReader


def feed_bytewise(decoder, data: bytes) -> list:
    out = []
    for i in range(len(data)):
        out += decoder.feed(data[i:i + 1])
    return out


# ---- the layouts, byte for byte ------------------------------------------------------------

def test_constants_are_the_go_sources():
    # nri pkg/net/multiplex/{mux.go,ttrpc.go} and ttrpc channel.go at v0.11.0 / v1.2.7
    assert (fr.MUX_HEADER_SIZE, fr.TTRPC_HEADER_SIZE, fr.MAX_MESSAGE) == (8, 10, 4 * 1024 * 1024)
    assert (fr.PLUGIN_SERVICE_CONN, fr.RUNTIME_SERVICE_CONN) == (1, 2)
    assert (fr.REQUEST, fr.RESPONSE, fr.DATA) == (1, 2, 3)
    assert fr.MAX_MUX_PAYLOAD == 10 + (4 << 20)


def test_mux_header_is_conn_id_then_length_big_endian():
    assert fr.mux_frame(2, b"abc") == b"\x00\x00\x00\x02\x00\x00\x00\x03abc"
    assert fr.mux_frame(1, b"") == b"\x00\x00\x00\x01\x00\x00\x00\x00"


def test_ttrpc_header_is_length_stream_type_flags_big_endian():
    assert fr.ttrpc_frame(0x01020305, fr.RESPONSE, 0x04, b"xy") == \
        b"\x00\x00\x00\x02\x01\x02\x03\x05\x02\x04xy"


def test_mux_frame_cuts_at_nri_writer_bound():
    payload = bytes(range(256)) * ((2 * fr.MAX_MUX_PAYLOAD + 5) // 256 + 1)
    payload = payload[:2 * fr.MAX_MUX_PAYLOAD + 5]
    wire = fr.mux_frame(1, payload)
    d = MuxDecoder()
    got = d.feed(wire)
    assert [len(p) for _, p in got] == [fr.MAX_MUX_PAYLOAD, fr.MAX_MUX_PAYLOAD, 5]
    assert b"".join(p for _, p in got) == payload


def test_mux_frame_refuses_reserved_and_out_of_range_ids():
    for bad in (0, -1, 1 << 32):
        with pytest.raises(FrameError):
            fr.mux_frame(bad, b"")


def test_ttrpc_frame_refuses_a_message_above_4_mib():
    fr.ttrpc_frame(1, fr.REQUEST, 0, bytes(fr.MAX_MESSAGE))
    with pytest.raises(FrameError):
        fr.ttrpc_frame(1, fr.REQUEST, 0, bytes(fr.MAX_MESSAGE + 1))


def test_message_frames_cut_as_ttrpcs_bufio_writer():
    small = fr.message_frames(1, 1, fr.REQUEST, 0, bytes(4086))
    assert len(small) == 8 + 4096                      # header + 4086: one frame
    got = MuxDecoder().feed(fr.message_frames(1, 1, fr.REQUEST, 0, bytes(4087)))
    assert [len(p) for _, p in got] == [4096, 1]
    got = MuxDecoder().feed(fr.message_frames(2, 3, fr.RESPONSE, 0, bytes(100_000)))
    assert [len(p) for _, p in got] == [4096, 100_010 - 4096]


# ---- the Go reader model (the fake runtime reads with it) ------------------------------------

def test_go_reader_takes_what_ttrpc_writes_and_refuses_one_big_frame():
    for size in (0, 1, 4086, 4087, 8182, 8183, 100_000):
        g = GoReader()
        for _, p in MuxDecoder().feed(fr.message_frames(1, 1, fr.REQUEST, 0, bytes(size)) * 2):
            assert g.take(p) is None, size
    g = GoReader()
    assert g.take(fr.ttrpc_frame(1, fr.REQUEST, 0, bytes(5000)))   # one 5010-byte frame: ENOMEM


# ---- MuxDecoder ---------------------------------------------------------------------------

FRAMES = [(1, b"hello"), (2, b""), (2, bytes(range(200))), (1, b"\x00" * 3)]
WIRE = b"".join(fr.mux_frame(c, p) for c, p in FRAMES)


def test_mux_round_trip_in_one_feed():
    d = MuxDecoder()
    assert d.feed(WIRE) == FRAMES
    assert d.buffered == 0


def test_mux_split_at_every_byte_boundary():
    for cut in range(len(WIRE) + 1):
        d = MuxDecoder()
        assert d.feed(WIRE[:cut]) + d.feed(WIRE[cut:]) == FRAMES, cut
        assert d.buffered == 0


def test_mux_byte_at_a_time():
    d = MuxDecoder()
    assert feed_bytewise(d, WIRE) == FRAMES


def test_mux_truncated_header_and_payload_stay_pending():
    d = MuxDecoder()
    assert d.feed(WIRE[:5]) == [] and d.buffered == 5
    frame = fr.mux_frame(1, b"hello")
    d = MuxDecoder()
    assert d.feed(frame[:-1]) == [] and d.buffered == len(frame) - 1
    assert d.feed(frame[-1:]) == [(1, b"hello")] and d.buffered == 0


@pytest.mark.parametrize("conn_id", [0, 3, 0xFFFFFFFF])
def test_mux_unknown_connection_is_an_error_at_its_header(conn_id):
    d = MuxDecoder()
    assert d.feed(fr.mux_frame(1, b"ok")) == [(1, b"ok")]
    with pytest.raises(FrameError, match="unknown connection"):
        d.feed(struct.pack(">II", conn_id, 1))      # no payload needed to refuse it
    with pytest.raises(FrameError):                  # and the decoder stays broken
        d.feed(fr.mux_frame(1, b"ok"))
    assert d.buffered == 0


def test_mux_oversized_frame_is_an_error_before_its_payload():
    d = MuxDecoder()
    with pytest.raises(FrameError, match="exceeds"):
        d.feed(struct.pack(">II", 1, fr.MAX_MUX_PAYLOAD + 1))
    small = MuxDecoder(max_frame=16)
    assert small.feed(fr.mux_frame(2, bytes(16))) == [(2, bytes(16))]
    with pytest.raises(FrameError):
        small.feed(struct.pack(">II", 2, 17))


def test_mux_buffers_at_most_one_partial_frame():
    d = MuxDecoder(max_frame=1000)
    wire = b"".join(fr.mux_frame(1, bytes(1000)) for _ in range(50))
    peak = 0
    for pos in range(0, len(wire), 777):
        d.feed(wire[pos:pos + 777])
        peak = max(peak, d.buffered)
    assert peak < 8 + 1000


def test_mux_many_tiny_frames_in_one_feed():
    wire = fr.mux_frame(1, b"x") * 100_000
    got = MuxDecoder().feed(wire)
    assert len(got) == 100_000 and got[-1] == (1, b"x")


# ---- TtrpcDecoder -------------------------------------------------------------------------

MESSAGES = [TtrpcMessage(1, fr.REQUEST, 0, b"req"), TtrpcMessage(3, fr.REQUEST, 0, b""),
            TtrpcMessage(2, fr.RESPONSE, 0, bytes(range(256)) * 3), TtrpcMessage(5, fr.DATA, 5, b"d")]
TWIRE = b"".join(fr.ttrpc_frame(m.stream_id, m.type, m.flags, m.payload) for m in MESSAGES)


def test_ttrpc_round_trip_and_every_split():
    assert TtrpcDecoder().feed(TWIRE) == MESSAGES
    for cut in range(len(TWIRE) + 1):
        d = TtrpcDecoder()
        assert d.feed(TWIRE[:cut]) + d.feed(TWIRE[cut:]) == MESSAGES, cut
        assert d.buffered == 0


def test_ttrpc_byte_at_a_time_and_three_way_splits():
    assert feed_bytewise(TtrpcDecoder(), TWIRE) == MESSAGES
    rng = random.Random(7)
    for _ in range(300):
        a, b = sorted(rng.randrange(len(TWIRE) + 1) for _ in range(2))
        d = TtrpcDecoder()
        assert d.feed(TWIRE[:a]) + d.feed(TWIRE[a:b]) + d.feed(TWIRE[b:]) == MESSAGES


def test_ttrpc_truncated_message_stays_pending():
    d = TtrpcDecoder()
    assert d.feed(TWIRE[:9]) == [] and d.buffered == 9
    assert d.feed(TWIRE[9:12]) == [] and d.buffered == 12
    assert d.feed(TWIRE[12:]) == MESSAGES


def test_ttrpc_oversized_message_is_skipped_and_reported():
    d = TtrpcDecoder(max_message=8)
    wire = fr.ttrpc_frame(1, fr.REQUEST, 0, b"ok") + fr.ttrpc_frame(3, fr.REQUEST, 2, bytes(9)) + \
        fr.ttrpc_frame(5, fr.REQUEST, 0, b"after")
    assert d.feed(wire) == [TtrpcMessage(1, 1, 0, b"ok"), Oversized(3, 1, 2, 9), TtrpcMessage(5, 1, 0, b"after")]
    for cut in range(len(wire) + 1):
        d = TtrpcDecoder(max_message=8)
        assert d.feed(wire[:cut]) + d.feed(wire[cut:]) == \
            [TtrpcMessage(1, 1, 0, b"ok"), Oversized(3, 1, 2, 9), TtrpcMessage(5, 1, 0, b"after")], cut
    d = TtrpcDecoder(max_message=8)
    assert feed_bytewise(d, wire)[1] == Oversized(3, 1, 2, 9)


def test_ttrpc_4_mib_plus_one_is_discarded_without_growing_the_buffer():
    header = struct.pack(">IIBB", fr.MAX_MESSAGE + 1, 7, fr.REQUEST, 0)
    d = TtrpcDecoder()
    assert d.feed(header) == []
    chunk = bytes(64 * 1024)
    left = fr.MAX_MESSAGE + 1
    peak = 0
    while left > 1:
        n = min(len(chunk), left - 1)
        assert d.feed(chunk[:n]) == []
        peak = max(peak, d.buffered)
        left -= n
    tail = fr.ttrpc_frame(9, fr.REQUEST, 0, b"next")
    assert d.feed(b"\x00" + tail) == [Oversized(7, fr.REQUEST, 0, fr.MAX_MESSAGE + 1), TtrpcMessage(9, 1, 0, b"next")]
    assert peak == 0 and d.buffered == 0
    # The whole oversized message in one feed is not copied into the buffer either.
    d = TtrpcDecoder()
    assert d.feed(header + bytes(fr.MAX_MESSAGE + 1) + b"\x00\x00") == [Oversized(7, 1, 0, fr.MAX_MESSAGE + 1)]
    assert d.buffered == 2


def test_ttrpc_exactly_4_mib_is_a_message():
    d = TtrpcDecoder()
    got = d.feed(fr.ttrpc_frame(1, fr.REQUEST, 0, bytes(fr.MAX_MESSAGE)))
    assert len(got) == 1 and len(got[0].payload) == fr.MAX_MESSAGE


def test_ttrpc_buffer_bounded_by_one_message():
    d = TtrpcDecoder(max_message=1000)
    wire = b"".join(fr.ttrpc_frame(i * 2 + 1, 1, 0, bytes(1000)) for i in range(40))
    peak = 0
    for pos in range(0, len(wire), 333):
        d.feed(wire[pos:pos + 333])
        peak = max(peak, d.buffered)
    assert peak <= 10 + 1000


def test_ttrpc_zero_length_messages_many_in_one_feed():
    wire = fr.ttrpc_frame(1, fr.REQUEST, 0, b"") * 100_000
    got = TtrpcDecoder().feed(wire)
    assert len(got) == 100_000 and got[0] == TtrpcMessage(1, 1, 0, b"")


# ---- garbage ------------------------------------------------------------------------------

def test_random_garbage_raises_nothing_but_frame_error():
    rng = random.Random(20251217)
    for _ in range(400):
        blob = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300)))
        # Mostly valid headers with random lengths and ids, then noise.
        if rng.random() < 0.5:
            blob = struct.pack(">II", rng.choice([1, 2, 1, 2, 0, 9]), rng.randrange(64)) + blob
        m = MuxDecoder(max_frame=rng.choice([16, 1024, fr.MAX_MUX_PAYLOAD]))
        t = TtrpcDecoder(max_message=rng.choice([0, 8, 100, fr.MAX_MESSAGE]))
        pos = 0
        try:
            while pos < len(blob):
                n = rng.randrange(1, 40)
                for _, payload in m.feed(blob[pos:pos + n]):
                    for item in t.feed(payload):
                        assert isinstance(item, (TtrpcMessage, Oversized))
                t.feed(blob[pos:pos + n])
                pos += n
        except FrameError:
            pass
        assert m.buffered <= 8 + m.max_frame
        assert t.buffered <= 10 + t.max_message
