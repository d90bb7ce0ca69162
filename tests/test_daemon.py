"""Which hooks the daemon builds, and what happens when one cannot start."""

from __future__ import annotations

import json
import os

import pytest

from anolisnuma.config import Config, HookSettings, HooksConfig, PathsConfig
from anolisnuma.daemon import HookUnavailable, build_hooks
from anolisnuma.policies.numa.config import NumaConfig
from anolisnuma.policies.qos.config import QosConfig
from anolisnuma.testing.waiting import wait_until


def _config(tmp_path, numa_policy: str = "ignore") -> Config:
    # A sys root without any NUMA topology: the NUMA hook cannot read one.
    empty = tmp_path / "empty"
    empty.mkdir()
    paths = PathsConfig(cgroup_root=str(empty), resctrl_root=str(empty / "resctrl"), sys_root=str(empty / "nosys"),
                        proc_root=str(empty), state_dir=str(tmp_path / "state"),
                        kubelet_cpu_manager_state=str(empty / "cpu_manager_state"))
    return Config(paths=paths, qos=QosConfig(enabled=False), numa=NumaConfig(enabled=True),
                  hooks=HooksConfig(per_hook={"numa": HookSettings(failure_policy=numa_policy)}))


def test_a_hook_that_cannot_start_is_left_out_and_the_proxy_still_runs(tmp_path):
    assert not os.path.exists(tmp_path / "empty" / "nosys")
    assert build_hooks(_config(tmp_path)) == []


def test_a_fail_closed_hook_that_cannot_start_stops_the_daemon(tmp_path):
    with pytest.raises(HookUnavailable, match="numa"):
        build_hooks(_config(tmp_path, numa_policy="fail"))


def test_disabled_policies_build_no_hooks(tmp_path):
    cfg = _config(tmp_path)
    cfg.numa = NumaConfig(enabled=False)
    assert build_hooks(cfg) == []


def test_listen_backlog_is_kept_when_asyncio_serves_the_socket(sockdir):
    """UnixListener listens with a backlog of 1024; asyncio's create_unix_server listens
    again on the socket, with 100 unless told. With the event loop busy (not accepting),
    a burst of connections must all be queued by the kernel, not refused (EAGAIN)."""
    import socket
    import threading

    from anolisnuma.testing.proxy import InProcessProxy, make_config

    burst = 300
    with open("/proc/sys/net/core/somaxconn") as f:
        if int(f.read()) < burst:
            pytest.skip("net.core.somaxconn caps every backlog below the burst")
    proxy = InProcessProxy(make_config(sockdir, os.path.join(sockdir, "nobody.sock")), configure_logging=False)
    proxy.start()
    entered, release = threading.Event(), threading.Event()

    def hold_the_loop() -> None:
        entered.set()
        release.wait(10)

    clients = []
    try:
        assert proxy.daemon.listener.backlog >= burst
        proxy.call_in_loop(hold_the_loop)
        assert entered.wait(5)
        queued = 0
        for _ in range(burst):
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.setblocking(False)
            clients.append(c)
            try:
                c.connect(proxy.socket_path)
            except BlockingIOError:  # the accept queue is full
                break
            queued += 1
        assert queued == burst
    finally:
        release.set()
        for c in clients:
            c.close()
        proxy.stop()


# ---------------------------------------------------------------- start order, readiness, reload

class _PinHook:
    """A pre-hook on CreateContainer that pins, as the NUMA hook does."""

    name = "pin"

    def wants_pre(self, method: str) -> bool:
        return method == "CreateContainer"

    def wants_post(self, method: str) -> bool:
        return False

    def pre(self, call) -> None:
        call.request.config.linux.resources.cpuset_cpus = "3"
        call.mark_modified()

    def resync(self, pods, containers) -> None:
        pass

    def start(self) -> None:
        pass

    def close(self) -> None:
        pass


def _create_request():
    from cri_proto import api_pb2

    return api_pb2.CreateContainerRequest(pod_sandbox_id="a" * 64, config=api_pb2.ContainerConfig(
        metadata=api_pb2.ContainerMetadata(name="c"))).SerializeToString()


def test_the_socket_answers_before_the_hooks_are_built_and_no_call_passes_without_them(sockdir, monkeypatch):
    """The kubelet calls Version at its start and exits if it fails: the daemon listens
    first and builds its hooks after. A lifecycle call arriving meanwhile waits for them."""
    import threading

    import grpc

    from anolisnuma import daemon as daemon_module
    from anolisnuma.testing.fake_cri import FakeCri, runtime_path
    from anolisnuma.testing.proxy import InProcessProxy, make_config
    from cri_proto import api_pb2

    building, release = threading.Event(), threading.Event()

    def slow_build(config):
        building.set()
        assert release.wait(10)
        return [_PinHook()]

    monkeypatch.setattr(daemon_module, "build_hooks", slow_build)
    with FakeCri(f"{sockdir}/cri.sock", containers=0, sandboxes=0) as fake, \
            InProcessProxy(make_config(sockdir, fake.socket_path)) as proxy, \
            grpc.insecure_channel(proxy.address) as channel:
        assert building.wait(5)
        version = channel.unary_unary(runtime_path("Version"))
        assert version(api_pb2.VersionRequest().SerializeToString(), timeout=5)
        create = channel.unary_unary(runtime_path("CreateContainer")).future(_create_request(), timeout=10)
        wait_until(lambda: proxy.daemon.interceptor.calls_waiting_for_hooks == 1)
        assert fake.calls(runtime_path("CreateContainer")) == 0
        assert not proxy.daemon.ready
        release.set()
        assert create.result()
        forwarded = api_pb2.CreateContainerRequest.FromString(fake.last(runtime_path("CreateContainer")).request)
        assert forwarded.config.linux.resources.cpuset_cpus == "3"
        assert proxy.daemon.ready


def test_a_fail_closed_hook_that_cannot_start_refuses_waiting_calls_and_exits_1(sockdir, monkeypatch):
    import threading

    import grpc

    from anolisnuma import daemon as daemon_module
    from anolisnuma.testing.fake_cri import FakeCri, runtime_path
    from anolisnuma.testing.proxy import InProcessProxy, make_config

    building, release = threading.Event(), threading.Event()

    def failing_build(config):
        building.set()
        assert release.wait(10)
        raise HookUnavailable("hook numa cannot start: no topology")

    monkeypatch.setattr(daemon_module, "build_hooks", failing_build)
    with FakeCri(f"{sockdir}/cri.sock", containers=0, sandboxes=0) as fake:
        proxy = InProcessProxy(make_config(sockdir, fake.socket_path)).start()
        with grpc.insecure_channel(proxy.address) as channel:
            assert building.wait(5)
            create = channel.unary_unary(runtime_path("CreateContainer")).future(_create_request(), timeout=10)
            wait_until(lambda: proxy.daemon.interceptor.calls_waiting_for_hooks == 1)
            release.set()
            with pytest.raises(grpc.RpcError) as e:
                create.result()
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "no topology" in e.value.details()
        proxy.thread.join(10)
        assert proxy.stop() == 1
        assert fake.calls(runtime_path("CreateContainer")) == 0


def test_systemd_is_told_ready_once_the_socket_answers(sockdir):
    import socket

    import grpc

    from anolisnuma.testing.fake_cri import FakeCri, runtime_path
    from anolisnuma.testing.proxy import SubprocessProxy, config_dict
    from cri_proto import api_pb2

    notify_path = f"{sockdir}/notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify, \
            FakeCri(f"{sockdir}/cri.sock", containers=0, sandboxes=0) as fake:
        notify.bind(notify_path)
        notify.settimeout(15)
        proxy = SubprocessProxy(config_dict(sockdir, fake.socket_path), sockdir, env={"NOTIFY_SOCKET": notify_path})
        try:
            proxy.start(wait=False)
            message = notify.recv(4096).decode()
            assert "READY=1" in message.split("\n")
            with grpc.insecure_channel(proxy.address) as channel:  # ready means it answers
                assert channel.unary_unary(runtime_path("Version"))(
                    api_pb2.VersionRequest().SerializeToString(), timeout=5)
            proxy.signal()
            assert "STOPPING=1" in notify.recv(4096).decode()
            assert proxy.wait(15) == 0
        finally:
            proxy.stop()


def test_sighup_reloads_what_may_change_live_and_refuses_a_bad_file(sockdir):
    import signal

    from anolisnuma.testing.fake_cri import FakeCri
    from anolisnuma.testing.proxy import SubprocessProxy, config_dict, read_log, write_config

    with FakeCri(f"{sockdir}/cri.sock", containers=0, sandboxes=0) as fake:
        cfg = config_dict(sockdir, fake.socket_path)
        proxy = SubprocessProxy(cfg, sockdir).start()
        log_file = cfg["log"]["file"]

        def reloads():
            return [line for line in read_log(log_file) if "reload" in line.get("message", "")]

        try:
            changed = dict(cfg, log=dict(cfg["log"], level="debug"), server=dict(cfg["server"], listen="/run/x.sock",
                                                                                  buffer_bytes_total=80 << 20))
            write_config(proxy.config_path, changed)
            proxy.signal(signal.SIGHUP)
            wait_until(lambda: reloads())
            done = reloads()[-1]
            assert done["message"] == "configuration reloaded"
            assert done["applied"] == ["log.level", "server.buffer_bytes_total"]
            assert done["needs_restart"] == ["server.listen"]
            with open(proxy.config_path, "w") as f:
                f.write("[server\nbroken")
            proxy.signal(signal.SIGHUP)
            wait_until(lambda: len(reloads()) == 2)
            assert reloads()[-1]["message"] == "configuration reload refused; the running configuration stays"
            assert proxy.proc.poll() is None
        finally:
            proxy.stop()


def _unblock(path: str) -> None:
    """Open and close a writer on the FIFO at ``path``, so a reader blocked opening it goes
    on (nothing to do when nobody is)."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:   # ENXIO: no reader; or no FIFO there
        pass


@pytest.mark.parametrize("swap_in,kind", [("fifo", "a FIFO"), ("/dev/zero", "a character device")])
def test_a_reload_from_a_fifo_or_dev_zero_is_refused_while_the_relay_answers(sockdir, swap_in, kind):
    """A FIFO at the configuration's path froze the relay until something was written
    into it; a link to /dev/zero grew the daemon by a GiB every six seconds. Either is one
    refusal line now, the relay answers throughout, and the running configuration stays."""
    import resource
    import signal

    import grpc

    from anolisnuma.testing.fake_cri import FakeCri, runtime_path
    from anolisnuma.testing.proxy import SubprocessProxy, config_dict, read_log, write_config
    from cri_proto import api_pb2

    with FakeCri(f"{sockdir}/cri.sock", containers=0, sandboxes=0) as fake:
        cfg = config_dict(sockdir, fake.socket_path)
        proxy = SubprocessProxy(cfg, sockdir).start()
        # Code that reads /dev/zero whole must fail here, not take the machine's memory.
        resource.prlimit(proxy.proc.pid, resource.RLIMIT_AS, (4 << 30, 4 << 30))

        def reloads():
            return [line for line in read_log(cfg["log"]["file"]) if "reload" in line.get("message", "")]

        request = api_pb2.VersionRequest().SerializeToString()
        try:
            with grpc.insecure_channel(proxy.address) as channel:
                version = channel.unary_unary(runtime_path("Version"))
                assert version(request, timeout=5)
                os.remove(proxy.config_path)
                if swap_in == "fifo":
                    os.mkfifo(proxy.config_path)
                else:
                    os.symlink(swap_in, proxy.config_path)
                proxy.signal(signal.SIGHUP)
                assert version(request, timeout=10)
                wait_until(lambda: reloads())
                refused = reloads()[-1]
                assert refused["message"] == "configuration reload refused; the running configuration stays"
                assert refused["error"] == (f"cannot read configuration file {proxy.config_path}: "
                                            f"it is not a regular file ({kind})")
                os.remove(proxy.config_path)
                write_config(proxy.config_path, dict(cfg, log=dict(cfg["log"], level="debug")))
                proxy.signal(signal.SIGHUP)
                wait_until(lambda: len(reloads()) == 2)
                assert reloads()[-1]["message"] == "configuration reloaded"
                assert reloads()[-1]["applied"] == ["log.level"]   # against the configuration it started with
                assert version(request, timeout=5) and proxy.proc.poll() is None
        finally:
            _unblock(proxy.config_path)
            proxy.stop()


def test_a_reload_reads_the_file_off_the_event_loop_and_reloads_run_one_at_a_time(sockdir, monkeypatch):
    """The file is read and parsed on a thread: a read that takes its time (a slow disk,
    a huge file) holds no relayed call. A second reload waits for the first, so the
    newer file is applied last."""
    import threading

    import grpc

    from anolisnuma import config as config_module
    from anolisnuma.config import Config
    from anolisnuma.testing.fake_cri import FakeCri, runtime_path
    from anolisnuma.testing.proxy import InProcessProxy, config_dict, write_config
    from cri_proto import api_pb2

    read_toml = config_module.load_toml
    reading, release = [], threading.Event()

    def slow_read(path):
        reading.append(path)
        assert release.wait(10)
        return read_toml(path)

    with FakeCri(f"{sockdir}/cri.sock", containers=0, sandboxes=0) as fake:
        data = config_dict(sockdir, fake.socket_path)
        path = write_config(os.path.join(sockdir, "c.toml"), data)
        with InProcessProxy(Config.load(path)) as proxy, grpc.insecure_channel(proxy.address) as channel:
            monkeypatch.setattr(config_module, "load_toml", slow_read)
            write_config(path, dict(data, log=dict(data["log"], level="debug")))
            try:
                proxy.call_in_loop(proxy.daemon._on_sighup)
                proxy.call_in_loop(proxy.daemon._on_sighup)
                wait_until(lambda: reading)
                assert channel.unary_unary(runtime_path("Version"))(
                    api_pb2.VersionRequest().SerializeToString(), timeout=5)
                assert len(reading) == 1   # the second reload waits for the first
            finally:
                release.set()

            def reloaded():
                return [line for line in proxy.log_lines() if line.get("message") == "configuration reloaded"]

            wait_until(lambda: len(reloaded()) == 2)
            assert reading == [path, path]
            assert [line.get("applied") for line in reloaded()] == [["log.level"], None]
            assert proxy.daemon.config.log.level == "debug"


def test_the_admin_reload_of_a_fifo_is_refused_without_holding_the_event_loop(sockdir):
    import asyncio

    from anolisnuma.admin.server import CommandError
    from anolisnuma.config import Config
    from anolisnuma.testing.fake_cri import FakeCri
    from anolisnuma.testing.proxy import InProcessProxy, config_dict, write_config

    with FakeCri(f"{sockdir}/cri.sock", containers=0, sandboxes=0) as fake:
        path = write_config(os.path.join(sockdir, "c.toml"), config_dict(
            sockdir, fake.socket_path, extra={"admin": {"socket": os.path.join(sockdir, "admin.sock")}}))
        with InProcessProxy(Config.load(path)) as proxy:
            # the admin surface starts a moment after the CRI socket answers
            commands = wait_until(lambda: proxy.daemon.admin.commands, "the admin commands")
            os.remove(path)
            os.mkfifo(path)
            reload = asyncio.run_coroutine_threadsafe(commands.dispatch("reload", {}), proxy.loop)
            try:
                with pytest.raises(CommandError) as e:
                    reload.result(10)
            finally:
                _unblock(path)
            assert str(e.value) == ("reload refused, the running configuration stays: cannot read configuration "
                                    f"file {path}: it is not a regular file (a FIFO)")


@pytest.mark.parametrize("content", [
    '{"version": 1, "pods": ["x"]}',
    '{"version": 1, "pods": [{"sandbox_id": ["a"], "uid": "u", "name": "n", "namespace": "ns"}]}',
    '{"version": 1, "containers": [{"container_id": "c", "sandbox_id": "s", "name": "n", "resources": "x"}]}',
    '{"version": 1, "pods": [{"sandbox_id": "s", "uid": "u", "name": "n", "namespace": "ns", "labels": ["a"]}]}',
    '{"version": 1, "pods": {}}',
    None,   # a FIFO
], ids=["a pod is a string", "a sandbox_id is a list", "resources is a string", "labels is a list",
        "pods is an object", "a FIFO"])
def test_the_daemon_starts_whatever_its_state_file_holds(sockdir, content):
    """A store.json of the wrong shape made the daemon exit 1 once it listened (a crash
    loop under Restart=always, and a kubelet without a runtime), a FIFO held its start.
    The file is moved aside and the store rebuilt from containerd."""
    import grpc

    from anolisnuma.testing.fake_cri import FakeCri, runtime_path
    from anolisnuma.testing.proxy import SubprocessProxy, config_dict, read_log
    from cri_proto import api_pb2

    with FakeCri(f"{sockdir}/cri.sock", containers=0, sandboxes=1) as fake:
        cfg = config_dict(sockdir, fake.socket_path)
        state_dir = cfg["paths"]["state_dir"]
        path = os.path.join(state_dir, "store.json")
        os.makedirs(state_dir, mode=0o700)
        if content is None:
            os.mkfifo(path)
        else:
            with open(path, "w") as f:
                f.write(content)
        proxy = SubprocessProxy(cfg, sockdir).start()

        def rebuilt():
            try:
                with open(path) as f:
                    return [p["sandbox_id"] for p in json.load(f)["pods"]] == fake.sandbox_ids()
            except (OSError, ValueError):
                return False

        try:
            with grpc.insecure_channel(proxy.address) as channel:
                assert channel.unary_unary(runtime_path("Version"))(
                    api_pb2.VersionRequest().SerializeToString(), timeout=10)
            wait_until(rebuilt)
            errors = [line for line in read_log(cfg["log"]["file"]) if line.get("level") == "error"]
            assert [(e["message"], e["path"]) for e in errors] == [
                ("state file is corrupt; moved aside, rebuilding from containerd", path)]
            assert os.path.basename(errors[0]["moved_to"]) in os.listdir(state_dir)
            assert proxy.proc.poll() is None
        finally:
            _unblock(path)
            proxy.stop()


def test_sigusr1_reopens_the_log_file_after_rotation(sockdir):
    import signal

    from anolisnuma.testing.fake_cri import FakeCri
    from anolisnuma.testing.proxy import SubprocessProxy, config_dict, read_log

    with FakeCri(f"{sockdir}/cri.sock", containers=0, sandboxes=0) as fake:
        cfg = config_dict(sockdir, fake.socket_path)
        proxy = SubprocessProxy(cfg, sockdir).start()
        log_file = cfg["log"]["file"]
        try:
            wait_until(lambda: read_log(log_file))
            os.rename(log_file, log_file + ".1")  # logrotate's rename, then its postrotate
            proxy.signal(signal.SIGUSR1)
            wait_until(lambda: os.path.exists(log_file))
            proxy.signal(signal.SIGHUP)  # any line: it must land in the new file
            wait_until(lambda: any("reload" in line.get("message", "") for line in read_log(log_file)))
        finally:
            proxy.stop()
