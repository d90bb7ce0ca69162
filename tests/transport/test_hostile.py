"""Hostile and broken clients against the daemon as it runs on a node (a subprocess).

Each case: the attacked connection gets an error or is closed; another connection's
Version answers within 1 s meanwhile; the daemon's RSS grows by less than its buffer
budget and comes back near its baseline; no file descriptor is left behind; SIGTERM still
stops it within its drain grace.
"""

from __future__ import annotations

import signal
import time
from typing import Iterator

import grpc
import pytest

from anolisnuma.testing.channel_options import CLIENT_OPTIONS, GO_LIKE_SERVER, MIB
from anolisnuma.testing.daemon_probes import Watchdog, assert_recovers, fds, rss_bytes, wait_until
from anolisnuma.testing.fake_cri import FakeCri, runtime_path
from anolisnuma.testing.h2raw import RawH2Client
from anolisnuma.testing.proxy import SubprocessProxy, config_dict, read_log
from anolisnuma.transport import h2 as wire

cri = pytest.importorskip("cri_api.v1.api_pb2")
cri_grpc = pytest.importorskip("cri_api.v1.api_pb2_grpc")

CREATE = runtime_path("CreateContainer")
RUN = runtime_path("RunPodSandbox")
UNKNOWN = "/made.up.Service/Upload"
PER_CONNECTION = 16 * MIB
TOTAL = 24 * MIB


# ---------------------------------------------------------------- the daemon

@pytest.fixture
def backend(sockdir: str) -> Iterator[FakeCri]:
    # containerd serves each stream on its own goroutine; with a pool of a few dozen
    # threads, the streams a flood holds open would make the fake, not the relay, what
    # the watchdog's Version waits for.
    with FakeCri(f"{sockdir}/cri.sock", containers=0, sandboxes=0, server_options=GO_LIKE_SERVER,
                 max_workers=4096) as f:
        yield f


@pytest.fixture
def daemon(sockdir: str, backend: FakeCri) -> Iterator[SubprocessProxy]:
    """The daemon with QoS on (its RunPodSandbox/CreateContainer pre-hooks hold requests)
    over an empty fake kernel tree, and small budgets."""
    cfg = config_dict(sockdir, backend.socket_path, extra={
        "server": {"buffer_bytes_per_connection": PER_CONNECTION, "buffer_bytes_total": TOTAL,
                   "shutdown_grace_seconds": 3.0},
        "qos": {"enabled": True},
    })
    proxy = SubprocessProxy(cfg, sockdir).start()
    # Intercepted calls that arrive while the hooks are still being built wait for them;
    # these tests are about the relay, so they start once the hooks are ready (a call
    # whose wait began in the very loop turn the hooks became ready was seen to wait on:
    # see Interceptor._when_ready).
    wait_until(lambda: any(line.get("message") == "hooks ready" for line in read_log(cfg["log"]["file"])),
               timeout=30, what="the daemon's hooks ready")
    # A first call warms up every code path, so that RSS baselines are taken on a warm
    # daemon; then the daemon itself ends that connection (an oversized frame), so that
    # when its end reaches us, the fds it used are closed and the fd baseline is exact.
    with RawH2Client(proxy.socket_path) as c:
        c.start()
        c.send(c.headers(1, runtime_path("Version")) + c.frame(wire.DATA, wire.FLAG_END_STREAM, 1, b"\x00" * 5))
        c.read(until=lambda f: f.stream == 1 and f.flags & wire.FLAG_END_STREAM)
        c.send(c.frame(wire.PING, 0, 0, b"\x00" * 20000))
        assert c.wait_closed()
    yield proxy
    proxy.stop()


# ---------------------------------------------------------------- frames and header blocks

def test_oversized_headers_frame_ends_the_connection(daemon):
    """One 16 MiB HEADERS frame used to freeze the event loop for minutes."""
    pid = daemon.proc.pid
    rss0, fds0 = rss_bytes(pid), fds(pid)
    with Watchdog(daemon.address), RawH2Client(daemon.socket_path) as c:
        c.start()
        # a frame header announcing 16 MiB - 1 of HEADERS payload
        c.send(((1 << 24) - 1).to_bytes(3, "big") + bytes([wire.HEADERS, wire.FLAG_END_HEADERS]) + (1).to_bytes(4, "big"))
        for _ in range(64):  # keep writing the announced payload until the proxy hangs up
            if not c.send(b"\x00" * 65536):
                break
        assert c.goaway_code() == wire.FRAME_SIZE_ERROR
        assert c.wait_closed()
    assert_recovers(daemon.proc.pid, rss0, fds0)


@pytest.mark.parametrize("fields", [b"\x00\x00\x00", b"\x40\x00\x00"], ids=["literal", "indexed-literal"])
def test_continuation_flood_ends_the_connection(fields, daemon):
    """Header blocks of empty literals in legal 16 KiB frames, HEADERS then CONTINUATIONs
    without end: the block is cut at 256 KiB and the connection ended."""
    pid = daemon.proc.pid
    rss0, fds0 = rss_bytes(pid), fds(pid)
    chunk = fields * (16383 // len(fields))
    started = time.monotonic()
    with Watchdog(daemon.address), RawH2Client(daemon.socket_path) as c:
        c.start()
        c.send(c.frame(wire.HEADERS, 0, 1, chunk))
        sent = len(chunk)
        while sent < 64 * MIB and c.send(c.frame(wire.CONTINUATION, 0, 1, chunk)):
            sent += len(chunk)
        assert c.goaway_code() == wire.ENHANCE_YOUR_CALM
        assert c.wait_closed()
    assert sent < 8 * MIB, "the proxy kept reading the flood"
    assert time.monotonic() - started < 10
    assert_recovers(daemon.proc.pid, rss0, fds0)


def test_many_empty_literals_in_one_block_end_the_connection_quickly(daemon):
    """Within the block cap but over the header list cap: decoded in linear time and
    refused, in milliseconds rather than the 14 s a quadratic decoder took."""
    with Watchdog(daemon.address), RawH2Client(daemon.socket_path) as c:
        c.start()
        block = b"\x00\x00\x00" * (200_000 // 3)
        frames = [block[i:i + 16384] for i in range(0, len(block), 16384)]
        c.send(c.frame(wire.HEADERS, 0, 1, frames[0]))
        for i, f in enumerate(frames[1:], 1):
            c.send(c.frame(wire.CONTINUATION, wire.FLAG_END_HEADERS if i == len(frames) - 1 else 0, 1, f))
        started = time.monotonic()
        assert c.goaway_code() == wire.ENHANCE_YOUR_CALM
        assert time.monotonic() - started < 5.0     # a quadratic decoder took 14 s


def test_undecodable_header_block_ends_the_connection_and_nothing_passes_unpoliced(daemon, backend):
    """A block the relay cannot decode (bad Huffman padding) used to switch the connection
    to blind relaying, where a later RunPodSandbox ran with no hook, no log, no record."""
    with RawH2Client(daemon.socket_path) as c:
        c.start()
        # literal field, new name "x", Huffman-coded value of four 0xff bytes (holds EOS)
        c.send(c.frame(wire.HEADERS, wire.FLAG_END_HEADERS | wire.FLAG_END_STREAM, 1,
                       b"\x00\x01x\x84\xff\xff\xff\xff"))
        c.send(c.headers(3, RUN) + c.frame(wire.DATA, wire.FLAG_END_STREAM, 3,
                                           b"\x00" + (0).to_bytes(4, "big")))
        assert c.goaway_code() == wire.COMPRESSION_ERROR
        assert c.wait_closed()
    assert backend.calls(RUN) == 0
    # the next connection is read afresh and policed
    with grpc.insecure_channel(daemon.address, options=CLIENT_OPTIONS) as ch:
        cri_grpc.RuntimeServiceStub(ch).RunPodSandbox(cri.RunPodSandboxRequest(config=cri.PodSandboxConfig(
            metadata=cri.PodSandboxMetadata(name="p", uid="u1", namespace="default"))), timeout=5)
    # the daemon's log is written by a thread of its own: the lines may follow the reply
    wait_until(lambda: any(line.get("message") == "run pod sandbox reply from containerd"
                           for line in read_log(daemon.data["log"]["file"])), what="the call's log line")
    assert any(line.get("http2_error") == "COMPRESSION_ERROR" for line in read_log(daemon.data["log"]["file"]))


def test_client_that_does_not_speak_http2_is_closed(daemon, backend):
    versions = backend.calls(runtime_path("Version"))
    with RawH2Client(daemon.socket_path) as c:
        c.send(b"GET /runtime.v1.RuntimeService/Version HTTP/1.1\r\nHost: x\r\n\r\n")
        assert c.wait_closed()
        assert c.goaway_code() == wire.PROTOCOL_ERROR
        assert {f.type for f in c.frames} <= {wire.SETTINGS, wire.GOAWAY}  # containerd's preface, our GOAWAY
    assert backend.calls(runtime_path("Version")) == versions


# ---------------------------------------------------------------- flow control and memory

def test_data_past_the_window_ends_the_connection(daemon):
    """A client that ignores flow control used to park its bytes in an unbounded queue
    (+1.6 GB in 3 s)."""
    pid = daemon.proc.pid
    rss0, fds0 = rss_bytes(pid), fds(pid)
    with Watchdog(daemon.address), RawH2Client(daemon.socket_path) as c:
        c.start()
        c.send(c.headers(1, UNKNOWN))
        sent = 0
        while sent < 256 * MIB and c.send(c.frame(wire.DATA, 0, 1, b"\x00" * 16384)):
            sent += 16384
        assert c.goaway_code() == wire.FLOW_CONTROL_ERROR
        assert c.wait_closed()
    assert sent < 8 * MIB
    assert_recovers(daemon.proc.pid, rss0, fds0)


def test_client_gone_with_both_directions_full_leaves_nothing_open(daemon, backend):
    """A client that stops reading a large server stream (after granting it a huge
    window), fills its upload window too, then closes: the daemon's connection to
    containerd must go with it (it used to stay open for ever, with its buffers, when a
    close waited for a write buffer to drain)."""
    backend.set_stream("/made.up.Service/Download", lambda req, ctx: (b"y" * MIB for _ in range(256)))
    pid = daemon.proc.pid
    rss0, fds0 = rss_bytes(pid), fds(pid)
    huge = wire.MAX_WINDOW
    for _ in range(3):
        c = RawH2Client(daemon.socket_path)
        c.start(settings=wire.SETTINGS_INITIAL_WINDOW_SIZE.to_bytes(2, "big") + huge.to_bytes(4, "big"))
        c.send(c.frame(wire.WINDOW_UPDATE, 0, 0, (huge - wire.DEFAULT_WINDOW).to_bytes(4, "big"))
               + c.headers(1, "/made.up.Service/Download")
               + c.frame(wire.DATA, wire.FLAG_END_STREAM, 1, b"\x00\x00\x00\x00\x00")
               + c.headers(3, UNKNOWN))
        for _ in range(3):  # the whole initial window (64 KiB) of upload, and no more
            c.send(c.frame(wire.DATA, 0, 3, b"u" * 16384))
        c.send(c.frame(wire.DATA, 0, 3, b"u" * (16384 - 1 - 5)))  # 5 bytes went to the download
        c.read(timeout=5, until=lambda f: f.type == wire.DATA and f.stream == 1)  # flowing
        wait_until(lambda: c.unread_bytes() >= 64 * 1024, what="the download filling the client's buffer")
        c.close()
    assert_recovers(daemon.proc.pid, rss0, fds0)


def test_reset_flood_is_summarised_in_the_log(daemon):
    """200k reset streams wrote 47 MB of log, one warning each; now a few lines."""
    log_file = daemon.data["log"]["file"]
    lines_before = len(read_log(log_file))
    with Watchdog(daemon.address), RawH2Client(daemon.socket_path) as c:
        c.start()
        for batch in range(20):
            frames = []
            for i in range(1000):
                sid = 1 + 2 * (batch * 1000 + i)
                frames.append(c.headers(sid, CREATE) + c.frame(wire.RST_STREAM, 0, sid, wire.CANCEL.to_bytes(4, "big")))
            assert c.send(b"".join(frames))
        c.send(c.headers(40_001, runtime_path("Version")) + c.frame(
            wire.DATA, wire.FLAG_END_STREAM, 40_001, b"\x00\x00\x00\x00\x00"))
        got = c.read(timeout=10, until=lambda f: f.stream == 40_001 and f.flags & wire.FLAG_END_STREAM)
        assert got and got[-1].stream == 40_001, "the connection stopped answering"
    lines = read_log(log_file)[lines_before:]
    assert len(lines) < 20, [line.get("message") for line in lines]


def test_sigterm_during_a_flood_stops_within_the_grace(daemon):
    with RawH2Client(daemon.socket_path) as c:
        c.start()
        chunk = b"\x00" + (1 << 20).to_bytes(4, "big") + b"x" * 16000
        for sid in range(1, 400, 2):  # many held requests, none finished
            c.send(c.headers(sid, CREATE) + c.frame(wire.DATA, 0, sid, chunk))
        c.read(timeout=0.5)
        started = time.monotonic()
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(timeout=10) == 0
        grace = daemon.data["server"]["shutdown_grace_seconds"]
        assert time.monotonic() - started < grace + 3.0
