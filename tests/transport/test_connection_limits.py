"""The CRI socket's own limits, against the daemon as a process: a connection that never
speaks HTTP/2 is closed after ``server.handshake_timeout_seconds``; at ``server.max_connections``
the connection idle longest is asked to go (GOAWAY, then closed) to make room for a new one,
and a new one is refused only when every connection has a call open. The connections that
do speak, and the kubelet's next one, are served throughout, and so is a well-behaved client
next to a flood of idle connections."""

from __future__ import annotations

import sys
from typing import Iterator, List

import grpc
import pytest

from anolisnuma.ctl.client import ask
from anolisnuma.testing.channel_options import CLIENT_OPTIONS
from anolisnuma.testing.daemon_probes import fds, status_when_up, wait_until
from anolisnuma.testing.fake_cri import FakeCri, runtime_path
from anolisnuma.testing.h2raw import RawH2Client
from anolisnuma.testing.proxy import SubprocessProxy, config_dict, read_log
from anolisnuma.transport import h2 as wire
from anolisnuma.transport.connection_cap import AUTO_CEILING, ConnectionCap, connection_cap

MAX_CONNECTIONS = 4
HANDSHAKE_SECONDS = 0.5
SLOW = runtime_path("Status")   # held by the backend: a call that stays open


@pytest.fixture
def backend(sockdir: str) -> Iterator[FakeCri]:
    with FakeCri(f"{sockdir}/cri.sock", containers=0, sandboxes=0) as f:
        yield f


@pytest.fixture
def daemon(sockdir: str, backend: FakeCri) -> Iterator[SubprocessProxy]:
    cfg = config_dict(sockdir, backend.socket_path, extra={
        "server": {"max_connections": MAX_CONNECTIONS, "handshake_timeout_seconds": HANDSHAKE_SECONDS},
        "admin": {"socket": f"{sockdir}/admin.sock"}})
    proxy = SubprocessProxy(cfg, sockdir).start()
    # the start-up's probe of the socket is a connection too, until the daemon reads its end
    wait_until(lambda: (status_when_up(cfg["admin"]["socket"]) or {}).get("relay", {}).get("connections") == 0,
               timeout=30, what="the start-up probe's connection to end")
    yield proxy
    proxy.stop()


def version(c: RawH2Client, stream: int) -> bool:
    """A Version call on ``stream`` of a started connection; True when it was answered."""
    if not c.send(c.headers(stream, runtime_path("Version")) +
                  c.frame(wire.DATA, wire.FLAG_END_STREAM, stream, b"\x00" * 5)):
        return False
    frames = c.read(until=lambda f: f.stream == stream and f.flags & wire.FLAG_END_STREAM)
    return any(f.stream == stream and f.flags & wire.FLAG_END_STREAM for f in frames)


def open_slow_call(c: RawH2Client, stream: int) -> None:
    """A call the backend holds: the connection has a call open until it is reset."""
    assert c.send(c.headers(stream, SLOW) + c.frame(wire.DATA, wire.FLAG_END_STREAM, stream, b"\x00" * 5))


def relay_status(proxy: SubprocessProxy) -> dict:
    return ask(proxy.data["admin"]["socket"], "status")["relay"]


def connections(proxy: SubprocessProxy) -> int:
    return relay_status(proxy)["connections"]


def log_messages(proxy: SubprocessProxy) -> List[str]:
    return [line.get("message", "") for line in read_log(proxy.data["log"]["file"])]


def logged(proxy: SubprocessProxy, message: str) -> None:
    """Wait for ``message`` in the daemon's log: its writer thread writes the lines of a
    tenth of a second at once, after the event they tell of."""
    wait_until(lambda: message in log_messages(proxy), what=f"the log line {message!r}")


def goaway_debug(c: RawH2Client) -> bytes:
    return next(f.payload[8:] for f in c.frames if f.type == wire.GOAWAY)


# ---------------------------------------------------------------- the cap's bookkeeping

def test_the_idle_order_is_the_order_connections_last_became_idle():
    cap: ConnectionCap[str] = ConnectionCap(limit=2)
    for c in ("a", "b", "c"):
        cap.idle(c)
    cap.busy("a")        # a call opens on a: it is not idle, whatever its age
    cap.idle("a")        # ... and ends: a is now the idle one seen last
    cap.idle("b")        # b was idle already: its place is kept
    assert cap.idle_order() == ["b", "c", "a"]
    assert cap.take_idlest() == "b" and cap.shedding == 1
    assert cap.has_room(2)          # b, being shed, has given up its place
    cap.idle("b")                    # a connection being shed never becomes a candidate again
    assert cap.idle_order() == ["c", "a"]
    cap.gone("b")
    assert cap.shedding == 0 and not cap.has_room(2)


def test_goodbyes_under_way_are_bounded_and_the_oldest_without_a_call_is_found():
    cap: ConnectionCap[int] = ConnectionCap(limit=64)
    assert cap.max_shedding == 4
    for c in range(6):
        cap.idle(c)
    taken = [cap.take_idlest() for _ in range(4)]
    assert taken == [0, 1, 2, 3] and not cap.may_shed()
    assert cap.oldest_shed(lambda c: c != 0) == 1      # 0 has a call open (it raced the GOAWAY)
    assert cap.oldest_shed(lambda c: False) is None


def test_the_cap_is_what_the_open_files_limit_carries_or_what_is_configured_within_it():
    assert connection_cap(0, 1024) == (1024 - 256 - 64) // 2         # two descriptors a connection
    assert connection_cap(0, 65536) == AUTO_CEILING == 16384          # then memory bounds it
    assert connection_cap(128, 65536) == 128                          # an explicit cap is kept...
    assert connection_cap(100000, 1024) == connection_cap(0, 1024)    # ... within the descriptors


# ---------------------------------------------------------------- the daemon

def test_the_daemon_raises_its_open_files_limit_and_derives_its_cap(sockdir, backend, tmp_path):
    """Started as systemd starts a service (a low soft limit, a higher hard one), the daemon
    raises its soft limit to the hard one, as containerd does, and takes its cap from it."""
    wrapper = tmp_path / "python"
    wrapper.write_text(f"#!/bin/sh\nexec prlimit --nofile=256:4096 {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    cfg = config_dict(sockdir, backend.socket_path, extra={"admin": {"socket": f"{sockdir}/admin.sock"}})
    proxy = SubprocessProxy(cfg, sockdir, python=str(wrapper)).start(timeout=30)
    try:
        with open(f"/proc/{proxy.proc.pid}/limits") as f:
            limits = next(line.split() for line in f if line.startswith("Max open files"))
        assert limits[3:5] == ["4096", "4096"]
        relay = wait_until(lambda: (status_when_up(cfg["admin"]["socket"]) or {}).get("relay"), timeout=30)
        assert relay["open_files_limit"] == 4096
        assert relay["max_connections"] == connection_cap(0, 4096) == (4096 - 256 - 256) // 2
    finally:
        proxy.stop()


def test_a_connection_that_never_speaks_is_closed_and_the_others_are_served(daemon):
    pid = daemon.proc.pid
    with RawH2Client(daemon.socket_path) as good:
        good.start()
        assert version(good, 1)
        baseline = fds(pid)
        silent = [RawH2Client(daemon.socket_path, timeout=30) for _ in range(3)]
        try:
            for c in silent:   # each is closed by the daemon, having sent nothing
                assert c.wait_closed(timeout=30)
                assert all(f.stream == 0 for f in c.frames)   # containerd's preface at most: no call
        finally:
            for c in silent:
                c.close()
        assert version(good, 3)   # the connection that spoke is not touched by the timeout
    wait_until(lambda: fds(pid) < baseline, what="the daemon to close the connections' descriptors")
    logged(daemon, "kubelet connection closed: no HTTP/2 preface within server.handshake_timeout_seconds")


def test_at_the_cap_the_connection_idle_longest_is_asked_to_go_and_the_new_one_is_served(daemon):
    held = [RawH2Client(daemon.socket_path, timeout=30) for _ in range(MAX_CONNECTIONS)]
    try:
        for i, c in enumerate(held):
            c.start()
            assert version(c, 1), i
        assert version(held[0], 3)   # held[0] spoke last: held[1] is now idle longest
        with RawH2Client(daemon.socket_path) as new:
            new.start()
            assert version(new, 1)
            # held[1] got the graceful goodbye (NO_ERROR, saying why), then was closed; it
            # does not answer the goodbye's PING, so the daemon waited for it, then closed
            assert held[1].goaway_code(timeout=30) == wire.NO_ERROR
            assert b"connection cap" in goaway_debug(held[1])
            assert held[1].wait_closed(timeout=30)
            for c in (held[0], held[2], held[3]):   # the others are not touched
                assert version(c, 5)
                assert not any(f.type == wire.GOAWAY for f in c.frames)
            assert version(new, 3)
    finally:
        for c in held:
            c.close()
    status = relay_status(daemon)
    assert status["counters"]["connections_shed_idle"] >= 1
    assert status["max_connections"] == MAX_CONNECTIONS
    logged(daemon, "idle kubelet connection closed to make room: the connection cap is reached "
                   "(the client reconnects for its next call)")


def test_with_a_call_open_on_every_connection_a_new_one_is_refused_until_one_is_idle(daemon, backend):
    backend.set_delay(SLOW, 60)
    held = [RawH2Client(daemon.socket_path, timeout=30) for _ in range(MAX_CONNECTIONS)]
    try:
        for c in held:
            c.start()
            open_slow_call(c, 1)
        backend.wait_for_calls(SLOW, MAX_CONNECTIONS, timeout=30)
        with RawH2Client(daemon.socket_path) as extra:
            extra.start()
            assert extra.wait_closed(timeout=30)
            assert extra.frames == []   # closed before containerd was even asked
        # the kubelet cancels one call: that connection is idle, and gives way to a new one
        assert held[0].send(held[0].frame(wire.RST_STREAM, 0, 1, (8).to_bytes(4, "big")))
        wait_until(lambda: relay_status(daemon)["idle_connections"] == 1, what="the cancelled call to end")
        with RawH2Client(daemon.socket_path) as new:
            new.start()
            assert version(new, 1)
        assert held[0].goaway_code(timeout=30) == wire.NO_ERROR
        for c in held[1:]:   # the calls still open were never touched
            assert not any(f.type == wire.GOAWAY for f in c.frames)
    finally:
        backend.set_delay(SLOW, 0)
        for c in held:
            c.close()
    assert relay_status(daemon)["counters"]["connections_refused_over_cap"] == 1
    logged(daemon, "kubelet connection refused: the connection cap is reached and every connection has a call open")


def test_a_flood_of_idle_connections_does_not_fail_a_well_behaved_client(daemon):
    """Forty idle connections that spoke once and never read again, opened by root faster
    than their goodbyes can end: a gRPC client beside them has every call answered, its
    own connection shed and reopened along the way, a client that comes after them is
    served, and the daemon holds no more descriptors than the cap and its reserve allow."""
    pid = daemon.proc.pid
    channel = grpc.insecure_channel(f"unix://{daemon.socket_path}", options=CLIENT_OPTIONS)
    call = channel.unary_unary(runtime_path("Version"))
    flood: List[RawH2Client] = []
    try:
        call(b"", timeout=30)   # the channel is connected (a failed call raises)
        baseline = fds(pid)
        for i in range(40):
            c = RawH2Client(daemon.socket_path, timeout=30)
            flood.append(c)
            c.start()
            version(c, 1)   # answered, or closed: it was shed by a newer one
            call(b"", timeout=30)   # raises on any failure
        # and a client that arrives after the flood is served too
        late = grpc.insecure_channel(f"unix://{daemon.socket_path}", options=CLIENT_OPTIONS)
        try:
            late.unary_unary(runtime_path("Version"))(b"", timeout=30)
        finally:
            late.close()
        status = relay_status(daemon)
        assert status["counters"].get("connections_refused_over_cap", 0) == 0
        assert status["counters"]["connections_shed_idle"] >= 36
        # every flood connection still counted is the cap's, or one of the bounded goodbyes
        assert status["connections"] <= MAX_CONNECTIONS + ConnectionCap(MAX_CONNECTIONS).max_shedding
        assert fds(pid) <= baseline + 2 * (MAX_CONNECTIONS + ConnectionCap(MAX_CONNECTIONS).max_shedding)
    finally:
        channel.close()
        for c in flood:
            c.close()
