"""Faults around the relay: the backend down or restarting, SIGTERM with calls in flight,
and the listening socket's hygiene (stale file, second instance, mode, parent dir)."""

from __future__ import annotations

import os
import signal
import socket
import stat
import threading
import time

import grpc
import pytest

from anolisnuma.testing.fake_cri import runtime_path
from anolisnuma.testing.proxy import InProcessProxy, SubprocessProxy, config_dict, make_config
from anolisnuma.testing.waiting import wait_until
from anolisnuma.transport.listener import ListenerError, UnixListener

cri_v1 = pytest.importorskip("cri_api.v1.api_pb2")
cri_v1_grpc = pytest.importorskip("cri_api.v1.api_pb2_grpc")

VERSION = runtime_path("Version")


def version(channel: grpc.Channel, timeout: float = 5.0):
    return cri_v1_grpc.RuntimeServiceStub(channel).Version(cri_v1.VersionRequest(version="v1"), timeout=timeout)


# "Fails fast": well before the call's 10 s deadline, and a loaded 2-core machine has room.
FAST = 3.0


def eventually_ok(channel: grpc.Channel, within: float = 15.0):
    """Retry Version with short sleeps, as the kubelet does, until it succeeds."""
    deadline = time.monotonic() + within
    while True:
        try:
            return version(channel, timeout=1.0)
        except grpc.RpcError as e:
            if time.monotonic() > deadline:
                raise AssertionError(f"still failing after {within}s: {e.code()} {e.details()}")
            time.sleep(0.05)


# ---------------------------------------------------------------- backend availability

def test_backend_down_at_start_fails_fast_unavailable(sockdir, open_channel):
    with InProcessProxy(make_config(sockdir, f"{sockdir}/nobody.sock")) as proxy:
        channel = open_channel(proxy.address)
        for _ in range(3):
            started = time.monotonic()
            with pytest.raises(grpc.RpcError) as e:
                version(channel, timeout=10)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
            assert time.monotonic() - started < FAST


def test_backend_socket_file_without_listener_fails_fast(sockdir, open_channel):
    stale = f"{sockdir}/stale-cri.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(stale)
    s.close()
    with InProcessProxy(make_config(sockdir, stale)) as proxy:
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as e:
            version(open_channel(proxy.address), timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        assert time.monotonic() - started < FAST


def test_backend_restarted_under_running_proxy(proxy, fake, open_channel):
    channel = open_channel(proxy.address)
    assert version(channel).runtime_name == "fake-cri"
    fake.stop(0)
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as e:
        version(channel, timeout=10)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    assert time.monotonic() - started < FAST
    fake.start()
    assert eventually_ok(channel).runtime_name == "fake-cri"
    # and a fresh client too
    assert version(open_channel(proxy.address)).runtime_name == "fake-cri"


def test_backend_killed_with_call_in_flight(proxy, fake, open_channel):
    fake.set_delay(VERSION, 5.0)
    channel = open_channel(proxy.address)
    result = {}

    def call() -> None:
        started = time.monotonic()
        try:
            version(channel, timeout=10)
            result["code"] = grpc.StatusCode.OK
        except grpc.RpcError as e:
            result["code"] = e.code()
        result["elapsed"] = time.monotonic() - started

    t = threading.Thread(target=call)
    t.start()
    fake.wait_for_calls(VERSION, 1)
    fake.stop(0)
    t.join(5)
    assert not t.is_alive()
    assert result["code"] in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.INTERNAL)
    assert result["elapsed"] < 3.0
    fake.set_delay(VERSION, 0)
    fake.start()
    assert eventually_ok(channel).runtime_name == "fake-cri"


# ---------------------------------------------------------------- shutdown

def test_sigterm_finishes_call_in_flight_and_removes_socket(sockdir, fake, open_channel):
    data = config_dict(sockdir, fake.socket_path, extra={"server": {"socket_mode": "0640"}})
    proxy = SubprocessProxy(data, sockdir).start()
    try:
        assert stat.S_IMODE(os.stat(proxy.socket_path).st_mode) == 0o640
        channel = open_channel(proxy.address)
        assert version(channel).runtime_name == "fake-cri"  # connection up before the slow call
        fake.set_delay(VERSION, 1.0)
        result = {}

        def call() -> None:
            try:
                result["reply"] = version(channel, timeout=10)
            except grpc.RpcError as e:
                result["error"] = e

        t = threading.Thread(target=call)
        t.start()
        fake.wait_for_calls(VERSION, 2)
        proxy.signal(signal.SIGTERM)
        t.join(10)
        assert "error" not in result, result.get("error")
        assert result["reply"].runtime_name == "fake-cri"
        assert proxy.wait(10) == 0, proxy.stderr
        assert not os.path.exists(proxy.socket_path)
        assert "anolisnuma stopped" in proxy.stderr
    finally:
        proxy.stop()


def test_in_process_stop_drains_calls_in_flight(sockdir, fake, open_channel):
    proxy = InProcessProxy(make_config(sockdir, fake.socket_path)).start()
    try:
        channel = open_channel(proxy.address)
        version(channel)
        fake.set_delay(VERSION, 0.8)
        result = {}
        t = threading.Thread(target=lambda: result.setdefault("reply", version(channel, timeout=10)))
        t.start()
        fake.wait_for_calls(VERSION, 2)
        stopper = threading.Thread(target=lambda: result.setdefault("exit", proxy.stop()))
        stopper.start()
        # draining: socket gone, the last GOAWAY sent (a call that crossed the first one
        # would still be served), the slow call still running
        wait_until(lambda: not os.path.exists(proxy.socket_path)
                   and all(s.goodbye == 2 for s in proxy.daemon.relay.splices),
                   "the drain's last GOAWAY")
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as e:  # a new call during the drain fails fast
            version(channel, timeout=5)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        assert time.monotonic() - started < FAST
        stopper.join(10)
        t.join(5)
        assert result["exit"] == 0
        assert result["reply"].runtime_name == "fake-cri"
        assert fake.calls(VERSION) == 2
        assert not os.path.exists(proxy.socket_path)
    finally:
        proxy.stop()


# ---------------------------------------------------------------- socket hygiene

def test_stale_socket_file_is_replaced(sockdir, fake, open_channel):
    listen = f"{sockdir}/run/an.sock"
    os.makedirs(os.path.dirname(listen))
    s = socket.socket(socket.AF_UNIX)
    s.bind(listen)  # bound, never listening, then closed: what a kill -9 leaves behind
    s.close()
    assert stat.S_ISSOCK(os.lstat(listen).st_mode)
    with InProcessProxy(make_config(sockdir, fake.socket_path, listen=listen)) as proxy:
        assert version(open_channel(proxy.address)).runtime_name == "fake-cri"


def test_second_instance_is_refused_and_first_keeps_serving(sockdir, fake, open_channel):
    with InProcessProxy(make_config(sockdir, fake.socket_path)) as first:
        data = config_dict(f"{sockdir}/second", fake.socket_path, listen=first.socket_path)
        second = SubprocessProxy(data, sockdir, name="second").start(wait=False)
        code = second.wait(20)
        assert code != 0
        assert (f"another anolisnuma instance (pid {os.getpid()}) is running on {first.socket_path} "
                f"(it holds {first.socket_path}.lock)") in second.stderr   # the first runs in this process
        assert version(open_channel(first.address)).runtime_name == "fake-cri"
        assert os.path.exists(first.socket_path)


def test_foreign_listener_on_the_path_is_refused(sockdir):
    path = f"{sockdir}/foreign.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.listen(1)
    try:
        with pytest.raises(ListenerError, match="another process is listening"):
            UnixListener(path).open()
        assert os.path.exists(path)
    finally:
        s.close()


def test_regular_file_on_the_path_is_not_replaced(sockdir):
    path = f"{sockdir}/not-a-socket"
    with open(path, "w") as f:
        f.write("precious")
    with pytest.raises(ListenerError, match="not a socket"):
        UnixListener(path).open()
    with open(path) as f:
        assert f.read() == "precious"


def test_default_socket_mode_is_0660(proxy):
    assert stat.S_IMODE(os.stat(proxy.socket_path).st_mode) == 0o660


def test_configured_socket_mode_is_applied(sockdir, fake, open_channel):
    with InProcessProxy(make_config(sockdir, fake.socket_path, socket_mode=0o600)) as proxy:
        assert stat.S_IMODE(os.stat(proxy.socket_path).st_mode) == 0o600
        assert version(open_channel(proxy.address)).runtime_name == "fake-cri"


def test_socket_parent_directory_is_created(sockdir, fake, open_channel):
    listen = f"{sockdir}/a/b/c/an.sock"
    with InProcessProxy(make_config(sockdir, fake.socket_path, listen=listen)) as proxy:
        assert os.path.isdir(f"{sockdir}/a/b/c")
        assert version(open_channel(proxy.address)).runtime_name == "fake-cri"
    assert not os.path.exists(listen)
