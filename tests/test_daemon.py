"""Which hooks the daemon builds, and what happens when one cannot start."""

from __future__ import annotations

import os

import pytest

from anolisnuma.config import Config, HookSettings, HooksConfig, PathsConfig
from anolisnuma.daemon import HookUnavailable, build_hooks
from anolisnuma.policies.numa.config import NumaConfig
from anolisnuma.policies.qos.config import QosConfig


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
