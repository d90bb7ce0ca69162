"""Start-up resync: make the store agree with what containerd runs.

Records of pods and containers containerd no longer has are dropped; pods and containers
we never saw (created while the proxy was down, or before it was installed) are read back
from containerd's verbose status. Records added by calls that pass while the resync runs
are never dropped: only what the store held before containerd was listed can be stale.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import structlog

from anolisnuma.state.records import ContainerRecord, ContainerResources, PodRecord
from anolisnuma.state.store import Store

log = structlog.get_logger("anolisnuma.resync")


def resync_store(client: Any, store: Store) -> Tuple[List[PodRecord], List[ContainerRecord]]:
    """Reconcile ``store`` with containerd through ``client`` (a CriClient); returns the
    pods and containers that exist now. Raises grpc.RpcError when containerd is down."""
    known_pods = {p.sandbox_id for p in store.pods()}
    known_containers = {c.container_id for c in store.containers()}
    sandboxes = client.list_pod_sandboxes()
    containers = client.list_containers()

    live_pods = {s.id for s in sandboxes}
    live_containers = {c.id for c in containers}
    dropped_pods = [sid for sid in known_pods - live_pods if store.remove_pod(sid) is not None]
    dropped_containers = [cid for cid in known_containers - live_containers
                          if store.remove_container(cid) is not None]

    adopted_pods = 0
    for s in sandboxes:
        if store.pod(s.id) is None:
            store.put_pod(_pod_from_containerd(client, s))
            adopted_pods += 1
    adopted_containers = 0
    for c in containers:
        if store.container(c.id) is None and store.pod(c.pod_sandbox_id) is not None:
            store.put_container(_container_from_containerd(client, c))
            adopted_containers += 1
    log.info("store reconciled with containerd", pods=len(live_pods), containers=len(live_containers),
             dropped_pods=len(dropped_pods), dropped_containers=len(dropped_containers),
             adopted_pods=adopted_pods, adopted_containers=adopted_containers)
    pods = [p for p in store.pods() if p.sandbox_id in live_pods]
    ctrs = [c for c in store.containers() if c.container_id in live_containers]
    return pods, ctrs


def _pod_from_containerd(client: Any, sandbox: Any) -> PodRecord:
    cgroup_parent = ""
    try:
        _, info = client.pod_sandbox_status(sandbox.id, verbose=True)
        cgroup_parent = _dig(info, "config", "linux", "cgroup_parent") or ""
    except Exception as e:  # the pod may vanish between list and status
        log.warning("cannot read pod status", pod_sandbox_id=sandbox.id, error=str(e))
    md = sandbox.metadata
    return PodRecord(sandbox_id=sandbox.id, uid=md.uid, name=md.name, namespace=md.namespace,
                     cgroup_parent=cgroup_parent, labels=dict(sandbox.labels),
                     annotations=dict(sandbox.annotations), runtime_handler=sandbox.runtime_handler)


def _container_from_containerd(client: Any, container: Any) -> ContainerRecord:
    resources = ContainerResources()
    try:
        _, info = client.container_status(container.id, verbose=True)
        resources = _resources_from_spec(_dig(info, "runtimeSpec", "linux", "resources") or {})
    except Exception as e:
        log.warning("cannot read container status", container_id=container.id, error=str(e))
    return ContainerRecord(container_id=container.id, sandbox_id=container.pod_sandbox_id,
                           name=container.metadata.name, labels=dict(container.labels),
                           annotations=dict(container.annotations), resources=resources)


def _resources_from_spec(res: Dict[str, Any]) -> ContainerResources:
    """ContainerResources from an OCI runtime spec's ``linux.resources``."""
    cpu = res.get("cpu") or {}
    memory = res.get("memory") or {}
    return ContainerResources(
        cpu_period=int(cpu.get("period") or 0), cpu_quota=int(cpu.get("quota") or 0),
        cpu_shares=int(cpu.get("shares") or 0), memory_limit_in_bytes=int(memory.get("limit") or 0),
        cpuset_cpus=str(cpu.get("cpus") or ""), cpuset_mems=str(cpu.get("mems") or ""))


def _dig(data: Any, *keys: str) -> Any:
    for k in keys:
        if not isinstance(data, dict):
            return None
        data = data.get(k)
    return data
