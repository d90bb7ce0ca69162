#!/usr/bin/env python3
"""Interference of a best-effort CPU hog on a latency-sensitive task, on this machine's real
kernel, with cgroups laid out as the kubelet's: the kubelet's defaults against what anolisnuma
writes on this kernel, and against the knobs peers reach for (issue 28, part 3). Root only;
cgroup v1 (the machine's).

- **LS**: a probe process (SCHED_OTHER, one thread) that sleeps until the next 1 ms tick and
  records how late it woke (p50/p99/p99.9). Its timer slack is 1 ns (``--timer-slack-ns``),
  so that what is measured is the scheduler, not the kernel's default 50 us of timer
  coalescing that would otherwise be added to every wake-up of every arm alike.
- **LS, request/response** (``--rr``): besides, a client in the LS pod that wakes at every tick
  and times the round trip of a 1-byte request to a server task of the same pod over pipes
  (two wake-ups by another task, as a service answering a request sees them).
- **BE**: twice as many spinning processes as CPUs; each counts its loops (BE throughput,
  loops/s summed).
- **Layout** (cgroupfs driver, under a private root ``/sys/fs/cgroup/<controller>/
  anolisnuma-bench-interference-<pid>``, i.e. a kubelet run with ``--cgroup-root`` there):
  ``kubepods`` (cpu.shares = 1024 x CPUs), ``kubepods/burstable`` (1024: the LS pod's request)
  with the LS pod (requests 1 CPU, no limit: shares 1024, no quota) and its container;
  ``kubepods/besteffort`` (cpu.shares = 2) with the BE pod and its container (2 each). The
  directories are made in the cpu, cpuacct, cpuset, memory and pids hierarchies as the kubelet
  makes them; the probe and the hog are moved into their containers' cgroups in the cpu
  hierarchy only (their memory and pids accounting stays where the benchmark was started).
- **anolisnuma**: ``python -m anolisnuma`` with QoS on at its defaults, in front of a fake CRI
  backend, gets RunPodSandbox / CreateContainer / StartContainer for both pods. It runs in a
  mount namespace of its own in which ``/sys/fs/cgroup/<controller>`` *is* the private root
  and ``/proc/sys`` is read-only: it sees this kernel's real cgroup files at its production
  paths and cannot write outside the benchmark's cgroups. Every settable file of the private
  tree is read before and after: the difference is what anolisnuma wrote (on a kernel without
  the vendor knobs: nothing). Its arm replays exactly those writes on the kubelet's layout.
- **Arms**: LS alone (hog stopped); kubelet defaults; ``cpu.idle = 1`` on the BestEffort class
  group; ``cpu.idle = 1`` on the BE pod group; a CFS quota of 50 % of the node's CPUs on the
  BestEffort class; anolisnuma. The first five are issue 28's measured table, re-measured
  (its figures are printed beside). Every arm runs once per round for ``--seconds`` after
  ``--settle`` seconds, round r starting with arm r and going forward, or backward every other
  round; per-round p99s are printed so drift shows, and ratios are against the
  kubelet-defaults arm of the same run. After each arm, every value it changed is written
  back and the whole tree checked against the kubelet's layout.

Everything made is removed again, also on error, Ctrl-C or SIGTERM; the workers and the daemon die with the benchmark even when it is killed.
Cgroup trees left by a benchmark killed with SIGKILL are removed by the next run. Exit status
0 when it ran, whatever the figures; 1 when it could not.

    sudo .venv/bin/python scripts/bench_interference.py            # 4 rounds x 5 s per arm, ~2.5 min
    sudo .venv/bin/python scripts/bench_interference.py --quick    # CI smoke run, ~20 s
    sudo .venv/bin/python scripts/bench_interference.py --rr       # also the request/response probe
"""

from __future__ import annotations

import argparse
import array
import contextlib
import ctypes
import gc
import mmap
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)   # the daemon's test helpers, imported where the daemon is driven
CGROUP_ROOT = "/sys/fs/cgroup"
# The hierarchies the kubelet makes pod directories in (of those a v1 node mounts).
CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory", "pids")
NAME_PREFIX = "anolisnuma-bench-interference-"
DAEMON_LOG_COPY = "/tmp/anolisnuma-interference-last-daemon.log"
PR_SET_PDEATHSIG, PR_SET_TIMERSLACK = 1, 29
# Writing the first file makes the kernel change the others: cpu.idle = 1 gives the group the
# idle weight and cpu.idle = 0 gives it 1024 shares, not those it had (sched_group_set_idle), so
# undoing an idle write must write the old cpu.shares back after it.
KERNEL_ALSO_CHANGES = {"cpu.idle": ("cpu.shares",)}
NOISY_PERCENT = 10   # other processes' share of the CPUs above which the figures are flagged
COUNT_EVERY = 0xFFFF   # a hog publishes its loop count every 65,536 loops (a few ms)


# --------------------------------------------------------------------------- workers
# The probe and the hogs are processes of their own (the interpreter lock would serialise
# threads), started from this file with --worker so that they import nothing but the stdlib.

def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _die_with_parent(parent: int) -> None:
    """A worker never outlives the benchmark, even one killed with SIGKILL."""
    _libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def hog_worker(shm: str, index: int) -> None:
    with open(shm, "r+b") as f:
        counts = memoryview(mmap.mmap(f.fileno(), 0)).cast("q")
    n = 0
    while True:
        n += 1
        if not n & COUNT_EVERY:
            counts[index] = n


def probe_worker(shm: str, out: str, period_ns: int, slack_ns: int, rr_fds: Optional[Tuple[int, int]]) -> None:
    """Wakes at every tick of ``period_ns`` and records, with the tick it was due at, how late
    it woke, or (with ``rr_fds``: request pipe, reply pipe) the round trip of a 1-byte request
    to the server task, sent at once."""
    if slack_ns:
        _libc().prctl(PR_SET_TIMERSLACK, ctypes.c_ulong(slack_ns), 0, 0, 0)
    gc.disable()   # no collector pause in the middle of a measurement
    with open(shm, "r+b") as f:
        stop = mmap.mmap(f.fileno(), 0)
    clock = time.monotonic_ns
    due_at, values = array.array("q"), array.array("q")
    due = clock() + period_ns
    while not stop[0]:
        wait = due - clock()
        if wait > 0:
            time.sleep(wait / 1e9)
        woke = clock()
        if rr_fds:
            os.write(rr_fds[0], b"?")
            os.read(rr_fds[1], 1)
            values.append(clock() - woke)
        else:
            values.append(woke - due)
        due_at.append(due)
        due += period_ns
        if due <= woke:   # a wake-up later than a period counts once, not once per missed tick
            due += ((woke - due) // period_ns + 1) * period_ns
    with open(out, "wb") as f:
        due_at.tofile(f)
        values.tofile(f)


def server_worker(requests: int, replies: int) -> None:
    """Answers each 1-byte request at once; ends with its client (end of file)."""
    while os.read(requests, 1):
        os.write(replies, b"!")


def worker_main(argv: Sequence[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", choices=("hog", "probe", "server"))
    ap.add_argument("--parent", type=int)
    ap.add_argument("--shm")
    ap.add_argument("--index", type=int, default=0)
    ap.add_argument("--out", default="")
    ap.add_argument("--period-ns", type=int, default=1_000_000)
    ap.add_argument("--slack-ns", type=int, default=1)
    ap.add_argument("--fds", default="", help="two pipe ends: where to write, where to read")
    a = ap.parse_args(argv)
    fds = tuple(int(x) for x in a.fds.split(",")) if a.fds else None
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the benchmark stops its workers itself
    _die_with_parent(a.parent)
    if a.worker == "hog":
        hog_worker(a.shm, a.index)
    elif a.worker == "server":
        server_worker(fds[1], fds[0])
    else:
        probe_worker(a.shm, a.out, a.period_ns, a.slack_ns, fds)
    return 0


def spawn_worker(*args: str, fds: Tuple[int, ...] = ()) -> subprocess.Popen:
    fd_args = ["--fds", ",".join(map(str, fds))] if fds else []
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), "--parent", str(os.getpid()), *args, *fd_args],
                            stdin=subprocess.DEVNULL, pass_fds=fds)


def shared_file(path: str, size: int) -> mmap.mmap:
    with open(path, "w+b") as f:
        f.truncate(size)
        return mmap.mmap(f.fileno(), size)


# --------------------------------------------------------------------------- cgroups

@dataclass(frozen=True)
class Write:
    """One value in one cgroup file of the private tree (``rel`` under its root)."""

    controller: str
    rel: str
    file: str
    value: str

    def __str__(self) -> str:
        return f"{self.controller}/{self.rel}/{self.file} = {self.value}"


class Tree:
    """The benchmark's private cgroup tree: ``<cgroup root>/<controller>/<name>/...`` in every
    hierarchy of ``controllers``. Nothing outside it is ever written."""

    def __init__(self, name: str, controllers: Sequence[str] = CONTROLLERS, root: str = CGROUP_ROOT) -> None:
        self.name, self.root = name, root
        self.controllers = tuple(c for c in controllers if os.path.isdir(os.path.join(root, c)))

    def path(self, controller: str, rel: str = "", file: str = "") -> str:
        return os.path.join(self.root, controller, self.name, rel, file).rstrip("/")

    def create(self) -> None:
        for c in self.controllers:
            self._mkdir(c, "")

    def mkdir(self, rel: str) -> None:
        """``rel`` (and its parents) in every hierarchy, as the kubelet makes a pod's."""
        parts = rel.split("/")
        for i in range(1, len(parts) + 1):
            for c in self.controllers:
                if not os.path.isdir(self.path(c, "/".join(parts[:i]))):
                    self._mkdir(c, "/".join(parts[:i]))

    def _mkdir(self, controller: str, rel: str) -> None:
        os.mkdir(self.path(controller, rel))
        if controller == "cpuset":   # a v1 cpuset starts empty: it takes its parent's, as the kubelet's do
            parent = os.path.dirname(self.path(controller, rel))
            for f in ("cpuset.cpus", "cpuset.mems"):
                with open(os.path.join(parent, f)) as src:
                    self._write_file(os.path.join(self.path(controller, rel), f), src.read().strip())

    def read(self, controller: str, rel: str, file: str) -> str:
        with open(self.path(controller, rel, file)) as f:
            return f.read().strip()

    @staticmethod
    def _write_file(path: str, value: str) -> None:
        fd = os.open(path, os.O_WRONLY)   # never O_CREAT: a file the kernel lacks is an error
        try:
            os.write(fd, value.encode())
        finally:
            os.close(fd)

    def write(self, w: Write) -> None:
        self._write_file(self.path(w.controller, w.rel, w.file), w.value)

    def apply(self, writes: Sequence[Write]) -> List[Write]:
        """Write ``writes`` in order and return the writes that undo them: the old values, in
        reverse order, with those of the files the kernel changes along (see
        KERNEL_ALSO_CHANGES). If one fails, those done are undone and the error raised."""
        undo: List[Write] = []
        try:
            for w in writes:
                block = [self.current(w.controller, w.rel, f) for f in (w.file, *KERNEL_ALSO_CHANGES.get(w.file, ()))]
                self.write(w)
                undo[:0] = block
        except BaseException:
            self.apply(undo)
            raise
        return undo

    def current(self, controller: str, rel: str, file: str) -> Write:
        return Write(controller, rel, file, self.read(controller, rel, file))

    def attach(self, rel: str, pid: int, controller: str = "cpu") -> None:
        self._write_file(self.path(controller, rel, "cgroup.procs"), str(pid))

    def settable(self) -> Dict[Tuple[str, str, str], str]:
        """Every readable, writable file of the tree with its value (task lists aside)."""
        out: Dict[Tuple[str, str, str], str] = {}
        for c in self.controllers:
            top = self.path(c)
            for d, _, files in os.walk(top):
                rel = os.path.relpath(d, top)
                rel = "" if rel == "." else rel
                for f in files:
                    p = os.path.join(d, f)
                    if f in ("tasks", "cgroup.procs") or os.stat(p).st_mode & 0o600 != 0o600:
                        continue
                    try:
                        with open(p) as fh:
                            out[(c, rel, f)] = fh.read().strip()
                    except OSError:
                        pass
        return out

    def expect(self, baseline: Dict[Tuple[str, str, str], str], after: str) -> None:
        """Raise unless every settable file of ``baseline`` holds its value there again: a
        value left changed would carry one arm's setting into the next arms' figures."""
        now = self.settable()
        changed = [f"{'/'.join(k)}: {v} -> {now.get(k)}" for k, v in sorted(baseline.items()) if now.get(k) != v]
        if changed:
            raise RuntimeError(f"values left changed after {after}: {'; '.join(changed)}")

    def remove(self) -> List[str]:
        """Remove the whole tree, deepest first; returns what could not be removed."""
        return [d for c in self.controllers for d in remove_tree(self.path(c))]


def remove_tree(top: str, retries: int = 100) -> List[str]:
    """rmdir every cgroup directory under ``top``, then it, deepest first (a cgroup whose last
    task was just reaped stays busy for a moment: retried every 50 ms); what is left."""
    from anolisnuma.testing.containerd import _rmdir_tree

    return _rmdir_tree(top, retries=retries)


def sweep_stale(root: str = CGROUP_ROOT, tmp: str = tempfile.gettempdir()) -> List[str]:
    """Remove what earlier runs killed before they could clean up left (their process is
    gone): their cgroup trees (one still holding tasks is left alone) and work directories."""
    removed = []
    for base in [os.path.join(root, c) for c in CONTROLLERS] + [tmp]:
        if not os.path.isdir(base):
            continue
        for entry in os.listdir(base):
            pid = entry[len(NAME_PREFIX):]
            if not entry.startswith(NAME_PREFIX) or not pid.isdigit() or _bench_alive(int(pid)):
                continue
            path = os.path.join(base, entry)
            if base == tmp:
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
            elif not remove_tree(path, retries=10):
                removed.append(path)
    return removed


def _bench_alive(pid: int) -> bool:
    """Whether ``pid`` is a run of this script (not a process that got its pid since, nor
    e.g. a test runner whose arguments name a file like it)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    return any(os.path.basename(a) == b"bench_interference.py" for a in argv)


# --------------------------------------------------------------------------- the kubelet's layout

@dataclass(frozen=True)
class Pods:
    """The two pods' cgroups (relative to the private root), as the kubelet names them."""

    ls_uid: str
    be_uid: str
    ls_cid: str
    be_cid: str

    @classmethod
    def new(cls) -> "Pods":
        return cls(str(uuid.uuid4()), str(uuid.uuid4()), uuid.uuid4().hex * 2, uuid.uuid4().hex * 2)

    @property
    def ls_pod(self) -> str:
        return f"kubepods/burstable/pod{self.ls_uid}"

    @property
    def be_pod(self) -> str:
        return f"kubepods/besteffort/pod{self.be_uid}"

    @property
    def ls_container(self) -> str:
        return f"{self.ls_pod}/{self.ls_cid}"

    @property
    def be_container(self) -> str:
        return f"{self.be_pod}/{self.be_cid}"


def kubelet_writes(pods: Pods, ncpu: int) -> List[Write]:
    """The cpu values the kubelet gives this node's groups: kubepods the node's CPUs, the
    Burstable class the sum of its pods' requests (the LS pod asks 1 CPU and sets no limit),
    the BestEffort class, its pods and containers the minimum, 2 shares."""
    def cpu(rel: str, shares: int, quota: int = -1) -> List[Write]:
        return [Write("cpu", rel, "cpu.shares", str(shares)), Write("cpu", rel, "cpu.cfs_quota_us", str(quota))]
    return (cpu("kubepods", 1024 * ncpu) + cpu("kubepods/burstable", 1024) + cpu("kubepods/besteffort", 2)
            + cpu(pods.ls_pod, 1024) + cpu(pods.ls_container, 1024)
            + cpu(pods.be_pod, 2) + cpu(pods.be_container, 2))


def build_layout(tree: Tree, pods: Pods, ncpu: int) -> None:
    tree.create()
    tree.mkdir(pods.ls_container)
    tree.mkdir(pods.be_container)
    tree.apply(kubelet_writes(pods, ncpu))


# --------------------------------------------------------------------------- arms

@dataclass(frozen=True)
class Arm:
    key: str
    label: str
    writes: Tuple[Write, ...] = ()
    hog: bool = True
    issue_p99: str = ""   # issue 28's measured figure, for the row set it keeps


def issue_arms(pods: Pods, ncpu: int, period_us: int) -> List[Arm]:
    quota = ncpu * period_us // 2
    return [
        Arm("alone", "LS alone (hog stopped)", hog=False, issue_p99="89"),
        Arm("kubelet", "kubelet defaults: BestEffort cpu.shares=2", issue_p99="61"),
        Arm("idle-class", "cpu.idle=1 on the BestEffort class",
            (Write("cpu", "kubepods/besteffort", "cpu.idle", "1"),), issue_p99="70"),
        Arm("idle-pod", "cpu.idle=1 on the BE pod group",
            (Write("cpu", pods.be_pod, "cpu.idle", "1"),), issue_p99="75"),
        Arm("quota-class", f"CFS quota 50% of {ncpu} CPUs on the BestEffort class",
            (Write("cpu", "kubepods/besteffort", "cpu.cfs_quota_us", str(quota)),), issue_p99="1,165"),
    ]


def anolisnuma_arm(writes: Sequence[Write]) -> Arm:
    return Arm("anolisnuma", "anolisnuma on this kernel" + ("" if writes else " (wrote nothing)"), tuple(writes))


def run_order(arms: Sequence[Arm], rounds: int) -> Iterator[Tuple[int, Arm]]:
    """Every arm once per round: round r starts with arm r and goes forward on even rounds,
    backward on odd ones, so that each arm goes first once in n rounds and follows
    different arms, and drift hits every arm alike."""
    n = len(arms)
    for r in range(rounds):
        step = 1 if r % 2 == 0 else -1
        for i in range(n):
            yield r, arms[(r + step * i) % n]


# --------------------------------------------------------------------------- what anolisnuma writes

# Run as `sh -c SANDBOX sandbox STAGE NAME CONTROLLER... -- COMMAND...`: in a mount namespace
# of its own (unshare), each hierarchy's private root is bound at its usual place over an
# empty /sys/fs/cgroup, and /proc/sys is made read-only: the daemon sees this kernel's real
# cgroup files where it looks in production and can change nothing outside the benchmark's tree.
SANDBOX = r"""
set -eu
stage=$1 name=$2; shift 2
ctrls=""
while [ "$1" != "--" ]; do ctrls="$ctrls $1"; shift; done
shift
for c in $ctrls; do mkdir -p "$stage/$c"; mount --bind "/sys/fs/cgroup/$c/$name" "$stage/$c"; done
mount -t tmpfs -o mode=755 anolisnuma-bench /sys/fs/cgroup
for c in $ctrls; do mkdir "/sys/fs/cgroup/$c"; mount --move "$stage/$c" "/sys/fs/cgroup/$c"; done
mount --bind /proc/sys /proc/sys
mount -o remount,bind,ro /proc/sys
exec "$@"
"""


@dataclass
class DaemonOutcome:
    writes: List[Write]
    new_files: List[str]
    said: List[str] = field(default_factory=list)
    compared: int = 0


def daemon_config(work: str, backend: str) -> Dict[str, object]:
    from anolisnuma.testing.proxy import config_dict

    return config_dict(work, backend, extra={
        "paths": {"cgroup_root": CGROUP_ROOT, "resctrl_root": "/sys/fs/resctrl", "sys_root": "/sys",
                  "proc_root": "/proc"},
        "cgroups": {"kubelet_cgroup_root": "/", "kubelet_cgroup_driver": "cgroupfs"},
        "qos": {"enabled": True},
        "log": {"stderr": False},
    })


def start_daemon(tree: Tree, work: str, backend: str) -> Tuple[subprocess.Popen, str, str]:
    from anolisnuma.testing.proxy import wait_for_socket, write_config

    data = daemon_config(work, backend)
    cfg = write_config(os.path.join(work, "daemon.toml"), data)
    cmd = ["setpriv", "--pdeathsig", "KILL", "unshare", "--mount", "--propagation", "private",
           "/bin/sh", "-c", SANDBOX, "sandbox", os.path.join(work, "stage"), tree.name, *tree.controllers, "--",
           sys.executable, "-m", "anolisnuma", "-c", cfg]
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with open(os.path.join(work, "daemon.stderr"), "wb") as err:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=env, cwd=REPO,
                                start_new_session=True)
    listen = str(data["server"]["listen"])   # type: ignore[index]
    try:
        wait_for_socket(listen, 30, alive=lambda: proc.poll() is None)
    except Exception:
        stop_process(proc)
        with open(os.path.join(work, "daemon.stderr"), errors="replace") as f:
            raise RuntimeError(f"anolisnuma did not start (exit {proc.returncode}):\n{f.read()[-3000:]}")
    return proc, listen, str(data["log"]["file"])   # type: ignore[index]


def stop_process(proc: subprocess.Popen, timeout: float = 15.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def send_pod(channel: object, fake: object, name: str, uid: str, parent: str, cid: str) -> None:
    """RunPodSandbox, CreateContainer, StartContainer as the kubelet sends them for a pod of one container."""
    from anolisnuma.testing.fake_cri import runtime_path
    from cri_proto import api_pb2 as pb

    def call(method: str, request: object, reply_type: type) -> object:
        stub = channel.unary_unary(runtime_path(method), request_serializer=type(request).SerializeToString,   # type: ignore[attr-defined]
                                   response_deserializer=reply_type.FromString)
        return stub(request, timeout=30)

    cfg = pb.PodSandboxConfig()
    cfg.metadata.name, cfg.metadata.namespace, cfg.metadata.uid = name, "bench", uid
    cfg.linux.cgroup_parent = "/" + parent
    sid = call("RunPodSandbox", pb.RunPodSandboxRequest(config=cfg), pb.RunPodSandboxResponse).pod_sandbox_id
    fake.set_reply(runtime_path("CreateContainer"), pb.CreateContainerResponse(container_id=cid))   # type: ignore[attr-defined]
    create = pb.CreateContainerRequest(pod_sandbox_id=sid, sandbox_config=cfg)
    create.config.metadata.name = "main"
    call("CreateContainer", create, pb.CreateContainerResponse)
    call("StartContainer", pb.StartContainerRequest(container_id=cid), pb.StartContainerResponse)


def what_anolisnuma_writes(tree: Tree, pods: Pods, work: str) -> DaemonOutcome:
    """Run the daemon over both pods, see what it changed, put the kubelet's values back."""
    import grpc

    from anolisnuma.testing.fake_cri import FakeCri
    from anolisnuma.testing.proxy import read_log

    before = tree.settable()
    with FakeCri(os.path.join(work, "cri.sock"), containers=0, sandboxes=0, events=0) as fake:
        proc, listen, log_file = start_daemon(tree, work, fake.socket_path)
        try:
            with grpc.insecure_channel("unix://" + listen) as channel:
                send_pod(channel, fake, "ls", pods.ls_uid, pods.ls_pod, pods.ls_cid)
                send_pod(channel, fake, "be", pods.be_uid, pods.be_pod, pods.be_cid)
        finally:
            stop_process(proc)
    after = tree.settable()
    shutil.copyfile(log_file, DAEMON_LOG_COPY)
    changed = [Write(c, rel, f, v) for (c, rel, f), v in sorted(after.items()) if (c, rel, f) in before
               and before[(c, rel, f)] != v]
    tree.apply([Write(w.controller, w.rel, w.file, before[(w.controller, w.rel, w.file)]) for w in changed])
    tree.expect(before, "putting the kubelet's values back over anolisnuma's")
    new = [f"{c}/{rel}/{f}" for (c, rel, f) in sorted(set(after) - set(before))]
    return DaemonOutcome(changed, new, said=pod_lines(read_log(log_file), ("bench/ls", "bench/be")),
                         compared=len(before))


def pod_lines(lines: Sequence[Dict[str, object]], refs: Sequence[str]) -> List[str]:
    """What the daemon's log says about the two pods' QoS: the lines with fields about
    levels, knobs or the call's decisions (the log level itself aside)."""
    out = []
    for line in lines:
        ref = line.get("pod") or f"{line.get('pod_namespace')}/{line.get('pod_name')}"
        said = {k: v for k, v in line.items() if k != "level" and ("knob" in k or "level" in k or k == "decisions")}
        if ref in refs and said:
            out.append(f"{ref}: {line.get('message')} ({', '.join(f'{k}={v}' for k, v in said.items())})")
    return out


# --------------------------------------------------------------------------- measuring

WAKE_UP, ROUND_TRIP = "wake-up", "request/response"
PROBE_TITLES = {
    WAKE_UP: "LS wake-up latency: how late the probe woke for its 1 ms tick",
    ROUND_TRIP: "LS request/response: round trip of a 1-byte request to a server task of the LS pod, every 1 ms",
}


class Workers:
    """The LS probes (and the request/response probe's server) and the BE hogs, placed in
    their containers' cgroups."""

    def __init__(self, tree: Tree, pods: Pods, work: str, hogs: int, period_ns: int, slack_ns: int,
                 round_trip: bool) -> None:
        self.procs: List[subprocess.Popen] = []
        self.probes: Dict[str, Tuple[subprocess.Popen, str]] = {}
        self.work = work
        self.counts_map = shared_file(os.path.join(work, "counts"), 8 * hogs)
        self.counts = memoryview(self.counts_map).cast("q")
        self.stop_map = shared_file(os.path.join(work, "stop"), mmap.PAGESIZE)
        try:
            probe_args = ("--period-ns", str(period_ns), "--slack-ns", str(slack_ns))
            self._ls(tree, pods, self._probe(WAKE_UP, *probe_args))
            if round_trip:
                self._round_trip(tree, pods, probe_args)
            self.hogs = [spawn_worker("--worker", "hog", "--shm", os.path.join(work, "counts"), "--index", str(i))
                         for i in range(hogs)]
            self.procs += self.hogs
            for h in self.hogs:
                tree.attach(pods.be_container, h.pid)
        except BaseException:
            self.kill()
            raise
        self.hogs_running = True

    def _probe(self, kind: str, *args: str, fds: Tuple[int, ...] = ()) -> subprocess.Popen:
        out = os.path.join(self.work, f"samples-{len(self.probes)}")
        proc = spawn_worker("--worker", "probe", "--shm", os.path.join(self.work, "stop"), "--out", out, *args, fds=fds)
        self.probes[kind] = (proc, out)
        return proc

    def _ls(self, tree: Tree, pods: Pods, proc: subprocess.Popen) -> None:
        self.procs.append(proc)
        tree.attach(pods.ls_container, proc.pid)

    def _round_trip(self, tree: Tree, pods: Pods, probe_args: Tuple[str, ...]) -> None:
        request, reply = os.pipe(), os.pipe()
        try:
            self._ls(tree, pods, spawn_worker("--worker", "server", fds=(reply[1], request[0])))
            self._ls(tree, pods, self._probe(ROUND_TRIP, *probe_args, fds=(request[1], reply[0])))
        finally:
            for fd in request + reply:   # the workers hold them: the server sees its client's end
                os.close(fd)

    def run_hogs(self, on: bool) -> None:
        if on != self.hogs_running:
            for h in self.hogs:
                h.send_signal(signal.SIGCONT if on else signal.SIGSTOP)
            self.hogs_running = on

    def loops(self) -> int:
        return sum(self.counts)

    def pids(self) -> List[int]:
        return [p.pid for p in self.procs]

    def samples(self) -> Dict[str, Tuple[array.array, array.array]]:
        """Stop the probes and read each one's (due time, value) samples, both in ns."""
        self.stop_map[0] = 1
        out = {}
        for kind, (proc, path) in self.probes.items():
            proc.wait(30)
            raw = array.array("q")
            with open(path, "rb") as f:
                raw.frombytes(f.read())
            half = len(raw) // 2
            out[kind] = (raw[:half], raw[half:])
        return out

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            p.wait()


@dataclass
class Window:
    arm: str
    round: int
    start: int   # monotonic ns
    end: int
    loops_per_s: float


def measure(tree: Tree, workers: Workers, arms: Sequence[Arm], rounds: int, seconds: float,
            settle: float) -> List[Window]:
    windows = []
    layout = tree.settable()
    for r, arm in run_order(arms, rounds):
        undo = tree.apply(arm.writes)
        try:
            workers.run_hogs(arm.hog)
            time.sleep(settle)
            t0, c0 = time.monotonic_ns(), workers.loops()
            time.sleep(seconds)
            t1, c1 = time.monotonic_ns(), workers.loops()
        finally:
            tree.apply(undo)
        tree.expect(layout, f"the arm {arm.key!r}")
        windows.append(Window(arm.key, r, t0, t1, (c1 - c0) * 1e9 / (t1 - t0)))
    workers.run_hogs(True)
    return windows


def values_in(windows: Sequence[Window], due_at: array.array, values: array.array) -> List[List[int]]:
    """Each window's probe samples (ns), by the tick they were due at."""
    out: List[List[int]] = [[] for _ in windows]
    bounds = sorted((w.start, w.end, i) for i, w in enumerate(windows))
    j = 0
    for due, value in zip(due_at, values):
        while j < len(bounds) and bounds[j][1] <= due:
            j += 1
        if j < len(bounds) and bounds[j][0] <= due:
            out[bounds[j][2]].append(value)
    return out


def pct(sorted_values: Sequence[float], p: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(round(p / 100 * (len(sorted_values) - 1))))]


# --------------------------------------------------------------------------- the machine's load

@dataclass
class CpuTimes:
    """/proc/stat's CPU line, and this benchmark's own processes' CPU time (ticks)."""

    total: int
    busy: int
    steal: int
    ours: int

    @classmethod
    def now(cls, pids: Sequence[int]) -> "CpuTimes":
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        steal = v[7] if len(v) > 7 else 0
        total = sum(v[:8])
        return cls(total, total - v[3] - v[4] - steal, steal, sum(_ticks(p) for p in [os.getpid(), *pids]))


def _ticks(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return 0


def load_average() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


# --------------------------------------------------------------------------- report

@dataclass
class Figures:
    p50: float
    p99: float
    p999: float
    samples: int
    loops_per_s: float
    round_p99: List[float]


def figures(arms: Sequence[Arm], windows: Sequence[Window], per_window: Sequence[List[int]]) -> Dict[str, Figures]:
    out = {}
    for arm in arms:
        idx = [i for i, w in enumerate(windows) if w.arm == arm.key]
        pooled = sorted(v / 1000 for i in idx for v in per_window[i])
        rounds = [pct(sorted(v / 1000 for v in per_window[i]), 99) for i in sorted(idx, key=lambda i: windows[i].round)]
        loops = sum(windows[i].loops_per_s for i in idx) / len(idx)
        out[arm.key] = Figures(pct(pooled, 50), pct(pooled, 99), pct(pooled, 99.9), len(pooled), loops, rounds)
    return out


def print_table(arms: Sequence[Arm], figs: Dict[str, Figures], issue: bool) -> None:
    """The figures, with ratios to the kubelet arm's and (``issue``) issue 28's p99 beside."""
    base = figs["kubelet"]
    print(f"{'arm':<46}{'p50 us':>8}{'p99 us':>8}{'p99.9 us':>10}{'samples':>9}{'BE Mloops/s':>13}"
          f"{'p99 x':>7}{'BE x':>6}" + (f"{'issue p99':>11}" if issue else ""))
    for arm in arms:
        f = figs[arm.key]
        be_x = f"{f.loops_per_s / base.loops_per_s:.2f}" if base.loops_per_s else "-"
        print(f"{arm.label:<46}{f.p50:>8.0f}{f.p99:>8.0f}{f.p999:>10.0f}{f.samples:>9}"
              f"{f.loops_per_s / 1e6:>13.2f}{f.p99 / base.p99:>7.2f}{be_x:>6}"
              + (f"{arm.issue_p99 or '-':>11}" if issue else ""))


def print_rounds(arms: Sequence[Arm], figs: Dict[str, Figures], rounds: int) -> None:
    """Per-round p99s show drift and bursts of other load; their median is what one noisy
    round cannot move."""
    base = statistics.median(figs["kubelet"].round_p99)
    print("\np99 per round (us), drift and bursts show across a row:")
    print(f"{'arm':<46}" + "".join(f"{'r' + str(r + 1):>7}" for r in range(rounds)) + f"{'median':>8}{'x':>6}")
    for arm in arms:
        rp = figs[arm.key].round_p99
        print(f"{arm.label:<46}" + "".join(f"{v:>7.0f}" for v in rp)
              + f"{statistics.median(rp):>8.0f}{statistics.median(rp) / base:>6.2f}")


def verdict(outcome: DaemonOutcome, by_probe: Dict[str, Dict[str, Figures]]) -> str:
    """Does anything anolisnuma writes on this kernel make LS p99 worse than the kubelet's
    defaults? When it wrote nothing its arm *is* the kubelet's layout, and the two arms'
    difference is this run's noise. Else worse means above the kubelet arm's worst round."""
    lines, worse = [], []
    for kind, figs in by_probe.items():
        a, k = figs["anolisnuma"], figs["kubelet"]
        lines.append(f"LS {kind} p99 {a.p99:.0f} us against the kubelet defaults' {k.p99:.0f} us ({a.p99 / k.p99:.2f}x; "
                     f"median round {statistics.median(a.round_p99) / statistics.median(k.round_p99):.2f}x; "
                     f"the kubelet arm's rounds {min(k.round_p99):.0f}-{max(k.round_p99):.0f} us)")
        if a.p99 > max(k.round_p99 + [k.p99]):
            worse.append(kind)
    if not outcome.writes:
        return (f"anolisnuma on this kernel wrote nothing ({outcome.compared} settable files compared): its arm is "
                "the kubelet's defaults, so nothing it writes makes LS p99 worse; the differences below are this "
                "run's noise.\n" + "\n".join(lines))
    return (f"anolisnuma on this kernel wrote {len(outcome.writes)} files: "
            + (f"WORSE than the kubelet's defaults ({', '.join(worse)})" if worse
               else "not worse than the kubelet's defaults") + ".\n" + "\n".join(lines))


def print_outcome(outcome: DaemonOutcome) -> None:
    print("What anolisnuma (python -m anolisnuma, [qos] on at its defaults) wrote for the two pods:")
    for w in outcome.writes:
        print(f"  {w}")
    if not outcome.writes:
        print(f"  nothing: none of the {outcome.compared} settable files of the pods' cgroup tree changed")
    for f in outcome.new_files:
        print(f"  new file: {f}")
    print("and said (its log, copied to " + DAEMON_LOG_COPY + "):")
    for line in outcome.said or ["  (nothing about the two pods)"]:
        print(f"  {line}")


# --------------------------------------------------------------------------- main

def _raise_exit(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def preflight() -> Optional[str]:
    if os.geteuid() != 0:
        return "needs root (it makes cgroups and runs the daemon in a mount namespace)"
    if os.path.exists(os.path.join(CGROUP_ROOT, "cgroup.controllers")):
        return "cgroup v2 is not measured by this script yet (this machine's kind is v1)"
    for c in ("cpu", "memory"):
        if not os.path.exists(os.path.join(CGROUP_ROOT, c, "cpu.shares" if c == "cpu" else "memory.limit_in_bytes")):
            return f"no cgroup v1 {c} hierarchy at {CGROUP_ROOT}/{c}"
    for tool in ("unshare", "setpriv"):
        if shutil.which(tool) is None:
            return f"{tool} (util-linux) is missing"
    return None


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="CI smoke run: 2 rounds x 1.2 s per arm")
    ap.add_argument("--rounds", type=int, help="rounds of every arm (default 4; --quick 2)")
    ap.add_argument("--seconds", type=float, help="measured seconds per arm per round (default 5; --quick 1.2)")
    ap.add_argument("--settle", type=float, help="seconds after each switch before measuring (default 0.5; --quick 0.25)")
    ap.add_argument("--period-us", type=int, default=1000, help="the probe's wake-up period")
    ap.add_argument("--timer-slack-ns", type=int, default=1,
                    help="the probe's timer slack; 0 keeps the kernel's default (50 us)")
    ap.add_argument("--hogs", type=int, default=0, help="BE spinning processes (default twice the CPUs)")
    ap.add_argument("--rr", action="store_true",
                    help="also a request/response probe in the LS pod (a client waking every period, a server)")
    args = ap.parse_args(argv)
    quick = args.quick
    args.rounds = args.rounds or (2 if quick else 4)
    args.seconds = args.seconds or (1.2 if quick else 5.0)
    args.settle = args.settle if args.settle is not None else (0.25 if quick else 0.5)
    args.hogs = args.hogs or 2 * (os.cpu_count() or 1)
    return args


def run(args: argparse.Namespace) -> None:
    pods = Pods.new()
    tree = Tree(NAME_PREFIX + str(os.getpid()))
    with contextlib.ExitStack() as cleanup:
        work = os.path.join(tempfile.gettempdir(), tree.name)
        os.mkdir(work, 0o700)
        cleanup.callback(shutil.rmtree, work, True)
        cleanup.callback(_report_left, tree)
        try:
            measure_and_report(args, cleanup, tree, pods, work)
        finally:
            _ignore_signals()   # a second Ctrl-C must not cut the clean-up short


def measure_and_report(args: argparse.Namespace, cleanup: contextlib.ExitStack, tree: Tree, pods: Pods,
                       work: str) -> None:
    ncpu = os.cpu_count() or 1
    build_layout(tree, pods, ncpu)
    outcome = what_anolisnuma_writes(tree, pods, work)
    period_us = int(tree.read("cpu", "kubepods/besteffort", "cpu.cfs_period_us"))
    arms = issue_arms(pods, ncpu, period_us) + [anolisnuma_arm(outcome.writes)]

    workers = Workers(tree, pods, work, args.hogs, args.period_us * 1000, args.timer_slack_ns, args.rr)
    cleanup.callback(workers.kill)
    load_before, t_before = load_average(), CpuTimes.now(workers.pids())
    start = time.monotonic()
    windows = measure(tree, workers, arms, args.rounds, args.seconds, args.settle)
    t_after = CpuTimes.now(workers.pids())
    samples = workers.samples()
    print_header(args, ncpu, tree, time.monotonic() - start, load_before, t_before, t_after)
    print_outcome(outcome)
    by_probe = {kind: figures(arms, windows, values_in(windows, *pair)) for kind, pair in samples.items()}
    for kind, figs in by_probe.items():
        print(f"\n{PROBE_TITLES[kind]}")
        print_table(arms, figs, issue=kind == WAKE_UP)
        print_rounds(arms, figs, args.rounds)
    print("\n" + verdict(outcome, by_probe))


def print_header(args: argparse.Namespace, ncpu: int, tree: Tree, took: float, load_before: str,
                 before: CpuTimes, after: CpuTimes) -> None:
    total = max(1, after.total - before.total)
    others = 100 * max(0, (after.busy - before.busy) - (after.ours - before.ours)) / total
    print(f"LS wake-up latency beside a BE CPU hog, {os.uname().sysname} {os.uname().release}, cgroup v1, "
          f"{ncpu} CPUs")
    print(f"LS: SCHED_OTHER probe waking every {args.period_us} us (timer slack "
          f"{args.timer_slack_ns or 'kernel default'} ns)" + (", and a request/response pair" if args.rr else "")
          + f"; BE: {args.hogs} spinning processes")
    print(f"layout: {tree.root}/<controller>/{tree.name}/kubepods/... (the kubelet's cgroupfs names and cpu values)")
    print(f"{args.rounds} rounds x {args.seconds:g} s per arm (+{args.settle:g} s settle), round r starting with arm r, "
          f"backward every other round; measured in {took:.0f} s")
    print(f"load average {load_before} before, {load_average()} after (the hog alone adds about {args.hogs}); "
          f"other processes used {others:.0f}% of the CPUs, steal {100 * (after.steal - before.steal) / total:.0f}%"
          + (" - NOISY: other load shared the machine" if others > NOISY_PERCENT else ""))
    print()


def _ignore_signals() -> None:
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)


def _report_left(tree: Tree) -> None:
    left = tree.remove()
    if left:
        print(f"could not remove {', '.join(left)}", file=sys.stderr)


def main(argv: Sequence[str]) -> int:
    if "--worker" in argv:
        return worker_main(argv)
    args = parse_args(argv)
    problem = preflight()
    if problem:
        print(f"bench_interference: {problem}", file=sys.stderr)
        return 1
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, _raise_exit)
    # Also when started with SIGINT ignored (a shell's background job): a SIGINT sent to the
    # benchmark is meant to stop it, and stopping is what cleans up.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for stale in sweep_stale():
        print(f"removed {stale}, left by a run that was killed", file=sys.stderr)
    try:
        run(args)
    except KeyboardInterrupt:
        print("bench_interference: interrupted; everything it made is removed", file=sys.stderr)
        return 1
    except SystemExit as e:
        print(f"bench_interference: stopped by signal {int(e.code or 0) - 128}; everything it made is removed",
              file=sys.stderr)
        return 1
    except Exception as e:   # a benchmark that could not run says why and exits 1
        print(f"bench_interference: could not run: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
