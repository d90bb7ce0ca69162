#!/usr/bin/env python3
"""See anolisnuma work without a kubelet or crictl: two pods through the proxy, then what
the daemon says it did with them.

    scripts/demo.py [--socket PATH] [--admin-socket PATH] [--daemon-pid PID]
                                               create the pods, show them
    scripts/demo.py --remove [...]             stop and remove them again

The pods go into the namespace ``anolisnuma-demo`` (``scripts/run-local.sh --demo`` runs the
proxy with NUMA placement on for that namespace):

- ``be-anolisbox``: a BestEffort pod written for anolisbox (``anolisbox.sh/qoslevel: BE``):
  its QoS level comes from the annotation;
- ``numa-web``: a Burstable pod of one CPU: NUMA-managed, so it is pinned to a NUMA node.

Each gets one container of the pause image the local containerd holds
(``registry.k8s.io/pause:3.6``; ``scripts/private-containerd`` imports it, with
``docker.io/library/busybox:anolisnuma``). As the kubelet does, the pod's cgroup is made
before RunPodSandbox. The calls are the project's own CRI messages (``cri_proto``) over
gRPC, sent to the proxy's socket like a kubelet's; then ``anolisnuma-ctl pods`` and
``anolisnuma-ctl explain`` show the decisions. Needs root.

Before any pod is made, the daemon on the admin socket must be the one serving ``--socket``
(and, given ``--daemon-pid``, that process): on a node where another anolisnuma holds
either socket, the demo would make its pods through one daemon and show the other's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import uuid
from typing import Any, List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import grpc  # noqa: E402

from anolisnuma.ctl import main as ctl_main  # noqa: E402
from anolisnuma.ctl.client import CtlError, ask  # noqa: E402
from anolisnuma.ctl.table import printable  # noqa: E402
from anolisnuma.testing.containerd import make_pod_cgroup, remove_pod_cgroup  # noqa: E402
from anolisnuma.testing.images import PAUSE_IMAGE  # noqa: E402
from cri_proto import api_pb2 as pb  # noqa: E402

NAMESPACE = "anolisnuma-demo"
RUNTIME = "/runtime.v1.RuntimeService/"
PERIOD = 100_000
MIB = 1 << 20
DEMO_LABEL = "anolisnuma.io/demo"
# How long the daemon has to answer on its admin socket (it listens there just after the CRI socket).
ADMIN_WAIT_SECONDS = 60.0


class Cri:
    """The few RuntimeService calls the demo makes, through the proxy."""

    def __init__(self, socket_path: str) -> None:
        self.channel = grpc.insecure_channel(f"unix://{socket_path}")

    def call(self, method: str, request: Any, reply: Any, timeout: float = 60) -> Any:
        stub = self.channel.unary_unary(RUNTIME + method, request_serializer=type(request).SerializeToString,
                                        response_deserializer=reply.FromString)
        return stub(request, timeout=timeout, wait_for_ready=True)


def pod_config(name: str, qos: str, annotations: dict, cpus: float) -> Any:
    uid = str(uuid.uuid4())
    parent = f"/kubepods/{qos}/pod{uid}" if qos != "guaranteed" else f"/kubepods/pod{uid}"
    resources = pb.LinuxContainerResources(cpu_period=PERIOD, cpu_quota=int(cpus * PERIOD),
                                           memory_limit_in_bytes=256 * MIB) if cpus else None
    return pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=name, namespace=NAMESPACE, uid=uid),
        hostname=name, labels={DEMO_LABEL: "true", "io.kubernetes.pod.namespace": NAMESPACE},
        annotations=annotations, linux=pb.LinuxPodSandboxConfig(cgroup_parent=parent, resources=resources))


def run_pod(cri: Cri, config: Any, cpus: float) -> str:
    make_pod_cgroup(config.linux.cgroup_parent)
    sid = cri.call("RunPodSandbox", pb.RunPodSandboxRequest(config=config), pb.RunPodSandboxResponse).pod_sandbox_id
    limits = pb.LinuxContainerResources(cpu_period=PERIOD, cpu_quota=int(cpus * PERIOD),
                                        memory_limit_in_bytes=256 * MIB) if cpus else pb.LinuxContainerResources()
    container = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="main"), image=pb.ImageSpec(image=PAUSE_IMAGE),
                                   linux=pb.LinuxContainerConfig(resources=limits))
    cid = cri.call("CreateContainer", pb.CreateContainerRequest(pod_sandbox_id=sid, config=container,
                                                                sandbox_config=config),
                   pb.CreateContainerResponse).container_id
    cri.call("StartContainer", pb.StartContainerRequest(container_id=cid), pb.StartContainerResponse)
    print(f"demo: {NAMESPACE}/{config.metadata.name} running (sandbox {sid[:13]}, container {cid[:13]})")
    return sid


def demo_pods(cri: Cri) -> List[Any]:
    reply = cri.call("ListPodSandbox", pb.ListPodSandboxRequest(
        filter=pb.PodSandboxFilter(label_selector={DEMO_LABEL: "true"})), pb.ListPodSandboxResponse)
    return list(reply.items)


def remove(cri: Cri) -> int:
    for pod in demo_pods(cri):
        cri.call("StopPodSandbox", pb.StopPodSandboxRequest(pod_sandbox_id=pod.id), pb.StopPodSandboxResponse)
        cri.call("RemovePodSandbox", pb.RemovePodSandboxRequest(pod_sandbox_id=pod.id), pb.RemovePodSandboxResponse)
        for qos in ("besteffort", "burstable"):  # where pod_config put it, from the pod's uid
            remove_pod_cgroup(f"/kubepods/{qos}/pod{pod.metadata.uid}")
        print(f"demo: {pod.metadata.namespace}/{pod.metadata.name} removed")
    return 0


def not_our_daemon(args: argparse.Namespace) -> Optional[str]:
    """None when the daemon answering on the admin socket is the one serving ``--socket``
    (and is ``--daemon-pid``); else why the demo must not go on."""
    try:
        path = args.admin_socket or ctl_main.admin_socket(ctl_main.build_parser().parse_args(["status"]))
    except CtlError as e:
        return str(e)
    deadline = time.monotonic() + ADMIN_WAIT_SECONDS
    while True:
        try:
            status = ask(path, "status", timeout=10)
            break
        except CtlError as e:
            if args.daemon_pid and not _alive(args.daemon_pid):
                return f"the daemon (pid {args.daemon_pid}) has ended (its words are above)"
            if time.monotonic() > deadline:
                return f"no daemon answers on the admin socket {path} within {ADMIN_WAIT_SECONDS:g}s: {e}"
        time.sleep(0.1)
    other = f"another anolisnuma (pid {status.get('pid')}, serving {status.get('listen')}) answers on {path}"
    if args.daemon_pid and status.get("pid") != args.daemon_pid:
        return f"{other}, not the daemon this demo is for (pid {args.daemon_pid}): anolisnuma-ctl would show its pods"
    if os.path.realpath(str(status.get("listen"))) != os.path.realpath(args.socket):
        return f"{other}, not the daemon serving {args.socket}: anolisnuma-ctl would show its pods"
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def ctl(args: argparse.Namespace, *command: str) -> int:
    argv = [os.path.join(os.path.dirname(sys.executable), "anolisnuma-ctl")]
    if not os.path.exists(argv[0]):
        argv = [sys.executable, "-m", "anolisnuma.ctl.main"]
    if args.admin_socket:
        argv += ["--admin-socket", args.admin_socket]
    print(f"\n$ anolisnuma-ctl {' '.join(command)}", flush=True)
    return subprocess.run(argv + list(command)).returncode


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="demo.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", default="/var/run/anolisnuma/anolisnuma.sock", help="the proxy's CRI socket")
    ap.add_argument("--admin-socket", default="", help="the daemon's admin socket (default: anolisnuma-ctl's)")
    ap.add_argument("--daemon-pid", type=int, default=0, help="the daemon the admin socket must be served by")
    ap.add_argument("--remove", action="store_true", help="stop and remove the demo's pods")
    args = ap.parse_args(argv)
    cri = Cri(args.socket)
    if not args.remove:
        why = not_our_daemon(args)
        if why is not None:
            # (it may quote whoever answers on the admin socket: escaped like anolisnuma-ctl's output)
            print(printable(f"demo: {why}; no pod was made"), file=sys.stderr)
            return 1
    try:
        if args.remove:
            return remove(cri)
        if demo_pods(cri):
            remove(cri)  # a demo run again starts from nothing
        be = pod_config("be-anolisbox", "besteffort", {"anolisbox.sh/qoslevel": "BE"}, 0)
        run_pod(cri, be, 0)
        web = pod_config("numa-web", "burstable", {}, 1.0)
        run_pod(cri, web, 1.0)
    except grpc.RpcError as e:
        print(f"demo: {e.code().name}: {e.details()}", file=sys.stderr)
        return 1
    rc = ctl(args, "pods")
    for config in (be, web):
        rc = ctl(args, "explain", f"{NAMESPACE}/{config.metadata.name}") or rc
    print(f"\ndemo: remove the pods with: {sys.executable} {os.path.abspath(__file__)} --remove")
    return rc


if __name__ == "__main__":
    sys.exit(main())
