#!/usr/bin/env python3
"""Pod start time four ways in one run: direct, through the proxy, with the NRI plugin, with
a minimal Go NRI plugin as the yardstick (issues 29 and 34).

    sudo .venv/bin/python scripts/bench_nri.py            # 3 x 6 rounds x 15 pods per arm, ~10 min
    sudo .venv/bin/python scripts/bench_nri.py --quick    # 1 x 2 rounds x 4 pods (CI smoke run, ~30-45 s)
    sudo .venv/bin/python scripts/bench_nri.py --repeat 1 # one repeat of the full rounds
    sudo .venv/bin/python scripts/bench_nri.py --json FILE

Needs root, containerd v2.2.7 (``build_named("2.2")``: /work/shared/containerd-2.2, NRI is
only in containerd 2.x), runc, the test images and the CRI stubs (container-runtime-interface-api).
It starts, and always removes again (also on error, Ctrl-C or SIGTERM):

- a private containerd 2.2.7 (``PrivateContainerd``, no CNI, a private NRI socket) under
  /tmp/anolisnuma-bench-nri-<pid> and /run/anolisnuma-bench-nri-<pid>;
- daemon A: ``python -m anolisnuma -c A.toml`` in proxy mode in front of it;
- daemon B: the same configuration plus ``[nri] enabled = true`` on containerd's NRI socket,
  registered as an NRI plugin only while its arm runs (an NRI plugin acts on every pod
  containerd makes): started and waited for ("registered with containerd as an NRI plugin"
  in its log) before each of its arms, stopped (SIGTERM) after; neither is timed.

Both daemons have NUMA placement on for the benchmark's namespace (and no periodic resync:
daemon A would adopt and pin the pods other arms make on containerd's own socket) over a
fake two-node topology mapped onto CPUs 0 and 1 (as tests/e2e/test_numa_e2e.py: node 0 =
CPU 0, node 1 = CPU 1, memory pinning off). The arms, all with one KubeletLike client (tests/e2e/cri_client.py,
as bench_proxy.py's pod start):

  direct   the client on containerd's own socket, no plugin registered
  proxy    the client on daemon A's socket
  nri      the client on containerd's own socket, daemon B registered
  anchor   the client on containerd's own socket, ``nri-anchor`` registered (the Go plugin of
           ../shared/nri-anchor, or $ANOLISNUMA_NRI_ANCHOR; NRI's own stub library, pinning
           pods of the namespace round-robin to CPU 0 / 1); started and waited for ("nri-anchor:
           synchronized") before each of its arms, stopped after; absent -> the arm is skipped

Daemon B subscribes to the NRI events its policies act on (with NUMA alone, not
StartContainer or StopContainer: ``NriFrontEnd.events``); nri-anchor to all eight.

Every arm starts with a warm-up pod, not timed and removed at once: containerd notices a
plugin that went away (the previous arm's) only at its next event.

One pod start = RunPodSandbox + CreateContainer + StartContainer of a host-network pod
(its cgroup made first, as the kubelet does) with one container requesting 50m; each call
is timed on its own too. Every round runs every arm once (the order rotates, and goes
backward every other round) so that drift and other load hit the arms alike; after each
arm everything it made is removed (not timed). After each proxy and nri arm every container's
real cgroup ``cpuset.cpus`` is read: it must be one node's CPUs (the run prints how many
were placed: figures without placement would mean nothing); the direct arm's must not be.

The rounds run ``--repeat`` times (the load is said for each repeat). Printed besides: per
figure the mean added over direct (the mean of per-round differences, with a 95 %
t-interval over rounds), "CreateContainer added over no plugin" for nri and anchor, the
plugins' CPU per pod start (process CPU clock of daemon B and of nri-anchor over the timed
pods; daemon B's from when the metrics scrape before them has ended in it), and issue 34's
targets read off them (met / missed; informative only).

Printed: per arm p50 / p90 / max of the pod start and of each call, their ratios to direct
(p50 and p90); what the daemons logged for the same calls (proxy: request in to reply out,
containerd's time included; nri: the event's time in the pipeline) and their pre-hooks'
time (from their metrics), so that the extra time can be split; and the CPU that processes
other than the benchmark's took meanwhile (from /proc/stat, minus this process, its
children, containerd and its shims). Exit status 0 whatever the figures, 1 when the
benchmark could not run, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _p in (HERE, os.path.join(HERE, "tests", "e2e"), os.path.join(HERE, "scripts")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from bench_proxy import T975, cpu_seconds, log, mean_interval, pct, t975  # noqa: E402,F401
from anolisnuma.policies.numa.cpuset import CpuSet, CpuSetError  # noqa: E402
from anolisnuma.testing.containerd import PrivateContainerd, cleanup_dead_instances  # noqa: E402
from anolisnuma.testing.containerd_builds import build_named  # noqa: E402
from anolisnuma.testing.fake_sysfs import GIB, FakeTopology  # noqa: E402
from anolisnuma.testing.proxy import SubprocessProxy, config_dict, read_log  # noqa: E402

BASE_PREFIX = "/tmp/anolisnuma-bench-nri-"
RUN_PREFIX = "/run/anolisnuma-bench-nri-"
LAST_LOG = "/tmp/anolisnuma-bench-nri-last-containerd.log"
NS = "bench-nri"
NODE_CPUS = {0: "0", 1: "1"}         # the fake topology's node -> this machine's CPU
ARMS = ("direct", "proxy", "nri", "anchor")
PLUGIN_ARMS = ("nri", "anchor")      # arms with an NRI plugin registered (one at a time)
CALLS = ("RunPodSandbox", "CreateContainer", "StartContainer")
REGISTERED = "registered with containerd as an NRI plugin"
CPU_SHARES = 51                      # 50m: 15 pods x 50m fit one node of one CPU
FULL = {"rounds": 6, "pods": 15, "repeat": 3}
QUICK = {"rounds": 2, "pods": 4, "repeat": 1}
ANCHOR_ENV = "ANOLISNUMA_NRI_ANCHOR"  # the Go yardstick plugin's binary, if not at ../shared/nri-anchor
ANCHOR_READY = "nri-anchor: synchronized"
# issue 34's targets (informative: the verdicts never change the exit status)
T_CREATE_OVER_ANCHOR_MS = 1.0        # NRI CreateContainer added <= anchor's + 1.0 ms
T_CPU_X_ANCHOR = 2.0                 # plugin CPU per pod start <= 2 x anchor's
T_POD_X_DIRECT = 1.03                # whole pod start p50 <= 1.03 x direct, proxy and nri
NOISY_PERCENT = 10.0                 # other processes' share of the CPUs that makes figures noisy
CG_CPUSET = "/sys/fs/cgroup/cpuset"


# --------------------------------------------------------------------------- pure parts

def stats(values: Sequence[float]) -> Dict[str, float]:
    """p50 / p90 / max / mean (and n) of ``values`` (ms)."""
    return {"n": len(values), "p50": pct(values, 0.5), "p90": pct(values, 0.9),
            "max": max(values) if values else float("nan"),
            "mean": sum(values) / len(values) if values else float("nan")}


def ratios(figures: Dict[str, Dict[str, float]], base: str = "direct") -> Dict[str, Dict[str, float]]:
    """Per arm, its p50 and p90 divided by the ``base`` arm's."""
    b = figures.get(base) or {}
    out = {}
    for arm, f in figures.items():
        out[arm] = {q: (f[q] / b[q] if b.get(q) else float("nan")) for q in ("p50", "p90")}
    return out


def run_order(arms: Sequence[str], rounds: int) -> List[List[str]]:
    """Round r starts with arm r (rotating), and goes backward every other round; with an
    even number of arms the direction also flips every full rotation (else each arm would
    always be followed by the same one)."""
    out = []
    n = len(arms)
    for r in range(rounds):
        k = r % n
        order = list(arms[k:]) + list(arms[:k])
        backward = (r % 2 == 1) != (n % 2 == 0 and (r // n) % 2 == 1)
        out.append([order[0]] + order[1:][::-1] if backward else order)
    return out


def node_of(cpus: str, node_cpus: Dict[int, str]) -> Optional[int]:
    """The NUMA node whose CPUs ``cpus`` (a cpuset list) is exactly, else None (e.g. the whole
    machine, or nothing readable)."""
    want = _cpu_set(cpus)
    if not want:
        return None
    for node, own in sorted(node_cpus.items()):
        if _cpu_set(own) == want:
            return node
    return None


def _cpu_set(text: str) -> Optional[CpuSet]:
    """A cpuset list as the kernel or containerd wrote it; None when it does not parse."""
    try:
        return CpuSet.parse((text or "").strip())
    except CpuSetError:
        return None


def placement(real_cpus: str, spec_cpus: str, node_cpus: Dict[int, str]) -> Optional[int]:
    """The node a container was placed on: its real cgroup's cpuset.cpus when readable, else
    the OCI spec's linux.resources.cpu.cpus; None when neither is one node's CPUs."""
    return node_of(real_cpus if real_cpus else spec_cpus, node_cpus)


def other_cpu_percent(before: Dict[str, float], after: Dict[str, float]) -> Dict[str, float]:
    """From two ``cpu_sample`` readings: the share (%) of all CPUs that was busy, that
    processes other than the benchmark's took, and steal."""
    total = max(1e-9, after["total"] - before["total"])
    busy = after["busy"] - before["busy"]
    ours = after["ours"] - before["ours"]
    return {"busy": 100 * busy / total, "other": 100 * max(0.0, busy - ours) / total,
            "steal": 100 * (after["steal"] - before["steal"]) / total}


def pooled_load(loads: Sequence[Dict[str, float]]) -> Dict[str, float]:
    """The repeats' other-load figures averaged (each repeat measures about as long)."""
    if not loads:
        return {}
    return {k: sum(ld[k] for ld in loads) / len(loads) for k in loads[0]}


def parse_metrics(text: str) -> Dict[Tuple[str, str], Tuple[float, float]]:
    """``anolisnuma_hook_duration_seconds`` from Prometheus text: (hook, stage) -> (count, sum),
    outcomes added up."""
    out: Dict[Tuple[str, str], List[float]] = {}
    pat = re.compile(r'^anolisnuma_hook_duration_seconds_(sum|count)\{([^}]*)\}\s+(\S+)')
    for line in text.splitlines():
        m = pat.match(line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        key = (labels.get("hook", "?"), labels.get("stage", "?"))
        slot = out.setdefault(key, [0.0, 0.0])
        slot[0 if m.group(1) == "count" else 1] += float(m.group(3))
    return {k: (v[0], v[1]) for k, v in out.items()}


def pre_hook_ms(before: Dict[Tuple[str, str], Tuple[float, float]],
                after: Dict[Tuple[str, str], Tuple[float, float]]) -> Tuple[int, float]:
    """Pre-hook calls and their milliseconds between two scrapes (every hook)."""
    n, s = 0.0, 0.0
    for key, (count, total) in after.items():
        if key[1] != "pre":
            continue
        c0, s0 = before.get(key, (0.0, 0.0))
        n += count - c0
        s += total - s0
    return int(n), s * 1000


def round_differences(arm_rounds: Sequence[Sequence[float]],
                      base_rounds: Sequence[Sequence[float]]) -> List[float]:
    """Per round, the arm's mean minus the base arm's mean (ms): rounds where either arm has
    no sample are left out. Pairing by round takes the drift between rounds out."""
    out = []
    for a, b in zip(arm_rounds, base_rounds):
        if a and b:
            out.append(sum(a) / len(a) - sum(b) / len(b))
    return out


def anchor_binary(repo: str, env: Optional[Dict[str, str]] = None) -> Tuple[Optional[str], str]:
    """(path, why): the Go yardstick plugin from $ANOLISNUMA_NRI_ANCHOR, else
    ../shared/nri-anchor/nri-anchor beside the repository; (None, why not) when neither is
    an executable file."""
    env = os.environ if env is None else env
    wanted = env.get(ANCHOR_ENV) or os.path.join(os.path.dirname(os.path.abspath(repo)), "shared",
                                                 "nri-anchor", "nri-anchor")
    if os.path.isfile(wanted) and os.access(wanted, os.X_OK):
        return wanted, f"nri-anchor at {wanted}"
    return None, f"no executable nri-anchor at {wanted} (set {ANCHOR_ENV})"


def _met(ok: bool) -> str:
    return "met" if ok else "missed"


def verdicts(s: Dict[str, Any]) -> List[Tuple[str, Optional[bool], str]]:
    """Issue 34's targets read off one run's summary: (target, met or None when not
    measured, the figures). Informative only."""
    out: List[Tuple[str, Optional[bool], str]] = []
    iv = s.get("intervals", {}).get("CreateContainer", {})
    nri, anc = iv.get("nri"), iv.get("anchor")
    name = f"NRI CreateContainer added <= anchor's + {T_CREATE_OVER_ANCHOR_MS:.1f} ms"
    if nri and anc and nri["n"] and anc["n"]:
        ok = nri["mean"] <= anc["mean"] + T_CREATE_OVER_ANCHOR_MS
        out.append((name, ok, f"{_met(ok)}: nri +{_f(nri['mean'], 2)} ms, anchor +{_f(anc['mean'], 2)} ms "
                              f"(difference {_f(nri['mean'] - anc['mean'], 2)} ms)"))
    else:
        out.append((name, None, "not measured (no anchor arm)"))
    cpu = s.get("plugin_cpu", {})
    name = f"plugin CPU per pod start <= {T_CPU_X_ANCHOR:g} x anchor's"
    cn, ca = cpu.get("nri"), cpu.get("anchor")
    if cn and ca and cn["n"] and ca["n"] and ca["mean"] > 0:
        ok = cn["mean"] <= T_CPU_X_ANCHOR * ca["mean"]
        out.append((name, ok, f"{_met(ok)}: daemon B {_f(cn['mean'], 2)} ms, anchor {_f(ca['mean'], 2)} ms "
                              f"({_f(cn['mean'] / ca['mean'], 2)} x)"))
    else:
        out.append((name, None, "not measured (no anchor arm)"))
    rat = s.get("ratios", {}).get("pod", {})
    for arm in ("proxy", "nri"):
        name = f"pod start p50 <= {T_POD_X_DIRECT:g} x direct ({arm})"
        x = rat.get(arm, {}).get("p50", float("nan"))
        if x == x:
            ok = x <= T_POD_X_DIRECT
            out.append((name, ok, f"{_met(ok)}: {_f(x, 3)} x"))
        else:
            out.append((name, None, "not measured"))
    return out


DAEMON_LINES = {"proxy": "reply from containerd", "nri": "answered to containerd (NRI)"}


def daemon_latencies(lines: Iterable[Dict[str, Any]], arm: str) -> Dict[str, List[float]]:
    """The ``latency_ms`` a daemon logged for each of CALLS in the benchmark's namespace: in
    proxy mode from the request's first byte to containerd's reply; in NRI mode the event's
    time in the pipeline."""
    out: Dict[str, List[float]] = {c: [] for c in CALLS}
    want = DAEMON_LINES[arm]
    for rec in lines:
        method = rec.get("method")
        if method in out and want in str(rec.get("message", "")) and "latency_ms" in rec \
                and rec.get("pod_namespace", NS) == NS:
            out[method].append(float(rec["latency_ms"]))
    return out


# --------------------------------------------------------------------------- the machine's load

def _ticks(pid: int, children: bool = True) -> int:
    """utime + stime (+ the reaped children's) of ``pid``, in clock ticks."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return sum(int(x) for x in fields[11:15 if children else 13])
    except (OSError, IndexError, ValueError):
        return 0


def _descendants(pid: int) -> List[int]:
    """``pid``'s living descendants (/proc/*/task/*/children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children") as f:
                    kids = [int(x) for x in f.read().split()]
            except (OSError, ValueError):
                continue
            out += kids
            todo += kids
    return out


class Ours:
    """CPU time of the benchmark's processes: this one and its reaped children (daemons
    stopped, runs of ctr), the living daemons, containerd and the shims of our containerd.
    Shims leave when their pods are removed (they are not our children): their time is
    sampled before each removal and the last sample kept."""

    def __init__(self, containerd_socket: str) -> None:
        self.socket = containerd_socket
        self.live: List[int] = []          # daemons and containerd (children of ours)
        self.shims: Dict[int, int] = {}    # pid -> last ticks seen (with their runc children)

    def sample_shims(self) -> None:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmd = f.read()
            except OSError:
                continue
            if b"containerd-shim" in cmd.split(b"\0", 1)[0] and self.socket.encode() in cmd:
                pid = int(entry)
                self.shims[pid] = max(self.shims.get(pid, 0), _ticks(pid))

    def ticks(self) -> int:
        self.sample_shims()
        t = os.times()
        own = (t.user + t.system + t.children_user + t.children_system) * os.sysconf("SC_CLK_TCK")
        seen = set(self.shims)   # (containerd may be the shims' parent: counted once)
        live = 0
        for pid in self.live:
            for p in [pid] + _descendants(pid):
                if p not in seen:
                    seen.add(p)
                    live += _ticks(p)
        return int(own) + live + sum(self.shims.values())


def cpu_sample(ours: Optional[Ours]) -> Dict[str, float]:
    """/proc/stat's CPU line (ticks) and our processes' ticks."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    steal = v[7] if len(v) > 7 else 0
    total = sum(v[:8])
    return {"total": total, "busy": total - v[3] - v[4] - steal, "steal": steal,
            "ours": ours.ticks() if ours is not None else 0}


def machine() -> Dict[str, str]:
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "?")
    except OSError:
        pass
    return {"host": platform.node(), "nproc": str(os.cpu_count()), "cpu": cpu, "kernel": platform.release(),
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "loadavg_at_start": " ".join(f"{x:.2f}" for x in os.getloadavg())}


# --------------------------------------------------------------------------- the run

def wait_quiet(pid: int, quiet_s: float = 0.2, limit_s: float = 3.0) -> bool:
    """Wait until process ``pid`` used under 1 ms of CPU in ``quiet_s`` (at most
    ``limit_s``): a metrics scrape's collection finishes after its answer (its threads,
    the collected lists let go), and that CPU is not a pod start's. False if never quiet."""
    deadline = time.monotonic() + limit_s
    last = cpu_seconds(pid)
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = cpu_seconds(pid)
        if now - last < 0.001:
            return True
        last = now
    return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def daemon_config(base: str, containerd: PrivateContainerd, nri: bool) -> Dict[str, Any]:
    """test_numa_e2e's NUMA configuration (fake 2-node topology on CPUs 0 and 1, memory
    pinning off) for the benchmark's namespace; metrics on a loopback port; with ``nri``
    the NRI front-end on containerd's private NRI socket."""
    port = free_port()
    data = config_dict(base, containerd.socket, extra={
        "numa": {"enabled": True, "namespaces": [NS], "memory_pinning": "off", "poll_interval_seconds": 1.0},
        "log": {"stderr": False}, "metrics": {"listen": f"127.0.0.1:{port}"},
        # Every arm's pods are in the managed namespace, and daemon A runs through them all:
        # its periodic resync would adopt and pin the pods of the direct and anchor arms
        # (made on containerd's own socket) that happen to be running then. Its start-up
        # resync is kept.
        "runtime": {"resync_interval_seconds": 0.0}})
    FakeTopology(name="2n-2c-bench-nri", node_cpus=NODE_CPUS, distances=[[10, 20], [20, 10]],
                 memory_bytes={0: 2 * GIB, 1: 2 * GIB}).write(data["paths"]["sys_root"])
    if nri:
        data["nri"] = {"enabled": True, "socket": containerd.nri_socket, "reconnect_max_seconds": 1.0}
    return data


class Daemon:
    """One anolisnuma subprocess (``SubprocessProxy``), its log read from an offset."""

    def __init__(self, name: str, base: str, data: Dict[str, Any]) -> None:
        os.makedirs(base, exist_ok=True)
        self.name = name
        self.data = data
        self.proc = SubprocessProxy(data, base, name=name)
        self.log_file = data["log"]["file"]
        self.metrics_url = f"http://{data['metrics']['listen']}/metrics"
        self.starts: List[float] = []     # seconds from start to ready (socket, or NRI registration)

    @property
    def running(self) -> bool:
        return self.proc.proc is not None and self.proc.proc.poll() is None

    def log_size(self) -> int:
        try:
            return os.path.getsize(self.log_file)
        except OSError:
            return 0

    def lines_from(self, offset: int) -> List[Dict[str, Any]]:
        try:
            with open(self.log_file, "rb") as f:
                f.seek(offset)
                text = f.read().decode(errors="replace")
        except OSError:
            return []
        out = []
        for line in text.splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out

    def start(self, ready_message: str = "", timeout: float = 60.0) -> None:
        offset = self.log_size()
        t0 = time.monotonic()
        self.proc.start(timeout=timeout)
        if ready_message:
            deadline = t0 + timeout
            while not any(r.get("message") == ready_message for r in self.lines_from(offset)):
                if not self.running:
                    raise RuntimeError(f"{self.name} exited with {self.proc.proc.returncode}: {self.proc.stderr[-2000:]}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name}: no {ready_message!r} in its log after {timeout:g} s")
                time.sleep(0.02)
        self.starts.append(time.monotonic() - t0)

    def stop(self) -> Optional[int]:
        return self.proc.stop(timeout=15.0)

    def hooks(self) -> Dict[Tuple[str, str], Tuple[float, float]]:
        with urllib.request.urlopen(self.metrics_url, timeout=5) as r:
            return parse_metrics(r.read().decode())

    def problems(self) -> List[str]:
        seen: Dict[str, int] = {}
        for rec in read_log(self.log_file):
            if rec.get("level") in ("warning", "error", "critical"):
                key = f"{rec.get('level')}: {rec.get('message')} {str(rec.get('error', ''))[:160]}".strip()
                seen[key] = seen.get(key, 0) + 1
        return [f"{self.name}: {n} x {k}" for k, n in sorted(seen.items())]


class Anchor:
    """The Go yardstick plugin (``nri-anchor``) as a subprocess, its output in a file."""

    def __init__(self, binary: str, nri_socket: str, log_file: str) -> None:
        self.binary, self.socket, self.log_file = binary, nri_socket, log_file
        self.proc: Optional[subprocess.Popen] = None
        self.starts: List[float] = []

    def argv(self) -> List[str]:
        # -mems empty: the daemons run with memory pinning off, so neither sets cpuset.mems
        return [self.binary, "-socket", self.socket, "-name", "anchor", "-idx", "10", "-namespace", NS,
                "-cpus", ",".join(NODE_CPUS[n] for n in sorted(NODE_CPUS)), "-mems="]

    def start(self, timeout: float = 30.0) -> None:
        t0 = time.monotonic()
        with open(self.log_file, "ab") as out:
            self.proc = subprocess.Popen(self.argv(), stdout=out, stderr=subprocess.STDOUT)
        while True:
            with open(self.log_file, errors="replace") as f:
                seen = f.read().count(ANCHOR_READY)
            if seen > len(self.starts):
                break
            if self.proc.poll() is not None:
                raise RuntimeError(f"nri-anchor exited with {self.proc.returncode}: {self.tail()}")
            if time.monotonic() - t0 > timeout:
                raise RuntimeError(f"nri-anchor: no {ANCHOR_READY!r} after {timeout:g} s: {self.tail()}")
            time.sleep(0.02)
        self.starts.append(time.monotonic() - t0)

    def tail(self) -> str:
        try:
            with open(self.log_file, errors="replace") as f:
                return f.read()[-1500:]
        except OSError:
            return ""

    def stop(self) -> Optional[int]:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout=10)


class Bench:
    def __init__(self, rounds: int, pods: int, repeat: int = 1, anchor: Optional[str] = None) -> None:
        self.rounds, self.pods, self.repeat = rounds, pods, repeat
        self.arms = [a for a in ARMS if a != "anchor" or anchor]
        self.anchor_binary = anchor
        self.anchor: Optional[Anchor] = None
        pid = os.getpid()
        self.pc = PrivateContainerd(f"{BASE_PREFIX}{pid}", f"{RUN_PREFIX}{pid}", cni=False,
                                    build=build_named("2.2"))
        self.work = os.path.join(self.pc.base_dir, "bench")
        self.a: Optional[Daemon] = None
        self.b: Optional[Daemon] = None
        self.clients: Dict[str, Any] = {}
        self.ours = Ours(self.pc.socket)
        self.samples: Dict[str, Dict[str, List[float]]] = {a: {k: [] for k in ("pod",) + CALLS} for a in ARMS}
        # per round, per arm and figure: that round's samples (the intervals pair arms by round)
        self.by_round: List[Dict[str, Dict[str, List[float]]]] = []
        self.plugin_cpu: Dict[str, List[float]] = {a: [] for a in PLUGIN_ARMS}   # ms per pod, per round
        self.loads: List[Dict[str, float]] = []
        self.placed: Dict[str, Dict[str, int]] = {a: {"pods": 0, "placed": 0, "node0": 0, "node1": 0} for a in ARMS}
        self.unplaced: List[str] = []
        self.logged: Dict[str, Dict[str, List[float]]] = {a: {c: [] for c in CALLS} for a in ("proxy", "nri")}
        self.hook_ms: Dict[str, List[float]] = {"proxy": [0, 0.0], "nri": [0, 0.0]}   # calls, ms
        self.problems: List[str] = []
        self.measured_s = 0.0
        self.load: Dict[str, float] = {}

    # ---- setup / teardown
    def setup(self) -> None:
        left = cleanup_dead_instances(BASE_PREFIX, RUN_PREFIX)
        if left:
            log(f"cleaned leftovers of killed runs: {left}")
        log(f"starting containerd {self.pc.build.name} under {self.pc.base_dir}")
        self.pc.start()
        self.pc.import_images()
        self.ours.live.append(self.pc.pid or 0)
        self.a = Daemon("a", os.path.join(self.work, "a"), daemon_config(os.path.join(self.work, "a"), self.pc, False))
        self.b = Daemon("b", os.path.join(self.work, "b"), daemon_config(os.path.join(self.work, "b"), self.pc, True))
        self.a.start(ready_message="hooks ready")
        self.ours.live.append(self.a.proc.proc.pid)
        from cri_client import KubeletLike
        self.clients = {"direct": KubeletLike(self.pc.socket, harness=self.pc, timeout=120),
                        "proxy": KubeletLike(self.a.proc.socket_path, harness=self.pc, timeout=120)}
        self.clients["nri"] = self.clients["anchor"] = self.clients["direct"]
        if self.anchor_binary:
            self.anchor = Anchor(self.anchor_binary, self.pc.nri_socket, os.path.join(self.work, "anchor.log"))

    def teardown(self) -> None:
        for kl in {id(k): k for k in self.clients.values()}.values():
            try:
                self.problems += [f"pod cleanup: {e}" for e in self.remove_all(kl)]
                kl.close()
            except Exception as e:
                self.problems.append(f"pod cleanup: {e!r}")
        if self.anchor is not None:
            try:
                self.anchor.stop()
            except Exception as e:
                self.problems.append(f"nri-anchor stop: {e!r}")
        for d in (self.b, self.a):
            if d is not None:
                try:
                    code = d.stop()
                    if code not in (0, None):
                        self.problems.append(f"daemon {d.name} exited with {code}")
                except Exception as e:
                    self.problems.append(f"daemon {d.name} stop: {e!r}")
        problems = self.pc.cleanup(save_log=LAST_LOG)   # also removes self.work (under its base dir)
        if problems:
            self.problems.append(f"containerd cleanup: {problems}")

    # ---- one pod, one arm
    def one_pod(self, kl: Any, arm: str) -> Tuple[float, float, float, float]:
        from cri_client import Pod, pb
        uid = str(uuid.uuid4())
        name = f"{arm}-{uid[:8]}"
        cfg = kl.sandbox_config(name, namespace=NS, uid=uid, network="node", qos="burstable")
        self.pc.make_pod_cgroup(cfg.linux.cgroup_parent)   # the kubelet makes it before RunPodSandbox
        os.makedirs(cfg.log_directory, exist_ok=True)
        ccfg = kl.container_config("main", kl.resources(cpu_shares=CPU_SHARES), network="node")
        rt = kl.runtime
        t0 = time.perf_counter()
        pod_id = rt.RunPodSandbox(pb.RunPodSandboxRequest(config=cfg), timeout=120).pod_sandbox_id
        t1 = time.perf_counter()
        kl.pods.append(Pod(id=pod_id, uid=uid, name=name, namespace=NS, cgroup_parent=cfg.linux.cgroup_parent,
                           network="node", config=cfg))
        t1b = time.perf_counter()
        cid = rt.CreateContainer(pb.CreateContainerRequest(pod_sandbox_id=pod_id, config=ccfg, sandbox_config=cfg),
                                 timeout=120).container_id
        t2 = time.perf_counter()
        kl.containers.append(cid)
        t2b = time.perf_counter()
        rt.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=120)
        t3 = time.perf_counter()
        run, create, start = t1 - t0, t2 - t1b, t3 - t2b
        return (run + create + start) * 1e3, run * 1e3, create * 1e3, start * 1e3

    def check_placement(self, kl: Any, arm: str) -> None:
        from cri_client import read_file
        for cid in kl.containers:
            _, info = kl.container_status(cid)
            linux = (info.get("runtimeSpec") or {}).get("linux") or {}
            spec = ((linux.get("resources") or {}).get("cpu") or {}).get("cpus", "")
            try:
                real = read_file(f"{CG_CPUSET}{linux.get('cgroupsPath', '')}/cpuset.cpus")
            except OSError:
                real = ""
            node = placement(real, spec, NODE_CPUS)
            p = self.placed[arm]
            p["pods"] += 1
            if node is not None:
                p["placed"] += 1
                p[f"node{node}"] += 1
            if (node is None) == (arm != "direct"):
                self.unplaced.append(f"{arm} {cid[:12]}: cgroup cpus {real!r}, spec cpus {spec!r}")

    def remove_all(self, kl: Any) -> List[str]:
        parents = [p.cgroup_parent for p in kl.pods]
        errors = kl.cleanup()
        for parent in parents:
            errors += [f"cgroup left: {d}" for d in self.pc.remove_pod_cgroup(parent)]
        return errors

    def plugin_pid(self, arm: str) -> int:
        """Register the arm's plugin (one at a time) and return its pid; 0 for no plugin."""
        if arm == "nri":
            assert self.b is not None
            self.b.start(ready_message=REGISTERED)
            pid = self.b.proc.proc.pid
        elif arm == "anchor":
            assert self.anchor is not None
            self.anchor.start()
            pid = self.anchor.proc.pid
        else:
            return 0
        self.ours.live.append(pid)
        return pid

    def stop_plugin(self, arm: str, pid: int) -> None:
        if not pid:
            return
        code = self.b.stop() if arm == "nri" else self.anchor.stop()
        self.ours.live.remove(pid)
        if code != 0:
            tail = self.b.proc.stderr[-500:] if arm == "nri" else self.anchor.tail()
            self.problems.append(f"{arm} plugin exited with {code}: {tail}")

    def arm(self, arm: str, n: int, record: bool) -> None:
        kl = self.clients[arm]
        daemon = self.a if arm == "proxy" else self.b if arm == "nri" else None
        pid = self.plugin_pid(arm)
        # A warm-up pod, not timed: containerd notices a plugin that went away (the previous
        # arm's) only at its next event, and that event pays for closing it.
        self.one_pod(kl, arm)
        self.problems += [f"{arm} warm-up cleanup: {e}" for e in self.remove_all(kl)]
        offset = daemon.log_size() if daemon is not None else 0
        hooks0 = daemon.hooks() if daemon is not None and record else {}
        if pid and hooks0:
            wait_quiet(pid)   # (the scrape's own tail is not the pods')
        cpu0 = cpu_seconds(pid) if pid else 0.0
        t0 = time.monotonic()
        times = [self.one_pod(kl, arm) for _ in range(n)]
        self.measured_s += time.monotonic() - t0
        cpu1 = cpu_seconds(pid) if pid else 0.0
        if record:
            this_round = self.by_round[-1][arm]
            for t in times:
                for key, v in zip(("pod",) + CALLS, t):
                    self.samples[arm][key].append(v)
                    this_round[key].append(v)
            if pid:
                self.plugin_cpu[arm].append((cpu1 - cpu0) * 1e3 / n)
            self.check_placement(kl, arm)
            if daemon is not None:
                time.sleep(1.05)   # the metrics page is collected at most once a second
                calls, ms = pre_hook_ms(hooks0, daemon.hooks())
                self.hook_ms[arm][0] += calls
                self.hook_ms[arm][1] += ms
                for c, v in daemon_latencies(daemon.lines_from(offset), arm).items():
                    self.logged[arm][c] += v
        self.ours.sample_shims()
        self.problems += [f"{arm} cleanup: {e}" for e in self.remove_all(kl)]
        self.stop_plugin(arm, pid)

    def measure(self) -> None:
        log(f"warm-up: 1 pod per arm ({', '.join(self.arms)})")
        for arm in self.arms:
            self.arm(arm, 1, record=False)
        t0 = time.monotonic()
        orders = run_order(self.arms, self.rounds * self.repeat)
        for k in range(self.repeat):
            before = cpu_sample(self.ours)
            for r in range(self.rounds):
                order = orders[k * self.rounds + r]
                log(f"repeat {k + 1}/{self.repeat}, round {r + 1}/{self.rounds}: {' '.join(order)}, "
                    f"{self.pods} pods each")
                self.by_round.append({a: {key: [] for key in ("pod",) + CALLS} for a in ARMS})
                for arm in order:
                    self.arm(arm, self.pods, record=True)
            self.loads.append(other_cpu_percent(before, cpu_sample(self.ours)))
        self.wall_s = time.monotonic() - t0
        self.load = pooled_load(self.loads)

    # ---- figures
    def summary(self) -> Dict[str, Any]:
        figs: Dict[str, Dict[str, Any]] = {k: {a: stats(self.samples[a][k]) for a in self.arms}
                                           for k in ("pod",) + CALLS}
        rat = {k: ratios(v) for k, v in figs.items()}
        daemon = {a: {c: stats(v) for c, v in self.logged[a].items()} for a in self.logged}
        hooks = {}
        for a, (calls, ms) in self.hook_ms.items():
            pods = len(self.samples[a]["pod"])
            hooks[a] = {"pre_hook_calls": calls, "pre_hook_ms_total": ms,
                        "pre_hook_ms_per_pod": ms / pods if pods else float("nan")}
        intervals = {k: {a: mean_interval(round_differences([r[a][k] for r in self.by_round],
                                                            [r["direct"][k] for r in self.by_round]))
                         for a in self.arms if a != "direct"} for k in ("pod",) + CALLS}
        cpu = {a: mean_interval(v) for a, v in self.plugin_cpu.items() if a in self.arms}
        return {"arms": list(self.arms), "repeat": self.repeat, "intervals": intervals, "plugin_cpu": cpu,
                "loads": self.loads, "anchor": getattr(self, "anchor_note", ""),
                "figures_ms": figs, "ratios": rat, "placement": self.placed, "unplaced": self.unplaced,
                "daemon_ms": daemon, "hooks": hooks, "rounds": self.rounds, "pods_per_arm_round": self.pods,
                "b_start_to_registered_s": stats(self.b.starts if self.b else []),
                "anchor_start_to_synchronized_s": stats(self.anchor.starts if self.anchor else []),
                "other_load": self.load, "measured_s": getattr(self, "wall_s", 0.0),
                "pod_start_s_total": self.measured_s}


# --------------------------------------------------------------------------- report

def _f(x: float, nd: int = 1) -> str:
    return "nan" if x != x else f"{x:.{nd}f}"


def render(r: Dict[str, Any]) -> str:
    s = r["summary"]
    m = r["machine"]
    figs, rat = s["figures_ms"], s["ratios"]
    arms = s.get("arms", list(ARMS))
    L = [f"bench_nri ({r['mode']}): {m['host']}, {m['nproc']} vCPU {m['cpu']}, Linux {m['kernel']}, "
         f"Python {m['python']}, {r.get('containerd', '?')}",
         f"{s.get('repeat', 1)} x {s['rounds']} rounds x {s['pods_per_arm_round']} pods per arm, arms interleaved "
         f"(order rotating); a warm-up pod per arm before its timed pods; command: {r['command']}",
         f"anchor arm: {s.get('anchor') or '-'}",
         ""]
    L.append("| arm | pods | placed on one node | pod start p50 / p90 / max, ms | x direct p50 | x direct p90 "
             "| added p50, ms |")
    L.append("|---|---:|---:|---:|---:|---:|---:|")
    for a in arms:
        f, x, p = figs["pod"][a], rat["pod"][a], s["placement"][a]
        placed = f"{p['placed']} (node 0: {p['node0']}, node 1: {p['node1']})"
        L.append(f"| {a} | {f['n']} | {placed} | {_f(f['p50'])} / {_f(f['p90'])} / {_f(f['max'])} | "
                 f"{_f(x['p50'], 3)} | {_f(x['p90'], 3)} | {_f(f['p50'] - figs['pod']['direct']['p50'])} |")
    L.append("")
    L.append("| call | arm | p50 / p90 / max, ms | mean, ms | x direct p50 / p90 | daemon logged p50 / mean, ms |")
    L.append("|---|---|---:|---:|---:|---:|")
    for c in CALLS:
        for a in arms:
            f, x = figs[c][a], rat[c][a]
            logged = s["daemon_ms"].get(a, {}).get(c)
            lg = (f"{_f(logged['p50'])} / {_f(logged['mean'])} (n={logged['n']})" if logged and logged["n"]
                  else "no event (not subscribed)" if a == "nri" else "-")
            L.append(f"| {c} | {a} | {_f(f['p50'])} / {_f(f['p90'])} / {_f(f['max'])} | {_f(f['mean'])} | "
                     f"{_f(x['p50'], 3)} / {_f(x['p90'], 3)} | {lg} |")
    L.append("")
    L += render_intervals(s, arms)
    L.append("")
    L.append("daemon logged: proxy = from the request's arrival to containerd's reply (pre-hooks and containerd "
             "included); nri = the event's time in anolisnuma's pipeline (pre-hooks, store, journal; not the "
             "ttrpc round trip)")
    for a, h in s["hooks"].items():
        L.append(f"{a}: pre-hooks ran {h['pre_hook_calls']} times, {_f(h['pre_hook_ms_total'])} ms in all, "
                 f"{_f(h['pre_hook_ms_per_pod'], 2)} ms per pod start (mean)")
    b = s["b_start_to_registered_s"]
    L.append(f"daemon B, start to registered (not timed): p50 {_f(b['p50'], 2)} s, max {_f(b['max'], 2)} s "
             f"over {b['n']} starts")
    a = s.get("anchor_start_to_synchronized_s")
    if a and a["n"]:
        L.append(f"nri-anchor, start to synchronized (not timed): p50 {_f(a['p50'], 2)} s, max {_f(a['max'], 2)} s "
                 f"over {a['n']} starts")
    for k, one in enumerate(s.get("loads", [])):
        L.append(f"repeat {k + 1}: other processes {_f(one['other'], 0)} % of all CPUs "
                 f"(busy {_f(one['busy'], 0)} %, steal {_f(one['steal'], 0)} %)")
    ld = s["other_load"]
    L.append(f"other load: processes not the benchmark's used {_f(ld.get('other', float('nan')), 0)} % of all CPUs "
             f"while measuring (machine busy {_f(ld.get('busy', float('nan')), 0)} %, steal "
             f"{_f(ld.get('steal', float('nan')), 0)} %); load average {m['loadavg_at_start']} before, "
             f"{r.get('loadavg_at_end', '?')} after"
             + ("  ** machine shared: figures are noisy **" if ld.get("other", 0) > NOISY_PERCENT else ""))
    L.append("")
    L.append("issue 34's targets (informative):")
    for name, ok, text in verdicts(s):
        L.append(f"  {name}: {text}")
    if s["unplaced"]:
        L.append(f"PLACEMENT WRONG for {len(s['unplaced'])} containers: " + "; ".join(s["unplaced"][:10]))
    if r.get("problems"):
        L.append("problems: " + "; ".join(r["problems"]))
    L.append(f"run took {r['elapsed_s']:.0f} s")
    return "\n".join(L)


def _iv(v: Optional[Dict[str, float]]) -> str:
    if not v or not v["n"]:
        return "-"
    return f"{v['mean']:+.2f} [{_f(v['lo'], 2)}, {_f(v['hi'], 2)}]"


def render_intervals(s: Dict[str, Any], arms: Sequence[str]) -> List[str]:
    """Pooled means over direct with their 95 % intervals, and the plugins' CPU."""
    iv = s.get("intervals")
    if not iv:
        return []
    others = [a for a in arms if a != "direct"]
    n = max((v["n"] for k in iv.values() for v in k.values()), default=0)
    L = [f"added over direct, mean of per-round differences with a 95 % t-interval over {n} rounds, ms:",
         "| figure | " + " | ".join(others) + " |", "|---|" + "---:|" * len(others)]
    for k in ("pod",) + CALLS:
        L.append(f"| {'pod start' if k == 'pod' else k} | " + " | ".join(_iv(iv[k].get(a)) for a in others) + " |")
    cc = iv.get("CreateContainer", {})
    L.append("CreateContainer added over no plugin: "
             + ", ".join(f"{a} {_iv(cc.get(a))} ms" for a in PLUGIN_ARMS if a in arms))
    cpu = s.get("plugin_cpu", {})
    who = {"nri": "daemon B (NRI mode)", "anchor": "nri-anchor"}
    L.append("plugin CPU per pod start (the plugin process over the timed pods, mean over rounds [95 %]): "
             + ", ".join(f"{who[a]} {_f(v['mean'], 2)} ms [{_f(v['lo'], 2)}, {_f(v['hi'], 2)}]"
                         for a, v in cpu.items() if v["n"]))
    return L


def preflight() -> Optional[str]:
    if os.geteuid() != 0:
        return "needs root (containerd, cgroups, mounts)"
    missing = build_named("2.2").missing()
    if missing:
        return f"needs containerd 2.2 (NRI): {missing}"
    if shutil.which("runc", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") is None:
        return "runc not found (scripts/install-deps.sh)"
    if not os.path.isdir(CG_CPUSET):
        return f"needs the cgroup v1 cpuset hierarchy at {CG_CPUSET}"
    from cri_client import CRI_IMPORT_ERROR
    return CRI_IMPORT_ERROR


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help=f"{QUICK['rounds']} rounds x {QUICK['pods']} pods (CI smoke)")
    ap.add_argument("--rounds", type=int, help=f"rounds (default {FULL['rounds']})")
    ap.add_argument("--pods", type=int, help=f"pods per arm and round (default {FULL['pods']})")
    ap.add_argument("--repeat", type=int, help=f"repeat the rounds N times, the load said for each "
                                               f"(default {FULL['repeat']}, {QUICK['repeat']} with --quick)")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON to FILE")
    args = ap.parse_args(argv)
    cfg = dict(QUICK if args.quick else FULL)
    cfg.update({k: v for k, v in (("rounds", args.rounds), ("pods", args.pods), ("repeat", args.repeat)) if v})
    problem = preflight()
    if problem:
        print(f"bench_nri: {problem}", file=sys.stderr)
        return 1

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    t0 = time.monotonic()
    result: Dict[str, Any] = {"mode": "quick" if args.quick else "full", "machine": machine(),
                              "command": " ".join(["scripts/bench_nri.py"] + (argv if argv is not None else sys.argv[1:]))}
    try:
        result["containerd"] = build_named("2.2").version()
    except Exception:
        result["containerd"] = "containerd 2.2"
    anchor, note = anchor_binary(HERE)
    if anchor is None:
        log(f"anchor arm skipped: {note}")
        note = f"skipped: {note}"
    bench = Bench(cfg["rounds"], cfg["pods"], cfg["repeat"], anchor)
    bench.anchor_note = note
    rc = 0
    try:
        bench.setup()
        bench.measure()
    except KeyboardInterrupt:
        log("interrupted; cleaning up")
        rc = 130
    except Exception as e:
        log(f"benchmark failed: {e!r}")
        for d in (bench.a, bench.b):
            if d is not None:
                log(f"daemon {d.name} stderr tail:\n{d.proc.stderr[-2000:]}")
        bench.problems.append(f"benchmark failed: {e!r}")
        rc = 1
    finally:
        # a second Ctrl-C or SIGTERM during clean-up must not leave containerd behind
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        log("cleaning up")
        for d in (bench.a, bench.b):
            if d is not None:
                bench.problems += d.problems()
        bench.teardown()
        signal.signal(signal.SIGINT, signal.default_int_handler)
    result["summary"] = bench.summary()
    result["problems"] = bench.problems
    result["loadavg_at_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    result["elapsed_s"] = time.monotonic() - t0
    if rc == 0:
        print(render(result))
    else:
        print("\n".join(bench.problems), file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, sort_keys=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
