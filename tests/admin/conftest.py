"""A daemon with the QoS and NUMA hooks on fake kernel trees, a fake containerd behind it,
its admin socket and metrics endpoint on, and a kubelet-like client driving pod lifecycles
through it; shared by the admin socket, ctl and metrics tests."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import uuid
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, Optional, Tuple

import grpc
import pytest

from anolisnuma.config import Config
from anolisnuma.ctl import main as ctl_main
from anolisnuma.testing.fake_cri import FakeCri
from anolisnuma.testing.fake_kernel import FakeKernel
from anolisnuma.testing.fake_sysfs import GIB, FakeTopology, write_cpu_manager_state
from anolisnuma.testing.proxy import InProcessProxy, config_dict, write_config
from anolisnuma.testing.waiting import wait_until
from cri_proto import api_pb2 as pb

RUNTIME = "/runtime.v1.RuntimeService/"
PERIOD = 100000
# 2 NUMA nodes of 4 CPUs; the kubelet's static CPU manager gave CPU 7 to one container.
TOPOLOGY = FakeTopology(name="2x4", node_cpus={0: "0-3", 1: "4-7"}, distances=[[10, 20], [20, 10]],
                        memory_bytes={0: 4 * GIB, 1: 4 * GIB})
EXCLUSIVE_POD_UID = str(uuid.uuid4())


def pod_parent(uid: str, kube_class: str = "burstable") -> str:
    """The cgroup_parent the kubelet (cgroupfs driver) gives a pod."""
    return f"/kubepods/{kube_class}/pod{uid}" if kube_class != "guaranteed" else f"/kubepods/pod{uid}"


@dataclass
class Pod:
    name: str
    namespace: str
    uid: str
    sandbox_id: str
    parent: str
    config: Any
    containers: Dict[str, str] = field(default_factory=dict)   # name -> id

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


class Kubelet:
    """CRI calls as the kubelet makes them (cri_proto messages), creating the cgroups the
    kubelet and runc would create in the fake kernel."""

    def __init__(self, address: str, kernel: FakeKernel) -> None:
        self.channel = grpc.insecure_channel(address)
        self.kernel = kernel
        self.calls = 0   # all of them intercepted ones

    def close(self) -> None:
        self.channel.close()

    def call(self, method: str, request: Any, reply_class: Any) -> Any:
        stub = self.channel.unary_unary(RUNTIME + method, request_serializer=type(request).SerializeToString,
                                        response_deserializer=reply_class.FromString)
        self.calls += 1
        return stub(request, timeout=10)

    def run_pod(self, name: str, namespace: str = "batch", *, uid: Optional[str] = None, kube_class: str = "burstable",
                annotations: Optional[Dict[str, str]] = None, labels: Optional[Dict[str, str]] = None,
                cgroup_parent: Optional[str] = None, cpus: int = 1, make_cgroup: bool = True) -> Pod:
        uid = uid or str(uuid.uuid4())
        if cgroup_parent is None:
            cgroup_parent = pod_parent(uid, kube_class)
            if make_cgroup:
                self.kernel.make_pod(cgroup_parent)
        config = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, namespace=namespace, uid=uid, attempt=0),
            labels=dict(labels or {}), annotations=dict(annotations or {}),
            linux=pb.LinuxPodSandboxConfig(cgroup_parent=cgroup_parent, resources=pb.LinuxContainerResources(
                cpu_period=PERIOD, cpu_quota=cpus * PERIOD, memory_limit_in_bytes=GIB)))
        reply = self.call("RunPodSandbox", pb.RunPodSandboxRequest(config=config), pb.RunPodSandboxResponse)
        return Pod(name, namespace, uid, reply.pod_sandbox_id, cgroup_parent, config)

    def create(self, pod: Pod, name: str = "app", cpuset: str = "", cpus: int = 1) -> str:
        req = pb.CreateContainerRequest(pod_sandbox_id=pod.sandbox_id, sandbox_config=pod.config, config=pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=name), linux=pb.LinuxContainerConfig(resources=pb.LinuxContainerResources(
                cpu_period=PERIOD, cpu_quota=cpus * PERIOD, memory_limit_in_bytes=GIB, cpuset_cpus=cpuset))))
        cid = self.call("CreateContainer", req, pb.CreateContainerResponse).container_id
        pod.containers[name] = cid
        return cid

    def start(self, pod: Pod, name: str = "app") -> None:
        cid = pod.containers[name]
        if pod.parent.startswith("/kubepods"):
            self.kernel.make_container(pod.parent, cid)
        self.call("StartContainer", pb.StartContainerRequest(container_id=cid), pb.StartContainerResponse)

    def run_started(self, name: str, namespace: str = "batch", containers: Tuple[str, ...] = ("app",),
                    cpuset: str = "", **kw: Any) -> Pod:
        """RunPodSandbox, then CreateContainer and StartContainer for each container."""
        pod = self.run_pod(name, namespace, **kw)
        for c in containers:
            self.create(pod, c, cpuset=cpuset)
            self.start(pod, c)
        return pod

    def remove(self, pod: Pod) -> None:
        for cid in pod.containers.values():
            self.call("StopContainer", pb.StopContainerRequest(container_id=cid), pb.StopContainerResponse)
            self.call("RemoveContainer", pb.RemoveContainerRequest(container_id=cid), pb.RemoveContainerResponse)
        self.call("StopPodSandbox", pb.StopPodSandboxRequest(pod_sandbox_id=pod.sandbox_id), pb.StopPodSandboxResponse)
        self.call("RemovePodSandbox", pb.RemovePodSandboxRequest(pod_sandbox_id=pod.sandbox_id),
                  pb.RemovePodSandboxResponse)


@dataclass
class Node:
    proxy: InProcessProxy
    kubelet: Kubelet
    kernel: FakeKernel
    fake: FakeCri
    config_path: str
    data: Dict[str, Any]
    admin_socket: str

    @property
    def daemon(self) -> Any:
        return self.proxy.daemon

    @property
    def metrics_url(self) -> str:
        return self.daemon.admin.metrics.url

    def settle(self) -> None:
        """Wait until the daemon recorded every call the kubelet made, their post-hooks ran
        and the state of what they removed was released (all happen just after the reply
        reached the client)."""
        interceptor = self.daemon.interceptor
        wait_until(lambda: sum(n for n, _, _ in interceptor.call_stats.snapshot().values()) >= self.kubelet.calls,
                   "the daemon to record every call")

        async def work_after_replies() -> int:
            # A removal's post-hooks start its release only as they end: what settle() waited
            # for may have started more, so count what is still there once it returns.
            await interceptor.settle(5)
            return len(interceptor._after_reply)

        wait_until(lambda: asyncio.run_coroutine_threadsafe(work_after_replies(), self.proxy.loop).result(10) == 0,
                   "the post-hooks and the releases they start to finish")

    def ctl(self, *args: str) -> Tuple[int, str, str]:
        """``anolisnuma-ctl --admin-socket <ours> ARGS`` in this process, once the daemon
        caught up with the kubelet: (exit code, stdout, stderr)."""
        if self.proxy.thread is not None:
            self.settle()
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = ctl_main.main(["--admin-socket", self.admin_socket] + list(args))
            except SystemExit as e:   # argparse
                code = int(e.code or 0)
        return code, out.getvalue(), err.getvalue()

    def ctl_json(self, *args: str) -> Any:
        import json

        code, out, err = self.ctl("-o", "json", *args)
        assert code == 0, err
        return json.loads(out)

    def rewrite_config(self, **sections: Dict[str, Any]) -> None:
        for name, values in sections.items():
            self.data.setdefault(name, {}).update(values)
        write_config(self.config_path, self.data)


def node_config(base: str, sockdir: str, backend: str, kernel: FakeKernel) -> Dict[str, Any]:
    return config_dict(base, backend, listen=os.path.join(sockdir, "cri.sock"), extra={
        "log": {"stderr": False},
        "paths": kernel.paths_table(),
        "qos": {"enabled": True, "reconcile_interval_seconds": 1.0},
        "numa": {"enabled": True, "namespaces": ["batch"], "poll_interval_seconds": 0.1,
                 "affinity": {"enabled": True, "interval_seconds": 0.1}},
        "admin": {"socket": os.path.join(sockdir, "admin.sock")},
        "metrics": {"listen": "127.0.0.1:0"},
    })


@pytest.fixture
def node(sockdir: str, kernel: Any, tmp_path: Any) -> Iterator[Node]:
    fk = kernel()
    TOPOLOGY.write(fk.paths.sys_root)
    write_cpu_manager_state(fk.paths.kubelet_cpu_manager_state, policy="static", default_cpuset="0-6",
                            entries={EXCLUSIVE_POD_UID: {"app": "7"}})
    fake = FakeCri(os.path.join(sockdir, "containerd.sock"), containers=0, sandboxes=0).start()
    data = node_config(str(tmp_path), sockdir, fake.socket_path, fk)
    path = write_config(str(tmp_path / "config.toml"), data)
    proxy = InProcessProxy(Config.load(path)).start()
    kubelet = Kubelet(proxy.address, fk)
    try:
        proxy.wait_resynced()
        yield Node(proxy, kubelet, fk, fake, path, data, data["admin"]["socket"])
    finally:
        kubelet.close()
        proxy.stop()
        fake.stop(0)
