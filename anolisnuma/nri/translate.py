"""NRI's pods and containers as the CRI messages the hooks read, and the hooks' edits back
as NRI adjustments.

The hooks were written for the kubelet's CRI calls (``anolisnuma/hooks``); in NRI mode
containerd tells the plugin the same facts in NRI's own messages. Translating them into
the CRI requests the kubelet would have sent lets the one pipeline (store, pod locks,
hooks, journal, metrics) serve both front-ends, so a policy cannot behave differently
under them. Only what the hooks read is carried over: identity, labels, annotations, the
cgroup parent, and the CPU/memory resources. The answer goes back the other way: the
cpuset fields a pre-hook edited become a ``ContainerAdjustment`` (CreateContainer) or a
``ContainerUpdate`` (UpdateContainer); nothing else a hook could edit has an NRI field a
hook uses.

Everything here reads messages containerd sent on a root-only socket; a field that is
absent reads as its zero value, as protobuf gives it, and nothing becomes a path here.
"""

from __future__ import annotations

from typing import Any, Optional

from cri_proto import api_pb2 as cri
from nri_proto import api_pb2 as nri

_INT64_MAX = 2 ** 63 - 1


def cri_resources(res: Any) -> cri.LinuxContainerResources:
    """NRI ``LinuxResources`` as CRI ``LinuxContainerResources`` (CPU and memory only;
    an unset optional is 0, as the kubelet sends "not set")."""
    out = cri.LinuxContainerResources()
    if res is None:
        return out
    cpu, mem = res.cpu, res.memory
    # (period and shares are uint64 in NRI and int64 in CRI: a value past int64, which no
    # runtime applies, is read as the largest CRI can say rather than failing the event)
    if cpu.HasField("period"):
        out.cpu_period = min(cpu.period.value, _INT64_MAX)
    if cpu.HasField("quota"):
        out.cpu_quota = cpu.quota.value
    if cpu.HasField("shares"):
        out.cpu_shares = min(cpu.shares.value, _INT64_MAX)
    out.cpuset_cpus = cpu.cpus
    out.cpuset_mems = cpu.mems
    if mem.HasField("limit"):
        out.memory_limit_in_bytes = mem.limit.value
    return out


def sandbox_config(pod: Any) -> cri.PodSandboxConfig:
    """The ``PodSandboxConfig`` the kubelet gave for NRI's ``PodSandbox``."""
    cfg = cri.PodSandboxConfig()
    cfg.metadata.name = pod.name
    cfg.metadata.uid = pod.uid
    cfg.metadata.namespace = pod.namespace
    cfg.labels.update(pod.labels)
    cfg.annotations.update(pod.annotations)
    cfg.linux.cgroup_parent = pod.linux.cgroup_parent
    if pod.linux.HasField("pod_resources"):
        cfg.linux.resources.CopyFrom(cri_resources(pod.linux.pod_resources))
    return cfg


def run_pod_sandbox(pod: Any) -> "tuple[cri.RunPodSandboxRequest, cri.RunPodSandboxResponse]":
    req = cri.RunPodSandboxRequest(config=sandbox_config(pod), runtime_handler=pod.runtime_handler)
    return req, cri.RunPodSandboxResponse(pod_sandbox_id=pod.id)


def create_container(pod: Any, ctr: Any) -> "tuple[cri.CreateContainerRequest, cri.CreateContainerResponse]":
    req = cri.CreateContainerRequest(pod_sandbox_id=pod.id or ctr.pod_sandbox_id)
    req.sandbox_config.CopyFrom(sandbox_config(pod))
    cfg = req.config
    cfg.metadata.name = ctr.name
    cfg.labels.update(ctr.labels)
    cfg.annotations.update(ctr.annotations)
    cfg.linux.resources.CopyFrom(cri_resources(ctr.linux.resources if ctr.HasField("linux") else None))
    return req, cri.CreateContainerResponse(container_id=ctr.id)


def update_container(ctr: Any, resources: Any) -> cri.UpdateContainerResourcesRequest:
    """The kubelet's UpdateContainerResources, from NRI's UpdateContainer (``resources``
    is the request's ``linux_resources``: what the kubelet asks for now)."""
    req = cri.UpdateContainerResourcesRequest(container_id=ctr.id)
    req.linux.CopyFrom(cri_resources(resources))
    return req


def _cpuset_edit(before: cri.LinuxContainerResources, after: cri.LinuxContainerResources) -> Optional[nri.LinuxResources]:
    """The cpuset fields a hook changed, as NRI resources; None when it changed none."""
    if before.cpuset_cpus == after.cpuset_cpus and before.cpuset_mems == after.cpuset_mems:
        return None
    res = nri.LinuxResources()
    res.cpu.cpus = after.cpuset_cpus
    res.cpu.mems = after.cpuset_mems
    return res


def adjustment(before: cri.CreateContainerRequest, after: cri.CreateContainerRequest) -> nri.ContainerAdjustment:
    """What containerd must change in the container it creates: the hooks' cpuset."""
    adjust = nri.ContainerAdjustment()
    res = _cpuset_edit(before.config.linux.resources, after.config.linux.resources)
    if res is not None:
        adjust.linux.resources.CopyFrom(res)
    return adjust


def container_update(container_id: str, before: cri.UpdateContainerResourcesRequest,
                     after: cri.UpdateContainerResourcesRequest) -> Optional[nri.ContainerUpdate]:
    """The hooks' cpuset for a container being updated; None when they changed none."""
    res = _cpuset_edit(before.linux, after.linux)
    if res is None:
        return None
    update = nri.ContainerUpdate(container_id=container_id)
    update.linux.resources.CopyFrom(res)
    return update


def cpuset_update(container_id: str, cpus: str, mems: str) -> nri.ContainerUpdate:
    """A live move (the re-pinner's): only the container's cpuset."""
    update = nri.ContainerUpdate(container_id=container_id)
    update.linux.resources.cpu.cpus = cpus
    update.linux.resources.cpu.mems = mems
    return update
