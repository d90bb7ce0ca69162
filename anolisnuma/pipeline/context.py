"""Turning CRI messages into the records and log fields the pipeline and hooks use."""

from __future__ import annotations

from typing import Any, Dict

from anolisnuma.state.records import ContainerRecord, ContainerResources, PodRecord


def pod_from_sandbox_config(sandbox_id: str, config: Any, runtime_handler: str) -> PodRecord:
    md = config.metadata
    return PodRecord(
        sandbox_id=sandbox_id, uid=md.uid, name=md.name, namespace=md.namespace,
        cgroup_parent=config.linux.cgroup_parent, labels=dict(config.labels),
        annotations=dict(config.annotations), runtime_handler=runtime_handler)


def resources_of(linux_resources_holder: Any) -> ContainerResources:
    """ContainerResources from a message with a ``resources`` field (LinuxContainerConfig)
    or from a LinuxContainerResources itself."""
    r = getattr(linux_resources_holder, "resources", linux_resources_holder)
    return ContainerResources(
        cpu_period=r.cpu_period, cpu_quota=r.cpu_quota, cpu_shares=r.cpu_shares,
        memory_limit_in_bytes=r.memory_limit_in_bytes, cpuset_cpus=r.cpuset_cpus, cpuset_mems=r.cpuset_mems)


def container_from_create(container_id: str, request: Any) -> ContainerRecord:
    cfg = request.config
    return ContainerRecord(
        container_id=container_id, sandbox_id=request.pod_sandbox_id, name=cfg.metadata.name,
        labels=dict(cfg.labels), annotations=dict(cfg.annotations), resources=resources_of(cfg.linux))


def describe(call: Any) -> Dict[str, str]:
    """The identity fields of a log line: pod namespace/name/uid, container name/id."""
    out: Dict[str, str] = {"method": call.method}
    pod = call.pod
    if pod is not None:
        out.update(pod_namespace=pod.namespace, pod_name=pod.name, pod_uid=pod.uid)
        if pod.sandbox_id:
            out["pod_sandbox_id"] = pod.sandbox_id
    req = call.request
    if call.container is not None:
        out.update(container_name=call.container.name, container_id=call.container.container_id)
    elif hasattr(req, "container_id"):
        out["container_id"] = req.container_id
    elif call.method == "CreateContainer":
        out["container_name"] = req.config.metadata.name
    if pod is None and hasattr(req, "pod_sandbox_id"):
        out["pod_sandbox_id"] = req.pod_sandbox_id
    return out
