"""The NRI plugin over a fake runtime that speaks and reads as containerd does
(anolisnuma/testing/nri_runtime.py): registration, Configure, a split Synchronize, the
events handed to the front-end, errors answered as containerd expects, live moves through
UpdateContainers (through CRI while not registered), reconnects; and a hostile runtime.
The front-end here is a recorder: the real one is tests/nri/test_frontend.py's and, on the
real containerd, tests/e2e/test_nri_e2e.py's."""

from __future__ import annotations

import os
import threading
from typing import Any, Iterator, List, Tuple

import pytest

from anolisnuma.nri.config import NriConfig
from anolisnuma.nri.frontend import EVENT_METHODS
from anolisnuma.nri.plugin import EVENT_MASK, NriPlugin
from anolisnuma.nri.session import NriRequestError
from anolisnuma.testing.nri_runtime import FakeNriRuntime
from anolisnuma.testing.waiting import wait_until
from cri_proto import api_pb2 as cri
from nri_proto import api_pb2 as nri


class Recorder:
    """What the plugin handed on; ``fail`` makes the next event raise it."""

    def __init__(self) -> None:
        self.timeout = 2.0
        self.calls: List[Tuple[str, Any]] = []
        self.fail: Any = None

    def fit_to(self, request_timeout: float) -> None:
        self.timeout = request_timeout * 0.9

    def events(self) -> Tuple[int, ...]:
        return tuple(EVENT_METHODS)

    def _note(self, name: str, *args: Any) -> None:
        self.calls.append((name, args))
        if self.fail is not None:
            raise self.fail

    def run_pod_sandbox(self, pod: Any) -> None:
        self._note("run_pod_sandbox", pod.id)

    def create_container(self, pod: Any, ctr: Any) -> Any:
        self._note("create_container", pod.id, ctr.id)
        adjust = nri.ContainerAdjustment()
        adjust.linux.resources.cpu.cpus = "1"
        return adjust

    def start_container(self, ctr: Any) -> None:
        self._note("start_container", ctr.id)

    def update_container(self, ctr: Any, res: Any) -> Any:
        self._note("update_container", ctr.id, res.cpu.cpus)
        return None

    def stop_container(self, ctr: Any) -> None:
        self._note("stop_container", ctr.id)

    def remove_container(self, ctr: Any) -> None:
        self._note("remove_container", ctr.id)

    def stop_pod_sandbox(self, pod: Any) -> None:
        self._note("stop_pod_sandbox", pod.id)

    def remove_pod_sandbox(self, pod: Any) -> None:
        self._note("remove_pod_sandbox", pod.id)


class CriClient:
    def __init__(self) -> None:
        self.updates: List[Tuple[str, str]] = []
        self.closed = False

    def close(self) -> None:
        self.closed = True

    def update_container_resources(self, cid: str, res: Any) -> None:
        self.updates.append((cid, res.cpuset_cpus))


class Garbage:
    """Stands for a request whose bytes are not the message the method takes."""

    def SerializeToString(self) -> bytes:
        return b"\x0a\xff\xff\xff\xff\x0f"


@pytest.fixture
def setup(tmp_path, nri_loop) -> Iterator[Tuple[FakeNriRuntime, NriPlugin, Recorder, List[int], CriClient]]:
    path = str(tmp_path / "nri.sock")
    runtime = FakeNriRuntime(path).start()
    synced: List[int] = []
    fe, cri_client = Recorder(), CriClient()
    plugin = NriPlugin(NriConfig(enabled=True, socket=path, reconnect_max_seconds=0.5), fe,
                       on_synchronize=lambda: synced.append(1), fallback=cri_client, loop=nri_loop)
    plugin.start()
    plugin.wake()
    try:
        assert runtime.registered.wait(10)
        # registered on the plugin's side too: the runtime notes the call before it answers,
        # and a test that closes the runtime in between would see a failed registration,
        # not a disconnect
        wait_until(lambda: plugin.n["registrations"] == 1, "the plugin registered")
        yield runtime, plugin, fe, synced, cri_client
    finally:
        plugin.stop()
        runtime.close()
    assert runtime.violations == []   # nothing sent that containerd's reader would fail on


def configure(runtime: FakeNriRuntime) -> Any:
    return runtime.call_plugin("Configure", nri.ConfigureRequest(runtime_name="containerd", runtime_version="v2.2.7",
                                                                  registration_timeout=5000, request_timeout=2000),
                               nri.ConfigureResponse)


def test_registers_subscribes_and_takes_the_runtimes_timeout(setup):
    runtime, plugin, fe, _, _ = setup
    method, req = runtime.requests[0]
    assert method == "RegisterPlugin" and (req.plugin_name, req.plugin_idx) == ("anolisnuma", "50")
    reply = configure(runtime)
    assert reply.events == EVENT_MASK
    subscribed = {e for e in range(1, nri.LAST) if reply.events & (1 << (e - 1))}
    assert subscribed == {nri.RUN_POD_SANDBOX, nri.STOP_POD_SANDBOX, nri.REMOVE_POD_SANDBOX, nri.CREATE_CONTAINER,
                          nri.START_CONTAINER, nri.UPDATE_CONTAINER, nri.STOP_CONTAINER, nri.REMOVE_CONTAINER}
    assert fe.timeout == pytest.approx(1.8)   # within containerd's 2 s, with room to answer
    assert plugin.runtime == "containerd v2.2.7" and plugin.counts()["connected"] == 1


def test_configure_subscribes_to_the_front_ends_events_only(setup):
    runtime, plugin, fe, _, _ = setup
    fe.events = lambda: (nri.RUN_POD_SANDBOX, nri.CREATE_CONTAINER, nri.REMOVE_CONTAINER)
    reply = configure(runtime)
    assert reply.events == (1 << (nri.RUN_POD_SANDBOX - 1)) | (1 << (nri.CREATE_CONTAINER - 1)) | (
        1 << (nri.REMOVE_CONTAINER - 1))


# NRI v0.8.0's last event (pkg/api: Event_LAST = 12), the NRI containerd 1.7 vendors
NRI_V080_LAST_EVENT = 11


def test_the_event_mask_subscribes_to_nothing_nri_v0_8_0_does_not_know():
    """containerd 1.7 (v1.7.34, the release many nodes run) vendors NRI v0.8.0, which knows
    events 1-11 only (RunPodSandbox ... RemoveContainer) and refuses a plugin whose Configure
    reply subscribes past them ("invalid plugin events: 0x..."): the plugin never registers
    and NRI mode places nothing on that node. UpdatePodSandbox (12), PostUpdatePodSandbox
    (13) and ValidateContainerAdjustment (14) came with later NRI (2.x vendors v0.11.0):
    subscribing to any of them would work on 2.2 and break every 1.7 node. The real
    registration on 1.7 is tests/e2e/test_nri_e2e.py's, run on the 1.7 build."""
    assert nri.REMOVE_CONTAINER == NRI_V080_LAST_EVENT   # our proto numbers events as NRI does
    v080_valid = (1 << NRI_V080_LAST_EVENT) - 1          # v0.8.0's ValidEvents: (1 << (LAST - 1)) - 1
    assert EVENT_MASK & ~v080_valid == 0, hex(EVENT_MASK & ~v080_valid)
    for later in (nri.UPDATE_POD_SANDBOX, nri.POST_UPDATE_POD_SANDBOX, nri.VALIDATE_CONTAINER_ADJUSTMENT):
        assert not EVENT_MASK & (1 << (later - 1)), nri.Event.Name(later)


def test_split_synchronize_echoes_more_and_resyncs_once(setup):
    runtime, plugin, _, synced, _ = setup
    configure(runtime)
    part = nri.SynchronizeRequest(pods=[nri.PodSandbox(id="p1")], more=True)
    assert runtime.call_plugin("Synchronize", part, nri.SynchronizeResponse) == nri.SynchronizeResponse(more=True)
    assert synced == []
    last = nri.SynchronizeRequest(containers=[nri.Container(id="c1")])
    reply = runtime.call_plugin("Synchronize", last, nri.SynchronizeResponse)
    assert not reply.more and not len(reply.update)
    assert synced == [1] and plugin.n["synchronizes"] == 1


def test_events_reach_the_front_end_and_the_adjustment_comes_back(setup):
    runtime, plugin, fe, _, _ = setup
    pod = nri.PodSandbox(id="sb1", uid="u1", name="web", namespace="ns")
    ctr = nri.Container(id="c1", pod_sandbox_id="sb1", name="main")
    runtime.call_plugin("StateChange", nri.StateChangeEvent(event=nri.RUN_POD_SANDBOX, pod=pod), nri.Empty)
    reply = runtime.call_plugin("CreateContainer", nri.CreateContainerRequest(pod=pod, container=ctr),
                                nri.CreateContainerResponse)
    assert reply.adjust.linux.resources.cpu.cpus == "1"
    for event in (nri.POST_CREATE_CONTAINER, nri.START_CONTAINER, nri.POST_START_CONTAINER):
        runtime.call_plugin("StateChange", nri.StateChangeEvent(event=event, pod=pod, container=ctr), nri.Empty)
    res = nri.LinuxResources()
    res.cpu.cpus = "0-1"
    runtime.call_plugin("UpdateContainer", nri.UpdateContainerRequest(pod=pod, container=ctr, linux_resources=res),
                        nri.UpdateContainerResponse)
    runtime.call_plugin("StopContainer", nri.StopContainerRequest(pod=pod, container=ctr), nri.StopContainerResponse)
    for event in (nri.REMOVE_CONTAINER, nri.STOP_POD_SANDBOX, nri.REMOVE_POD_SANDBOX):
        runtime.call_plugin("StateChange", nri.StateChangeEvent(event=event, pod=pod, container=ctr), nri.Empty)
    assert [c[0] for c in fe.calls] == ["run_pod_sandbox", "create_container", "start_container", "update_container",
                                        "stop_container", "remove_container", "stop_pod_sandbox",
                                        "remove_pod_sandbox"]   # the Post* events are not ours
    assert fe.calls[3][1] == ("c1", "0-1")
    assert plugin.n["events"] == 8


def test_a_refusal_is_the_calls_status_and_a_bug_is_internal(setup):
    runtime, plugin, fe, _, _ = setup
    pod = nri.PodSandbox(id="sb1")
    fe.fail = NriRequestError(8, "anolisnuma hook numa: no room")
    with pytest.raises(NriRequestError) as e:
        runtime.call_plugin("CreateContainer", nri.CreateContainerRequest(pod=pod, container=nri.Container(id="c")),
                            nri.CreateContainerResponse)
    assert e.value.code == 8 and "no room" in str(e.value)
    # a bug is the event's alone, and the event passes as if anolisnuma were not there
    fe.fail = KeyError("secret internals")
    assert runtime.call_plugin("StateChange", nri.StateChangeEvent(event=nri.RUN_POD_SANDBOX, pod=pod),
                               nri.Empty) == nri.Empty()
    assert (plugin.n["events_refused"], plugin.n["events_failed"], plugin.n["events_passed_on"]) == (1, 1, 1)
    assert plugin.connected   # the session goes on


def test_malformed_requests_are_refused_and_change_nothing(setup):
    runtime, plugin, fe, _, _ = setup
    for method in ("CreateContainer", "StateChange", "Configure", "Synchronize"):
        with pytest.raises(NriRequestError) as e:
            runtime.call_plugin(method, Garbage(), nri.Empty)   # type: ignore[arg-type]
        assert e.value.code == 3, method   # INVALID_ARGUMENT
    with pytest.raises(NriRequestError) as e:
        runtime.call_plugin("ValidateContainerAdjustment", nri.ValidateContainerAdjustmentRequest(),
                            nri.ValidateContainerAdjustmentResponse)
    assert e.value.code == 12   # not a validator: UNIMPLEMENTED
    assert fe.calls == [] and plugin.connected


def test_live_moves_go_through_update_containers_and_through_cri_when_not_registered(setup):
    runtime, plugin, _, _, cri_client = setup
    plugin.update_container_resources("c1", cri.LinuxContainerResources(cpuset_cpus="1", cpuset_mems="0"))
    method, req = runtime.requests[-1]
    assert method == "UpdateContainers"
    (update,) = req.update
    assert (update.container_id, update.linux.resources.cpu.cpus, update.linux.resources.cpu.mems) == ("c1", "1", "0")
    assert not update.linux.resources.HasField("memory")   # only the cpuset: the rest stays as it is
    runtime.update_error = (5, "no such container")
    with pytest.raises(NriRequestError):
        plugin.update_container_resources("gone", cri.LinuxContainerResources(cpuset_cpus="1"))
    assert plugin.n["updates_failed"] == 1 and cri_client.updates == []
    runtime.close()
    wait_until(lambda: not plugin.connected, "the plugin saw the runtime go")
    plugin.update_container_resources("c2", cri.LinuxContainerResources(cpuset_cpus="0"))
    assert cri_client.updates == [("c2", "0")] and plugin.n["updates_via_cri"] == 1
    plugin.close()   # the re-pinner's close at shutdown: the fallback's connection closed
    assert cri_client.closed


def test_reconnects_with_backoff_when_the_runtime_comes_back(setup, tmp_path):
    runtime, plugin, _, _, _ = setup
    runtime.close()
    wait_until(lambda: plugin.n["disconnects"] == 1, "the disconnect seen")
    wait_until(lambda: plugin.n["connect_failures"] >= 2, "a few attempts while nothing listens")
    again = FakeNriRuntime(runtime.path).start()
    try:
        assert again.registered.wait(10)
        wait_until(lambda: plugin.n["registrations"] == 2 and plugin.connected, "registered again")
        assert plugin.last_error == ""   # the status no longer lists the old failure
        assert configure(again).events == EVENT_MASK
    finally:
        again.close()


def test_a_runtime_that_never_answers_registration_is_left_and_retried(tmp_path, monkeypatch, nri_loop):
    path = str(tmp_path / "nri.sock")
    runtime = FakeNriRuntime(path)
    runtime.answer_calls = False
    runtime.start()
    plugin = NriPlugin(NriConfig(enabled=True, socket=path, reconnect_max_seconds=0.5), Recorder(), loop=nri_loop)
    monkeypatch.setattr("anolisnuma.nri.plugin.REGISTRATION_TIMEOUT", 0.3)
    try:
        plugin.start()
        plugin.wake()
        wait_until(lambda: "registration failed" in plugin.last_error, "registration given up")
        assert not plugin.connected and plugin.n["registrations"] == 0
    finally:
        plugin.stop()
        runtime.close()


def test_stop_is_prompt_while_nothing_listens(tmp_path, nri_loop):
    plugin = NriPlugin(NriConfig(enabled=True, socket=str(tmp_path / "absent.sock"), reconnect_max_seconds=300),
                       Recorder(), loop=nri_loop)
    plugin.start()
    plugin.wake()
    wait_until(lambda: plugin.n["connect_failures"] >= 1, "a failed connect")
    done = threading.Event()
    threading.Thread(target=lambda: (plugin.stop(), done.set()), daemon=True).start()
    assert done.wait(10)   # not the backoff's up-to-300 s
    assert not os.path.exists(tmp_path / "absent.sock")


@pytest.mark.parametrize("how", ["directory writable by all", "socket owned by another user"])
def test_a_socket_another_user_could_replace_is_not_connected_to(tmp_path, how, nri_loop):
    """Whoever may change the socket or a directory above it could listen there in
    containerd's place and tell the plugin of pods that are not there."""
    d = tmp_path / "nri"
    d.mkdir()
    path = str(d / "nri.sock")
    runtime = FakeNriRuntime(path).start()
    if how == "directory writable by all":
        os.chmod(d, 0o777)
    else:
        os.chown(path, 1000, 1000)
    plugin = NriPlugin(NriConfig(enabled=True, socket=path, reconnect_max_seconds=0.5), Recorder(), loop=nri_loop)
    plugin.start()
    plugin.wake()
    try:
        wait_until(lambda: plugin.n["connect_refused_untrusted"] >= 2, "refused, and again after the backoff")
        assert not runtime.connected.is_set() and plugin.n["connects"] == 0
        assert "another user could listen there" in plugin.last_error
        assert ("chmod go-w" if how.startswith("directory") else "chown root") in plugin.last_error
        os.chmod(d, 0o755)   # fixed: it connects on its next attempt
        os.chown(path, 0, 0)
        assert runtime.registered.wait(10)
    finally:
        plugin.stop()
        runtime.close()


NOBODY = 65534

# Binds as root (the socket's file is root's, 0600 in a root-only directory: the path check
# passes), then listens as nobody: the kernel's SO_PEERCRED names nobody.
LISTEN_AS_NOBODY = """
import os, socket, sys
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1])
os.chmod(sys.argv[1], 0o600)
os.setgid(65534); os.setuid(65534)
s.listen(8)
print("listening", flush=True)
sys.stdin.read()
"""


def test_a_listener_that_is_not_root_behind_a_root_owned_socket_is_refused(tmp_path, nri_loop):
    """The socket's file says who bound it; only the kernel says who listens: a process of
    another user there would tell the plugin of pods that are not there."""
    import subprocess
    import sys

    # given containerd's socket path, root's, listened on by a process running as nobody
    d = tmp_path / "nri"
    d.mkdir()
    path = str(d / "nri.sock")
    impostor = subprocess.Popen([sys.executable, "-c", LISTEN_AS_NOBODY, path], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
    plugin = NriPlugin(NriConfig(enabled=True, socket=path, reconnect_max_seconds=0.5), Recorder(), loop=nri_loop)
    runtime = None
    try:
        assert impostor.stdout.readline() == "listening\n" and os.stat(path).st_uid == 0
        # when the plugin connects
        plugin.start()
        plugin.wake()
        # then it is refused on the peer's uid, said with the path and the fix, counted, and
        # tried again after the backoff
        wait_until(lambda: plugin.n.get("connect_refused_peer", 0) >= 2, "refused, and again after the backoff")
        assert plugin.n["registrations"] == 0 and plugin.n["connects"] == 0
        assert (f"not connected: {path} is listened on by pid {impostor.pid}, running as uid {NOBODY}, not root"
                in plugin.last_error)
        assert f"fix: stop process {impostor.pid}" in plugin.last_error
        # and once containerd's own socket is there, it connects
        impostor.stdin.close()
        impostor.wait(30)
        os.unlink(path)
        runtime = FakeNriRuntime(path).start()
        assert runtime.registered.wait(10)
    finally:
        plugin.stop()
        if impostor.poll() is None:
            impostor.kill()
            impostor.wait(30)
        if runtime is not None:
            runtime.close()


def test_a_link_another_user_owns_swapped_into_the_path_is_refused(tmp_path, nri_loop):
    """A sticky directory (as /tmp) on the way: root's link there is followed, and another
    user's, swapped in while the plugin was away, is refused even though it leads to the
    same root-only directory: its owner could point it elsewhere between a check and the
    connect (the plugin connects to what it judged, through /proc/self/fd)."""
    # given shared/nri (a root-owned link in a sticky directory) -> real/, where the runtime is
    real, shared = tmp_path / "real", tmp_path / "shared"
    real.mkdir()
    shared.mkdir()
    os.chmod(shared, 0o1777)
    os.symlink(real, shared / "nri")
    path = str(shared / "nri" / "nri.sock")
    runtime = FakeNriRuntime(str(real / "nri.sock")).start()
    plugin = NriPlugin(NriConfig(enabled=True, socket=path, reconnect_max_seconds=0.5), Recorder(), loop=nri_loop)
    plugin.start()
    plugin.wake()
    again = None
    try:
        assert runtime.registered.wait(10)   # root's link: followed
        wait_until(lambda: plugin.n["registrations"] == 1, "the plugin registered")   # (as in setup)
        # when the runtime goes and another user's link takes the place of root's
        runtime.close()
        wait_until(lambda: plugin.n["disconnects"] == 1, "the disconnect seen")
        os.unlink(shared / "nri")
        os.symlink(real, shared / "nri")
        os.lchown(shared / "nri", NOBODY, NOBODY)
        again = FakeNriRuntime(str(real / "nri.sock")).start()
        # then the plugin does not connect through it, says where and the fix, and retries
        wait_until(lambda: plugin.n["connect_refused_untrusted"] >= 2, "refused, and again after the backoff")
        assert not again.connected.is_set() and plugin.n["connects"] == 1
        assert (f"{shared / 'nri'} (above {path}) is a symbolic link owned by uid {NOBODY}, not root: another user "
                f"could listen there in containerd's place; fix: chown -h root {shared / 'nri'}") in plugin.last_error
        os.lchown(shared / "nri", 0, 0)   # fixed: it connects on its next attempt
        assert again.registered.wait(10)
    finally:
        plugin.stop()
        for rt in (runtime, again):
            if rt is not None:
                rt.close()


@pytest.fixture
def real_front_end(tmp_path) -> Iterator[Tuple[FakeNriRuntime, NriPlugin, List[int]]]:
    """The plugin with the real front-end (the interception pipeline on its own loop, no
    hooks), registered with the fake runtime; ``synced`` counts the resyncs asked."""
    from anolisnuma.config import HooksConfig
    from anolisnuma.nri.frontend import NriFrontEnd
    from anolisnuma.pipeline.interceptor import Interceptor
    from anolisnuma.state.store import Store
    from anolisnuma.testing.loop_thread import LoopThread

    ic = Interceptor([], HooksConfig(), Store())
    runtime = FakeNriRuntime(str(tmp_path / "nri.sock")).start()
    synced: List[int] = []
    with LoopThread() as lt:
        plugin = NriPlugin(NriConfig(enabled=True, socket=runtime.path, reconnect_max_seconds=0.5),
                           NriFrontEnd(ic, lt.loop, timeout=5.0), on_synchronize=lambda: synced.append(1))
        plugin.start()
        plugin.wake()
        try:
            assert runtime.registered.wait(10)
            yield runtime, plugin, synced
        finally:
            plugin.stop()
            runtime.close()
    ic.executor.shutdown(wait=False)


def create(runtime: FakeNriRuntime, cid: str, shares: int = 0) -> Any:
    pod = nri.PodSandbox(id="sb1", uid="u1", name="web", namespace="ns")
    ctr = nri.Container(id=cid, pod_sandbox_id="sb1", name=cid)
    if shares:
        ctr.linux.resources.cpu.shares.value = shares
    return runtime.call_plugin("CreateContainer", nri.CreateContainerRequest(pod=pod, container=ctr),
                               nri.CreateContainerResponse)


def failures(logs: List[dict]) -> List[dict]:
    return [e for e in logs if e["log_level"] in ("error", "warning", "critical")]


@pytest.mark.parametrize("how", ["MemoryError", "OverflowError", "RecursionError"])
def test_an_event_whose_handling_raises_is_answered_alone_and_the_session_goes_on(real_front_end, monkeypatch,
                                                                                   how):
    """H1 through NRI: a peer's event that makes the translation (or anything after it) run
    out of memory, overflow or recurse too deep costs that event an error answer, one log
    line and a count, and nothing else."""
    from structlog.testing import capture_logs

    runtime, plugin, _ = real_front_end
    # given an event whose translation raises
    # (a crafted one, shares past int64, raised ValueError once: translate.py reads it as
    # int64's largest now, tests/fuzz/test_fuzz_nri.py)
    def boom(*_args: Any) -> Any:
        raise {"MemoryError": MemoryError, "OverflowError": OverflowError,
               "RecursionError": RecursionError}[how]("from the test")
    monkeypatch.setattr("anolisnuma.nri.translate.create_container", boom)
    shares, error = 0, how
    # when containerd sends it
    with capture_logs() as logs:
        passed = create(runtime, "bad", shares)
    # then that request is answered as if anolisnuma were not there (no hook is
    # fail-closed: the relay would forward the call unchanged), in one log line (no
    # traceback) and one count
    assert passed == nri.CreateContainerResponse()
    (line,) = failures(logs)
    assert line["event"] == "NRI: a request failed; the session goes on"
    assert (line["method"], line["error"]) == ("CreateContainer", error) and "exc_info" not in line
    assert plugin.counts()["events_failed"] == 1 and plugin.counts()["events_passed_on"] == 1
    # and with a fail-closed hook on CreateContainer, the same event is refused, as the relay refuses it
    monkeypatch.setattr(plugin.frontend.interceptor, "fail_closed", lambda method: method == "CreateContainer")
    with pytest.raises(NriRequestError) as e:
        create(runtime, "bad-too", shares)
    assert e.value.code == 13 and e.value.message == f"anolisnuma failed to handle CreateContainer ({error})"
    # and the next event on the same session works
    monkeypatch.undo()
    assert create(runtime, "good").adjust == nri.ContainerAdjustment()   # (no hooks: nothing to adjust)
    assert plugin.connected and plugin.n["connects"] == 1 and plugin.n["events"] == 3


def test_a_request_other_than_an_event_that_raises_is_counted_too(real_front_end):
    runtime, plugin, synced = real_front_end
    # given a resync that cannot even be asked for
    plugin.on_synchronize = lambda: (_ for _ in ()).throw(RecursionError("maximum recursion depth exceeded"))
    # when containerd synchronizes
    with pytest.raises(NriRequestError) as e:
        runtime.call_plugin("Synchronize", nri.SynchronizeRequest(), nri.SynchronizeResponse)
    # then the request is answered with an error and counted
    assert e.value.code == 13 and "Synchronize (RecursionError)" in e.value.message
    assert plugin.counts()["requests_failed"] == 1 and plugin.counts()["events_failed"] == 0
    # and the session goes on
    plugin.on_synchronize = lambda: synced.append(1)
    runtime.call_plugin("Synchronize", nri.SynchronizeRequest(), nri.SynchronizeResponse)
    assert synced == [1] and plugin.connected
