"""Shared pieces of the pipeline tests: CRI v1 stubs (full cri_api stubs, the independent
oracle), client/server options like the real peers', and request builders."""

from __future__ import annotations

import uuid
from typing import Dict, Optional

import pytest

pb = pytest.importorskip("cri_api.v1.api_pb2")
pb_grpc = pytest.importorskip("cri_api.v1.api_pb2_grpc")

from anolisnuma.testing.channel_options import CLIENT_OPTIONS, GO_LIKE_SERVER, MIB  # noqa: F401 (re-exported)


def sandbox_config(name: str = "web-0", namespace: str = "shop", uid: Optional[str] = None,
                   annotations: Optional[Dict[str, str]] = None, labels: Optional[Dict[str, str]] = None,
                   qos: str = "burstable"):
    uid = uid or str(uuid.uuid4())
    return pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=name, uid=uid, namespace=namespace, attempt=1),
        hostname=name, log_directory=f"/var/log/pods/{namespace}_{name}_{uid}",
        dns_config=pb.DNSConfig(servers=["10.96.0.10"], searches=[f"{namespace}.svc.cluster.local"],
                                options=["ndots:5"]),
        port_mappings=[pb.PortMapping(protocol=pb.TCP, container_port=8080, host_port=0)],
        labels={"app": name, "io.kubernetes.pod.namespace": namespace, **(labels or {})},
        annotations={"kubernetes.io/config.source": "api", **(annotations or {})},
        linux=pb.LinuxPodSandboxConfig(
            cgroup_parent=f"/kubepods/{qos}/pod{uid}",
            security_context=pb.LinuxSandboxSecurityContext(
                namespace_options=pb.NamespaceOption(network=pb.POD, pid=pb.CONTAINER),
                run_as_user=pb.Int64Value(value=1000), supplemental_groups=[1000, 2000],
                seccomp=pb.SecurityProfile(profile_type=pb.SecurityProfile.RuntimeDefault)),
            sysctls={"net.ipv4.ip_local_port_range": "1024 65535"},
            overhead=pb.LinuxContainerResources(cpu_shares=10),
            resources=pb.LinuxContainerResources(cpu_period=100000, cpu_quota=200000,
                                                 memory_limit_in_bytes=512 * MIB)),
    )


def create_request(sandbox_id: str, sandbox: Optional[object] = None, name: str = "app",
                   cpuset: str = "0-1", annotations: Optional[Dict[str, str]] = None):
    """A CreateContainerRequest with (nearly) every field the kubelet fills."""
    sandbox = sandbox or sandbox_config()
    return pb.CreateContainerRequest(
        pod_sandbox_id=sandbox_id,
        config=pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=name, attempt=2),
            image=pb.ImageSpec(image="sha256:" + "ab" * 32, annotations={"img": "x"},
                               user_specified_image="docker.io/library/nginx:1.27"),
            command=["/bin/sh", "-c"], args=["exec nginx -g 'daemon off;'"], working_dir="/srv",
            envs=[pb.KeyValue(key=f"ENV_{i}", value=f"value {i}") for i in range(20)],
            mounts=[pb.Mount(container_path="/data", host_path="/var/lib/kubelet/pods/x/volumes/data",
                             readonly=True, propagation=pb.PROPAGATION_PRIVATE,
                             uidMappings=[pb.IDMapping(host_id=100000, container_id=0, length=65536)])],
            devices=[pb.Device(container_path="/dev/fuse", host_path="/dev/fuse", permissions="rwm")],
            labels={"io.kubernetes.container.name": name},
            annotations={"io.kubernetes.container.hash": "abc123", "io.kubernetes.container.restartCount": "2",
                         **(annotations or {})},
            log_path=f"{name}/2.log", stdin=False, tty=True,
            linux=pb.LinuxContainerConfig(
                resources=pb.LinuxContainerResources(
                    cpu_period=100000, cpu_quota=150000, cpu_shares=1536, memory_limit_in_bytes=256 * MIB,
                    oom_score_adj=-997, cpuset_cpus=cpuset, cpuset_mems="0",
                    hugepage_limits=[pb.HugepageLimit(page_size="2MB", limit=0)],
                    unified={"memory.high": "200000000"}, memory_swap_limit_in_bytes=256 * MIB),
                security_context=pb.LinuxContainerSecurityContext(
                    capabilities=pb.Capability(add_capabilities=["NET_BIND_SERVICE"], drop_capabilities=["ALL"]),
                    run_as_user=pb.Int64Value(value=101), readonly_rootfs=True, no_new_privs=True,
                    masked_paths=["/proc/kcore"], readonly_paths=["/proc/sys"],
                    seccomp=pb.SecurityProfile(profile_type=pb.SecurityProfile.RuntimeDefault))),
            CDI_devices=[pb.CDIDevice(name="vendor.com/gpu=0")],
            stop_signal=pb.SIGTERM,
        ),
        sandbox_config=sandbox,
    )
