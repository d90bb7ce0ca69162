"""A daemon under a socket supervisor on the real containerd, for the restart tests and
``scripts/bench_restart.py``.

:class:`RestartLab` writes a configuration with NUMA placement on (a fake two-node
topology mapped onto this machine's CPUs 0 and 1, memory pinning off, namespace
``restart``: the placements are real ``cpuset.cpus`` values) and QoS off, starts
``python -m anolisnuma`` from a tree (this checkout, or one made by
:func:`~anolisnuma.testing.socket_supervisor.export_tree`) under a
:class:`~anolisnuma.testing.socket_supervisor.SocketSupervisor`, and makes the pod
templates a :class:`~anolisnuma.testing.goclient.GoLoad` cycles through (their pod cgroups
made as the kubelet does). :meth:`placements_missing` says which of containerd's pods of
that namespace have no placement in the state file, or a container whose real cgroup is not
on its pod's NUMA node.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from typing import Any, Dict, List, Optional, Tuple

from anolisnuma.testing.containerd import CGROUP_ROOT, PrivateContainerd
from anolisnuma.testing.fake_sysfs import GIB, FakeTopology
from anolisnuma.testing.images import BUSYBOX_IMAGE
from anolisnuma.testing.proxy import REPO_ROOT, config_dict, read_log, write_config
from anolisnuma.testing.socket_supervisor import SocketSupervisor

NAMESPACE = "restart"
NODE_CPUS = {0: "0", 1: "1"}   # the fake topology's node -> this machine's CPU
SLEEP = ["/bin/sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 1 & wait $!; done"]
EVENTS_SUBSCRIBE = "/containerd.services.events.v1.Events/Subscribe"
GET_CONTAINER_EVENTS = "/runtime.v1.RuntimeService/GetContainerEvents"


class RestartLab:
    def __init__(self, containerd: PrivateContainerd, base: str, *, tree: str = REPO_ROOT,
                 grace: float = 10.0, numa: bool = True) -> None:
        self.containerd = containerd
        self.base = base
        self.tree = tree
        self.data = config_dict(base, containerd.socket, grace=grace,
                                extra={"log": {"stderr": False}, "runtime": {"connect_timeout_seconds": 5.0}})
        if numa:
            self.data["numa"] = {"enabled": True, "namespaces": [NAMESPACE], "memory_pinning": "off",
                                 "poll_interval_seconds": 0.2}
            FakeTopology(name="2n-2c-restart", node_cpus=NODE_CPUS, distances=[[10, 20], [20, 10]],
                         memory_bytes={0: 2 * GIB, 1: 2 * GIB}).write(self.data["paths"]["sys_root"])
        self.config_path = write_config(os.path.join(base, "anolisnuma.toml"), self.data)
        self.socket = self.data["server"]["listen"]
        self.state_dir = self.data["paths"]["state_dir"]
        self.log_path = self.data["log"]["file"]
        self.parents: List[str] = []
        self.supervisor = SocketSupervisor(self.socket, self.argv(), env=self.env(tree),
                                           log_path=os.path.join(base, "daemon.out"))

    def argv(self) -> List[str]:
        return [sys.executable, "-m", "anolisnuma", "-c", self.config_path]

    @staticmethod
    def env(tree: str) -> Dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NOTIFY_SOCKET")}
        env["PYTHONPATH"] = tree
        return env

    def start(self) -> "RestartLab":
        self.supervisor.start(cwd=self.tree)
        return self

    def upgrade(self, tree: str) -> int:
        """Restart into ``tree`` (its ``PYTHONPATH`` and working directory)."""
        self.tree = tree
        return self.supervisor.restart(env=self.env(tree), cwd=tree)

    def close(self) -> None:
        self.supervisor.close()

    # ---------------------------------------------------------------- pods
    def pod_template(self, name: str, millicpu: int = 500) -> Tuple[bytes, bytes, str]:
        """(PodSandboxConfig, ContainerConfig, pod uid) of a burstable pod of NAMESPACE with
        one container asking ``millicpu``; its pod cgroup is made now. Needs the full CRI
        stubs (``cri_api``, a test dependency: security contexts)."""
        from cri_api.v1 import api_pb2 as pb

        uid = str(uuid.uuid4())
        parent = f"/kubepods/burstable/pod{uid}"
        self.containerd.make_pod_cgroup(parent)
        self.parents.append(parent)
        log_dir = os.path.join(self.containerd.pod_log_root, uid)
        os.makedirs(log_dir, exist_ok=True)
        ns = pb.NamespaceOption(network=pb.NODE, pid=pb.CONTAINER, ipc=pb.POD)
        sandbox = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, uid=uid, namespace=NAMESPACE),
            log_directory=log_dir,
            labels={"io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": NAMESPACE,
                    "io.kubernetes.pod.uid": uid},
            linux=pb.LinuxPodSandboxConfig(cgroup_parent=parent,
                                           security_context=pb.LinuxSandboxSecurityContext(namespace_options=ns)))
        period = 100000
        container = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name="main"), image=pb.ImageSpec(image=BUSYBOX_IMAGE),
            command=SLEEP, log_path="main/0.log",
            labels={"io.kubernetes.container.name": "main"},
            linux=pb.LinuxContainerConfig(
                resources=pb.LinuxContainerResources(cpu_shares=millicpu * 1024 // 1000, cpu_period=period,
                                                     cpu_quota=millicpu * period // 1000),
                security_context=pb.LinuxContainerSecurityContext(namespace_options=ns)))
        return sandbox.SerializeToString(), container.SerializeToString(), uid

    def placements_missing(self) -> List[str]:
        """What is wrong with the placements of containerd's running pods of NAMESPACE: a pod
        with no allocation in numa.json, or a running container whose real cpuset.cpus is
        not its pod's node's CPU. Empty when every pod has its placement."""
        from cri_proto import api_pb2 as pb
        from anolisnuma.cri.client import CriClient

        allocations = {a["pod_uid"]: a for a in self.numa_state()}
        problems = []
        client = CriClient(self.containerd.socket)
        try:
            containers = client.list_containers()
            for p in client.list_pod_sandboxes():
                if p.metadata.namespace != NAMESPACE or p.state != pb.SANDBOX_READY:
                    continue
                alloc = allocations.get(p.metadata.uid)
                if alloc is None:
                    problems.append(f"pod {p.metadata.name} ({p.metadata.uid}) has no placement in numa.json")
                    continue
                want = ",".join(NODE_CPUS[n] for n in alloc["nodes"])
                for c in containers:
                    if c.pod_sandbox_id != p.id or c.state != pb.CONTAINER_RUNNING:
                        continue
                    _, info = client.container_status(c.id)
                    path = info["runtimeSpec"]["linux"]["cgroupsPath"].lstrip("/")
                    got = _read(os.path.join(CGROUP_ROOT, "cpuset", path, "cpuset.cpus"))
                    if got != want:
                        problems.append(f"container {c.id[:12]} of pod {p.metadata.name}: cpuset.cpus "
                                        f"{got!r}, its placement says {want!r}")
        finally:
            client.close()
        return problems

    def numa_state(self) -> List[Dict[str, Any]]:
        try:
            with open(os.path.join(self.state_dir, "numa.json")) as f:
                return json.load(f)["allocations"]
        except FileNotFoundError:
            return []

    def log(self) -> List[Dict[str, Any]]:
        return read_log(self.log_path)


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None
