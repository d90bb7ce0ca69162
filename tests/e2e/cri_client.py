"""A kubelet-like CRI client for end-to-end tests.

Built on the full CRI v1 stubs of the PyPI package ``container-runtime-interface-api``
(``cri_api.v1``; Python >= 3.10), which are independent of the project's own ``cri_proto``
subset. ``KubeletLike`` talks to any CRI socket -- containerd's own or the proxy's -- does
what the kubelet does around the calls (creates the pod cgroup before RunPodSandbox, leaves
the hostname empty for host-network pods) and remembers everything it created so
``cleanup()`` can stop and remove it.
"""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import grpc

try:
    from cri_api.v1 import api_pb2 as pb
    from cri_api.v1 import api_pb2_grpc as pbg
    CRI_IMPORT_ERROR: Optional[str] = None
except ImportError as _e:  # Python < 3.10 or test extras not installed
    pb = pbg = None  # type: ignore[assignment]
    CRI_IMPORT_ERROR = f"cri_api (container-runtime-interface-api) not importable: {_e}"

from anolisnuma.testing import containerd as harness_mod
from anolisnuma.testing.images import BUSYBOX_IMAGE, PAUSE_IMAGE

__all__ = ["KubeletLike", "Pod", "pb", "pbg", "BUSYBOX_IMAGE", "PAUSE_IMAGE", "CRI_IMPORT_ERROR",
           "SLEEP_FOREVER"]

# PID 1 of test containers: exits 0 on SIGTERM at once (``sleep & wait`` lets the trap run
# without waiting for the current sleep), so StopContainer never waits for its timeout.
SLEEP_FOREVER = ["/bin/sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 1 & wait $!; done"]

_QOS_PARENTS = {"guaranteed": "/kubepods", "burstable": "/kubepods/burstable",
                "besteffort": "/kubepods/besteffort"}


@dataclass
class Pod:
    """A sandbox this client started."""
    id: str
    uid: str
    name: str
    namespace: str
    cgroup_parent: str
    network: str
    config: Any  # pb.PodSandboxConfig


def _ns_mode(network: str) -> int:
    if network not in ("node", "pod"):
        raise ValueError(f"network must be 'node' or 'pod', not {network!r}")
    return pb.NODE if network == "node" else pb.POD


class KubeletLike:
    """CRI calls the way the kubelet makes them, over ``unix://socket_path``.

    ``harness`` (a ``PrivateContainerd``) is used to create and record pod cgroups, so they
    are removed even if a test crashes; without it the module-level helpers are used.
    ``runtime`` / ``images`` are the raw stubs for calls not wrapped here.
    """

    def __init__(self, socket_path: str, harness: Optional["harness_mod.PrivateContainerd"] = None,
                 log_root: Optional[str] = None, timeout: float = 30.0,
                 connect_timeout: float = 10.0) -> None:
        if pb is None:
            raise RuntimeError(CRI_IMPORT_ERROR)
        self.socket_path = socket_path
        self.harness = harness
        self.timeout = timeout
        if log_root is None:
            log_root = harness.pod_log_root if harness is not None else \
                tempfile.mkdtemp(prefix="anolisnuma-podlogs-")
        self.log_root = log_root
        self.channel = grpc.insecure_channel(f"unix://{socket_path}")
        self.runtime = pbg.RuntimeServiceStub(self.channel)
        self.images = pbg.ImageServiceStub(self.channel)
        # Wait for the socket with a real call: channel_ready_future leaves a polling thread
        # behind that makes close() take 0.2 s.
        try:
            self.runtime.Version(pb.VersionRequest(version="v1"), timeout=connect_timeout,
                                 wait_for_ready=True)
        except grpc.RpcError:
            self.channel.close()
            raise
        self.pods: List[Pod] = []
        self.containers: List[str] = []
        self._cgroups: List[str] = []

    # ---------------------------------------------------------------- builders
    @staticmethod
    def resources(cpu_shares: int = 0, cpu_quota: int = 0, cpu_period: int = 0,
                  memory_limit: int = 0, cpuset_cpus: str = "", cpuset_mems: str = "",
                  oom_score_adj: int = 0, unified: Optional[Mapping[str, str]] = None) -> Any:
        """A ``LinuxContainerResources`` (0 / "" = unset, as in the kubelet)."""
        return pb.LinuxContainerResources(
            cpu_shares=cpu_shares, cpu_quota=cpu_quota, cpu_period=cpu_period,
            memory_limit_in_bytes=memory_limit, cpuset_cpus=cpuset_cpus,
            cpuset_mems=cpuset_mems, oom_score_adj=oom_score_adj, unified=dict(unified or {}))

    def sandbox_config(self, name: str, namespace: str = "default", uid: Optional[str] = None,
                       cgroup_parent: Optional[str] = None, network: str = "node",
                       labels: Optional[Mapping[str, str]] = None,
                       annotations: Optional[Mapping[str, str]] = None,
                       log_dir: Optional[str] = None, qos: str = "burstable",
                       pod_resources: Any = None, attempt: int = 0) -> Any:
        """A ``PodSandboxConfig``. ``cgroup_parent`` defaults to the kubelet's cgroupfs
        layout for ``qos`` (``/kubepods[/burstable|/besteffort]/pod<uid>``)."""
        uid = uid or str(uuid.uuid4())
        if cgroup_parent is None:
            cgroup_parent = f"{_QOS_PARENTS[qos]}/pod{uid}"
        mode = _ns_mode(network)
        linux = pb.LinuxPodSandboxConfig(
            cgroup_parent=cgroup_parent,
            security_context=pb.LinuxSandboxSecurityContext(
                namespace_options=pb.NamespaceOption(network=mode, pid=pb.CONTAINER, ipc=pb.POD)))
        if pod_resources is not None:
            linux.resources.CopyFrom(pod_resources)
        return pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, uid=uid, namespace=namespace, attempt=attempt),
            # The kubelet sends no hostname for host-network pods: runc cannot set one
            # without a private UTS namespace.
            hostname="" if network == "node" else name[:63],
            log_directory=log_dir if log_dir is not None else os.path.join(self.log_root, uid),
            labels={"io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": namespace,
                    "io.kubernetes.pod.uid": uid, **dict(labels or {})},
            annotations=dict(annotations or {}),
            linux=linux)

    def container_config(self, name: str, resources: Any = None, image: str = BUSYBOX_IMAGE,
                         command: Optional[Sequence[str]] = None, args: Sequence[str] = (),
                         labels: Optional[Mapping[str, str]] = None,
                         annotations: Optional[Mapping[str, str]] = None,
                         envs: Optional[Mapping[str, str]] = None, network: str = "node",
                         attempt: int = 0) -> Any:
        """A ``ContainerConfig``; the default command sleeps and exits 0 on SIGTERM."""
        mode = _ns_mode(network)
        cfg = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=name, attempt=attempt),
            image=pb.ImageSpec(image=image),
            command=list(command if command is not None else SLEEP_FOREVER),
            args=list(args),
            envs=[pb.KeyValue(key=k, value=v) for k, v in (envs or {}).items()],
            log_path=f"{name}/{attempt}.log",
            labels={"io.kubernetes.container.name": name, **dict(labels or {})},
            annotations=dict(annotations or {}),
            linux=pb.LinuxContainerConfig(
                security_context=pb.LinuxContainerSecurityContext(
                    namespace_options=pb.NamespaceOption(network=mode, pid=pb.CONTAINER, ipc=pb.POD))))
        if resources is not None:
            cfg.linux.resources.CopyFrom(resources)
        return cfg

    # ---------------------------------------------------------------- plain calls
    def version(self, timeout: Optional[float] = None) -> Any:
        return self.runtime.Version(pb.VersionRequest(version="v1"),
                                    timeout=self.timeout if timeout is None else timeout)

    def status(self) -> Dict[str, bool]:
        """Runtime conditions by type, e.g. ``{"RuntimeReady": True, "NetworkReady": True}``."""
        r = self.runtime.Status(pb.StatusRequest(verbose=False), timeout=self.timeout)
        return {c.type: c.status for c in r.status.conditions}

    def list_images(self) -> List[str]:
        """All repo tags the runtime knows."""
        r = self.images.ListImages(pb.ListImagesRequest(), timeout=self.timeout)
        return sorted(t for i in r.images for t in i.repo_tags)

    def pod_status(self, pod_id: str, verbose: bool = False) -> Any:
        return self.runtime.PodSandboxStatus(
            pb.PodSandboxStatusRequest(pod_sandbox_id=pod_id, verbose=verbose), timeout=self.timeout)

    def container_status(self, container_id: str) -> Tuple[Any, Dict[str, Any]]:
        """(ContainerStatus, parsed verbose ``info`` JSON: pid, runtimeSpec, ...)."""
        r = self.runtime.ContainerStatus(
            pb.ContainerStatusRequest(container_id=container_id, verbose=True), timeout=self.timeout)
        info = json.loads(r.info["info"]) if "info" in r.info else {}
        return r.status, info

    def list_containers(self, pod_id: Optional[str] = None) -> List[Any]:
        flt = pb.ContainerFilter(pod_sandbox_id=pod_id) if pod_id else None
        return list(self.runtime.ListContainers(pb.ListContainersRequest(filter=flt),
                                                timeout=self.timeout).containers)

    def list_pods(self) -> List[Any]:
        return list(self.runtime.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=self.timeout).items)

    def update_resources(self, container_id: str, resources: Any) -> None:
        self.runtime.UpdateContainerResources(
            pb.UpdateContainerResourcesRequest(container_id=container_id, linux=resources),
            timeout=self.timeout)

    def exec_sync(self, container_id: str, cmd: Sequence[str], timeout: int = 10) -> Any:
        return self.runtime.ExecSync(pb.ExecSyncRequest(container_id=container_id, cmd=list(cmd),
                                                        timeout=timeout), timeout=timeout + 5)

    # ---------------------------------------------------------------- lifecycle
    def _make_cgroup(self, parent: str) -> None:
        if self.harness is not None:
            self.harness.make_pod_cgroup(parent)
        else:
            harness_mod.make_pod_cgroup(parent)
        if parent not in self._cgroups:
            self._cgroups.append(parent)

    def run_pod(self, name: Optional[str] = None, namespace: str = "default",
                uid: Optional[str] = None, network: str = "node", qos: str = "burstable",
                cgroup_parent: Optional[str] = None, labels: Optional[Mapping[str, str]] = None,
                annotations: Optional[Mapping[str, str]] = None, pod_resources: Any = None,
                config: Any = None) -> Pod:
        """Create the pod cgroup, then RunPodSandbox. Pass ``config`` to send a ready-made
        ``PodSandboxConfig`` (its cgroup_parent is still created)."""
        if config is None:
            uid = uid or str(uuid.uuid4())
            name = name or f"pod-{uid[:8]}"
            config = self.sandbox_config(name, namespace, uid, cgroup_parent, network, labels,
                                         annotations, qos=qos, pod_resources=pod_resources)
        md = config.metadata
        parent = config.linux.cgroup_parent
        if parent:
            self._make_cgroup(parent)
        if config.log_directory:
            os.makedirs(config.log_directory, exist_ok=True)
        net = "node" if config.linux.security_context.namespace_options.network == pb.NODE else "pod"
        pod_id = self.runtime.RunPodSandbox(pb.RunPodSandboxRequest(config=config),
                                            timeout=self.timeout).pod_sandbox_id
        pod = Pod(id=pod_id, uid=md.uid, name=md.name, namespace=md.namespace,
                  cgroup_parent=parent, network=net, config=config)
        self.pods.append(pod)
        return pod

    def create_container(self, pod: Pod, name: str, resources: Any = None,
                         config: Any = None, **kw: Any) -> str:
        """CreateContainer in ``pod``; ``kw`` goes to ``container_config``. Returns the id."""
        if config is None:
            config = self.container_config(name, resources, network=pod.network, **kw)
        cid = self.runtime.CreateContainer(pb.CreateContainerRequest(
            pod_sandbox_id=pod.id, config=config, sandbox_config=pod.config),
            timeout=self.timeout).container_id
        self.containers.append(cid)
        return cid

    def start_container(self, container_id: str) -> None:
        self.runtime.StartContainer(pb.StartContainerRequest(container_id=container_id),
                                    timeout=self.timeout)

    def run_container(self, pod: Pod, name: str, resources: Any = None, **kw: Any) -> str:
        """create_container + start_container; returns the container id."""
        cid = self.create_container(pod, name, resources, **kw)
        self.start_container(cid)
        return cid

    def stop_container(self, container_id: str, timeout: int = 5) -> None:
        self.runtime.StopContainer(pb.StopContainerRequest(container_id=container_id, timeout=timeout),
                                   timeout=self.timeout + timeout)

    def remove_container(self, container_id: str) -> None:
        self.runtime.RemoveContainer(pb.RemoveContainerRequest(container_id=container_id),
                                     timeout=self.timeout)
        if container_id in self.containers:
            self.containers.remove(container_id)

    def stop_pod(self, pod: Pod) -> None:
        self.runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod.id),
                                    timeout=self.timeout)

    def remove_pod(self, pod: Pod) -> None:
        """RemovePodSandbox (removes its containers too) and the pod cgroup."""
        self.runtime.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod.id),
                                      timeout=self.timeout)
        self.pods = [p for p in self.pods if p.id != pod.id]
        self._remove_cgroup(pod.cgroup_parent)

    def _remove_cgroup(self, parent: str) -> List[str]:
        if not parent or parent not in self._cgroups:
            return []
        if self.harness is not None:
            left = self.harness.remove_pod_cgroup(parent)
        else:
            left = harness_mod.remove_pod_cgroup(parent)
        if not left:
            self._cgroups.remove(parent)
        return left

    def cleanup(self) -> List[str]:
        """Stop and remove every container and pod this client created, then their pod
        cgroups. Errors are collected, not raised; returns them."""
        errors: List[str] = []

        def attempt(what: str, fn: Any, *args: Any) -> None:
            try:
                fn(*args)
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.NOT_FOUND:
                    errors.append(f"{what}: {e.code()} {e.details()}")

        for cid in reversed(list(self.containers)):
            attempt(f"StopContainer {cid[:12]}", self.stop_container, cid, 2)
            attempt(f"RemoveContainer {cid[:12]}", self.remove_container, cid)
            if cid in self.containers:
                self.containers.remove(cid)
        for pod in reversed(list(self.pods)):
            attempt(f"StopPodSandbox {pod.id[:12]}", self.stop_pod, pod)
            attempt(f"RemovePodSandbox {pod.id[:12]}", self.remove_pod, pod)
        self.pods = []
        for parent in list(self._cgroups):
            errors += [f"cgroup left: {d}" for d in self._remove_cgroup(parent)]
        return errors

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> "KubeletLike":
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.cleanup()
        finally:
            self.close()


# --------------------------------------------------------------------------- small test helpers

def read_file(path: str) -> str:
    """A cgroup or state file's content, stripped."""
    with open(path) as f:
        return f.read().strip()
