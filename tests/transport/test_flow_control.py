"""Flow control of held requests, with the kubelet's own HTTP/2 stack (grpc-go) and grpcio's.

grpc-go writes at most one 16 KiB DATA frame per active stream in turn, within a 64 KiB
connection window, and sends more only when its peer gives the window back. A relay that
holds request bytes without crediting them stalls every call of the connection once a few
large requests are in flight (issue: 6 of 8 CreateContainers with 40 KiB of env hit their
deadline, none was pinned). Here every held request, of any size up to the message limit,
gets its pre-hook, and when the buffer budget cannot hold them all the newest are refused
with RESOURCE_EXHAUSTED: nothing stalls and nothing passes unpoliced.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import List

import grpc
import pytest

from anolisnuma.pipeline.hooks import CREATE_CONTAINER, Call, Hook
from anolisnuma.testing.channel_options import CLIENT_OPTIONS, GO_LIKE_SERVER, MIB
from anolisnuma.testing.fake_cri import FakeCri, runtime_path
from anolisnuma.testing.goclient import build_gocri, run_gocri
from anolisnuma.testing.kubelet_env import service_link_env
from anolisnuma.testing.proxy import InProcessProxy, make_config

cri = pytest.importorskip("cri_api.v1.api_pb2")
cri_grpc = pytest.importorskip("cri_api.v1.api_pb2_grpc")

CREATE = runtime_path("CreateContainer")
PINNED = "7"
OK, RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED = 0, 8, 4


class PinHook(Hook):
    """Pins every container it sees, as the NUMA hook does, and counts what it saw."""

    name = "pin"

    def __init__(self) -> None:
        self.seen = 0
        self._lock = threading.Lock()

    def wants_pre(self, method: str) -> bool:
        return method == CREATE_CONTAINER

    def wants_post(self, method: str) -> bool:
        return False

    def pre(self, call: Call) -> None:
        call.request.config.linux.resources.cpuset_cpus = PINNED
        call.mark_modified()
        with self._lock:
            self.seen += 1


def create_body(i: int, env_bytes: int) -> bytes:
    """A kubelet-like CreateContainerRequest carrying ``env_bytes`` of env (service links)."""
    envs = [cri.KeyValue(key=k, value=v) for k, v in service_link_env(env_bytes, f"C{i}")]
    return cri.CreateContainerRequest(
        pod_sandbox_id=f"{i:064d}",
        config=cri.ContainerConfig(metadata=cri.ContainerMetadata(name=f"app-{i}"), envs=envs,
                                   linux=cri.LinuxContainerConfig(resources=cri.LinuxContainerResources(
                                       cpu_shares=1024, cpuset_cpus="0-1"))),
        sandbox_config=cri.PodSandboxConfig(metadata=cri.PodSandboxMetadata(name=f"pod-{i}", uid=f"uid-{i}",
                                                                            namespace="default")),
    ).SerializeToString()


@pytest.fixture(scope="module")
def gocri() -> str:
    return build_gocri()


@pytest.fixture
def backend(sockdir: str):
    with FakeCri(f"{sockdir}/cri.sock", containers=0, sandboxes=0, server_options=GO_LIKE_SERVER) as f:
        yield f


def start_proxy(sockdir: str, backend: FakeCri, hook: Hook, per_connection: int = 32 * MIB,
                total: int = 64 * MIB) -> InProcessProxy:
    config = make_config(sockdir, backend.socket_path)
    config.server.buffer_bytes_per_connection = per_connection
    config.server.buffer_bytes_total = total
    return InProcessProxy(config, hooks=[hook]).start()


def received(backend: FakeCri) -> List:
    return [cri.CreateContainerRequest.FromString(r.request) for r in backend.requests(CREATE)]


@pytest.mark.parametrize("calls,env_bytes", [(8, 40 << 10), (64, 40 << 10), (16, 1 << 20)],
                         ids=["8x40KiB", "64x40KiB", "16x1MiB"])
def test_grpc_go_concurrent_large_creates_are_all_pinned(calls, env_bytes, gocri, sockdir, backend):
    hook = PinHook()
    proxy = start_proxy(sockdir, backend, hook)
    try:
        bodies = [create_body(i, env_bytes) for i in range(calls)]
        results = run_gocri(proxy.socket_path, CREATE, bodies, deadline_s=20, binary=gocri)
        assert [r["code"] for r in results] == [OK] * calls, [r["message"] for r in results if r["code"]]
        got = received(backend)
        assert len(got) == calls and hook.seen == calls
        assert all(r.config.linux.resources.cpuset_cpus == PINNED for r in got)
        sent = {cri.CreateContainerRequest.FromString(b).pod_sandbox_id: b for b in bodies}
        for r in got:  # everything but the pinning arrives as the kubelet sent it
            original = cri.CreateContainerRequest.FromString(sent[r.pod_sandbox_id])
            assert list(r.config.envs) == list(original.config.envs)
        assert proxy.daemon.relay.budget.used == 0
    finally:
        proxy.stop()


def test_grpc_go_creates_over_the_budget_complete_pinned_or_are_refused(gocri, sockdir, backend):
    """64 × 1 MiB on one connection is more than a 16 MiB budget holds: each call completes
    pinned or gets RESOURCE_EXHAUSTED at once; none waits out its deadline and none passes
    unpinned. (That another connection is served meanwhile is measured where the daemon runs
    in a process of its own: tests/transport/test_hostile.py, scripts/bench_proxy.py; here
    the proxy, the fake backend and the client's decoding share one interpreter lock.)"""
    hook = PinHook()
    proxy = start_proxy(sockdir, backend, hook, per_connection=16 * MIB, total=24 * MIB)
    try:
        bodies = [create_body(i, 1 << 20) for i in range(64)]
        results = run_gocri(proxy.socket_path, CREATE, bodies, deadline_s=20, binary=gocri)
        codes = [r["code"] for r in results]
        assert set(codes) <= {OK, RESOURCE_EXHAUSTED}, [(r["code"], r["message"]) for r in results]
        assert codes.count(OK) >= 8  # the budget holds at least that many at once
        refused = [r for r in results if r["code"] == RESOURCE_EXHAUSTED]
        assert refused and all("budget" in r["message"] for r in refused)
        got = received(backend)
        ok_ids = {cri.CreateContainerRequest.FromString(bodies[r["index"]]).pod_sandbox_id
                  for r in results if r["code"] == OK}
        assert {r.pod_sandbox_id for r in got} == ok_ids and len(got) == len(ok_ids)
        assert all(r.config.linux.resources.cpuset_cpus == PINNED for r in got)
        assert proxy.daemon.relay.budget.used == 0
        assert proxy.daemon.relay.budget.peak <= 24 * MIB
        assert proxy.daemon.relay.counters["calls_refused_resource_exhausted"] == len(refused)
    finally:
        proxy.stop()


def test_grpcio_concurrent_large_creates_are_all_pinned(sockdir, backend):
    """The same with grpcio's C-core stack (other frame sizes, windows and scheduling)."""
    hook = PinHook()
    proxy = start_proxy(sockdir, backend, hook)
    try:
        bodies = [create_body(i, 1 << 20) for i in range(16)]
        with grpc.insecure_channel(proxy.address, options=CLIENT_OPTIONS) as channel:
            call = channel.unary_unary(CREATE)
            with ThreadPoolExecutor(16) as pool:
                replies = list(pool.map(lambda b: call(b, timeout=20), bodies))
        assert all(cri.CreateContainerResponse.FromString(r).container_id for r in replies)
        got = received(backend)
        assert len(got) == 16 and all(r.config.linux.resources.cpuset_cpus == PINNED for r in got)
    finally:
        proxy.stop()
