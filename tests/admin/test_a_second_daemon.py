"""A daemon that cannot serve its admin socket or its metrics endpoint says so: one plain
line on stderr at start, whatever the log's destination, and in ``status``; it serves the
kubelet all the same."""

from __future__ import annotations

import contextlib
import io
import os
import socket
from typing import Iterator, List, Tuple

import grpc
import pytest

from anolisnuma.ctl import main as ctl_main
from anolisnuma.ctl.client import ask
from anolisnuma.testing.daemon_probes import status_when_up
from anolisnuma.testing.fake_cri import FakeCri
from anolisnuma.testing.proxy import SubprocessProxy, config_dict
from anolisnuma.testing.waiting import wait_until
from cri_proto import api_pb2 as pb


@pytest.fixture
def fake(sockdir: str) -> Iterator[FakeCri]:
    backend = FakeCri(os.path.join(sockdir, "containerd.sock"), containers=0, sandboxes=0).start()
    yield backend
    backend.stop(0)


def daemon(sockdir: str, name: str, backend: str, *, stderr_logs: bool = False, **sections) -> SubprocessProxy:
    """A daemon of its own (CRI socket, log file, state) named ``name``, started."""
    data = config_dict(os.path.join(sockdir, name), backend, listen=os.path.join(sockdir, f"{name}.sock"),
                       extra={"log": {"stderr": stderr_logs}, **sections})
    return SubprocessProxy(data, sockdir, name=name).start()


def plain_lines(proxy: SubprocessProxy, start: str) -> List[str]:
    """The lines of its stderr that are not log lines (JSON) and begin with ``start``."""
    return [line for line in proxy.stderr.splitlines() if line.startswith(start)]


def kubelet_version(proxy: SubprocessProxy) -> str:
    with grpc.insecure_channel(proxy.address) as channel:
        version = channel.unary_unary("/runtime.v1.RuntimeService/Version",
                                      request_serializer=pb.VersionRequest.SerializeToString,
                                      response_deserializer=pb.VersionResponse.FromString)
        return version(pb.VersionRequest(), timeout=10).runtime_name


def ctl(*args: str) -> Tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = ctl_main.main(list(args))
    return code, out.getvalue()


@pytest.mark.parametrize("stderr_logs", [False, True], ids=["logs-in-a-file", "logs-on-stderr-too"])
def test_a_second_daemon_on_a_taken_admin_socket_says_so_once_and_serves_the_kubelet(sockdir, fake, stderr_logs):
    # given: a first daemon serving the admin socket
    admin = os.path.join(sockdir, "admin.sock")
    first = daemon(sockdir, "first", fake.socket_path, admin={"socket": admin})
    second = None
    try:
        wait_until(lambda: status_when_up(admin), "the first daemon's admin socket")
        # when: a second one is configured with the same admin socket
        second = daemon(sockdir, "second", fake.socket_path, stderr_logs=stderr_logs, admin={"socket": admin})
        # then: it tells the person who started it, naming the first one's pid
        [line] = wait_until(lambda: plain_lines(second, "anolisnuma: no admin socket"), "the second daemon's word")
        assert line == (f"anolisnuma: no admin socket: another anolisnuma instance (pid {first.proc.pid}) is running "
                        f"on {admin} (it holds {admin}.lock). This daemon serves the kubelet without it, and "
                        f"anolisnuma-ctl cannot reach this daemon: at {admin} it reaches the other one. Stop that "
                        f"one, or give this daemon a socket of its own ([admin] socket).")
        # it serves the kubelet all the same
        assert kubelet_version(second) == "fake-cri"
        # and what the line warns of: anolisnuma-ctl at that path is answered by the first
        assert ask(admin, "status", timeout=10)["pid"] == first.proc.pid
        assert second.stop() == 0
        assert len(plain_lines(second, "anolisnuma: ")) == 1   # once, for the whole run
    finally:
        if second is not None:
            second.stop()
        first.stop()


def test_a_daemon_whose_metrics_port_is_taken_says_so_on_stderr_and_in_status(sockdir, fake):
    # given: the configured metrics port is another process's
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    listen = f"127.0.0.1:{taken.getsockname()[1]}"
    admin = os.path.join(sockdir, "admin.sock")
    proxy = None
    try:
        # when: the daemon starts
        proxy = daemon(sockdir, "node", fake.socket_path, admin={"socket": admin}, metrics={"listen": listen})
        # then: the person who started it reads why there are no metrics
        [line] = wait_until(lambda: plain_lines(proxy, "anolisnuma: no metrics endpoint"), "the daemon's word")
        assert line == (f"anolisnuma: no metrics endpoint: cannot serve {listen}: Address already in use. This "
                        f"daemon serves the kubelet without it; another process (another anolisnuma?) has that "
                        f"port: stop it, or give this daemon a port of its own ([metrics] listen); "
                        f"`anolisnuma-ctl status` says so.")
        # and so does status, as data and as text
        s = wait_until(lambda: status_when_up(admin), "the admin socket")
        assert s["metrics_url"] is None and s["admin_socket"] == admin
        assert s["surfaces"]["admin_socket"] == {"path": admin, "error": None}
        metrics = s["surfaces"]["metrics"]
        assert metrics["listen"] == listen and "Address already in use" in metrics["error"]
        code, out = ctl("--admin-socket", admin, "status")
        assert code == 0
        [row] = [r for r in out.splitlines() if r.startswith("metrics:")]
        assert row.split(":", 1)[1].strip() == (f"UNAVAILABLE on {listen}: {metrics['error']} "
                                                f"(the daemon runs on without it)")
        assert kubelet_version(proxy) == "fake-cri"
    finally:
        if proxy is not None:
            proxy.stop()
        taken.close()
