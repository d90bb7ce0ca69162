"""The daemon's own client (CriClient, grpcio) against the real containerd: what the resync,
the re-pinner and the PID lookups call, checked against what the full CRI stubs and the
real cgroups say."""

from __future__ import annotations

import os

import grpc
import pytest
from cri_client import KubeletLike, read_file

from anolisnuma.cri.client import CallError, CriClient
from cri_proto import api_pb2

CG = "/sys/fs/cgroup"


@pytest.fixture
def client(containerd):
    with CriClient(containerd.socket, timeout_seconds=30.0) as c:
        yield c


def _cpus_of(kl: KubeletLike, cid: str) -> str:
    _, info = kl.container_status(cid)
    return read_file(f"{CG}/cpuset{info['runtimeSpec']['linux']['cgroupsPath']}/cpuset.cpus")


def test_version_lists_and_status_agree_with_the_full_stubs(client, kubelet_direct: KubeletLike):
    v = client.version()
    assert v.runtime_name == "containerd" and v.runtime_api_version == "v1"
    pod = kubelet_direct.run_pod(name="cri-client", namespace="cri-client")
    cid = kubelet_direct.run_container(pod, "main", kubelet_direct.resources(cpu_shares=256))

    sandboxes = {s.id: s for s in client.list_pod_sandboxes()}
    assert sandboxes[pod.id].metadata.uid == pod.uid and sandboxes[pod.id].state == api_pb2.SANDBOX_READY
    containers = {c.id: c for c in client.list_containers(api_pb2.ContainerFilter(pod_sandbox_id=pod.id))}
    assert list(containers) == [cid] and containers[cid].state == api_pb2.CONTAINER_RUNNING

    status, info = client.container_status(cid)
    _, theirs = kubelet_direct.container_status(cid)
    assert status.id == cid and info["pid"] == theirs["pid"] > 1 and info["sandboxID"] == pod.id
    assert os.path.isdir(f"/proc/{info['pid']}")
    pstatus, pinfo = client.pod_sandbox_status(pod.id)
    assert pstatus.metadata.name == "cri-client" and pinfo["pid"] > 1


def test_a_re_pin_reaches_the_real_cgroup(client, kubelet_direct: KubeletLike):
    pod = kubelet_direct.run_pod(name="cri-repin", namespace="cri-client")
    cid = kubelet_direct.run_container(pod, "main", kubelet_direct.resources(cpu_shares=256))
    cpus = sorted(os.sched_getaffinity(0))
    target = str(cpus[-1])
    status, _ = client.container_status(cid)
    resources = api_pb2.LinuxContainerResources()
    resources.CopyFrom(status.resources.linux)
    resources.cpuset_cpus = target
    client.update_container_resources(cid, resources)
    assert _cpus_of(kubelet_direct, cid) == target
    assert client.container_status(cid)[0].resources.linux.cpuset_cpus == target


def test_an_unknown_container_is_not_found(client):
    with pytest.raises(CallError) as err:
        client.container_status("0" * 64)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(CallError) as err:
        client.update_container_resources("0" * 64, api_pb2.LinuxContainerResources(cpuset_cpus="0"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
