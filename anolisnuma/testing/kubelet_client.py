"""A kubelet-like CRI client for tests and benchmarks: the pod lifecycle calls the kubelet
makes (cri_proto messages over a plain gRPC channel), for a proxy or a fake backend.

    kubelet = Kubelet(proxy.address)
    pod = kubelet.run("web-0", namespace="batch", containers=2)
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Dict, List

import grpc

from anolisnuma.testing.fake_sysfs import GIB
from cri_proto import api_pb2 as pb

PERIOD = 100000
RUNTIME = "/runtime.v1.RuntimeService/"


@dataclass
class Pod:
    name: str
    namespace: str
    uid: str
    sandbox_id: str
    config: Any
    containers: Dict[str, str] = field(default_factory=dict)


class Kubelet:
    """The kubelet's pod lifecycle calls through the proxy (cri_proto messages)."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address)

    def call(self, method: str, request: Any, reply_class: Any, timeout: float = 10) -> Any:
        stub = self.channel.unary_unary(RUNTIME + method, request_serializer=type(request).SerializeToString,
                                        response_deserializer=reply_class.FromString)
        return stub(request, timeout=timeout)

    def run(self, name: str, namespace: str = "batch", containers: int = 1) -> Pod:
        """RunPodSandbox and CreateContainer for ``containers`` containers of half a CPU."""
        uid = str(uuid.uuid4())
        config = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, namespace=namespace, uid=uid, attempt=0),
            linux=pb.LinuxPodSandboxConfig(cgroup_parent=f"/kubepods/burstable/pod{uid}",
                                           resources=pb.LinuxContainerResources(
                                               cpu_period=PERIOD, cpu_quota=PERIOD, memory_limit_in_bytes=GIB)))
        sid = self.call("RunPodSandbox", pb.RunPodSandboxRequest(config=config),
                        pb.RunPodSandboxResponse).pod_sandbox_id
        pod = Pod(name, namespace, uid, sid, config)
        for i in range(containers):
            req = pb.CreateContainerRequest(pod_sandbox_id=sid, sandbox_config=config, config=pb.ContainerConfig(
                metadata=pb.ContainerMetadata(name=f"c{i}"), linux=pb.LinuxContainerConfig(
                    resources=pb.LinuxContainerResources(cpu_period=PERIOD, cpu_quota=PERIOD // 2))))
            pod.containers[f"c{i}"] = self.call("CreateContainer", req, pb.CreateContainerResponse).container_id
        return pod

    def version(self, timeout: float = 5) -> Any:
        return self.call("Version", pb.VersionRequest(), pb.VersionResponse, timeout=timeout)

    def close(self) -> None:
        self.channel.close()


def sent_cpusets(fake: Any, container_id: str) -> List[str]:
    """The ``cpuset_cpus`` of every UpdateContainerResources a FakeCri got for
    ``container_id``, in order (what the daemon's re-pinner asked containerd for)."""
    out = []
    for r in fake.requests(RUNTIME + "UpdateContainerResources"):
        req = pb.UpdateContainerResourcesRequest.FromString(r.request)
        if req.container_id == container_id:
            out.append(req.linux.cpuset_cpus)
    return out
