"""CriClient's guarantees against the fake CRI backend's fault injection: a deadline on
every call, the message size cap both ways, a clear error when containerd cannot be
reached, close() releasing the connection, and grpc's C core in the daemon's process (its
threads in the census, kept running once started, and what happens with no thread to be
had)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
import time

import grpc
import pytest

from anolisnuma.cri.client import CallError, CriClient
from anolisnuma.testing.daemon_probes import wait_until
from anolisnuma.testing.fake_cri import FakeCri, runtime_path
from anolisnuma.workers import census
from cri_proto import api_pb2

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VERSION = runtime_path("Version")
CID = "c" * 64
PIDS_ROOT = "/sys/fs/cgroup/pids"


@pytest.fixture
def fake(sockdir):
    with FakeCri(os.path.join(sockdir, "cri.sock"), containers=5, sandboxes=5) as f:
        yield f


def _socket_fds() -> int:
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                n += 1
        except OSError:
            pass
    return n


def test_every_call_carries_the_deadline(fake):
    with CriClient(fake.socket_path, timeout_seconds=7.0) as c:
        c.version()
        c.list_pod_sandboxes()
        c.list_containers()
        c.pod_sandbox_status(fake.sandbox_ids()[0])
        c.container_status(fake.container_ids()[0])
        c.update_container_resources(CID, api_pb2.LinuxContainerResources(cpuset_cpus="0"))
    for method in ("Version", "ListPodSandbox", "ListContainers", "PodSandboxStatus", "ContainerStatus",
                   "UpdateContainerResources"):
        seen = fake.last(runtime_path(method)).time_remaining
        # (grpc-timeout is sent in whole units: the fake may see a few ms more)
        assert seen is not None and 0 < seen <= 7.1, (method, seen)


def test_a_stalled_containerd_fails_the_call_at_its_deadline_and_the_next_call_works(fake):
    fake.set_delay(VERSION, 60.0)
    with CriClient(fake.socket_path, timeout_seconds=0.5) as c:
        t0 = time.monotonic()
        with pytest.raises(CallError) as err:
            c.version()
        took = time.monotonic() - t0
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert 0.5 <= took < 30.0                 # the deadline, not the fake's minute
        assert fake.last(VERSION).time_remaining <= 0.6   # containerd was told it too
        fake.set_delay(VERSION, 0)
        link = c._link
        assert c.version().runtime_name == "fake-cri"
        assert c._link is link                    # a deadline does not cost the connection


@pytest.mark.parametrize("what", ["absent", "stale socket", "not a socket"])
def test_an_unreachable_containerd_fails_fast_saying_where(sockdir, what):
    path = os.path.join(sockdir, "containerd.sock")
    if what == "stale socket":    # left by a containerd that died: nobody listens
        s = socket.socket(socket.AF_UNIX)
        s.bind(path)
        s.close()
    elif what == "not a socket":
        open(path, "w").close()
    with CriClient(path, timeout_seconds=60.0) as c:
        t0 = time.monotonic()
        with pytest.raises(CallError) as err:
            c.version()
        assert time.monotonic() - t0 < 30.0       # fails fast, not at the deadline
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert path in err.value.details() and str(err.value).startswith("UNAVAILABLE: ")


def test_a_reply_over_the_limit_fails_and_the_client_goes_on(fake):
    big = api_pb2.ListContainersResponse()
    for i in range(300):
        big.containers.add(id="%064x" % i).annotations["blob"] = "x" * 4096
    fake.set_reply(runtime_path("ListContainers"), big)
    with CriClient(fake.socket_path, max_message_bytes=256 * 1024, timeout_seconds=10.0) as c:
        with pytest.raises(CallError) as err:
            c.list_containers()
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert c.version().runtime_name == "fake-cri"
    with CriClient(fake.socket_path, max_message_bytes=2 * 1024 * 1024, timeout_seconds=10.0) as c:
        assert len(c.list_containers()) == 300


def test_a_request_over_the_limit_is_not_sent(fake):
    path = runtime_path("UpdateContainerResources")
    with CriClient(fake.socket_path, max_message_bytes=64 * 1024, timeout_seconds=10.0) as c:
        with pytest.raises(CallError) as err:
            c.update_container_resources(CID, api_pb2.LinuxContainerResources(), {"a": "x" * 100_000})
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert fake.calls(path) == 0
        c.update_container_resources(CID, api_pb2.LinuxContainerResources(), {"a": "b"})
        assert fake.calls(path) == 1


def test_a_reply_that_does_not_decode_is_internal(fake):
    fake.set_reply(VERSION, b"\xff\xff\xff")
    with CriClient(fake.socket_path, timeout_seconds=10.0) as c:
        with pytest.raises(CallError) as err:
            c.version()
    assert err.value.code() == grpc.StatusCode.INTERNAL and "Version" in err.value.details()


def test_containerd_errors_keep_their_code_and_details(fake):
    fake.set_error(runtime_path("ContainerStatus"), grpc.StatusCode.NOT_FOUND, "container \"x\" not found")
    with CriClient(fake.socket_path, timeout_seconds=10.0) as c:
        with pytest.raises(CallError) as err:
            c.container_status("x")
    assert err.value.code().name == "NOT_FOUND" and err.value.details() == 'container "x" not found'
    assert isinstance(err.value, grpc.RpcError)


def test_close_releases_the_connection_and_cancels_a_call_in_flight(fake):
    before = _socket_fds()
    c = CriClient(fake.socket_path, timeout_seconds=60.0)
    c.version()
    assert _socket_fds() > before
    fake.set_delay(VERSION, 60.0)
    outcome = []

    def stalled() -> None:
        try:
            c.version()
            outcome.append("answered")
        except CallError as e:
            outcome.append(e.code().name)

    t = threading.Thread(target=stalled)
    t.start()
    fake.wait_for_calls(VERSION, 2, timeout=30.0)
    c.close()
    t.join(30.0)
    assert outcome == ["CANCELLED"]
    with pytest.raises(CallError) as err:
        c.version()
    assert err.value.code() == grpc.StatusCode.CANCELLED
    wait_until(lambda: _socket_fds() <= before, "the client's connection to be closed", 30.0)
    c.close()


def test_the_client_follows_a_restart_at_once_with_threads_sharing_it(fake):
    with CriClient(fake.socket_path, timeout_seconds=10.0) as c:
        assert c.version().runtime_name == "fake-cri"
        fake.stop(0)
        codes = set()

        def call() -> None:
            try:
                c.version()
                codes.add("OK")
            except CallError as e:
                codes.add(e.code().name)

        threads = [threading.Thread(target=call) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30.0)
        assert codes == {"UNAVAILABLE"}
        fake.start()
        t0 = time.monotonic()
        assert c.version().runtime_name == "fake-cri"   # no reconnect backoff to wait out
        assert time.monotonic() - t0 < 30.0


def test_grpc_core_threads_are_in_the_census_and_stay_after_a_client_closes(fake):
    with CriClient(fake.socket_path, timeout_seconds=10.0) as c:
        c.version()
    native = census()["native"]
    assert native.get("grpc_global_tim", 0) >= 1 and native.get("event_engine", 0) >= 1, native


def test_the_daemon_package_never_forks():
    """grpc's fork support is off (GRPC_ENABLE_FORK_SUPPORT unset): a fork after the first
    channel would leave the child with the core's locks but not its threads. The daemon
    runs no subprocess; only anolisnuma-ctl (ctl/, its own process) and the test helpers do.
    (The daemon imports ctl/kubelet/ for its readers of the kubelet's files, inspect and
    cgroup_settings, which run no subprocess; probe.py and cli.py there serve
    ``anolisnuma-ctl kubelet enable``.)"""
    found = []
    pkg = os.path.join(REPO, "anolisnuma")
    for root, dirs, files in os.walk(pkg):
        rel = os.path.relpath(root, pkg)
        if rel.split(os.sep)[0] in ("ctl", "testing"):
            continue
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(root, name)) as f:
                    text = f.read()
                for word in ("import subprocess", "os.fork(", "multiprocessing", "os.posix_spawn", "os.system("):
                    if word in text:
                        found.append((os.path.join(rel, name), word))
    assert found == []


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.isdir(PIDS_ROOT), reason="needs root and the cgroup v1 pids hierarchy")
def test_once_a_client_was_made_new_clients_need_no_thread(fake, tmp_path):
    """With no thread to be had (a full pids cgroup), grpc's core aborts the process when it
    has to start its threads. The first client starts them and keeps them: clients made
    later (a resync pass, the status probe) call containerd without a new thread."""
    script = tmp_path / "held.py"
    script.write_text(textwrap.dedent(f"""
        import os, sys
        from anolisnuma.cri.client import CriClient
        cg = sys.argv[1]
        CriClient({fake.socket_path!r}).version()   # the daemon's start-up resync
        os.mkdir(cg)
        try:
            with open(os.path.join(cg, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
            with open(os.path.join(cg, "pids.current")) as f:
                held = f.read().strip()
            with open(os.path.join(cg, "pids.max"), "w") as f:
                f.write(held)
            for _ in range(5):
                with CriClient({fake.socket_path!r}, timeout_seconds=10.0) as c:
                    c.version()
                    c.list_containers()
            print("ok", held, flush=True)
        finally:
            with open(os.path.join(cg, "pids.max"), "w") as f:
                f.write("max")
            with open(os.path.join({PIDS_ROOT!r}, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
            os.rmdir(cg)
    """))
    cg = os.path.join(PIDS_ROOT, f"anolisnuma-test-{os.getpid()}-{time.monotonic_ns()}")
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.run([sys.executable, str(script), cg], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith(b"ok"), proc.stderr.decode()[-2000:]
    assert b"pthread_create failed" not in proc.stderr
    assert fake.calls(VERSION) == 6
