"""The graceful goodbye at shutdown, frame by frame (a raw HTTP/2 client sees what a
grpc-go client would): GOAWAY with the highest stream id and a PING first; after the PING's
ACK the GOAWAY with the last stream id really opened; a call opened in between is served;
the open call finishes; the connection closes once nothing but event watches is open."""

from __future__ import annotations

import struct
import threading

from anolisnuma.cri import grpcwire
from anolisnuma.testing.fake_cri import runtime_path
from anolisnuma.testing.h2raw import RawH2Client
from anolisnuma.testing.proxy import InProcessProxy, make_config
from anolisnuma.transport import h2
from anolisnuma.transport.splice.goodbye import DRAIN_PING, MAX_STREAM_ID

VERSION = runtime_path("Version")


def goaways(frames):
    return [struct.unpack(">II", f.payload[:8]) for f in frames if f.type == h2.GOAWAY]


def call(c: RawH2Client, sid: int) -> None:
    c.send(c.headers(sid, VERSION) + h2.frame(h2.DATA, h2.FLAG_END_STREAM, sid, grpcwire.frame_message(b"")))


def test_double_goaway_serves_the_stream_that_raced_the_first(sockdir, fake):
    proxy = InProcessProxy(make_config(sockdir, fake.socket_path, grace=10)).start()
    stopped = threading.Thread(target=proxy.stop)
    try:
        with RawH2Client(proxy.socket_path) as c:
            c.start()
            c.send(h2.frame(h2.SETTINGS, h2.FLAG_ACK, 0))
            fake.set_delay(VERSION, 0.5)
            call(c, 1)                         # in flight at the shutdown
            fake.wait_for_calls(VERSION, 1)
            stopped.start()
            first = c.read(5, until=lambda f: f.type == h2.PING and not f.flags & h2.FLAG_ACK)
            assert goaways(first) == [(MAX_STREAM_ID, h2.NO_ERROR)]
            assert first[-1].payload == DRAIN_PING
            call(c, 3)                         # opened before the client read the GOAWAY
            c.send(h2.frame(h2.PING, h2.FLAG_ACK, 0, DRAIN_PING))
            rest = c.read(10, until=lambda f: False)
            assert goaways(rest) == [(3, h2.NO_ERROR)]      # the last stream it opened
            ends = {f.stream for f in rest if f.type == h2.HEADERS and f.flags & h2.FLAG_END_STREAM}
            assert ends == {1, 3}                            # both answered, none refused
            assert not [f for f in rest if f.type == h2.RST_STREAM]
            assert c.eof                                     # closed once they were done
        stopped.join(10)
        assert fake.calls(VERSION) == 2
    finally:
        if not stopped.is_alive():
            proxy.stop()


def test_a_stream_opened_after_the_last_goaway_is_refused_for_a_retry(sockdir, fake):
    proxy = InProcessProxy(make_config(sockdir, fake.socket_path, grace=10)).start()
    stopped = threading.Thread(target=proxy.stop)
    try:
        with RawH2Client(proxy.socket_path) as c:
            c.start()
            fake.set_delay(VERSION, 0.5)
            call(c, 1)
            fake.wait_for_calls(VERSION, 1)
            stopped.start()
            c.read(5, until=lambda f: f.type == h2.PING and not f.flags & h2.FLAG_ACK)
            c.send(h2.frame(h2.PING, h2.FLAG_ACK, 0, DRAIN_PING))
            c.read(5, until=lambda f: f.type == h2.GOAWAY and f.payload[:4] != struct.pack(">I", MAX_STREAM_ID))
            call(c, 5)                         # a client that ignores the GOAWAY
            rest = c.read(10, until=lambda f: False)
            assert [(f.stream, struct.unpack(">I", f.payload)[0]) for f in rest if f.type == h2.RST_STREAM] \
                == [(5, h2.REFUSED_STREAM)]    # grpc-go retries a refused stream transparently
        stopped.join(10)
        assert fake.calls(VERSION) == 1
    finally:
        if not stopped.is_alive():
            proxy.stop()
