"""The interception pipeline through the real relay, with the fake backend and test hooks:
decode → pre-hooks → forward → post-hooks, the store, opt-out, budgets, failure policies,
per-pod ordering and the log lines."""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, List, Optional

import grpc
import pytest

from anolisnuma.config import HookSettings
from anolisnuma.pipeline.hooks import (CREATE_CONTAINER, REMOVE_CONTAINER, REMOVE_POD_SANDBOX, RUN_POD_SANDBOX,
                                       START_CONTAINER, STOP_CONTAINER, STOP_POD_SANDBOX,
                                       UPDATE_CONTAINER_RESOURCES, Call, Hook, HookRefused)
from anolisnuma.testing.fake_cri import FakeCri, runtime_path
from anolisnuma.testing.proxy import InProcessProxy, make_config
from anolisnuma.testing.waiting import wait_until

from pipeline_helpers import CLIENT_OPTIONS, create_request, pb, pb_grpc, sandbox_config

ALL_METHODS = frozenset({RUN_POD_SANDBOX, STOP_POD_SANDBOX, REMOVE_POD_SANDBOX, CREATE_CONTAINER,
                         START_CONTAINER, STOP_CONTAINER, REMOVE_CONTAINER, UPDATE_CONTAINER_RESOURCES})
CREATE = runtime_path("CreateContainer")
RUN = runtime_path("RunPodSandbox")


class Recorder(Hook):
    """A hook that records what it saw and runs the given functions."""

    def __init__(self, name: str = "rec", methods=ALL_METHODS, pre: Optional[Callable[[Call], Any]] = None,
                 post: Optional[Callable[[Call], Any]] = None) -> None:
        self.name = name
        self.methods = frozenset(methods)
        self._pre, self._post = pre, post
        self.seen: List[tuple] = []   # (stage, method, call, t_start, t_end)

    def pre(self, call: Call) -> None:
        t = time.monotonic()
        try:
            if self._pre:
                self._pre(call)
        finally:
            self.seen.append(("pre", call.method, call, t, time.monotonic()))

    def post(self, call: Call) -> None:
        t = time.monotonic()
        try:
            if self._post:
                self._post(call)
        finally:
            self.seen.append(("post", call.method, call, t, time.monotonic()))

    def stages(self, method: Optional[str] = None) -> List[tuple]:
        return [(s, m) for s, m, *_ in self.seen if method is None or m == method]


def set_cpuset(value: str):
    def edit(call: Call) -> None:
        call.request.config.linux.resources.cpuset_cpus = value
        call.mark_modified()
    return edit


# ---------------------------------------------------------------- bodies

def test_without_hooks_backend_gets_the_exact_bytes(start_proxy, fake, open_stub):
    proxy = start_proxy()
    stub = open_stub(proxy.address)
    req = create_request("a" * 64)
    stub.CreateContainer(req, timeout=5)
    assert fake.last(CREATE).request == req.SerializeToString()
    run = pb.RunPodSandboxRequest(config=sandbox_config(), runtime_handler="runc")
    stub.RunPodSandbox(run, timeout=5)
    assert fake.last(RUN).request == run.SerializeToString()


def test_hook_that_does_not_edit_forwards_the_exact_bytes(start_proxy, fake, open_stub):
    hook = Recorder()
    proxy = start_proxy([hook])
    req = create_request("a" * 64)
    open_stub(proxy.address).CreateContainer(req, timeout=5)
    wait_until(lambda: len(hook.stages(CREATE_CONTAINER)) == 2)
    assert hook.stages(CREATE_CONTAINER) == [("pre", CREATE_CONTAINER), ("post", CREATE_CONTAINER)]
    assert fake.last(CREATE).request == req.SerializeToString()


def test_pre_hook_edit_changes_only_that_field(start_proxy, fake, open_stub):
    proxy = start_proxy([Recorder(methods={CREATE_CONTAINER}, pre=set_cpuset("6-7,12"))])
    req = create_request("a" * 64, cpuset="0-1")
    open_stub(proxy.address).CreateContainer(req, timeout=5)
    got = pb.CreateContainerRequest.FromString(fake.last(CREATE).request)
    expected = pb.CreateContainerRequest()
    expected.CopyFrom(req)
    expected.config.linux.resources.cpuset_cpus = "6-7,12"
    assert got == expected  # fields cri_proto does not declare (mounts, CDI, security…) survived
    assert got.config.CDI_devices[0].name == "vendor.com/gpu=0"
    assert got.sandbox_config.linux.security_context.run_as_user.value == 1000


def grow_or_shrink(call: Call) -> None:
    ann = call.request.config.annotations
    if ann.get("shape") == "grow":
        ann["padding"] = "p" * int(ann["by"])
    else:  # (hooks see cri_proto messages: only declared fields can be edited)
        ann.clear()
        call.request.config.labels.clear()
    call.mark_modified()


def check_create(fake: FakeCri, stub, i: int, rng: random.Random) -> None:
    grow = i % 2 == 0
    by = rng.randrange(1, 12000)
    ann = {"shape": "grow", "by": str(by)} if grow else {"shape": "shrink", "ballast": "b" * by}
    reply = stub.CreateContainer(create_request("c" * 64, name=f"c{i}", annotations=ann), timeout=5)
    assert len(reply.container_id) == 64
    got = pb.CreateContainerRequest.FromString(fake.last(CREATE).request)
    if grow:
        assert got.config.annotations["padding"] == "p" * by
    else:
        assert not got.config.labels and not got.config.annotations
        assert len(got.config.envs) == 20  # undeclared fields survive
    assert got.config.metadata.name == f"c{i}"


def test_bodies_growing_and_shrinking_across_many_calls(start_proxy, fake, open_stub):
    """Edits change the body length both ways (by up to 12 KB) on 300 calls of one
    connection; the relay settles connection-level flow control after each, so the
    connection neither stalls nor gets reset."""
    rng = random.Random(3)
    proxy = start_proxy([Recorder(methods={CREATE_CONTAINER}, pre=grow_or_shrink)])
    stub = open_stub(proxy.address)
    for i in range(300):
        check_create(fake, stub, i, rng)
        if i % 50 == 0:  # pass-through calls in between, on the same connection
            assert stub.Version(pb.VersionRequest(), timeout=5).runtime_name == "fake-cri"


def run_edits_with_bulk_traffic(proxy, fake) -> None:
    rng = random.Random(5)
    fake.set_reply("/test.Bulk/Echo", lambda req, ctx: req[:16])
    shared = grpc.insecure_channel(proxy.address, options=CLIENT_OPTIONS)
    stub = pb_grpc.RuntimeServiceStub(shared)
    echo = shared.unary_unary("/test.Bulk/Echo")
    stop = threading.Event()

    def background() -> int:
        # pass-through requests of 70 KB (more than the 64 KiB window) on the same connection
        n = 0
        while not stop.is_set():
            assert echo(b"b" * 70000, timeout=5) == b"b" * 16
            n += 1
        return n

    try:
        with ThreadPoolExecutor(2) as pool:
            bg = [pool.submit(background), pool.submit(background)]
            try:
                for i in range(100):
                    check_create(fake, stub, i, rng)
            finally:
                stop.set()
            assert all(f.result(10) > 0 for f in bg)
    finally:
        shared.close()


def test_unedited_intercepted_calls_with_bulk_traffic(start_proxy, fake):
    """Held-then-released request bodies (a hook that reads but does not edit) mixed with
    70 KB pass-through requests that keep the connection window exhausted."""
    proxy = start_proxy([Recorder(methods={CREATE_CONTAINER})])
    rng = random.Random(1)
    shared = grpc.insecure_channel(proxy.address, options=CLIENT_OPTIONS)
    stub = pb_grpc.RuntimeServiceStub(shared)
    echo = shared.unary_unary("/test.Bulk/Echo")
    fake.set_reply("/test.Bulk/Echo", lambda req, ctx: req[:16])
    stop = threading.Event()

    def background() -> None:
        while not stop.is_set():
            echo(b"b" * 70000, timeout=5)

    try:
        with ThreadPoolExecutor(2) as pool:
            bg = [pool.submit(background), pool.submit(background)]
            try:
                for i in range(100):
                    req = create_request("c" * 64, annotations={"ballast": "b" * rng.randrange(1, 12000)})
                    stub.CreateContainer(req, timeout=5)
                    assert fake.last(CREATE).request == req.SerializeToString()
            finally:
                stop.set()
            for f in bg:
                f.result(10)
    finally:
        shared.close()


def test_edited_bodies_with_concurrent_bulk_traffic(start_proxy, fake):
    proxy = start_proxy([Recorder(methods={CREATE_CONTAINER}, pre=grow_or_shrink)])
    run_edits_with_bulk_traffic(proxy, fake)


@pytest.mark.parametrize("size", [40_000, 1_000_000, 8_000_000])
def test_large_intercepted_request_gets_its_pre_hooks(size, start_proxy, fake, open_stub):
    """A request of any size up to the message limit is held and edited: kubelet
    CreateContainers with hundreds of service-link variables are far over one window."""
    hook = Recorder(methods={CREATE_CONTAINER}, pre=set_cpuset("3"))
    proxy = start_proxy([hook])
    req = create_request("d" * 64, annotations={"big": "x" * size})
    reply = open_stub(proxy.address).CreateContainer(req, timeout=10)
    assert len(reply.container_id) == 64
    forwarded = pb.CreateContainerRequest.FromString(fake.last(CREATE).request)
    assert forwarded.config.linux.resources.cpuset_cpus == "3"
    assert forwarded.config.annotations["big"] == "x" * size
    assert ("pre", CREATE_CONTAINER) in hook.stages()
    wait_until(lambda: proxy.store.container(reply.container_id) is not None)
    assert proxy.daemon.relay.budget.used == 0


def test_large_request_without_pre_hooks_streams_through_and_is_recorded(start_proxy, fake, open_stub):
    proxy = start_proxy([])
    req = create_request("d" * 64, annotations={"big": "x" * 1_000_000})
    reply = open_stub(proxy.address).CreateContainer(req, timeout=5)
    assert fake.last(CREATE).request == req.SerializeToString()
    wait_until(lambda: proxy.store.container(reply.container_id) is not None)


def test_edit_growing_body_beyond_backend_stream_window(sockdir, open_stub):
    """An edit larger than containerd's stream window is sent within it, the rest as
    containerd grants more: the edited request arrives whole."""
    small_windows = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 65535)]
    with FakeCri(f"{sockdir}/go-like.sock", containers=0, sandboxes=0, server_options=small_windows) as fake:

        def grow(call: Call) -> None:
            call.request.config.annotations["padding"] = "p" * 300_000
            call.mark_modified()

        with InProcessProxy(make_config(f"{sockdir}/p", fake.socket_path, listen=f"{sockdir}/p.sock"),
                            hooks=[Recorder(methods={CREATE_CONTAINER}, pre=grow)]) as proxy:
            stub = open_stub(proxy.address, CLIENT_OPTIONS + [("grpc.http2.bdp_probe", 0)])
            for i in range(3):
                req = create_request(f"{i}" * 64)
                reply = stub.CreateContainer(req, timeout=5)
                assert len(reply.container_id) == 64
                forwarded = pb.CreateContainerRequest.FromString(fake.last(CREATE).request)
                assert forwarded.config.annotations["padding"] == "p" * 300_000
            assert stub.Version(pb.VersionRequest(), timeout=5).runtime_name


def test_unreadable_held_request_is_refused_naming_why(start_proxy, fake):
    """A request the policies cannot read (here: flagged compressed) is never passed on
    unpoliced: the caller is told why."""
    proxy = start_proxy([Recorder(methods={CREATE_CONTAINER})])
    body = create_request("u" * 64).SerializeToString()
    with grpc.insecure_channel(proxy.address) as channel:
        call = channel.unary_unary(CREATE, request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as e:
            call(b"\x00" + body[:10], timeout=5)  # truncated: not a CreateContainerRequest
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "cannot read this CreateContainer request" in e.value.details()
    assert fake.calls(CREATE) == 0


# ---------------------------------------------------------------- failure policies and budgets

def test_failing_hook_with_ignore_forwards_unchanged(start_proxy, fake, open_stub):
    def half_edit_then_fail(call: Call) -> None:
        call.request.config.linux.resources.cpuset_cpus = "9"
        call.mark_modified()
        raise RuntimeError("cannot read the topology")

    proxy = start_proxy([Recorder(name="broken", methods={CREATE_CONTAINER}, pre=half_edit_then_fail),
                         Recorder(name="fine", methods={CREATE_CONTAINER})])
    req = create_request("a" * 64)
    reply = open_stub(proxy.address).CreateContainer(req, timeout=5)
    assert len(reply.container_id) == 64
    assert fake.last(CREATE).request == req.SerializeToString()  # the half-made edit was discarded
    assert proxy.interceptor.counters["hook_broken_pre_failed"] == 1
    assert proxy.interceptor.counters["hook_fine_pre_ok"] == 1


def test_failing_hook_with_fail_policy_refuses_the_call(start_proxy, fake, open_stub):
    def refuse(call: Call) -> None:
        raise HookRefused("no NUMA node has 64 free CPUs", code="RESOURCE_EXHAUSTED")

    proxy = start_proxy([Recorder(name="numa", methods={CREATE_CONTAINER}, pre=refuse)],
                        per_hook={"numa": HookSettings(failure_policy="fail")})
    stub = open_stub(proxy.address)
    with pytest.raises(grpc.RpcError) as e:
        stub.CreateContainer(create_request("a" * 64), timeout=5, metadata=[("x-seq", "1")])
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "anolisnuma hook numa" in e.value.details()
    assert "no NUMA node has 64 free CPUs" in e.value.details()
    assert proxy.interceptor.counters["calls_refused"] == 1
    # the connection (and its HPACK state) is still fine for the next calls
    for i in range(20):
        stub.StartContainer(pb.StartContainerRequest(container_id=f"{i:064x}"), timeout=5,
                            metadata=[("x-seq", str(i)), ("x-other", "v" * i)])
        assert fake.last(runtime_path("StartContainer")).metadata_dict["x-seq"] == str(i)
    assert fake.calls(CREATE) == 0  # containerd never ran it, not even later
    with pytest.raises(grpc.RpcError) as e:
        stub.CreateContainer(create_request("a" * 64), timeout=5)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_plain_exception_with_fail_policy_is_unknown(start_proxy, fake, open_stub):
    def boom(call: Call) -> None:
        raise ValueError("boom")

    proxy = start_proxy([Recorder(name="strict", methods={RUN_POD_SANDBOX}, pre=boom)],
                        per_hook={"strict": HookSettings(failure_policy="fail")})
    with pytest.raises(grpc.RpcError) as e:
        open_stub(proxy.address).RunPodSandbox(pb.RunPodSandboxRequest(config=sandbox_config()), timeout=5)
    assert e.value.code() == grpc.StatusCode.UNKNOWN
    assert "boom" in e.value.details()
    assert fake.calls(RUN) == 0


def test_hook_over_budget_is_ignored(start_proxy, fake, open_stub):
    release = threading.Event()

    def slow(call: Call) -> None:
        release.wait(30)
        call.request.config.linux.resources.cpuset_cpus = "5"
        call.mark_modified()

    proxy = start_proxy([Recorder(name="slow", methods={CREATE_CONTAINER}, pre=slow)],
                        per_hook={"slow": HookSettings(budget_seconds=0.2)})
    req = create_request("a" * 64)
    started = time.monotonic()
    try:
        # The reply comes while the hook is still held: the budget, not the hook, ended the wait.
        open_stub(proxy.address).CreateContainer(req, timeout=10)
        elapsed = time.monotonic() - started
    finally:
        release.set()
    assert elapsed >= 0.15
    assert fake.last(CREATE).request == req.SerializeToString()
    assert proxy.interceptor.counters["hook_slow_pre_failed"] == 1


def test_hook_over_budget_with_fail_policy_refuses(start_proxy, fake, open_stub):
    proxy = start_proxy([Recorder(name="slow", methods={CREATE_CONTAINER}, pre=lambda c: time.sleep(0.6))],
                        per_hook={"slow": HookSettings(budget_seconds=0.1, failure_policy="fail")})
    with pytest.raises(grpc.RpcError) as e:
        open_stub(proxy.address).CreateContainer(create_request("a" * 64), timeout=5)
    assert e.value.code() == grpc.StatusCode.UNKNOWN
    assert "budget" in e.value.details()
    assert fake.calls(CREATE) == 0


def test_hung_hook_is_skipped_instead_of_taking_every_worker(start_proxy, fake, open_stub):
    """A hook stuck in the kernel keeps its thread; after two such calls it is not called
    again until they return, so the other calls keep their speed and the pool stays free."""
    release = threading.Event()
    entered = []

    def hang(call: Call) -> None:
        entered.append(1)
        release.wait(10)

    proxy = start_proxy([Recorder(name="hung", methods={CREATE_CONTAINER}, pre=hang)],
                        per_hook={"hung": HookSettings(budget_seconds=0.1)})
    stub = open_stub(proxy.address)
    try:
        for i in range(6):
            stub.CreateContainer(create_request(f"{i}" * 64), timeout=5)
        assert len(entered) == 2  # calls 3..6 did not start another stuck thread
        assert proxy.interceptor.counters["hook_hung_pre_failed"] == 6
    finally:
        release.set()
    wait_until(lambda: proxy.interceptor._overrunning.get("hung") == 0)  # the stuck calls returned
    stub.CreateContainer(create_request("z" * 64), timeout=5)
    assert len(entered) == 3


# ---------------------------------------------------------------- opt-out

@pytest.mark.parametrize("where,key", [("annotations", "anolisnuma.io/skip"),
                                       ("labels", "runtimeproxy.koordinator.sh/skip-hookserver")])
def test_pod_opt_out_skips_every_hook(where, key, start_proxy, fake, open_stub):
    hook = Recorder(pre=set_cpuset("1"))
    proxy = start_proxy([hook])
    stub = open_stub(proxy.address)
    skipped = sandbox_config(name="agent", **{where: {key: "true"}})
    sid = stub.RunPodSandbox(pb.RunPodSandboxRequest(config=skipped), timeout=5).pod_sandbox_id
    req = create_request(sid, sandbox=skipped)
    cid = stub.CreateContainer(req, timeout=5).container_id
    stub.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=5)
    assert hook.seen == []  # no pre-hook (they run before the request is forwarded)
    assert fake.last(CREATE).request == req.SerializeToString()
    wait_until(lambda: proxy.store.pod(sid) is not None)  # still recorded, only the hooks are skipped
    # a pod that did not opt out gets the hooks
    normal = sandbox_config(name="web")
    sid2 = stub.RunPodSandbox(pb.RunPodSandboxRequest(config=normal), timeout=5).pod_sandbox_id
    stub.CreateContainer(create_request(sid2, sandbox=normal), timeout=5)
    wait_until(lambda: ("post", CREATE_CONTAINER) in hook.stages())
    assert ("pre", RUN_POD_SANDBOX) in hook.stages() and ("pre", CREATE_CONTAINER) in hook.stages()
    # ...and none ran for the opted-out pod, post-hooks included (their replies came first)
    assert [c for _s, _m, c, *_ in hook.seen if c.pod is not None and c.pod.name == "agent"] == []


# ---------------------------------------------------------------- replies, store, ordering

def test_post_hooks_see_decoded_replies_and_the_store_follows(start_proxy, fake, open_stub):
    hook = Recorder()
    proxy = start_proxy([hook])
    stub = open_stub(proxy.address)
    cfg = sandbox_config(name="db-0", namespace="data")
    sid = stub.RunPodSandbox(pb.RunPodSandboxRequest(config=cfg, runtime_handler="runc"), timeout=5).pod_sandbox_id
    # The store follows a reply right after the reply's bytes went out (for the next call
    # on the same connection it is always there; this thread may look a moment earlier).
    wait_until(lambda: proxy.store.pod(sid) is not None)
    pod = proxy.store.pod(sid)
    assert (pod.name, pod.namespace, pod.uid) == ("db-0", "data", cfg.metadata.uid)
    assert pod.cgroup_parent == cfg.linux.cgroup_parent and pod.runtime_handler == "runc"

    cid = stub.CreateContainer(create_request(sid, sandbox=cfg, name="postgres", cpuset="2-3"),
                               timeout=5).container_id
    wait_until(lambda: proxy.store.container(cid) is not None)
    ctr = proxy.store.container(cid)
    assert ctr.sandbox_id == sid and ctr.name == "postgres"
    assert ctr.resources.cpuset_cpus == "2-3" and ctr.resources.cpu_quota == 150000

    stub.UpdateContainerResources(pb.UpdateContainerResourcesRequest(
        container_id=cid, linux=pb.LinuxContainerResources(cpuset_cpus="4-5", cpu_shares=2)), timeout=5)
    wait_until(lambda: proxy.store.container(cid).resources.cpuset_cpus == "4-5")

    wait_until(lambda: ("post", UPDATE_CONTAINER_RESOURCES) in hook.stages())
    posts = {m: c for s, m, c, *_ in hook.seen if s == "post"}
    assert posts[RUN_POD_SANDBOX].reply.pod_sandbox_id == sid
    assert posts[CREATE_CONTAINER].reply.container_id == cid
    assert posts[CREATE_CONTAINER].pod.sandbox_id == sid
    assert posts[UPDATE_CONTAINER_RESOURCES].container.container_id == cid

    stub.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=5)
    stub.StopContainer(pb.StopContainerRequest(container_id=cid, timeout=10), timeout=5)
    stub.RemoveContainer(pb.RemoveContainerRequest(container_id=cid), timeout=5)
    wait_until(lambda: proxy.store.container(cid) is None)
    assert proxy.store.pod(sid) is not None
    stub.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid), timeout=5)
    stub.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid), timeout=5)
    wait_until(lambda: proxy.store.pod(sid) is None)
    wait_until(lambda: ("post", REMOVE_POD_SANDBOX) in hook.stages())
    # every lifecycle method went through both stages, pre before post
    for m in (START_CONTAINER, STOP_CONTAINER, REMOVE_CONTAINER, STOP_POD_SANDBOX, REMOVE_POD_SANDBOX):
        assert hook.stages(m) == [("pre", m), ("post", m)]
    post_start = [c for s, m, c, *_ in hook.seen if s == "post" and m == START_CONTAINER][0]
    assert post_start.container.name == "postgres" and post_start.pod.name == "db-0"


def test_failed_call_is_not_recorded_and_runs_no_post_hook(start_proxy, fake, open_stub):
    hook = Recorder()
    proxy = start_proxy([hook])
    fake.set_error(RUN, grpc.StatusCode.UNKNOWN, "failed to setup network for sandbox")
    with pytest.raises(grpc.RpcError) as e:
        open_stub(proxy.address).RunPodSandbox(pb.RunPodSandboxRequest(config=sandbox_config()), timeout=5)
    assert e.value.details() == "failed to setup network for sandbox"
    # on_reply ran (its line is written after the store would have been updated)...
    wait_until(lambda: [l for l in proxy.log_lines() if l.get("message") == "run pod sandbox reply from containerd"])
    assert proxy.store.pods() == []
    # ...and a later successful call's post-hook comes, but none for the failed one
    fake.clear(RUN)
    sid = open_stub(proxy.address).RunPodSandbox(pb.RunPodSandboxRequest(config=sandbox_config()),
                                                 timeout=5).pod_sandbox_id
    wait_until(lambda: ("post", RUN_POD_SANDBOX) in hook.stages())
    assert hook.stages() == [("pre", RUN_POD_SANDBOX), ("pre", RUN_POD_SANDBOX), ("post", RUN_POD_SANDBOX)]
    assert [p.sandbox_id for p in proxy.store.pods()] == [sid]


def test_per_pod_ordering(start_proxy, fake, open_stub):
    """A slow RunPodSandbox post-hook of pod A delays A's CreateContainer pre-hook, not B's."""
    def slow_for_a(call: Call) -> None:
        if call.method == RUN_POD_SANDBOX and call.pod.name == "a":
            time.sleep(0.6)

    hook = Recorder(methods={RUN_POD_SANDBOX, CREATE_CONTAINER}, post=slow_for_a)
    proxy = start_proxy([hook])
    stub = open_stub(proxy.address)
    cfg_b = sandbox_config(name="b")
    sid_b = stub.RunPodSandbox(pb.RunPodSandboxRequest(config=cfg_b), timeout=5).pod_sandbox_id
    cfg_a = sandbox_config(name="a")
    sid_a = stub.RunPodSandbox(pb.RunPodSandboxRequest(config=cfg_a), timeout=5).pod_sandbox_id

    results = {}

    def create(name, sid, cfg):
        t = time.monotonic()
        stub.CreateContainer(create_request(sid, sandbox=cfg, name=name), timeout=5)
        results[name] = time.monotonic() - t

    ta = threading.Thread(target=create, args=("ca", sid_a, cfg_a))
    tb = threading.Thread(target=create, args=("cb", sid_b, cfg_b))
    ta.start()
    tb.start()
    ta.join(5)
    tb.join(5)
    wait_until(lambda: len([1 for s, m, *_ in hook.seen if s == "post" and m == CREATE_CONTAINER]) == 2)

    def when(stage, method, pod_name, end=False):
        for s, m, c, t0, t1 in hook.seen:
            if s == stage and m == method and c.pod.name == pod_name:
                return t1 if end else t0
        raise AssertionError((stage, method, pod_name))

    a_post_run_end = when("post", RUN_POD_SANDBOX, "a", end=True)
    assert when("pre", CREATE_CONTAINER, "a") >= a_post_run_end
    assert when("pre", CREATE_CONTAINER, "b") < a_post_run_end
    assert results["cb"] < 0.4 <= results["ca"]


# ---------------------------------------------------------------- logs

def test_request_and_reply_log_lines(start_proxy, fake, open_stub):
    proxy = start_proxy([Recorder()])
    stub = open_stub(proxy.address)
    cfg = sandbox_config(name="web-1", namespace="shop")
    sid = stub.RunPodSandbox(pb.RunPodSandboxRequest(config=cfg), timeout=5).pod_sandbox_id
    fake.set_error(RUN, grpc.StatusCode.NOT_FOUND, "sandbox image not found")
    with pytest.raises(grpc.RpcError):
        stub.RunPodSandbox(pb.RunPodSandboxRequest(config=sandbox_config(name="web-2", namespace="shop")), timeout=5)
    # the reply line is written right after the reply's bytes went out to the client
    def reply_lines():
        return [l for l in proxy.log_lines() if l.get("message") == "run pod sandbox reply from containerd"]
    wait_until(lambda: len(reply_lines()) == 2)
    rep = reply_lines()
    # one line per call at info: the request's own line is written at debug only
    assert not [l for l in proxy.log_lines() if l.get("message") == "run pod sandbox request from kubelet"]
    assert [l["pod_name"] for l in rep] == ["web-1", "web-2"]
    ok, failed = rep
    assert (ok["pod_namespace"], ok["pod_uid"]) == ("shop", cfg.metadata.uid)
    assert ok["status"] == "OK" and ok["pod_sandbox_id"] == sid and ok["level"] == "info"
    assert isinstance(ok["latency_ms"], (int, float)) and ok["latency_ms"] >= 0
    assert failed["status"] == "NOT_FOUND" and failed["level"] == "warning"
    assert "sandbox image not found" in failed["error"]
    # pass-through calls are not logged at info
    stub.Version(pb.VersionRequest(), timeout=5)
    assert not [l for l in proxy.log_lines() if "Version" in str(l.get("method", ""))]


def test_not_found_on_stop_or_remove_is_logged_at_info(start_proxy, fake, open_stub):
    """The kubelet stops and removes what may be gone already; containerd 1.6 answers NOT_FOUND,
    which the kubelet takes as done: no warning for it. The same status on another call, or
    another status on a teardown call, is still a warning."""
    proxy = start_proxy([Recorder()])
    stub = open_stub(proxy.address)
    gone = "e" * 64
    for name in ("StopPodSandbox", "RemovePodSandbox"):
        fake.set_error(runtime_path(name), grpc.StatusCode.NOT_FOUND, "an error occurred when try to find sandbox")
        with pytest.raises(grpc.RpcError):
            getattr(stub, name)(getattr(pb, name + "Request")(pod_sandbox_id=gone), timeout=5)
    for name in ("StopContainer", "RemoveContainer"):
        fake.set_error(runtime_path(name), grpc.StatusCode.NOT_FOUND, "an error occurred when try to find container")
        with pytest.raises(grpc.RpcError):
            getattr(stub, name)(getattr(pb, name + "Request")(container_id=gone), timeout=5)
    fake.set_error(runtime_path("StopContainer"), grpc.StatusCode.UNKNOWN, "failed to kill container")
    with pytest.raises(grpc.RpcError):
        stub.StopContainer(pb.StopContainerRequest(container_id=gone), timeout=5)
    fake.set_error(RUN, grpc.StatusCode.NOT_FOUND, "sandbox image not found")
    with pytest.raises(grpc.RpcError):
        stub.RunPodSandbox(pb.RunPodSandboxRequest(config=sandbox_config(name="web-3", namespace="shop")), timeout=5)

    def replies():
        return [(l["message"], l["status"], l["level"]) for l in proxy.log_lines()
                if str(l.get("message", "")).endswith("reply from containerd")]
    wait_until(lambda: len(replies()) == 6)
    assert replies() == [
        ("stop pod sandbox reply from containerd", "NOT_FOUND", "info"),
        ("remove pod sandbox reply from containerd", "NOT_FOUND", "info"),
        ("stop container reply from containerd", "NOT_FOUND", "info"),
        ("remove container reply from containerd", "NOT_FOUND", "info"),
        ("stop container reply from containerd", "UNKNOWN", "warning"),
        ("run pod sandbox reply from containerd", "NOT_FOUND", "warning"),
    ]


def test_error_status_in_trailers_split_over_continuation_frames(start_proxy, fake, open_stub):
    """Trailers larger than a frame come as HEADERS + CONTINUATION; the call ends, and its
    status is read, only once the whole block is in (regression: it was logged as OK)."""
    proxy = start_proxy([])
    # a client that, like the kubelet (grpc-go), accepts frames of at most 16 KiB (with BDP
    # probing on, grpc-core's client raises the frame size it advertises; grpc-go does not)
    stub = open_stub(proxy.address, CLIENT_OPTIONS + [("grpc.http2.max_frame_size", 16384),
                                                      ("grpc.http2.bdp_probe", 0),
                                                      ("grpc.max_metadata_size", 1 << 20)])
    fake.set_error(runtime_path("StartContainer"), grpc.StatusCode.NOT_FOUND, "no such container " + "x" * 40000)
    with pytest.raises(grpc.RpcError) as e:
        stub.StartContainer(pb.StartContainerRequest(container_id="f" * 64), timeout=5)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    replies = wait_until(lambda: [l for l in proxy.log_lines()
                                  if l.get("message") == "start container reply from containerd"])
    assert replies[-1]["status"] == "NOT_FOUND"


# ---------------------------------------------------------------- cancellation and concurrency

def test_kubelet_gives_up_while_pre_hook_runs(start_proxy, fake, open_stub):
    """The caller's deadline passes while a pre-hook still works: the call ends with
    DEADLINE_EXCEEDED, containerd never runs it, and the connection stays usable."""
    hook = Recorder(methods={CREATE_CONTAINER}, pre=lambda c: time.sleep(0.5))
    proxy = start_proxy([hook])
    stub = open_stub(proxy.address)
    with pytest.raises(grpc.RpcError) as e:
        stub.CreateContainer(create_request("a" * 64), timeout=0.15)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    wait_until(lambda: hook.stages(CREATE_CONTAINER), "the hook to finish")
    # its decision must not reach containerd, not even after the calls that follow
    for _ in range(3):
        stub.StartContainer(pb.StartContainerRequest(container_id="b" * 64), timeout=5)
    assert fake.calls(CREATE) == 0
    reply = stub.CreateContainer(create_request("a" * 64), timeout=5)
    assert len(reply.container_id) == 64
    assert fake.calls(CREATE) == 1


def test_request_split_over_several_data_frames_is_edited(start_proxy, fake, open_stub):
    proxy = start_proxy([Recorder(methods={CREATE_CONTAINER}, pre=set_cpuset("4-7"))])
    req = create_request("a" * 64, annotations={"ballast": "z" * 25_000})  # > one 16 KiB frame
    open_stub(proxy.address).CreateContainer(req, timeout=5)
    got = pb.CreateContainerRequest.FromString(fake.last(CREATE).request)
    assert got.config.linux.resources.cpuset_cpus == "4-7"
    assert got.config.annotations["ballast"] == "z" * 25_000


def test_concurrent_pod_lifecycles(start_proxy, fake, open_stub):
    """16 kubelet workers run whole pod lifecycles at once through an editing hook."""
    hook = Recorder(methods={CREATE_CONTAINER, UPDATE_CONTAINER_RESOURCES},
                    pre=lambda c: set_cpuset("1")(c) if c.method == CREATE_CONTAINER else None)
    proxy = start_proxy([hook])
    stub = open_stub(proxy.address)

    def lifecycle(n: int) -> None:
        cfg = sandbox_config(name=f"pod-{n}")
        sid = stub.RunPodSandbox(pb.RunPodSandboxRequest(config=cfg), timeout=10).pod_sandbox_id
        cids = [stub.CreateContainer(create_request(sid, sandbox=cfg, name=f"c{k}"), timeout=10).container_id
                for k in range(3)]
        for cid in cids:
            stub.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=10)
            stub.UpdateContainerResources(pb.UpdateContainerResourcesRequest(
                container_id=cid, linux=pb.LinuxContainerResources(cpu_shares=n + 2)), timeout=10)
            # the store follows a reply just after its bytes went out: wait, never assume
            assert wait_until(lambda: proxy.store.container(cid)).sandbox_id == sid
        for cid in cids:
            stub.StopContainer(pb.StopContainerRequest(container_id=cid), timeout=10)
            stub.RemoveContainer(pb.RemoveContainerRequest(container_id=cid), timeout=10)
        stub.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid), timeout=10)
        stub.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid), timeout=10)

    with ThreadPoolExecutor(16) as pool:
        for f in [pool.submit(lifecycle, n) for n in range(16)]:
            f.result(30)
    # the last RemovePodSandbox replies reached the workers just before their records went
    wait_until(lambda: proxy.store.pods() == [] and proxy.store.containers() == [])
    creates = fake.requests(CREATE)
    assert len(creates) == 48
    assert all(pb.CreateContainerRequest.FromString(r.request).config.linux.resources.cpuset_cpus == "1"
               for r in creates)
    wait_until(lambda: len(hook.stages(UPDATE_CONTAINER_RESOURCES)) == 96)
    assert proxy.interceptor.counters["hook_rec_pre_failed"] == 0


def test_a_bug_in_the_pipeline_never_loses_the_call(start_proxy, fake, open_stub):
    """If interception itself raises, the relay forwards the request as it came."""
    proxy = start_proxy([Recorder(methods={CREATE_CONTAINER}, pre=set_cpuset("7"))])

    def broken(*args, **kwargs):
        raise RuntimeError("a bug in the pipeline")

    proxy.daemon.interceptor.on_request = broken
    req = create_request("f" * 64)
    reply = open_stub(proxy.address).CreateContainer(req, timeout=5)
    assert len(reply.container_id) == 64
    assert fake.last(CREATE).request == req.SerializeToString()
    assert any(e["message"].startswith("interception failed") for e in proxy.log_lines())


def test_a_removed_pod_leaves_no_lock_behind(start_proxy, fake, open_stub):
    proxy = start_proxy([Recorder()])
    stub = open_stub(proxy.address)
    for n in range(5):
        cfg = sandbox_config(name=f"short-lived-{n}")
        sid = stub.RunPodSandbox(pb.RunPodSandboxRequest(config=cfg), timeout=5).pod_sandbox_id
        stub.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid), timeout=5)
        stub.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid), timeout=5)
    wait_until(lambda: proxy.interceptor.pod_locks.structures() == {"pods": 0})
