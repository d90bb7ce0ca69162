"""The CRI socket's own limits, against the daemon as a process: a connection that never
speaks HTTP/2 is closed after ``server.handshake_timeout_seconds``, one over
``server.max_connections`` is closed at once; the connections that do speak, and the
kubelet's next one, are served throughout."""

from __future__ import annotations

from typing import Iterator, List

import pytest

from anolisnuma.ctl.client import ask
from anolisnuma.testing.daemon_probes import fds, status_when_up, wait_until
from anolisnuma.testing.fake_cri import FakeCri, runtime_path
from anolisnuma.testing.h2raw import RawH2Client
from anolisnuma.testing.proxy import SubprocessProxy, config_dict, read_log
from anolisnuma.transport import h2 as wire

MAX_CONNECTIONS = 4
HANDSHAKE_SECONDS = 0.5


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


def connections(proxy: SubprocessProxy) -> int:
    return ask(proxy.data["admin"]["socket"], "status")["relay"]["connections"]


def log_messages(proxy: SubprocessProxy) -> List[str]:
    return [line.get("message", "") for line in read_log(proxy.data["log"]["file"])]


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
    assert "kubelet connection closed: no HTTP/2 preface within server.handshake_timeout_seconds" \
        in log_messages(daemon)


def test_a_connection_over_the_cap_is_closed_at_once_and_room_comes_back(daemon):
    held = [RawH2Client(daemon.socket_path) for _ in range(MAX_CONNECTIONS)]
    try:
        for i, c in enumerate(held):
            c.start()
            assert version(c, 1), i
        with RawH2Client(daemon.socket_path) as extra:
            extra.start()
            assert extra.wait_closed()
            assert extra.frames == []   # closed before containerd was even asked
        held.pop().close()
        wait_until(lambda: connections(daemon) < MAX_CONNECTIONS, what="the daemon to see a connection end")
        assert _served(daemon)
    finally:
        for c in held:
            c.close()
    assert "kubelet connection refused: server.max_connections are open" in log_messages(daemon)


def _served(daemon: SubprocessProxy) -> bool:
    with RawH2Client(daemon.socket_path) as c:
        c.start()
        return version(c, 1)
