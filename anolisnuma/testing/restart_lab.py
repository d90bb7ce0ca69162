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
import time
import uuid
from typing import Any, Dict, List, Optional, Tuple

from anolisnuma.testing.containerd import CGROUP_ROOT, PrivateContainerd
from anolisnuma.testing.fake_sysfs import GIB, FakeTopology
from anolisnuma.testing.images import BUSYBOX_IMAGE
from anolisnuma.testing.proxy import REPO_ROOT, config_dict, read_log, write_config
from anolisnuma.testing.socket_supervisor import SocketSupervisor
from anolisnuma.testing.waiting import wait_until

NAMESPACE = "restart"
NODE_CPUS = {0: "0", 1: "1"}   # the fake topology's node -> this machine's CPU
SLEEP = ["/bin/sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 1 & wait $!; done"]
EVENTS_SUBSCRIBE = "/containerd.services.events.v1.Events/Subscribe"
GET_CONTAINER_EVENTS = "/runtime.v1.RuntimeService/GetContainerEvents"


class RestartLab:
    def __init__(self, containerd: PrivateContainerd, base: str, *, tree: str = REPO_ROOT,
                 grace: float = 10.0, numa: bool = True, log_level: str = "info") -> None:
        self.containerd = containerd
        self.base = base
        self.tree = tree
        self.data = config_dict(base, containerd.socket, grace=grace,
                                extra={"log": {"stderr": False, "level": log_level}, "runtime": {"connect_timeout_seconds": 5.0}})
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
        self.orphaned_tasks: List[str] = []   # runc containers containerd had lost (see _remove_orphans)
        self.stuck_tasks: List[str] = []      # tasks of exited containers killed by ctr (_delete_stuck_tasks)
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

    def close(self) -> List[str]:
        """Stop the daemon and the socket; remove every pod of NAMESPACE from containerd
        (directly) and the pod cgroups made; returns what could not be removed."""
        self.supervisor.close()
        return self.remove_pods()

    def run_pod(self, name: str, millicpu: int = 500, socket_path: Optional[str] = None) -> Tuple[str, str]:
        """A pod with one running container, made through the proxy (or ``socket_path``) the
        kubelet's way; (sandbox id, container id)."""
        from cri_api.v1 import api_pb2 as pb
        from cri_api.v1 import api_pb2_grpc as pbg
        import grpc

        sandbox, container, _ = self.pod_template(name, millicpu)
        sb, ct = pb.PodSandboxConfig.FromString(sandbox), pb.ContainerConfig.FromString(container)
        with grpc.insecure_channel(f"unix://{socket_path or self.socket}") as ch:
            rt = pbg.RuntimeServiceStub(ch)
            pod = rt.RunPodSandbox(pb.RunPodSandboxRequest(config=sb), timeout=60).pod_sandbox_id
            cid = rt.CreateContainer(pb.CreateContainerRequest(pod_sandbox_id=pod, config=ct, sandbox_config=sb),
                                     timeout=60).container_id
            rt.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=60)
        return pod, cid

    def remove_pods(self) -> List[str]:
        from cri_api.v1 import api_pb2 as pb
        from cri_api.v1 import api_pb2_grpc as pbg
        import grpc

        problems = []
        with grpc.insecure_channel(f"unix://{self.containerd.socket}") as ch:
            rt = pbg.RuntimeServiceStub(ch)
            self.stuck_tasks += self._delete_stuck_tasks(rt, pb)
            for p in rt.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=30).items:
                if p.metadata.namespace != NAMESPACE:
                    continue
                error = self._stop_and_remove(rt, pb, p.id)
                if error is not None and "cannot delete running task" in (error.details() or ""):
                    stuck = self._delete_stuck_tasks(rt, pb)   # one its cut StartContainer left since
                    self.stuck_tasks += stuck
                    error = self._stop_and_remove(rt, pb, p.id) if stuck else error
                if error is not None:
                    problems.append(f"pod {p.metadata.name}: {error.code().name} {error.details()}")
            problems += self._remove_orphans(rt, pb)
            self.orphaned_tasks += self._kill_lost_tasks(rt, pb)
        for parent in self.parents:
            left = self.containerd.remove_pod_cgroup(parent)
            problems += [f"cgroup left: {d} (tasks: {_tasks(d)})" for d in left]
        self.parents = []
        return problems

    def _delete_stuck_tasks(self, rt: Any, pb: Any) -> List[str]:
        """Containers the CRI says exited whose containerd task is still there, their tasks
        killed and deleted with ``ctr``; their ids. containerd 1.7 makes one when the
        StartContainer it is running is cancelled after it made the task ("failed to create
        containerd task: failed to get task pid: context canceled"): the CRI marks the
        container exited, so StopContainer passes it by and RemoveContainer refuses it
        ("cannot delete running task") on every try, as it would the kubelet's."""
        exited = {c.id for c in rt.ListContainers(pb.ListContainersRequest(), timeout=30).containers
                  if c.state == pb.CONTAINER_EXITED}
        if not exited:
            return []
        stuck = []
        for line in self.containerd.ctr("task", "ls").splitlines()[1:]:
            words = line.split()   # TASK PID STATUS
            if len(words) == 3 and words[0] in exited and words[2] != "STOPPED":
                stuck.append(words[0])
        for cid in stuck:
            self.containerd.ctr("task", "delete", "--force", cid)
        return stuck

    def _kill_lost_tasks(self, rt: Any, pb: Any) -> List[str]:
        """Containers runc still has that containerd no longer knows, killed and deleted;
        their ids. containerd 2.x makes one when the StartContainer it is running is
        cancelled (its client's connection closed: a kill -9 of the daemon) after ``runc
        create``: its ``runc init`` waits in the pod's cgroup, and no CRI call can reach it."""
        known = {c.id for c in rt.ListContainers(pb.ListContainersRequest(), timeout=30).containers}
        known |= {p.id for p in rt.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=30).items}
        return self.containerd.kill_lost_tasks(known)

    @staticmethod
    def _remove_orphans(rt: Any, pb: Any) -> List[str]:
        """Containers whose pod is gone, removed as the kubelet's garbage collector does. A
        CreateContainer that a kill -9 cut may still be running in containerd 2.x when its
        pod is removed: the container it then makes belongs to no pod (its ``runc init``
        waits in the pod's cgroup)."""
        import grpc

        sandboxes = {p.id for p in rt.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=30).items}
        problems = []
        for c in rt.ListContainers(pb.ListContainersRequest(), timeout=30).containers:
            if c.pod_sandbox_id in sandboxes:
                continue
            try:
                rt.StopContainer(pb.StopContainerRequest(container_id=c.id, timeout=0), timeout=60)
                rt.RemoveContainer(pb.RemoveContainerRequest(container_id=c.id), timeout=60)
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.NOT_FOUND:
                    problems.append(f"container {c.id[:12]} of no pod: {e.code().name} {e.details()}")
        return problems

    @staticmethod
    def _stop_and_remove(rt: Any, pb: Any, sandbox_id: str, attempts: int = 20) -> Optional[Any]:
        """StopPodSandbox then RemovePodSandbox, again while containerd refuses (a StartContainer
        a kill cut may finish after the stop, leaving a running task), as the kubelet does; None
        once removed, else the last error."""
        import grpc

        error = None
        for _ in range(attempts):
            try:
                rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=60)
                rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=60)
                return None
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.NOT_FOUND:
                    return None
                error = e
                time.sleep(0.25)   # the kubelet's pace of retries, not a wait for a state
        return error

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

    def placements_missing(self, settle: float = 10.0) -> List[str]:
        """What is wrong with the placements of containerd's running pods of NAMESPACE: a pod
        with no allocation in numa.json, or a running container whose real cpuset.cpus is
        not its pod's node's CPU. Empty when every pod has its placement. numa.json is
        written behind the calls and the re-pinner works behind them too: asked again until
        empty or ``settle`` seconds passed, the last answer returned."""
        problems: List[str] = []

        def settled() -> bool:
            problems[:] = self._placements_missing()
            return not problems

        try:
            wait_until(settled, "every pod's placement", settle)
        except AssertionError:
            pass
        return problems

    def _placements_missing(self) -> List[str]:
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


EDGE_SECONDS = 2.0   # see stream_report


def stream_report(records: List[Dict[str, Any]], stream: str = "events", reference: str = "direct",
                  margin: float = 0.2) -> Dict[str, Any]:
    """How the event stream ``stream`` (through the proxy) did beside ``reference`` (the
    same subscription on containerd's own socket), from GoLoad's records: how many times it
    was opened, and the events the reference received while the proxied stream had been
    open for over ``margin`` seconds (and was not about to close) that it never got, but for
    those at a span's edges sent before or after every event it got (below): ``lost`` must
    be empty."""
    end = max((r["t"] for r in records if "t" in r), default=0.0)
    spans = []
    opened: Optional[float] = None
    for r in records:
        if r.get("stream") != stream:
            continue
        if r["kind"] == "open":
            opened = r["t"]
        elif r["kind"] == "closed" and opened is not None:
            spans.append((opened, r["t"]))
            opened = None
    if opened is not None:
        spans.append((opened, end))
    got = {r["key"] for r in records if r["kind"] == "event" and r.get("stream") == stream}
    ref = [r for r in records if r["kind"] == "event" and r.get("stream") == reference]
    sent_at = {r["key"]: r["t"] for r in ref}
    # The client's "open" is when it sent its request, not when containerd took the
    # subscription, and its "closed" comes a moment after the cut; on a busy machine either
    # gap can pass the margin. containerd sends every subscriber its events in one order: an
    # event sent before the first one the stream got in a span, or after the last, and within
    # EDGE_SECONDS of the span's start or end, may have fallen in that gap. Any other missing
    # event is lost (a stream that stalls longer than that is caught).
    bounds = []
    for a, b in spans:
        mine = [sent_at[r["key"]] for r in records if r["kind"] == "event" and r.get("stream") == stream
                and a <= r["t"] <= b and r["key"] in sent_at]
        bounds.append((a, b, min(mine) if mine else None, max(mine) if mine else None))

    def in_gap(t: float, a: float, b: float, lo: Optional[float], hi: Optional[float]) -> bool:
        return ((lo is not None and t < lo and t < a + EDGE_SECONDS)
                or (hi is not None and t > hi and t > b - EDGE_SECONDS))

    lost = [r for r in ref if r["key"] not in got
            and any(a + margin < r["t"] < b - margin and not in_gap(r["t"], a, b, lo, hi)
                    for a, b, lo, hi in bounds)]
    return {"opens": sum(1 for r in records if r["kind"] == "open" and r.get("stream") == stream),
            "events": len(got),
            "reference_events": sum(1 for r in records if r["kind"] == "event" and r.get("stream") == reference),
            "lost": lost}


def _tasks(cgroup_dir: str) -> str:
    """The pids in a cgroup and their command lines, for a leftover's report."""
    try:
        with open(os.path.join(cgroup_dir, "tasks")) as f:
            pids = f.read().split()
    except OSError as e:
        return f"unreadable: {e.strerror}"
    out = []
    for pid in pids[:5]:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            out.append(f"{pid} {argv}")
        except OSError:
            out.append(pid)
    return "; ".join(out) or "none"
