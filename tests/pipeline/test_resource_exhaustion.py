"""No resource exhaustion turns into a policy bypass: when a hook cannot be run (no thread,
the executor shut down) or the pipeline itself fails (out of memory), the call takes the
hook's failure policy: refused when it is ``fail``, forwarded as if anolisnuma were not
there when it is ``ignore``. The thread case is made real: the daemon as a process in a
pids cgroup that allows no new thread."""

from __future__ import annotations

import os
import uuid
from typing import Any, Iterator, List

import grpc
import pytest

from anolisnuma.config import HookSettings
from anolisnuma.ctl.client import ask
from anolisnuma.pipeline.hooks import CREATE_CONTAINER, Call, Hook
from anolisnuma.testing.daemon_probes import status_when_up, wait_until
from anolisnuma.testing.fake_cri import FakeCri, runtime_path
from anolisnuma.testing.fake_sysfs import GIB, FakeTopology
from anolisnuma.testing.proxy import SubprocessProxy, config_dict

from pipeline_helpers import CLIENT_OPTIONS, create_request, pb, pb_grpc, sandbox_config

CREATE = runtime_path("CreateContainer")
PIDS_ROOT = "/sys/fs/cgroup/pids"


class Pin(Hook):
    """Pins every container to CPU 3."""

    name = "pin"
    methods = frozenset({CREATE_CONTAINER})

    def pre(self, call: Call) -> None:
        call.request.config.linux.resources.cpuset_cpus = "3"
        call.mark_modified()


def forwarded_cpusets(fake: FakeCri) -> List[str]:
    return [pb.CreateContainerRequest.FromString(r.request).config.linux.resources.cpuset_cpus
            for r in fake.requests(CREATE)]


@pytest.mark.parametrize("policy", ["fail", "ignore"])
def test_a_hook_whose_executor_is_shut_down_takes_its_failure_policy(policy, start_proxy, fake, open_stub):
    proxy = start_proxy([Pin()], per_hook={"pin": HookSettings(failure_policy=policy)})
    stub = open_stub(proxy.address)
    stub.CreateContainer(create_request("a" * 64, cpuset=""), timeout=10)
    proxy.daemon.executor.shutdown(wait=True)   # as at the end of a shutdown, or a pool gone

    if policy == "fail":
        with pytest.raises(grpc.RpcError) as e:
            stub.CreateContainer(create_request("b" * 64, cpuset=""), timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "anolisnuma hook pin: could not be run" in e.value.details()
        assert forwarded_cpusets(fake) == ["3"]   # containerd never saw the second
    else:
        stub.CreateContainer(create_request("b" * 64, cpuset=""), timeout=10)
        assert forwarded_cpusets(fake) == ["3", ""]   # as if anolisnuma were not there
    assert proxy.interceptor.counters["hook_pin_pre_failed"] == 1


@pytest.mark.parametrize("where", ["reading the request", "running the pre-hooks"])
@pytest.mark.parametrize("policy", ["fail", "ignore"])
def test_the_pipeline_out_of_memory_takes_the_failure_policy(policy, where, start_proxy, fake, open_stub):
    proxy = start_proxy([Pin()], per_hook={"pin": HookSettings(failure_policy=policy)})
    stub = open_stub(proxy.address)

    def no_memory(*args: Any) -> Any:
        raise MemoryError()

    async def no_memory_later(*args: Any) -> Any:
        raise MemoryError()

    if where == "reading the request":   # before on_request returns
        proxy.interceptor._read = no_memory
    else:                                # in the task that runs the pre-hooks
        proxy.interceptor._run_pre = no_memory_later
    if policy == "fail":
        with pytest.raises(grpc.RpcError) as e:
            stub.CreateContainer(create_request("a" * 64, cpuset=""), timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "could not apply its policies to this CreateContainer (MemoryError)" in e.value.details()
        assert fake.calls(CREATE) == 0
        assert proxy.interceptor.counters["calls_refused"] == 1
    else:
        stub.CreateContainer(create_request("a" * 64, cpuset=""), timeout=10)
        assert forwarded_cpusets(fake) == [""]
        assert proxy.interceptor.counters["pipeline_failures_forwarded"] == 1


# ---------------------------------------------------------------- no thread, for real

class PidsCgroup:
    """A pids cgroup of cgroup v1 that a process is moved into and out of again."""

    def __init__(self) -> None:
        self.path = os.path.join(PIDS_ROOT, f"anolisnuma-test-{uuid.uuid4().hex[:8]}")
        os.mkdir(self.path)

    def hold(self, pid: int) -> int:
        """Move ``pid`` (all its threads) in and allow no new task; the tasks it has."""
        self._write("cgroup.procs", str(pid))
        current = int(self._read("pids.current"))
        self._write("pids.max", str(current))
        return current

    def release(self, pid: int) -> None:
        self._write("pids.max", "max")
        try:
            with open(os.path.join(PIDS_ROOT, "cgroup.procs"), "w") as f:
                f.write(str(pid))
        except ProcessLookupError:
            pass
        os.rmdir(self.path)

    def _read(self, name: str) -> str:
        with open(os.path.join(self.path, name)) as f:
            return f.read().strip()

    def _write(self, name: str, value: str) -> None:
        with open(os.path.join(self.path, name), "w") as f:
            f.write(value)


def half_a_cpu(request: Any) -> Any:
    """8 of them fit the 8 CPUs twice over: no refusal for want of room."""
    request.config.linux.resources.cpu_quota = 50000
    return request


def thread_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


@pytest.fixture
def numa_daemon(sockdir: str, kernel: Any, tmp_path: Any) -> Iterator[Any]:
    """The daemon as a process with the NUMA hook fail-closed (pods of namespace batch
    are placed on one of two nodes), on a fake containerd."""
    if not os.path.isdir(PIDS_ROOT):
        pytest.skip("no pids cgroup (v1) on this machine")
    fk = kernel()
    FakeTopology(name="2x4", node_cpus={0: "0-3", 1: "4-7"}, distances=[[10, 20], [20, 10]],
                 memory_bytes={0: 4 * GIB, 1: 4 * GIB}).write(fk.paths.sys_root)
    fake = FakeCri(os.path.join(sockdir, "containerd.sock"), containers=0, sandboxes=0).start()
    data = config_dict(str(tmp_path), fake.socket_path, listen=os.path.join(sockdir, "cri.sock"), extra={
        "paths": fk.paths_table(),
        "numa": {"enabled": True, "namespaces": ["batch"]},
        "hooks": {"numa": {"failure_policy": "fail", "budget_seconds": 30.0}},
        "admin": {"socket": os.path.join(sockdir, "admin.sock")},
    })
    proxy = SubprocessProxy(data, str(tmp_path)).start()
    try:
        yield proxy, fake, data["admin"]["socket"]
    finally:
        proxy.stop()
        fake.stop(0)


def test_with_no_thread_to_be_had_every_pod_still_gets_its_placement_or_is_refused(numa_daemon):
    proxy, fake, admin_socket = numa_daemon
    channel = grpc.insecure_channel(proxy.address, options=CLIENT_OPTIONS)
    try:
        stub = pb_grpc.RuntimeServiceStub(channel)
        wait_until(lambda: (status_when_up(admin_socket) or {}).get("resynced"), timeout=30,
                   what="the hooks and their loops to be up")
        sandboxes = []
        for i in range(8):   # RunPodSandbox before the limit: the store knows each pod
            config = sandbox_config(f"job-{i}", namespace="batch")
            reply = stub.RunPodSandbox(pb.RunPodSandboxRequest(config=config), timeout=10)
            sandboxes.append((reply.pod_sandbox_id, config))

        pids = PidsCgroup()
        try:
            held = pids.hold(proxy.proc.pid)
            futures = [stub.CreateContainer.future(half_a_cpu(create_request(sid, sandbox=config, cpuset="")),
                                                   timeout=30)
                       for sid, config in sandboxes]
            outcomes = []
            for f in futures:
                try:
                    outcomes.append(("ok", f.result().container_id))
                except grpc.RpcError as e:
                    outcomes.append((e.code().name, e.details()))
            status = ask(admin_socket, "status")   # the operator can still look
            threads = thread_count(proxy.proc.pid)
        finally:
            pids.release(proxy.proc.pid)
    finally:
        channel.close()

    forwarded = forwarded_cpusets(fake)
    # Nothing reached containerd without its placement: each create that went through
    # was pinned to a node's CPUs, each that could not be was refused, saying why.
    assert "" not in forwarded, (forwarded, outcomes)
    assert len(forwarded) == sum(1 for kind, _ in outcomes if kind == "ok")
    assert all(kind == "ok" or (kind == "UNAVAILABLE" and "could not be run" in why) for kind, why in outcomes), outcomes
    assert threads <= held
    pools = status["threads"]["pools"]
    assert pools["hook"] == {"threads": 8, "size": 8} and pools["admin"] == {"threads": 2, "size": 2}
    assert pools["reload"] == {"threads": 1, "size": 1}
    assert status["threads"]["total"] <= held
