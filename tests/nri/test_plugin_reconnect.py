"""The NRI plugin while containerd is away, over the fake runtime: a socket made again is
tried at once whatever the backoff grew to, a socket that is there but refuses keeps the
backoff; live moves wait for the registration (``ready``), which wakes the re-pinner, and
then leave through NRI, not CRI. The real containerd's twin is
tests/e2e/test_nri_e2e.py::test_nri_registers_within_a_second_of_containerds_socket_coming_back."""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any, List, Tuple

from anolisnuma.nri import door
from anolisnuma.nri.config import NriConfig
from anolisnuma.nri.plugin import NriPlugin
from anolisnuma.reconcile.numa import CpusetRepinner
from anolisnuma.testing.nri_runtime import FakeNriRuntime
from anolisnuma.testing.waiting import wait_until

from test_plugin import CriClient, Recorder


def plugin_on(path: str, loop: Any, **kw: Any) -> NriPlugin:
    return NriPlugin(NriConfig(enabled=True, socket=path, reconnect_max_seconds=300), Recorder(), loop=loop, **kw)


def test_a_socket_made_again_is_tried_at_once_whatever_the_backoff(tmp_path, nri_loop, monkeypatch):
    monkeypatch.setattr("anolisnuma.nri.plugin.FIRST_RETRY_SECONDS", 30.0)
    path = str(tmp_path / "nri.sock")
    plugin = plugin_on(path, nri_loop)
    plugin.start()
    plugin.wake()
    runtime = None
    try:
        # (the delay is set just after the failure is counted: waited for itself)
        backoff = wait_until(lambda: plugin.describe()["retry_in_seconds"], "a failed connect: nothing listens")
        assert backoff >= 24 and plugin.n["connect_failures"] == 1   # 30 s, give or take 20 %
        made = time.monotonic()
        runtime = FakeNriRuntime(path).start()   # containerd back: its socket bound
        assert runtime.registered.wait(backoff / 2), "not before the backoff: the socket was not watched"
        took = time.monotonic() - made
        wait_until(lambda: plugin.n["registrations"] == 1, "registered on the plugin's side")
        assert took < backoff / 20, (took, backoff)   # the poll's 0.1 s and a registration, not 30 s
        assert plugin.n["connect_failures"] == 1 and plugin.describe()["retry_in_seconds"] is None
    finally:
        plugin.stop()
        if runtime is not None:
            runtime.close()


def test_a_socket_that_is_there_but_refuses_keeps_the_backoff(tmp_path, nri_loop, monkeypatch):
    monkeypatch.setattr("anolisnuma.nri.plugin.FIRST_RETRY_SECONDS", 1.0)
    path = str(tmp_path / "nri.sock")
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(path)   # bound, never listened on: what a kill -9 of containerd leaves behind
    stale.close()
    tries: List[float] = []
    real = door.connect
    monkeypatch.setattr(door, "connect", lambda p, t: (tries.append(time.monotonic()), real(p, t))[1])
    plugin = plugin_on(path, nri_loop)
    plugin.start()
    plugin.wake()
    try:
        wait_until(lambda: len(tries) >= 3 and plugin.n["connect_failures"] >= 3
                   and "Connection refused" in plugin.last_error, "three refused connects", timeout=60)
        # the delays are at least 1 s and 2 s, less 20 % of jitter (not compounded from one to the
        # next): the poll never cut them short
        assert tries[1] - tries[0] >= 0.8 and tries[2] - tries[1] >= 1.6, [b - a for a, b in zip(tries, tries[1:])]
    finally:
        plugin.stop()


def test_stop_ends_the_pause_at_once(tmp_path, nri_loop, monkeypatch):
    monkeypatch.setattr("anolisnuma.nri.plugin.FIRST_RETRY_SECONDS", 300.0)
    plugin = plugin_on(str(tmp_path / "absent.sock"), nri_loop)
    plugin.start()
    plugin.wake()
    wait_until(lambda: plugin.n["connect_failures"] == 1, "a failed connect")
    started = time.monotonic()
    plugin.stop()
    assert not plugin.running and time.monotonic() - started < 5   # not the 300 s pause


class Placement:
    """The re-pinner's side of the placement service: one container to re-pin."""

    def __init__(self, pending: List[Tuple[str, str, str]]) -> None:
        self.pending = list(pending)
        self.applied: List[str] = []
        self.failed: List[str] = []

    def pending_updates(self) -> List[Tuple[str, str, str]]:
        return list(self.pending)

    def mark_applied(self, cid: str, cpus: str, mems: str) -> None:
        self.applied.append(cid)
        self.pending = [u for u in self.pending if u[0] != cid]

    def apply_failed(self, cid: str, error: str) -> bool:
        self.failed.append(cid)
        return False


def test_the_repinner_waits_for_the_registration_then_sends_through_nri(tmp_path, nri_loop):
    """After a restart: the re-pins of what was adopted wait for the plugin (not CRI updates
    sent before it registers); its registration wakes the re-pinner; they leave as
    UpdateContainers."""
    path = str(tmp_path / "nri.sock")
    placement, cri_client = Placement([("c1", "1", "0")]), CriClient()
    repinner = CpusetRepinner(placement, cri_client)
    plugin = plugin_on(path, nri_loop, fallback=cri_client, on_registered=repinner.wake)
    repinner.client = plugin   # as the daemon wires it, before the re-pinner's first pass
    assert not plugin.ready()
    assert repinner.step() == 0   # the first pass: nothing sent, nothing failed, still pending
    assert (placement.applied, placement.failed, cri_client.updates) == ([], [], [])
    assert repinner.counts() == {"applied": 0, "failed": 0, "gone": 0, "deferred": 1}
    runtime = FakeNriRuntime(path).start()
    repinner.start()
    plugin.start()
    plugin.wake()
    try:
        wait_until(lambda: placement.applied == ["c1"], "the re-pin applied once registered")
        assert plugin.ready() and plugin.n["updates_sent"] == 1 and plugin.n["updates_via_cri"] == 0
        method, req = runtime.requests[-1]
        assert method == "UpdateContainers" and req.update[0].container_id == "c1"
        assert cri_client.updates == []
    finally:
        repinner.stop()
        plugin.stop()
        runtime.close()


def test_past_the_wait_live_moves_go_through_cri(tmp_path, nri_loop, monkeypatch):
    """NRI never registers (off in containerd, say): the re-pins are not held for ever."""
    monkeypatch.setattr("anolisnuma.nri.plugin.WAIT_FOR_REGISTRATION", 0.0)
    placement, cri_client = Placement([("c1", "1", "0")]), CriClient()
    plugin = plugin_on(str(tmp_path / "absent.sock"), nri_loop, fallback=cri_client)
    repinner = CpusetRepinner(placement, plugin)
    assert plugin.ready() and repinner.step() == 1
    assert cri_client.updates == [("c1", "1")] and plugin.n["updates_via_cri"] == 1


def test_a_socket_another_user_keeps_making_again_does_not_make_it_try_faster(tmp_path, nri_loop, monkeypatch):
    """Hostile: whoever may write in the socket's directory is refused (test_plugin.py); the
    watch must not let them make the plugin try, and log a refusal, at the poll's rate."""
    monkeypatch.setattr("anolisnuma.nri.plugin.FIRST_RETRY_SECONDS", 1.0)
    d = tmp_path / "nri"
    d.mkdir()
    os.chmod(d, 0o777)
    path = str(d / "nri.sock")
    tries: List[float] = []
    real = door.connect
    monkeypatch.setattr(door, "connect", lambda p, t: (tries.append(time.monotonic()), real(p, t))[1])
    stop = threading.Event()

    def churn() -> None:   # a new socket at the path every 20 ms
        while not stop.is_set():
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.bind(path)
            s.listen(1)
            stop.wait(0.02)
            s.close()

    churner = threading.Thread(target=churn, daemon=True)
    churner.start()
    plugin = plugin_on(path, nri_loop)
    plugin.start()
    plugin.wake()
    try:
        wait_until(lambda: plugin.n["connect_refused_untrusted"] >= 3, "three refusals", timeout=60)
        assert tries[1] - tries[0] >= 0.8 and tries[2] - tries[1] >= 1.6, [b - a for a, b in zip(tries, tries[1:])]
        assert plugin.n["connects"] == 0
    finally:
        stop.set()
        churner.join()
        plugin.stop()
