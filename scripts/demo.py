#!/usr/bin/env python3
"""See anolisnuma work without a kubelet or crictl: two pods made as a kubelet would make
them, then what the daemon did with them.

    scripts/demo.py [--socket PATH] [--admin-socket PATH] [--daemon-pid PID]
                                               create the pods, show them
    scripts/demo.py --remove [--socket PATH]   stop and remove them again

The pods go into the namespace ``anolisnuma-demo`` (``scripts/run-local.sh --demo`` runs the
daemon with NUMA placement on for that namespace), each with one container of the pause
image the local containerd holds (``scripts/private-containerd`` imports it):

- ``batch``: a BestEffort pod written for anolisbox (``anolisbox.sh/qoslevel: BE``): its
  QoS level comes from the annotation;
- ``web``: a Burstable pod of one CPU: QoS LS from its Kubernetes class.

Both are NUMA-managed; on two nodes the balance puts them on different ones. ``--socket``
is where they are made: the proxy's socket, or, when the daemon takes its pods from NRI,
containerd's own (the daemon's ``[runtime] endpoint``), as a kubelet's calls go in each mode.
As the kubelet does, the pod's cgroup is made before RunPodSandbox; the calls are the
project's CRI messages (``cri_proto``) over gRPC. Then the demo runs ``anolisnuma-ctl pods``
and says what each pod got: its NUMA node (and its container's cpuset as the kernel reads
it), its QoS level, what that level writes on each kernel family (from the daemon's own
configuration file and knob table) and what this kernel let it write. Every command it runs
is printed with the paths it ran with. Needs root.

Before any pod is made, the daemon on the admin socket must be the one the pods reach
(serving ``--socket``, or, in NRI mode, running on it as its runtime, registered) and,
given ``--daemon-pid``, that process: on a node where another anolisnuma holds either
socket, the demo would make its pods through one daemon and show the other's.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
import time
import uuid
from typing import Any, Dict, List, Optional, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import grpc  # noqa: E402

from anolisnuma.config import Config  # noqa: E402
from anolisnuma.configfile import ConfigError  # noqa: E402
from anolisnuma.ctl import main as ctl_main  # noqa: E402
from anolisnuma.ctl.client import CtlError, ask  # noqa: E402
from anolisnuma.ctl.table import printable  # noqa: E402
from anolisnuma.policies.qos.levels import QosLevel  # noqa: E402
from anolisnuma.policies.qos.plan import family_plans  # noqa: E402
from anolisnuma.policies.qos.table import rows  # noqa: E402
from anolisnuma.system.knobs import FAMILIES  # noqa: E402
from anolisnuma.testing.containerd import cgroup_hierarchies, make_pod_cgroup, remove_pod_cgroup  # noqa: E402
from anolisnuma.testing.images import PAUSE_IMAGE  # noqa: E402
from cri_proto import api_pb2 as pb  # noqa: E402

NAMESPACE = "anolisnuma-demo"
RUNTIME = "/runtime.v1.RuntimeService/"
PERIOD = 100_000
MIB = 1 << 20
DEMO_LABEL = "anolisnuma.io/demo"
# How long the daemon has to answer on its admin socket (it listens there just after the CRI
# socket), and in NRI mode to be registered with containerd.
ADMIN_WAIT_SECONDS = 60.0
WIDTH = 100
FAKE_NOTE = "FAKE"   # scripts/local_config.py writes it in a fake sys_root


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


def run_pod(cri: Cri, config: Any, cpus: float) -> Tuple[str, str]:
    """The pod and its one container, made and started; (sandbox id, container id)."""
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
    return sid, cid


def demo_pods(cri: Cri) -> List[Any]:
    reply = cri.call("ListPodSandbox", pb.ListPodSandboxRequest(
        filter=pb.PodSandboxFilter(label_selector={DEMO_LABEL: "true"})), pb.ListPodSandboxResponse)
    return list(reply.items)


def remove(cri: Cri) -> int:
    # (in name order: containerd lists them in no set order)
    for pod in sorted(demo_pods(cri), key=lambda p: (p.metadata.namespace, p.metadata.name, p.id)):
        cri.call("StopPodSandbox", pb.StopPodSandboxRequest(pod_sandbox_id=pod.id), pb.StopPodSandboxResponse)
        cri.call("RemovePodSandbox", pb.RemovePodSandboxRequest(pod_sandbox_id=pod.id), pb.RemovePodSandboxResponse)
        for qos in ("besteffort", "burstable"):  # where pod_config put it, from the pod's uid
            remove_pod_cgroup(f"/kubepods/{qos}/pod{pod.metadata.uid}")
        print(f"demo: {pod.metadata.namespace}/{pod.metadata.name} removed")
    return 0


def not_our_daemon(args: argparse.Namespace) -> Tuple[Optional[str], Dict[str, Any]]:
    """(None, its status) when the daemon answering on the admin socket is the one the pods
    reach (and is ``--daemon-pid``), registered with containerd in NRI mode; else (why the
    demo must not go on, {})."""
    try:
        path = admin_path(args)
    except CtlError as e:
        return str(e), {}
    deadline = time.monotonic() + ADMIN_WAIT_SECONDS
    while True:
        try:
            status = ask(path, "status", timeout=10)
            break
        except CtlError as e:
            if args.daemon_pid and not _alive(args.daemon_pid):
                return f"the daemon (pid {args.daemon_pid}) has ended (its words are above)", {}
            if time.monotonic() > deadline:
                return f"no daemon answers on the admin socket {path} within {ADMIN_WAIT_SECONDS:g}s: {e}", {}
        time.sleep(0.1)
    other = f"another anolisnuma (pid {status.get('pid')}, serving {status.get('listen')}) answers on {path}"
    if args.daemon_pid and status.get("pid") != args.daemon_pid:
        return f"{other}, not the daemon this demo is for (pid {args.daemon_pid}): anolisnuma-ctl would show its pods", {}
    if not nri_mode(status):
        if not same_path(status.get("listen"), args.socket):
            return f"{other}, not the daemon serving {args.socket}: anolisnuma-ctl would show its pods", {}
        return None, status
    if not same_path(status.get("runtime_endpoint"), args.socket):
        return (f"the daemon on {path} (pid {status.get('pid')}) takes its pods from the NRI of the containerd on "
                f"{status.get('runtime_endpoint')}, not {args.socket}: it would not hear of the demo's pods"), {}
    # pods made before the plugin registers run without the policies until it does
    while not registered(status.get("front_end") or {}):
        if time.monotonic() > deadline:
            fe = status.get("front_end") or {}
            return (f"the daemon (pid {status.get('pid')}) is not registered with containerd's NRI on "
                    f"{fe.get('socket')} within {ADMIN_WAIT_SECONDS:g}s ({fe.get('last_disconnect')})"), {}
        time.sleep(0.1)
        try:
            status = ask(path, "status", timeout=10)
        except CtlError as e:
            return f"the daemon stopped answering on {path}: {e}", {}
    return None, status


def registered(fe: Dict[str, Any]) -> bool:
    """The NRI plugin is connected, registered, configured (containerd named itself) and
    synchronized: containerd sends it the events of the pods made from now on. (Connected
    alone is a session that may not be registered yet.)"""
    return bool(fe.get("connected") and fe.get("runtime") and fe.get("registrations", 0) >= 1
                and fe.get("synchronizes", 0) >= 1)


def admin_path(args: argparse.Namespace) -> str:
    return args.admin_socket or ctl_main.admin_socket(ctl_main.build_parser().parse_args(["status"]))


def nri_mode(status: Dict[str, Any]) -> bool:
    return (status.get("front_end") or {}).get("mode") == "nri"


def same_path(a: Any, b: str) -> bool:
    return isinstance(a, str) and os.path.realpath(a) == os.path.realpath(b)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def say(text: str, indent: str = "      ") -> None:
    """One demo statement, wrapped at WIDTH columns (a leading newline kept as a blank line)."""
    # (it quotes the daemon, which quotes containerd and pods: escaped like anolisnuma-ctl's output)
    text = printable(text, keep="\n")
    lead = text[:len(text) - len(text.lstrip("\n"))]
    print(lead + textwrap.fill(text.lstrip("\n"), WIDTH, subsequent_indent=indent, break_long_words=False,
                               break_on_hyphens=False))


def ctl_argv(args: argparse.Namespace, *command: str) -> Tuple[List[str], str]:
    """anolisnuma-ctl's argv on this run's admin socket, and how to print it: by its name
    when that is the one on PATH, else by its path."""
    tool = os.path.join(os.path.dirname(sys.executable), "anolisnuma-ctl")
    argv = [tool] if os.path.exists(tool) else [sys.executable, "-m", "anolisnuma.ctl.main"]
    on_path = shutil.which("anolisnuma-ctl")
    shown = ["anolisnuma-ctl"] if on_path and os.path.realpath(on_path) == os.path.realpath(argv[0]) else list(argv)
    rest = ["--admin-socket", admin_path(args), *command]
    return argv + rest, " ".join(shlex.quote(w) for w in shown + rest)


def ctl(args: argparse.Namespace, *command: str) -> int:
    argv, shown = ctl_argv(args, *command)
    print(f"\n$ {shown}", flush=True)
    return subprocess.run(argv).returncode


# ---------------------------------------------------------------- what the demo says

def say_mode(status: Dict[str, Any], socket_path: str) -> None:
    if nri_mode(status):
        fe = status["front_end"]
        say(f"demo: anolisnuma (pid {status.get('pid')}) runs in NRI mode, registered with {fe.get('runtime')} "
            f"as plugin {fe.get('plugin')} on {fe.get('socket')}; the pods are made on containerd's socket "
            f"{socket_path}, as a kubelet's calls go, with nothing in between")
    else:
        say(f"demo: anolisnuma (pid {status.get('pid')}) runs as a proxy; the pods are made through its socket "
            f"{socket_path}, as a kubelet pointed at it would make them")


def say_topology(config: Config) -> None:
    from anolisnuma.hooks.numa import load_topology

    sys_root = config.paths.sys_root
    try:
        topo = load_topology(sys_root)
    except Exception as e:   # the daemon's own words for it are in its log
        say(f"demo: the NUMA topology under {sys_root} cannot be read: {e}")
        return
    nodes = ", ".join(f"node {n.id} = CPU {n.cpus}" for n in topo.nodes)
    try:
        with open(os.path.join(sys_root, FAKE_NOTE)) as f:
            fake = printable(f.read(200).split(":")[0].strip())   # local_config.py's; shown as text whatever it holds
    except OSError:
        fake = ""
    if fake:
        say(f"demo: NUMA topology: {len(topo.nodes)} nodes ({nodes}). It is FAKE: this machine has one node, "
            f"so placement reads the e2e tests' topology {fake} from {sys_root} ([paths] sys_root); the "
            f"cpusets are real, memory is not pinned")
    else:
        say(f"demo: NUMA topology: {len(topo.nodes)} node(s) ({nodes}), read from {sys_root}")


def kernel_cpuset(parent: str, cid: str) -> str:
    """cpuset.cpus of the container's cgroup as the kernel reads it ("" when not found)."""
    for mnt, ctrls in cgroup_hierarchies(include_v2=True):
        if ctrls and "cpuset" not in ctrls:
            continue
        try:
            with open(os.path.join(mnt + parent, cid, "cpuset.cpus")) as f:
                return f.read().strip()
        except OSError:
            continue
    return ""


def say_pod(name: str, entry: Dict[str, Any], cid: str, plans: Dict[str, Any]) -> None:
    print(f"\n{NAMESPACE}/{name}")
    numa = entry.get("numa") or {}
    if numa.get("placed"):
        mems = f"mems {numa['mems']}" if numa.get("mems") else "memory not pinned"
        seen = kernel_cpuset(entry["pod"]["cgroup_parent"], cid)
        where = f"node {', '.join(str(n) for n in numa.get('nodes', []))}"
        say(f"  NUMA  {where}: cpus {numa.get('cpus')}, {mems} ({numa.get('why')}); its container's cgroup "
            f"reads cpuset.cpus = {seen or '?'}", indent="        ")
    else:
        say(f"  NUMA  not placed: {numa.get('why')}", indent="        ")
    qos = entry.get("qos") or {}
    level = qos.get("level")
    if level is None:
        say(f"  QoS   none: {qos.get('why')}", indent="        ")
        return
    say(f"  QoS   {level} ({qos.get('why')}); what {level} writes on each kernel family:", indent="        ")
    for family in FAMILIES:
        values = plans[family.name].levels[QosLevel(level)].knob_values()
        said = ", ".join(f"{k}={v}" for k, v in values) or "nothing ([qos] turns its knobs off)"
        say(f"        {family.title}: {said}", indent="          ")
    knobs = qos.get("knobs") or {}
    here = f"this kernel (Linux {os.uname().release}"
    if knobs.get("family", "none") == "none":
        here += ", neither family's files)"
    else:
        here += f", {knobs['family']})"
    done = list(knobs.get("set") or [])
    held = dict(knobs.get("held") or {})
    text = f"{here}: set {', '.join(done)}" if done else f"{here}: nothing written"
    if held:
        text += "; not written: " + "; ".join(f"{k} ({why})" for k, why in held.items())
    say(f"        {text}", indent="          ")


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="demo.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", default="/var/run/anolisnuma/anolisnuma.sock",
                    help="where the pods are made: the proxy's CRI socket, or in NRI mode containerd's")
    ap.add_argument("--admin-socket", default="", help="the daemon's admin socket (default: anolisnuma-ctl's)")
    ap.add_argument("--daemon-pid", type=int, default=0, help="the daemon the admin socket must be served by")
    ap.add_argument("--remove", action="store_true", help="stop and remove the demo's pods")
    args = ap.parse_args(argv)
    cri = Cri(args.socket)
    if args.remove:
        try:
            return remove(cri)
        except grpc.RpcError as e:
            print(f"demo: {e.code().name}: {e.details()}", file=sys.stderr)
            return 1
    why, status = not_our_daemon(args)
    if why is not None:
        # (it may quote whoever answers on the admin socket: escaped like anolisnuma-ctl's output)
        print(printable(f"demo: {why}; no pod was made"), file=sys.stderr)
        return 1
    try:
        config = Config.load(status["config"])
    except (ConfigError, KeyError, TypeError) as e:
        print(f"demo: cannot read the daemon's configuration {status.get('config')}: {e}", file=sys.stderr)
        return 1
    say_mode(status, args.socket)
    say_topology(config)
    try:
        if demo_pods(cri):
            remove(cri)  # a demo run again starts from nothing
        be = pod_config("batch", "besteffort", {"anolisbox.sh/qoslevel": "BE"}, 0)
        web = pod_config("web", "burstable", {}, 1.0)
        made = {c.metadata.name: run_pod(cri, c, cpus) for c, cpus in ((be, 0), (web, 1.0))}
    except grpc.RpcError as e:
        print(f"demo: {e.code().name}: {e.details()}", file=sys.stderr)
        return 1
    rc = ctl(args, "pods")
    plans = family_plans(rows(config.qos))
    _, explain = ctl_argv(args, "explain", f"{NAMESPACE}/NAME")
    say(f"\ndemo: what each pod got, as the daemon explains it (all of it: {explain}):")
    for name, (_, cid) in made.items():
        try:
            entries = ask(admin_path(args), "explain", {"pod": f"{NAMESPACE}/{name}"}, timeout=10)
        except CtlError as e:
            print(f"demo: explain {NAMESPACE}/{name}: {e}", file=sys.stderr)
            rc = rc or 1
            continue
        say_pod(name, entries[-1], cid, plans)
    remove_cmd = " ".join(shlex.quote(w) for w in (sys.executable, os.path.abspath(__file__), "--remove",
                                                    "--socket", args.socket))
    say(f"\ndemo: remove the pods with: {remove_cmd}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
