#!/usr/bin/env python3
"""Benchmark: containerd direct vs through the anolisnuma proxy, measured in one run.

    sudo .venv/bin/python scripts/bench_proxy.py [--quick] [--json FILE]

Needs root, containerd/runc/ctr (scripts/install-deps.sh) and the test extras (grpcio,
psutil, container-runtime-interface-api). It starts, and always removes again (also on
error or Ctrl-C):

- a private real containerd (``PrivateContainerd``, no CNI) under
  /tmp/anolisnuma-bench-<pid> and /run/anolisnuma-bench-<pid>;
- proxy A: ``python -m anolisnuma -c A.toml`` in front of that containerd;
- a fake CRI backend (``anolisnuma.testing.fake_cri.FakeCri``) serving 1,000 / 5,000
  synthetic containers, and proxy B in front of it;
- proxies C and H in front of the real containerd with the NUMA hook on (a fake 2-node
  topology over this machine's CPUs, written under the proxy's directory; memory pinning
  off) and the default memory budgets.

- proxy N in front of the real containerd with the NUMA hook on for its own namespace
  (part 1: CreateContainer with NUMA on against direct, issue 34's <= +1.5 ms).

Parts 1-5 measure the pass-through cost (proxies A and B, no hook enabled); part 1 also
runs the same pod starts through proxy N, interleaved with the other two (every pod asks
for 50m so that the NUMA hook places it), and reports CreateContainer per path, the mean
added over direct (per-iteration differences, 95 % t-interval) and how many were placed. Parts 1, 2 and
4 also measure ``socat UNIX-LISTEN:...,fork UNIX-CONNECT:...`` (Debian package socat) in
front of the same backend, the floor of any relay: one more unix-socket hop and a copy.
With ``--proxy-tree DIR`` the proxies of another source tree run beside this tree's in the
same interleaved loops of parts 1, 2 and 4 (path "before"). Part 6 sends
bursts of large CreateContainers (64 with 40 KiB of kubelet-like service-link env, 16 and 64
with 1 MiB) all at once on ONE grpc-go connection (``gocri``, built by
``anolisnuma.testing.goclient``), direct to containerd and through proxy C, alternating, and
counts what was created, refused (RESOURCE_EXHAUSTED) and stalled. Part 7 attacks proxy H
the ways ``tests/transport/test_hostile.py`` does (10,000 held streams, a CONTINUATION
flood, DATA past the window, a 16 MiB HEADERS frame) and reports its RSS before, at peak and
after, its fds, and the latencies of a Version watchdog on another connection. Part 8
compares a full run's pass-through figures with the previous full run (``PREVIOUS``).

The proxies run as subprocesses (their CPU time and RSS are their own) with
``MALLOC_MMAP_THRESHOLD_=67108864 MALLOC_TRIM_THRESHOLD_=268435456`` in their environment,
as the systemd unit sets them. Clients of parts 1-5 are grpcio sync channels calling with
raw bytes (no protobuf decode on the client, so the client's own cost does not dilute the
ratios). Direct and proxied calls are interleaved call by call (the order alternates) after
a warm-up, so drift on the machine hits both sides alike.

It prints a table with the targets of issues 7 and 10 beside the figures (PASS/MISS);
``--quick`` runs fewer iterations, one burst of each size and a 2,500-stream flood (under a
minute, plus ~20 s the first time gocri is built) for CI smoke use; the full run takes about
3-4 minutes on 2 CPUs. ``--only large,hostile`` runs some parts (names in ``PHASES``).
Other load on the machine shows in the figures: the report says how much CPU processes
other than the benchmark's own took during the run. The exit code is 0 even when a target
is missed (it is a benchmark, not a test); 1 when the benchmark itself could not run, 130
when interrupted.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _p in (REPO, os.path.join(REPO, "tests", "e2e")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import grpc  # noqa: E402
import psutil  # noqa: E402

from anolisnuma.testing.containerd import PrivateContainerd, cleanup_dead_instances  # noqa: E402

BASE_PREFIX = "/tmp/anolisnuma-bench-"
RUN_PREFIX = "/run/anolisnuma-bench-"
RUNTIME = "/runtime.v1.RuntimeService/"
KIB, MIB = 1 << 10, 1 << 20
CREATE = RUNTIME + "CreateContainer"
UNKNOWN = "/made.up.Service/Upload"
LARGE_NS = "bench-numa"        # the namespace the NUMA hook of proxies C and H manages
POD_NUMA_NS = "bench-numa-pods"   # the namespace the NUMA hook of proxy N manages (pod start)
POD_CPU_SHARES = 51            # 50m: every pod start asks for CPU, so the NUMA hook places it
CODE_NAMES = {0: "OK", 1: "CANCELLED", 2: "UNKNOWN", 4: "DEADLINE_EXCEEDED", 8: "RESOURCE_EXHAUSTED",
              13: "INTERNAL", 14: "UNAVAILABLE"}
PROXY_ENV = {"MALLOC_MMAP_THRESHOLD_": "67108864", "MALLOC_TRIM_THRESHOLD_": "268435456"}
CLIENT_OPTIONS = [("grpc.max_receive_message_length", 64 * MIB),
                  ("grpc.max_send_message_length", 64 * MIB),
                  # separate connections per channel object (no global subchannel sharing)
                  ("grpc.use_local_subchannel_pool", 1)]

# Targets of issue 10 (issue 2 had asked for: added p50 <= 250 µs, lists <= 1.5x, 16-way
# throughput >= 50 %, RSS <= 60 MB).
T_ADDED_P50_US = 100.0     # Version, Status
T_CPU_US = 100.0           # proxy CPU per small call
T_LIST_RATIO = 1.2         # ListContainers x1000 (fake backend), p50
T_POD_RATIO = 1.05         # issue 2
T_NUMA_CREATE_MS = 1.5     # issue 34: CreateContainer with the NUMA hook on, over direct (mean)
# two-sided 95 % quantiles of Student's t by degrees of freedom (no scipy on the machine)
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
        10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110,
        18: 2.101, 19: 2.093, 20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060,
        26: 2.056, 27: 2.052, 28: 2.048, 29: 2.045, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}
T_TPUT_RATIO = 0.80
T_RSS_MB = 48.0          # issue 20: room for grpcio's core (the daemon's own calls to containerd)
T_RSS_GROWTH_MB = 2.0
TPUT_SLICE_S = 0.5
BUSY_WARN_PCT = 10.0   # "not growing": at most this much between the last two checkpoints

FULL = dict(lat_warmup=200, lat_iters=5000, fake_warmup=10,
            fake_iters={"ListContainers x1000": 1000, "ListContainers x5000": 200,
                        "ListPodSandbox x1000": 1000},
            pods=20, tput_seconds=3.0, tput_modes=(1, 16), rss_checkpoints=(10_000, 50_000, 100_000),
            rss_threads=8, rss_channels=2,
            large=dict(pods=8, rounds=3, deadline=30.0, sizes=((64, 40 * KIB), (16, MIB), (64, MIB))),
            hostile_streams=10_000)
QUICK = dict(lat_warmup=50, lat_iters=300, fake_warmup=3,
             fake_iters={"ListContainers x1000": 40, "ListContainers x5000": 12,
                         "ListPodSandbox x1000": 40},
             pods=3, tput_seconds=1.0, tput_modes=(1,), rss_checkpoints=(1_000, 5_000, 10_000),
             rss_threads=8, rss_channels=2,
             large=dict(pods=4, rounds=1, deadline=15.0, sizes=((64, 40 * KIB), (64, MIB))),
             hostile_streams=2_500)


# The parts of the benchmark (--only), in the order they run.
PHASES = {"pods": "pod_start", "latency": "latency_real", "throughput": "throughput", "rss": "rss",
          "lists": "latency_fake", "large": "large_creates", "hostile": "hostile"}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- statistics

def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1)."""
    s = sorted(values)
    if not s:
        return float("nan")
    return s[min(len(s) - 1, max(0, int(math.ceil(q * len(s))) - 1))]


def lat_summary(direct_ns: List[int], proxy_ns: List[int]) -> Dict[str, float]:
    d50, d99 = pct(direct_ns, 0.50) / 1e3, pct(direct_ns, 0.99) / 1e3
    p50, p99 = pct(proxy_ns, 0.50) / 1e3, pct(proxy_ns, 0.99) / 1e3
    return {"n": len(direct_ns), "direct_p50_us": d50, "direct_p99_us": d99,
            "proxy_p50_us": p50, "proxy_p99_us": p99,
            "added_p50_us": p50 - d50, "added_p99_us": p99 - d99,
            "ratio_p50": p50 / d50 if d50 else float("nan"),
            "ratio_p99": p99 / d99 if d99 else float("nan")}


def t975(df: int) -> float:
    """Student's t two-sided 95 % quantile for ``df`` degrees of freedom (the table's next
    smaller df when it has no entry: a slightly wider, never a narrower, interval)."""
    if df < 1:
        return float("nan")
    if df > 120:
        return 1.960
    return T975[max(k for k in T975 if k <= df)]


def mean_interval(values: Sequence[float]) -> Dict[str, float]:
    """Mean of ``values`` with a 95 % t-interval (n - 1 degrees of freedom); the interval is
    nan when there are fewer than two values (one round says nothing about its spread)."""
    n = len(values)
    nan = float("nan")
    if n == 0:
        return {"n": 0, "mean": nan, "lo": nan, "hi": nan}
    mean = sum(values) / n
    if n < 2:
        return {"n": 1, "mean": mean, "lo": nan, "hi": nan}
    sd = (sum((v - mean) ** 2 for v in values) / (n - 1)) ** 0.5
    half = t975(n - 1) * sd / n ** 0.5
    return {"n": n, "mean": mean, "lo": mean - half, "hi": mean + half}



def numa_create_summary(creates: Dict[str, List[float]], times: Dict[str, List[float]]) -> Dict[str, Any]:
    """CreateContainer (ms) per path and what the NUMA hook's path adds over direct: the
    mean of the per-iteration differences (the paths' i-th pods ran in the same
    interleaved iteration) with a 95 % t-interval, and the p50 difference; the whole pod
    start's median ratio too; against issue 34's target (mean added <= T_NUMA_CREATE_MS)."""
    per = {k: {"n": len(v), "p50": pct(v, 0.5), "p90": pct(v, 0.9),
               "mean": sum(v) / len(v) if v else float("nan")} for k, v in creates.items()}
    diffs = [b - a for a, b in zip(creates.get("direct", []), creates.get("numa", []))]
    added = mean_interval(diffs)
    d, x = times.get("direct") or [], times.get("numa") or []
    ratio = statistics.median(x) / statistics.median(d) if d and x else float("nan")
    return {"create_ms": per, "added_mean": added,
            "added_p50_ms": per.get("numa", {}).get("p50", float("nan")) - per.get("direct", {}).get("p50", float("nan")),
            "pod_ratio_median": ratio, "target_ms": T_NUMA_CREATE_MS,
            "met": added["mean"] <= T_NUMA_CREATE_MS if added["n"] else None}

def cpu_seconds(pid: int) -> float:
    """CPU time of process ``pid`` (all its threads), to the nanosecond: Linux's CPU clock
    of another process (clock id ``~pid << 3 | 2``, as clock_getcpuclockid makes it). The
    tick-based figures of /proc (10 ms) would be too coarse for a few thousand calls."""
    try:
        return time.clock_gettime(((~pid) << 3) | 2)
    except OSError:
        t = psutil.Process(pid).cpu_times()
        return t.user + t.system


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


# --------------------------------------------------------------------------- the proxy

class ProxyProc:
    """``python -m anolisnuma -c CONFIG`` as a subprocess."""

    def __init__(self, name: str, workdir: str, endpoint: str,
                 numa_nodes: Optional[Dict[int, str]] = None, numa_namespace: str = "",
                 tree: str = REPO, config: Optional[Dict[str, Any]] = None) -> None:
        """No hook unless ``numa_nodes`` (node id -> CPU list) is given: then the NUMA hook
        is on for ``numa_namespace`` over a fake topology of those nodes (written under
        the proxy's directory as its ``paths.sys_root``; every other host path is fake
        too), with memory pinning off and the default memory budgets. ``tree``: the
        source tree it runs from (``--proxy-tree`` gives a second one to compare with).
        ``config``: a whole configuration to run instead (its socket, log file and state
        directory become this proxy's)."""
        self.name = name
        self.tree = tree
        self.dir = os.path.join(workdir, name)
        os.makedirs(self.dir, exist_ok=True)
        self.socket = os.path.join(self.dir, "proxy.sock")
        self.log_path = os.path.join(self.dir, "proxy.log")
        self.out_path = os.path.join(self.dir, "proxy.out")
        self.config_path = os.path.join(self.dir, "config.toml")
        self.endpoint = endpoint
        self.numa_nodes = dict(numa_nodes or {})
        self.proc: Optional[subprocess.Popen] = None
        self.ps: Optional[psutil.Process] = None
        self.exit_code: Optional[int] = None
        self.stop_seconds: Optional[float] = None
        data: Dict[str, Any] = {
            "server": {"listen": self.socket},
            "runtime": {"endpoint": endpoint},
            "log": {"file": self.log_path, "level": "info", "stderr": False},
            "paths": {"state_dir": os.path.join(self.dir, "state")},
            "qos": {"enabled": False},
            "numa": {"enabled": False},
            # several proxies run at once: none takes the node's admin socket
            "admin": {"socket": ""},
        }
        if config is not None:
            data = {k: dict(v) if isinstance(v, dict) else v for k, v in config.items()}
            data.setdefault("server", {})["listen"] = self.socket
            data.setdefault("paths", {})["state_dir"] = os.path.join(self.dir, "state")
            data["log"] = {"file": self.log_path, "level": "info", "stderr": False}
        if self.numa_nodes:
            from anolisnuma.testing.fake_sysfs import GIB, FakeTopology

            host = os.path.join(self.dir, "fakehost")
            data["paths"].update(
                sys_root=os.path.join(host, "sys"), cgroup_root=os.path.join(host, "sys", "fs", "cgroup"),
                resctrl_root=os.path.join(host, "sys", "fs", "resctrl"), proc_root=os.path.join(host, "proc"),
                kubelet_cpu_manager_state=os.path.join(host, "kubelet", "cpu_manager_state"))
            ids = sorted(self.numa_nodes)
            FakeTopology(name=f"{len(ids)}n-bench", node_cpus=self.numa_nodes,
                         distances=[[10 if a == b else 20 for b in ids] for a in ids],
                         memory_bytes={i: 2 * GIB for i in ids}).write(data["paths"]["sys_root"])
            data["numa"] = {"enabled": True, "namespaces": [numa_namespace], "memory_pinning": "off",
                            "poll_interval_seconds": 1.0}
        from anolisnuma.testing.proxy import to_toml
        with open(self.config_path, "w") as f:
            f.write(to_toml(data))

    def budgets(self) -> Tuple[int, int]:
        """The effective (per connection, total) memory budgets of this proxy's config."""
        from anolisnuma.config import Config
        server = Config.load(self.config_path).server
        return server.buffer_bytes_per_connection, server.buffer_bytes_total

    def env(self) -> Dict[str, str]:
        env = dict(os.environ)
        env.update(PROXY_ENV)
        env["PYTHONPATH"] = self.tree + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        return env

    def argv(self) -> List[str]:
        return [sys.executable, "-m", "anolisnuma", "-c", self.config_path]

    def check_config(self, retries: int = 10, wait: float = 30.0) -> None:
        """``--check-config``; retried for a while when a module is still missing (other
        parts of the package may be in flux while the benchmark is developed)."""
        for attempt in range(retries):
            r = subprocess.run(self.argv() + ["--check-config"], cwd=self.tree, env=self.env(),
                               capture_output=True, text=True, timeout=60)
            if r.returncode == 0:
                return
            if "ModuleNotFoundError" not in r.stderr and "ImportError" not in r.stderr:
                raise RuntimeError(f"proxy config refused: {r.stderr.strip() or r.stdout.strip()}")
            log(f"proxy --check-config: import problem, retrying in {wait:.0f}s: "
                f"{r.stderr.strip().splitlines()[-1]}")
            time.sleep(wait)
        raise RuntimeError("proxy --check-config kept failing on an import")

    def start(self, timeout: float = 30.0) -> None:
        out = open(self.out_path, "wb")
        try:
            self.proc = subprocess.Popen(self.argv(), cwd=self.tree, env=self.env(), stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            out.close()
        self.ps = psutil.Process(self.proc.pid)
        deadline = time.monotonic() + timeout
        while not os.path.exists(self.socket):
            if self.proc.poll() is not None:
                raise RuntimeError(f"proxy {self.name} exited with {self.proc.returncode}: {self.tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"proxy {self.name}: no socket after {timeout}s: {self.tail()}")
            time.sleep(0.02)
        ch = grpc.insecure_channel(f"unix://{self.socket}", options=CLIENT_OPTIONS)
        try:
            ch.unary_unary(RUNTIME + "Version")(b"", timeout=max(1.0, deadline - time.monotonic()),
                                                  wait_for_ready=True)
        finally:
            ch.close()

    def wait_log(self, event: str, timeout: float) -> bool:
        """Wait until the proxy's log has a line with ``"event": event``."""
        needle = json.dumps(event)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with open(self.log_path) as f:
                    if needle in f.read():
                        return True
            except OSError:
                pass
            time.sleep(0.1)
        return False

    def cpu(self) -> float:
        assert self.ps is not None
        return cpu_seconds(self.ps.pid)

    def rss_mb(self) -> float:
        assert self.ps is not None
        return self.ps.memory_info().rss / MIB

    def threads(self) -> int:
        assert self.ps is not None
        return self.ps.num_threads()

    def tail(self, n: int = 20) -> str:
        parts = []
        for p in (self.out_path, self.log_path):
            try:
                with open(p, errors="replace") as f:
                    parts.append("\n".join(f.read().splitlines()[-n:]))
            except OSError:
                pass
        return "\n".join(x for x in parts if x)

    def stop(self, timeout: float = 15.0) -> Optional[int]:
        if self.proc is None or self.proc.poll() is not None:
            if self.proc is not None:
                self.exit_code = self.proc.returncode
            return self.exit_code
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.exit_code = self.proc.wait(timeout)
            self.stop_seconds = time.monotonic() - t0
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.exit_code = self.proc.wait(5)
        return self.exit_code

    def log_problems(self) -> Dict[str, Any]:
        """Counts of log lines by level and the distinct warning/error events."""
        levels: Dict[str, int] = {}
        events: Dict[str, int] = {}
        try:
            with open(self.log_path, errors="replace") as f:
                for line in f:
                    try:
                        rec = json.loads(line)
                    except ValueError:
                        levels["unparsed"] = levels.get("unparsed", 0) + 1
                        continue
                    lvl = str(rec.get("level", "?"))
                    levels[lvl] = levels.get(lvl, 0) + 1
                    if lvl in ("warning", "error", "critical", "exception"):
                        key = f"{lvl}: {rec.get('message', rec.get('event'))} {str(rec.get('error', ''))[:120]}".strip()
                        events[key] = events.get(key, 0) + 1
        except OSError:
            pass
        try:
            with open(self.out_path, errors="replace") as f:
                out = f.read().strip()
        except OSError:
            out = ""
        return {"levels": levels, "problems": events, "stdout_stderr": out[-2000:]}


# socat's transfer block (its default is 8 KiB): as large as asyncio's reads, so that big
# replies cost it no more syscalls than they cost the proxy.
SOCAT_BUFFER = int(os.environ.get("BENCH_SOCAT_BUFFER", 256 * KIB))


class SocatRelay:
    """``socat UNIX-LISTEN:sock,fork UNIX-CONNECT:endpoint``: a C byte relay with no
    HTTP/2 at all, the floor of what one more unix-socket hop and a copy cost. Its CPU is
    the listener's plus that of the children it forks per connection (live and reaped)."""

    def __init__(self, name: str, workdir: str, endpoint: str) -> None:
        self.name = name
        self.dir = os.path.join(workdir, name)
        os.makedirs(self.dir, exist_ok=True)
        self.socket = os.path.join(self.dir, "socat.sock")
        self.endpoint = endpoint
        self.proc: Optional[subprocess.Popen] = None
        self.ps: Optional[psutil.Process] = None

    def start(self, timeout: float = 10.0) -> None:
        exe = shutil.which("socat")
        if exe is None:
            raise RuntimeError("socat not found (Debian package socat; scripts/install-deps.sh installs it)")
        self.proc = subprocess.Popen([exe, "-b", str(SOCAT_BUFFER), f"UNIX-LISTEN:{self.socket},fork",
                                      f"UNIX-CONNECT:{self.endpoint}"],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        self.ps = psutil.Process(self.proc.pid)
        deadline = time.monotonic() + timeout
        while not os.path.exists(self.socket):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"socat did not listen on {self.socket}")
            time.sleep(0.01)

    def cpu(self) -> float:
        assert self.ps is not None
        t = self.ps.cpu_times()
        total = cpu_seconds(self.ps.pid) + t.children_user + t.children_system
        for c in self.ps.children():
            try:
                total += cpu_seconds(c.pid)
            except (OSError, psutil.Error):
                pass
        return total

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        try:
            os.unlink(self.socket)
        except OSError:
            pass


# --------------------------------------------------------------------------- clients

def channel(sock: str) -> grpc.Channel:
    ch = grpc.insecure_channel(f"unix://{sock}", options=CLIENT_OPTIONS)
    ch.unary_unary(RUNTIME + "Version")(b"", timeout=10, wait_for_ready=True)
    return ch


def requests() -> Dict[str, bytes]:
    from cri_api.v1 import api_pb2 as pb
    return {"Version": pb.VersionRequest(version="v1").SerializeToString(),
            "Status": pb.StatusRequest(verbose=False).SerializeToString(),
            "ListContainers": pb.ListContainersRequest().SerializeToString(),
            "ListPodSandbox": pb.ListPodSandboxRequest().SerializeToString()}


def interleaved(paths: List[Tuple[str, Callable, Optional[Callable[[], float]]]], req: bytes, iters: int,
                warmup: int) -> Dict[str, Dict[str, Any]]:
    """One call on each path per iteration, the order rotated (and reversed every other
    round), so drift and bursts of other load hit every path alike. ``paths``: (name,
    unary callable, CPU-seconds function of the relay or None). Returns per path the
    latencies (ns), the relay's CPU seconds over the measured loop and one reply."""
    n = len(paths)
    out: Dict[str, Dict[str, Any]] = {name: {"ns": [], "cpu": 0.0, "reply": b""} for name, _, _ in paths}
    for _ in range(warmup):
        for name, call, _ in paths:
            out[name]["reply"] = call(req, timeout=30)
    orders = []
    for k in range(2 * n):
        rot = paths[k % n:] + paths[:k % n]
        orders.append([(out[name]["ns"], call) for name, call, _ in (rot if k < n else rot[::-1])])
    clock = time.perf_counter_ns
    cpu0 = {name: fn() for name, _, fn in paths if fn is not None}
    gc.disable()
    try:
        for i in range(iters):
            for lat, call in orders[i % (2 * n)]:
                t0 = clock()
                call(req, timeout=30)
                lat.append(clock() - t0)
    finally:
        gc.enable()
    for name, _, fn in paths:
        if fn is not None:
            out[name]["cpu"] = fn() - cpu0[name]
    return out


def path_summary(direct_ns: List[int], ns: List[int], cpu: float) -> Dict[str, float]:
    """Percentiles of one relayed path against direct, and the relay's CPU per call."""
    d50, d99 = pct(direct_ns, 0.50) / 1e3, pct(direct_ns, 0.99) / 1e3
    p50, p99 = pct(ns, 0.50) / 1e3, pct(ns, 0.99) / 1e3
    return {"p50_us": p50, "p99_us": p99, "added_p50_us": p50 - d50, "added_p99_us": p99 - d99,
            "ratio_p50": p50 / d50 if d50 else float("nan"), "ratio_p99": p99 / d99 if d99 else float("nan"),
            "cpu_us_per_call": cpu / max(1, len(ns)) * 1e6}


def run_callers(chans: List[grpc.Channel], method: Any, req: bytes, threads: int,
                seconds: Optional[float] = None, total: Optional[int] = None,
                latencies: Optional[List[int]] = None) -> Tuple[int, float, int]:
    """``threads`` callers on the connected channels ``chans`` (round robin) calling
    ``method`` (a name, or a list of names rotated per call) for ``seconds`` or until
    ``total`` calls. Returns (calls completed, elapsed seconds, errors); the latency (ns)
    of every completed call is added to ``latencies`` when given."""
    channels = len(chans)
    methods = [method] if isinstance(method, str) else list(method)
    reqs = requests()
    counts = [0] * threads
    errors = [0] * threads
    stop = threading.Event()
    start = threading.Barrier(threads + 1)
    lock = threading.Lock()
    left = [total if total is not None else -1]

    lats: List[List[int]] = [[] for _ in range(threads)]
    clock = time.perf_counter_ns

    def worker(i: int) -> None:
        calls = [(chans[i % channels].unary_unary(RUNTIME + m), reqs.get(m, req)) for m in methods]
        k = i
        mine = lats[i]
        start.wait()
        while not stop.is_set():
            if total is not None:
                with lock:
                    if left[0] <= 0:
                        return
                    left[0] -= 1
            fn, rq = calls[k % len(calls)]
            k += 1
            t0 = clock()
            try:
                fn(rq, timeout=30)
            except grpc.RpcError:
                errors[i] += 1
                continue
            if total is not None or not stop.is_set():
                counts[i] += 1
                mine.append(clock() - t0)

    ts = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(threads)]
    for t in ts:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    if seconds is not None:
        time.sleep(seconds)
        stop.set()
        elapsed = time.perf_counter() - t0
        for t in ts:
            t.join(60)
    else:
        for t in ts:
            t.join()
        elapsed = time.perf_counter() - t0
    if latencies is not None:
        for mine in lats:
            latencies.extend(mine)
    return sum(counts), elapsed, sum(errors)


# --------------------------------------------------------------------------- fake lists

def realistic_lists(n_containers: int, n_sandboxes: int) -> Tuple[bytes, bytes]:
    """ListContainers / ListPodSandbox replies shaped like a kubelet-managed node:
    the labels and annotations the kubelet sets on every sandbox and container."""
    from cri_api.v1 import api_pb2 as pb
    from anolisnuma.testing.fake_cri import hex_id, pod_uid

    sandboxes = []
    for i in range(n_sandboxes):
        uid = pod_uid(f"bench-pod-{i}")
        name, ns = f"app-{i % 97}-{hex_id(str(i))[:10]}-{hex_id(str(-i))[:5]}", f"ns-{i % 13}"
        sandboxes.append(pb.PodSandbox(
            id=hex_id(f"bench-sandbox-{i}"), state=pb.SANDBOX_READY,
            created_at=1_700_000_000_000_000_000 + i, runtime_handler="",
            metadata=pb.PodSandboxMetadata(name=name, uid=uid, namespace=ns, attempt=0),
            labels={"io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": ns,
                    "io.kubernetes.pod.uid": uid, "app": f"app-{i % 97}",
                    "pod-template-hash": hex_id(str(i))[:10]},
            annotations={"kubernetes.io/config.seen": "2024-01-01T00:00:00.000000000Z",
                         "kubernetes.io/config.source": "api"}))
    containers = []
    n_sb = max(1, n_sandboxes)
    for i in range(n_containers):
        sb = sandboxes[i % n_sb] if sandboxes else None
        md = sb.metadata if sb is not None else pb.PodSandboxMetadata(name="x", uid=pod_uid("x"), namespace="x")
        cname = f"container-{i % 7}"
        containers.append(pb.Container(
            id=hex_id(f"bench-container-{i}"), pod_sandbox_id=sb.id if sb is not None else hex_id("x"),
            metadata=pb.ContainerMetadata(name=cname, attempt=i % 3),
            image=pb.ImageSpec(image="sha256:" + hex_id(f"image-{i % 50}")),
            image_ref="registry.example.com/team/app@sha256:" + hex_id(f"image-{i % 50}"),
            state=pb.CONTAINER_RUNNING, created_at=1_700_000_000_000_000_000 + i,
            labels={"io.kubernetes.container.name": cname, "io.kubernetes.pod.name": md.name,
                    "io.kubernetes.pod.namespace": md.namespace, "io.kubernetes.pod.uid": md.uid},
            annotations={"io.kubernetes.container.hash": f"{i * 2654435761 % 2**32:08x}",
                         "io.kubernetes.container.restartCount": str(i % 3),
                         "io.kubernetes.container.terminationMessagePath": "/dev/termination-log",
                         "io.kubernetes.container.terminationMessagePolicy": "File",
                         "io.kubernetes.pod.terminationGracePeriod": "30"}))
    return (pb.ListContainersResponse(containers=containers).SerializeToString(),
            pb.ListPodSandboxResponse(items=sandboxes).SerializeToString())


# --------------------------------------------------------------------------- large creates, hostile clients

def numa_nodes() -> Dict[int, str]:
    """A fake 2-node topology over the CPUs this process may use: node 0 the first half,
    node 1 the rest (on 2 CPUs: node 0 = CPU 0, node 1 = CPU 1, as in the e2e tests)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return {0: str(cpus[0]), 1: str(cpus[0])}
    half = len(cpus) // 2
    return {0: ",".join(map(str, cpus[:half])), 1: ",".join(map(str, cpus[half:]))}


def size_label(n: int) -> str:
    return f"{n // MIB}MiB" if n % MIB == 0 else f"{n // KIB}KiB"


def service_links(total_bytes: int, salt: str) -> List[Any]:
    """Env the way the kubelet writes service links, ``total_bytes`` of it."""
    from cri_api.v1 import api_pb2 as pb

    from anolisnuma.testing.kubelet_env import service_link_env
    return [pb.KeyValue(key=k, value=v) for k, v in service_link_env(total_bytes, salt)]


def rss_of(p: ProxyProc) -> int:
    from anolisnuma.testing.daemon_probes import rss_bytes
    assert p.proc is not None
    return rss_bytes(p.proc.pid)


class RssSampler:
    """The peak RSS of ``pid`` (None: nothing), read from /proc every few ms on a thread."""

    def __init__(self, pid: Optional[int], interval: float = 0.005) -> None:
        self.pid = pid
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _run(self) -> None:
        from anolisnuma.testing.daemon_probes import rss_bytes
        assert self.pid is not None
        while True:
            try:
                self.peak = max(self.peak, rss_bytes(self.pid))
            except (OSError, AssertionError):
                return
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> "RssSampler":
        if self.pid is not None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(5)
            self._run_once()

    def _run_once(self) -> None:
        from anolisnuma.testing.daemon_probes import rss_bytes
        try:
            self.peak = max(self.peak, rss_bytes(self.pid))   # type: ignore[arg-type]
        except (OSError, AssertionError):
            pass


def settle_rss(pid: int, rss0: int, timeout: float, fds0: Optional[int] = None) -> Tuple[int, int, Optional[float]]:
    """Wait (up to ``timeout``) until the RSS of ``pid`` is back within 10 MB of ``rss0``
    and, given ``fds0``, its fds back to that count. Returns (RSS, fds, seconds it took or
    None if it did not come back)."""
    from anolisnuma.testing.daemon_probes import fds, rss_bytes
    t0 = time.monotonic()
    while True:
        rss, n = rss_bytes(pid), fds(pid)
        if rss < rss0 + 10 * MIB and (fds0 is None or n <= fds0):
            return rss, n, time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            return rss, n, None
        time.sleep(0.02)


_VERSION_PROBE = """
import sys, time, grpc
from cri_api.v1 import api_pb2 as cri, api_pb2_grpc as cri_grpc
stub = cri_grpc.RuntimeServiceStub(grpc.insecure_channel(sys.argv[1]))
stub.Version(cri.VersionRequest(), timeout=10)
print("ready", flush=True)
while True:
    started = time.monotonic()
    try:
        stub.Version(cri.VersionRequest(), timeout=10)
    except grpc.RpcError as e:
        print(f"error {time.monotonic() - started:.6f} {e.code().name}", flush=True)
        continue
    print(f"{time.monotonic() - started:.6f}", flush=True)
"""


class VersionProbe:
    """The watchdog of ``anolisnuma.testing.daemon_probes.Watchdog`` (Version again and
    again on a connection of its own, in a process of its own so that it measures the
    daemon, not this process), reporting every call: how many ran, the worst and the
    failures. It runs for at least ``min_s`` so that an attack the daemon ends in
    milliseconds still has calls around it."""

    def __init__(self, address: str, min_s: float = 1.0) -> None:
        self.address = address
        self.min_s = min_s
        self.times: List[float] = []
        self.errors: List[str] = []

    def __enter__(self) -> "VersionProbe":
        self.proc = subprocess.Popen([sys.executable, "-c", _VERSION_PROBE, self.address], cwd=REPO,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the Version probe's first call failed")
        self.t0 = time.monotonic()
        # drained as it comes: a full pipe would stop the probe
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if not line.endswith("\n"):
                break   # cut by the kill
            if line.startswith("error"):
                self.errors.append(line.strip())
            else:
                self.times.append(float(line))

    def __exit__(self, *exc: object) -> None:
        left = self.min_s - (time.monotonic() - self.t0)
        if left > 0:
            time.sleep(left)
        self.proc.kill()
        self.proc.wait(10)
        self._reader.join(10)

    @property
    def worst_ms(self) -> float:
        return max(self.times + [0.0]) * 1e3


def spec_cpus(kl: Any, cid: str) -> str:
    """``linux.resources.cpu.cpus`` of the OCI spec containerd recorded for ``cid``."""
    _, info = kl.container_status(cid)
    spec = info.get("runtimeSpec") or {}
    return ((spec.get("linux", {}).get("resources") or {}).get("cpu") or {}).get("cpus", "")


def remove_quietly(kl: Any, cid: str) -> None:
    try:
        kl.remove_container(cid)
    except grpc.RpcError:
        pass


def goaway_name(code: Optional[int]) -> str:
    from anolisnuma.transport import h2 as wire
    if code is None:
        return "none"
    for name in ("NO_ERROR", "PROTOCOL_ERROR", "INTERNAL_ERROR", "FLOW_CONTROL_ERROR", "FRAME_SIZE_ERROR",
                 "COMPRESSION_ERROR", "ENHANCE_YOUR_CALM", "REFUSED_STREAM"):
        if getattr(wire, name, None) == code:
            return name
    return str(code)


# --------------------------------------------------------------------------- phases

class Bench:
    def __init__(self, quick: bool, compare_tree: str = "") -> None:
        self.quick = quick
        self.compare_tree = compare_tree   # --proxy-tree: its proxies run beside this tree's
        self.before: Dict[str, ProxyProc] = {}
        self.socats: List[SocatRelay] = []
        self.paths: Dict[str, List[Tuple[str, str, Optional[Callable[[], float]]]]] = {}
        self.path_channels: Dict[str, Dict[str, grpc.Channel]] = {}
        self.cfg = QUICK if quick else FULL
        pid = os.getpid()
        self.base = f"{BASE_PREFIX}{pid}"
        self.run = f"{RUN_PREFIX}{pid}"
        self.work = os.path.join(self.base, "bench")
        self.pc: Optional[PrivateContainerd] = None
        self.proxy_a: Optional[ProxyProc] = None
        self.proxy_b: Optional[ProxyProc] = None
        self.proxy_c: Optional[ProxyProc] = None   # NUMA hook on: large creates
        self.proxy_h: Optional[ProxyProc] = None   # NUMA hook on: hostile clients
        self.proxy_n: Optional[ProxyProc] = None   # NUMA hook on: pod start
        self.fake: Any = None
        self.kubelets: List[Any] = []
        self.channels: List[grpc.Channel] = []
        self.results: Dict[str, Any] = {}
        self.problems: List[str] = []
        self.proxy_logs: Dict[str, Any] = {}

    def proxies(self) -> List[ProxyProc]:
        return [p for p in (self.proxy_a, self.proxy_b, self.proxy_c, self.proxy_h, self.proxy_n)
                if p is not None] + \
            list(self.before.values())

    # ---- setup / teardown
    # ---- how much CPU other processes took while we measured
    @staticmethod
    def _busy_now() -> float:
        t = psutil.cpu_times()
        return sum(t) - t.idle - getattr(t, "iowait", 0.0) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)

    @staticmethod
    def _own_cpu() -> float:
        t = psutil.Process().cpu_times()
        return t.user + t.system + t.children_user + t.children_system

    def _ours(self) -> float:
        """CPU seconds of the benchmark's own processes: this one (clients, fake backend),
        the proxies, containerd and its shims."""
        total = self._own_cpu()
        for p in self.proxies():
            if p.proc is not None and p.proc.poll() is None:
                try:
                    total += p.cpu()
                except psutil.Error:
                    pass
        for sc in self.socats:
            try:
                total += sc.cpu()
            except psutil.Error:
                pass
        pid = self.pc.pid if self.pc is not None else None
        if pid:
            try:
                root = psutil.Process(pid)
                for proc in [root] + root.children(recursive=True) + self._shims(pid):
                    t = proc.cpu_times()   # children_*: the runc calls a shim has reaped
                    total += t.user + t.system + t.children_user + t.children_system
            except psutil.Error:
                pass
        return total

    def _shims(self, containerd_pid: int) -> List[psutil.Process]:
        """containerd-shim processes started for our containerd (they reparent away)."""
        sock = self.pc.socket if self.pc is not None else None
        out = []
        for proc in psutil.process_iter(["name", "cmdline"]):
            try:
                if (proc.info["name"] or "").startswith("containerd-shim") and sock and \
                        any(sock in a for a in (proc.info["cmdline"] or [])):
                    out.append(proc)
            except psutil.Error:
                pass
        return out

    def mark_start(self) -> None:
        self._t0 = (time.monotonic(), self._busy_now(), self._own_cpu())

    def other_load(self) -> None:
        """Share of the machine's CPU that processes other than ours used during the
        measurements (system busy time minus our processes' CPU time)."""
        if not hasattr(self, "_t0"):
            return
        wall0, busy0, own0 = self._t0
        wall = time.monotonic() - wall0
        busy = self._busy_now() - busy0
        ours = self._ours() - own0
        n = os.cpu_count() or 1
        self.results["machine"]["other_cpu_pct_during_run"] = f"{max(0.0, busy - ours) / (wall * n) * 100:.0f}"
        self.results["machine"]["busy_cpu_pct_during_run"] = f"{busy / (wall * n) * 100:.0f}"

    def setup(self) -> None:
        self.mark_start()
        left = cleanup_dead_instances(BASE_PREFIX, RUN_PREFIX)
        if left:
            log(f"cleaned leftovers of crashed runs: {left}")
        log(f"starting private containerd under {self.base}")
        self.pc = PrivateContainerd(self.base, self.run, cni=False)
        self.pc.write_config()
        self.pc.start()
        self.pc.import_images()
        os.makedirs(self.work, exist_ok=True)
        self.proxy_a = ProxyProc("proxy-a", self.work, self.pc.socket)
        self.proxy_a.check_config()
        self.proxy_a.start()
        self.proxy_a.wait_log("store reconciled with containerd", 10)
        log(f"proxy A pid {self.proxy_a.proc.pid} on {self.proxy_a.socket} -> {self.pc.socket}")

    def teardown(self) -> None:
        try:
            self.other_load()
        except Exception as e:  # only a report figure
            self.problems.append(f"other-load accounting: {e!r}")
        for kl in self.kubelets:
            try:
                errs = kl.cleanup()
                if errs:
                    self.problems.append(f"pod cleanup: {errs}")
                kl.close()
            except Exception as e:
                self.problems.append(f"pod cleanup: {e!r}")
        for ch in self.channels:
            try:
                ch.close()
            except Exception:
                pass
        for sc in self.socats:
            try:
                sc.stop()
            except Exception as e:
                self.problems.append(f"{sc.name} stop: {e!r}")
        for p in self.proxies():
            try:
                rc = p.stop()
                if rc not in (0, None):
                    self.problems.append(f"{p.name} exited with {rc} on SIGTERM")
            except Exception as e:
                self.problems.append(f"{p.name} stop: {e!r}")
            # Read and keep the proxy's log before the base dir goes.
            info = p.log_problems()
            info["exit_code"] = p.exit_code
            kept = f"{BASE_PREFIX}last-{p.name}.log"
            try:
                shutil.copyfile(p.log_path, kept)
                info["log_kept_at"] = kept
            except OSError:
                pass
            self.proxy_logs[p.name] = info
        if self.fake is not None:
            try:
                self.fake.stop(0)
            except Exception as e:
                self.problems.append(f"fake stop: {e!r}")
        if self.pc is not None:
            try:
                left = self.pc.cleanup()
                if left:
                    self.problems.append(f"containerd cleanup: {left}")
            except Exception as e:
                self.problems.append(f"containerd cleanup: {e!r}")
        shutil.rmtree(self.base, ignore_errors=True)

    # ---- 1. pod start on the real containerd
    def pod_start(self) -> None:
        from cri_client import KubeletLike, Pod, pb

        n = self.cfg["pods"]
        assert self.pc is not None and self.proxy_a is not None
        # proxy N: the NUMA hook on for its own namespace (issue 34: CreateContainer with NUMA
        # on against direct, in the same interleaved loop)
        self.proxy_n = ProxyProc("proxy-n", self.work, self.pc.socket, numa_nodes=numa_nodes(),
                                 numa_namespace=POD_NUMA_NS)
        self.proxy_n.start()
        self.proxy_n.wait_log("store reconciled with containerd", 30)
        kd = KubeletLike(self.pc.socket, harness=self.pc)
        self.kubelets.append(kd)
        kp = KubeletLike(self.proxy_a.socket, harness=self.pc)
        self.kubelets.append(kp)
        kn = KubeletLike(self.proxy_n.socket, harness=self.pc)
        self.kubelets.append(kn)
        times: Dict[str, List[float]] = {"direct": [], "proxy": [], "numa": []}
        creates: Dict[str, List[float]] = {"direct": [], "proxy": [], "numa": []}   # CreateContainer, ms

        proxied: Dict[str, float] = {}   # pod name -> client-measured seconds, via the proxy

        def one(kl: Any, tag: str) -> float:
            uid = str(uuid.uuid4())
            name = f"bench-{tag}-{uid[:8]}"
            ns = POD_NUMA_NS if tag.startswith("numa") else "bench"
            cfg = kl.sandbox_config(name, namespace=ns, uid=uid,
                                    network="node", qos="burstable")
            # The kubelet creates the pod cgroup (cgroupfs driver) before RunPodSandbox; the
            # harness records it, so its cleanup removes it even after a crash.
            self.pc.make_pod_cgroup(cfg.linux.cgroup_parent)
            os.makedirs(cfg.log_directory, exist_ok=True)
            # the same 50m request on every path, so that CreateContainer is alike but for the hook
            ccfg = kl.container_config("main", kl.resources(cpu_shares=POD_CPU_SHARES), network="node")
            rt = kl.runtime
            # Only the three CRI calls are timed (no client-side bookkeeping inside).
            t0 = time.perf_counter()
            pod_id = rt.RunPodSandbox(pb.RunPodSandboxRequest(config=cfg), timeout=120).pod_sandbox_id
            kl.pods.append(Pod(id=pod_id, uid=uid, name=name, namespace=ns,
                               cgroup_parent=cfg.linux.cgroup_parent, network="node", config=cfg))
            t1 = time.perf_counter()
            cid = rt.CreateContainer(pb.CreateContainerRequest(
                pod_sandbox_id=pod_id, config=ccfg, sandbox_config=cfg), timeout=120).container_id
            t2 = time.perf_counter()
            kl.containers.append(cid)
            rt.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=120)
            took = time.perf_counter() - t0
            if tag == "proxy":
                proxied[name] = took
            if tag in creates:
                creates[tag].append((t2 - t1) * 1e3)
            return took

        log(f"pod start: 1 warm-up + {n} pods each way (direct, proxy, proxy with NUMA), interleaved")
        one(kd, "warm")
        one(kp, "warm")
        one(kn, "numa-warm")
        paths = [("direct", kd), ("proxy", kp), ("numa", kn)]
        for i in range(n):
            k = i % len(paths)
            order = paths[k:] + paths[:k]
            for tag, kl in (order if i % 2 == 0 else order[::-1]):
                times[tag].append(one(kl, tag))
        self.results["numa_create"] = numa_create_summary(creates, times)
        self.results["numa_create"]["placed"] = self._placed(kn)
        d, p = statistics.median(times["direct"]), statistics.median(times["proxy"])
        paired = statistics.median(b / a for a, b in zip(times["direct"], times["proxy"]))
        self.results["pod_start"] = {
            "paired_ratio_median": paired,
            "n": n, "direct_median_ms": d * 1e3, "proxy_median_ms": p * 1e3,
            "direct_min_ms": min(times["direct"]) * 1e3, "proxy_min_ms": min(times["proxy"]) * 1e3,
            "ratio": p / d, "pods_running": len(kd.pods) + len(kp.pods) + len(kn.pods)}
        # The proxy logs containerd's time for each intercepted call (latency_ms, from forward
        # to reply): client time minus that is what the proxy itself added, free of the large
        # run-to-run spread of runc/containerd.
        time.sleep(0.3)
        upstream: Dict[str, float] = {}
        try:
            with open(self.proxy_a.log_path) as f:
                for line in f:
                    try:
                        rec = json.loads(line)
                    except ValueError:
                        continue
                    if rec.get("pod_name") in proxied and "latency_ms" in rec and \
                            rec.get("method") in ("RunPodSandbox", "CreateContainer", "StartContainer"):
                        upstream[rec["pod_name"]] = upstream.get(rec["pod_name"], 0.0) + rec["latency_ms"]
        except OSError:
            pass
        over = [proxied[k] * 1e3 - v for k, v in upstream.items()]
        if len(over) == len(proxied):
            self.results["pod_start"].update(
                proxy_overhead_median_ms=statistics.median(over),
                proxy_overhead_max_ms=max(over),
                proxy_overhead_pct_of_direct=statistics.median(over) / (d * 1e3) * 100)
        else:
            self.problems.append(f"pod start: proxy log has latency for {len(upstream)} of "
                                 f"{len(proxied)} proxied pods")

    @staticmethod
    def _placed(kl: Any) -> Dict[str, int]:
        """How many of ``kl``'s containers the NUMA hook placed: the OCI spec's cpuset is
        one fake node's CPUs (figures without placement would mean nothing)."""
        nodes = set(numa_nodes().values())
        out = {"containers": 0, "placed": 0}
        for cid in kl.containers:
            try:
                _, info = kl.container_status(cid)
            except Exception:
                continue
            linux = (info.get("runtimeSpec") or {}).get("linux") or {}
            cpus = ((linux.get("resources") or {}).get("cpu") or {}).get("cpus", "")
            out["containers"] += 1
            out["placed"] += int(cpus in nodes)
        return out

    # ---- relayed paths compared with direct in parts 1, 2 and 4
    def relays(self, endpoint: str, tag: str) -> List[Tuple[str, str, Optional[Callable[[], float]]]]:
        """(name, socket, CPU function) of every path to ``endpoint``: direct, socat (the
        byte-relay floor), this tree's proxy and, with --proxy-tree, the other tree's."""
        if tag in self.paths:
            return self.paths[tag]
        socat = SocatRelay(f"socat-{tag}", self.work, endpoint)
        self.socats.append(socat)
        socat.start()
        proxy = self.proxy_a if tag == "a" else self.proxy_b
        assert proxy is not None
        out: List[Tuple[str, str, Optional[Callable[[], float]]]] = [
            ("direct", endpoint, None), ("socat", socat.socket, socat.cpu), ("proxy", proxy.socket, proxy.cpu)]
        if self.compare_tree:
            before = self.before.get(tag)
            if before is None:
                before = ProxyProc(f"proxy-{tag}0", self.work, endpoint, tree=self.compare_tree)
                self.before[tag] = before
                before.start()
                before.wait_log("store reconciled with containerd", 120)
            out.append(("before", before.socket, before.cpu))
        self.paths[tag] = out
        return out

    def _latency(self, endpoint: str, tag: str, cases: List[Tuple[str, str, bytes, int, int]],
                 expect: Optional[Dict[str, bytes]] = None) -> Dict[str, Any]:
        paths = self.relays(endpoint, tag)
        chans = self.path_channels.get(tag)
        if chans is None:
            chans = self.path_channels[tag] = {name: channel(sock) for name, sock, _ in paths}
            self.channels += list(chans.values())
        out = {}
        for label, m, req, iters, warmup in cases:
            log(f"latency {label}: {warmup} warm-up + {iters} calls on each of {', '.join(chans)}")
            res = interleaved([(name, chans[name].unary_unary(RUNTIME + m), fn) for name, _, fn in paths],
                              req, iters, warmup)
            d = res["direct"]["ns"]
            s = lat_summary(d, res["proxy"]["ns"])
            s["reply_bytes"] = len(res["direct"]["reply"])
            s["proxy_cpu_us_per_call"] = res["proxy"]["cpu"] / iters * 1e6
            s["paths"] = {name: path_summary(d, r["ns"], r["cpu"]) for name, r in res.items() if name != "direct"}
            want = (expect or {}).get(label, res["direct"]["reply"] if m == "Version" else None)
            for name, r in res.items():
                if want is not None and r["reply"] != want:
                    self.problems.append(f"{label}: reply bytes through {name} differ "
                                         f"({len(r['reply'])} against {len(want)})")
            out[label] = s
        return out

    # ---- 2. unary latency on the real containerd
    def latency_real(self) -> None:
        assert self.pc is not None and self.proxy_a is not None
        reqs = requests()
        n, w = self.cfg["lat_iters"], self.cfg["lat_warmup"]
        self.results["latency_real"] = self._latency(
            self.pc.socket, "a", [(m, m, reqs[m], n, w) for m in ("Version", "Status", "ListContainers",
                                                                      "ListPodSandbox")])

    # ---- 3. big lists via the fake backend
    def latency_fake(self) -> None:
        from anolisnuma.testing.fake_cri import FakeCri

        lc1000, lps1000 = realistic_lists(1000, 1000)
        lc5000, _ = realistic_lists(5000, 1000)
        sock = os.path.join(self.work, "fake", "cri.sock")
        self.fake = FakeCri(sock, containers=0, sandboxes=0, max_workers=32)
        self.fake.keep_requests = 1
        self.fake.set_reply(RUNTIME + "ListContainers", lc1000)
        self.fake.set_reply(RUNTIME + "ListPodSandbox", lps1000)
        self.fake.start()
        self.proxy_b = ProxyProc("proxy-b", self.work, sock)
        self.proxy_b.start()
        # The proxy's start-up resync lists (and status-checks) the 1,000 pods: let it finish.
        if not self.proxy_b.wait_log("store reconciled with containerd", 120):
            self.problems.append("proxy B: start-up resync did not finish within 120 s")
        out = {}
        cases = [("ListContainers x1000", "ListContainers", lc1000),
                 ("ListPodSandbox x1000", "ListPodSandbox", lps1000),
                 ("ListContainers x5000", "ListContainers", lc5000)]
        for label, m, body in cases:
            self.fake.set_reply(RUNTIME + m, body)
            out.update(self._latency(sock, "b", [(label, m, b"", self.cfg["fake_iters"][label],
                                                  self.cfg["fake_warmup"])], expect={label: body}))
        self.results["latency_fake"] = out
        self.results["proxy_b_rss_mb"] = self.proxy_b.rss_mb()

    # ---- 4. 16-way throughput
    def throughput(self) -> None:
        assert self.pc is not None and self.proxy_a is not None
        secs = self.cfg["tput_seconds"]
        paths = self.relays(self.pc.socket, "a")
        names = [name for name, _, _ in paths]
        out = {}
        for chans in self.cfg["tput_modes"]:
            tot = {name: [0, 0.0, 0.0, []] for name in names}   # calls, seconds, relay CPU, latencies
            errs = 0
            slices = max(2, int(round(secs / TPUT_SLICE_S)))
            log(f"throughput: 16 callers on {chans} channel(s), Version, {secs:.0f}s on each of "
                f"{', '.join(names)} in {slices} rotating slices")
            conns = {name: [channel(sock) for _ in range(chans)] for name, sock, _ in paths}
            try:
                for name in names:   # warm-up: threads, connections, caches
                    run_callers(conns[name], "Version", b"", 16, seconds=0.2)
                # rotating order: slow drift and bursts of other load hit every path alike
                for i in range(slices):
                    rot = paths[i % len(paths):] + paths[:i % len(paths)]
                    for name, _, fn in (rot if i % 2 == 0 else rot[::-1]):
                        c0 = fn() if fn else 0.0
                        n, el, e = run_callers(conns[name], "Version", b"", 16, seconds=secs / slices,
                                               latencies=tot[name][3])
                        tot[name][0] += n
                        tot[name][1] += el
                        tot[name][2] += (fn() - c0) if fn else 0.0
                        errs += e
            finally:
                for cs in conns.values():
                    for ch in cs:
                        ch.close()
            rate = {name: t[0] / t[1] for name, t in tot.items()}
            d = rate["direct"]
            r: Dict[str, Any] = {"channels": chans, "direct_calls_s": d, "proxy_calls_s": rate["proxy"],
                                 "ratio": rate["proxy"] / d, "errors": errs,
                                 "proxy_cpu_us_per_call": tot["proxy"][2] / max(1, tot["proxy"][0]) * 1e6,
                                 "direct_p50_us": pct(tot["direct"][3], 0.5) / 1e3,
                                 "direct_p99_us": pct(tot["direct"][3], 0.99) / 1e3}
            r["paths"] = {}
            for name in names[1:]:
                ps = path_summary(tot["direct"][3], tot[name][3], tot[name][2])
                ps["cpu_us_per_call"] = tot[name][2] / max(1, tot[name][0]) * 1e6
                ps.update(calls_s=rate[name], ratio=rate[name] / d)
                r["paths"][name] = ps
            out[f"{chans}ch"] = r
            if errs:
                self.problems.append(f"throughput {chans}ch: {errs} failed calls")
        self.results["throughput"] = out

    # ---- 5. CPU per call and RSS over 100,000 calls
    def rss(self) -> None:
        assert self.proxy_a is not None
        pa = self.proxy_a
        threads, chans = self.cfg["rss_threads"], self.cfg["rss_channels"]
        mix = ["Version", "Status", "ListPodSandbox", "ListContainers"]
        points = [{"calls": 0, "rss_mb": pa.rss_mb(), "threads": pa.threads()}]
        done = 0
        errs = 0
        log(f"RSS: {self.cfg['rss_checkpoints'][-1]} calls ({'/'.join(mix)} rotated), "
            f"{threads} threads on {chans} channels")
        conns = [channel(pa.socket) for _ in range(chans)]
        self.channels += conns
        for cp in self.cfg["rss_checkpoints"]:
            c0 = pa.cpu()
            n, el, e = run_callers(conns, mix, b"", threads, total=cp - done)
            cpu = pa.cpu() - c0
            done += n + e
            errs += e
            points.append({"calls": done, "rss_mb": pa.rss_mb(), "threads": pa.threads(),
                           "calls_s": n / el, "proxy_cpu_us_per_call": cpu / max(1, n) * 1e6})
            log(f"  {done} calls: RSS {points[-1]['rss_mb']:.1f} MB, {n / el:.0f} calls/s")
        if errs:
            self.problems.append(f"RSS phase: {errs} failed calls")
        self.results["rss"] = {"points": points, "errors": errs, "threads": threads, "channels": chans}

    # ---- 6. bursts of large CreateContainers on one grpc-go connection, NUMA hook on
    def _numa_proxy(self, name: str) -> ProxyProc:
        assert self.pc is not None
        p = ProxyProc(name, self.work, self.pc.socket, numa_nodes=numa_nodes(), numa_namespace=LARGE_NS)
        if name == "proxy-c":
            self.proxy_c = p
        else:
            self.proxy_h = p
        p.start()
        p.wait_log("store reconciled with containerd", 30)
        return p

    def large_creates(self) -> None:
        from cri_client import KubeletLike, pb
        from anolisnuma.testing.goclient import build_gocri, run_gocri

        assert self.pc is not None
        lc = self.cfg["large"]
        t_build = time.monotonic()
        gocri = build_gocri()
        build_s = time.monotonic() - t_build
        px = self._numa_proxy("proxy-c")
        per_conn, total = px.budgets()
        log(f"large creates: proxy C pid {px.proc.pid} (NUMA hook on {LARGE_NS!r}, fake topology "
            f"{numa_nodes()}, budgets {per_conn // MIB}/{total // MIB} MiB); gocri ready in {build_s:.1f}s")
        kd = KubeletLike(self.pc.socket, harness=self.pc, timeout=60)
        kp = KubeletLike(px.socket, harness=self.pc, timeout=60)
        self.kubelets += [kd, kp]
        npods = lc["pods"]
        with ThreadPoolExecutor(4) as pool:
            pods = {"direct": list(pool.map(lambda i: kd.run_pod(name=f"large-d-{i}", namespace=LARGE_NS),
                                            range(npods))),
                    "proxy": list(pool.map(lambda i: kp.run_pod(name=f"large-p-{i}", namespace=LARGE_NS),
                                           range(npods)))}
        clients = {"direct": kd, "proxy": kp}
        socks = {"direct": self.pc.socket, "proxy": px.socket}
        node_cpus = set(numa_nodes().values())
        out: Dict[str, Any] = {"proxy": "proxy C", "hook": "numa", "namespace": LARGE_NS,
                               "topology": {str(k): v for k, v in numa_nodes().items()},
                               "budget_per_connection_bytes": per_conn, "budget_total_bytes": total,
                               "pods_each_way": npods, "deadline_s": lc["deadline"], "rounds": lc["rounds"],
                               "cases": {}}
        for calls, env_bytes in lc["sizes"]:
            label = f"{calls}x{size_label(env_bytes)}"
            env = pb.ContainerConfig(envs=service_links(env_bytes, "APP")).SerializeToString()
            case: Dict[str, Any] = {"calls": calls, "env_bytes": env_bytes, "rounds": []}
            rss0 = rss_of(px)
            peak = rss0
            log(f"large creates {label}: {lc['rounds']} round(s) of {calls} concurrent CreateContainer on one "
                f"grpc-go connection, each way")
            for r in range(lc["rounds"]):
                for way in (("direct", "proxy") if r % 2 == 0 else ("proxy", "direct")):
                    kl = clients[way]
                    bodies = []
                    for i in range(calls):
                        pod = pods[way][i % npods]
                        cfg = kl.container_config(f"big-{r}-{i:02d}", kl.resources(cpu_shares=2))
                        cfg.MergeFromString(env)
                        bodies.append(pb.CreateContainerRequest(pod_sandbox_id=pod.id, config=cfg,
                                                                sandbox_config=pod.config).SerializeToString())
                    sampler = RssSampler(px.proc.pid if way == "proxy" else None)
                    with sampler:
                        t0 = time.monotonic()
                        res = run_gocri(socks[way], CREATE, bodies, deadline_s=lc["deadline"], binary=gocri)
                        wall = time.monotonic() - t0
                    peak = max(peak, sampler.peak)
                    codes: Dict[str, int] = {}
                    for x in res:
                        codes[CODE_NAMES.get(x["code"], str(x["code"]))] = \
                            codes.get(CODE_NAMES.get(x["code"], str(x["code"])), 0) + 1
                    created = [pb.CreateContainerResponse.FromString(x["reply"]).container_id
                               for x in res if x["code"] == 0]
                    ms_all = [x["elapsed_ms"] for x in res]
                    ms_ok = sorted(x["elapsed_ms"] for x in res if x["code"] == 0)
                    rd = {"ok_ms_sorted": ms_ok, "round": r, "way": way, "request_bytes": len(bodies[0]),
                          "codes": codes,
                          "created": len(created), "all_done_ms": max(ms_all),
                          "all_created_ms": max(ms_ok) if ms_ok else float("nan"),
                          "call_p50_ms": pct(ms_all, 0.5), "wall_s": wall,
                          "refused_messages": sorted({x["message"] for x in res if x["code"] == 8})[:3]}
                    if way == "proxy" and r == 0 and created:
                        rd["pinned"] = sum(1 for c in created if spec_cpus(kd, c) in node_cpus)
                    log(f"  {way:6} round {r}: {len(created)}/{calls} created, all done in "
                        f"{rd['all_done_ms']:.0f} ms, {codes}" + (f", pinned {rd['pinned']}" if "pinned" in rd else ""))
                    case["rounds"].append(rd)
                    # the next round starts from the same state: remove what this one made
                    with ThreadPoolExecutor(8) as pool:
                        list(pool.map(lambda c: remove_quietly(kl, c), created))
            case["proxy_rss_before_mb"] = rss0 / MIB
            case["proxy_rss_peak_mb"] = peak / MIB
            settle_rss(px.proc.pid, rss0, 10.0)
            time.sleep(0.5)
            case["proxy_rss_after_mb"] = rss_of(px) / MIB
            rounds = case["rounds"]
            d = [x["all_done_ms"] for x in rounds if x["way"] == "direct"]
            p = [x["all_done_ms"] for x in rounds if x["way"] == "proxy"]
            case.update(direct_median_ms=statistics.median(d), proxy_median_ms=statistics.median(p),
                        ratio=statistics.median(p) / statistics.median(d),
                        refused=[x["codes"].get("RESOURCE_EXHAUSTED", 0) for x in rounds if x["way"] == "proxy"],
                        stalled=sum(x["codes"].get("DEADLINE_EXCEEDED", 0) for x in rounds),
                        other_errors=sum(n for x in rounds for c, n in x["codes"].items()
                                         if c not in ("OK", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED")),
                        direct_failed=sum(calls - x["created"] for x in rounds if x["way"] == "direct"))
            # With refusals the proxy creates fewer: when had direct created as many?
            n_prx = int(statistics.median(x["created"] for x in rounds if x["way"] == "proxy"))
            # (on a busy machine direct may have created fewer than that within its deadline)
            reached = [x["ok_ms_sorted"][n_prx - 1] for x in rounds
                       if x["way"] == "direct" and 0 < n_prx <= x["created"]]
            if 0 < n_prx < calls and reached:
                case["direct_ms_to_same_count"] = statistics.median(reached)
                case["same_count"] = n_prx
            if case["stalled"] or case["other_errors"] or case["direct_failed"]:
                self.problems.append(f"large creates {label}: {case['stalled']} stalled, "
                                     f"{case['other_errors']} other errors, {case['direct_failed']} direct failures")
            out["cases"][label] = case
        self.results["large_creates"] = out

    # ---- 7. the daemon's RSS under hostile clients
    def hostile(self) -> None:
        from anolisnuma.testing.daemon_probes import fds
        from anolisnuma.testing.h2raw import RawH2Client
        from anolisnuma.transport import h2 as wire

        ph = self._numa_proxy("proxy-h")
        pid = ph.proc.pid
        per_conn, total = ph.budgets()
        sock = ph.socket
        log(f"hostile clients: proxy H pid {pid} (NUMA hook on, budgets {per_conn // MIB}/{total // MIB} MiB)")
        # Warm up every code path of a call, then let the daemon itself end that connection
        # (an oversized PING), so that the fd baseline is exact (tests/transport/test_hostile.py).
        with RawH2Client(sock) as c:
            c.start()
            c.send(c.headers(1, RUNTIME + "Version") + c.frame(wire.DATA, wire.FLAG_END_STREAM, 1, b"\x00" * 5))
            c.read(until=lambda f: f.stream == 1 and bool(f.flags & wire.FLAG_END_STREAM))
            c.send(c.frame(wire.PING, 0, 0, b"\x00" * 20000))
            c.wait_closed()
        streams = self.cfg["hostile_streams"]

        def flood() -> Dict[str, Any]:
            r = subprocess.run(
                [sys.executable, "-c", "import sys; from anolisnuma.testing.h2raw import flood_held_streams; "
                 "print(flood_held_streams(sys.argv[1], sys.argv[2], int(sys.argv[3])))", sock, CREATE, str(streams)],
                cwd=REPO, capture_output=True, text=True, timeout=600)
            if r.returncode != 0:
                raise RuntimeError(f"flood_held_streams failed: {r.stderr.strip()[-500:]}")
            refused = int(r.stdout.strip())
            return {"streams": streams, "refused": refused, "held_at_most": streams - refused}

        def continuation() -> Dict[str, Any]:
            chunk = b"\x00\x00\x00" * (16383 // 3)   # empty literals in legal 16 KiB frames
            with RawH2Client(sock) as c:
                c.start()
                c.send(c.frame(wire.HEADERS, 0, 1, chunk))
                sent = len(chunk)
                while sent < 64 * MIB and c.send(c.frame(wire.CONTINUATION, 0, 1, chunk)):
                    sent += len(chunk)
                return {"goaway": goaway_name(c.goaway_code()), "closed": c.wait_closed(), "sent_bytes": sent}

        def data_past_window() -> Dict[str, Any]:
            with RawH2Client(sock) as c:
                c.start()
                c.send(c.headers(1, UNKNOWN))   # a pass-through call (as in test_hostile.py)
                sent = 0
                while sent < 256 * MIB and c.send(c.frame(wire.DATA, 0, 1, b"\x00" * 16384)):
                    sent += 16384
                return {"goaway": goaway_name(c.goaway_code()), "closed": c.wait_closed(), "sent_bytes": sent}

        def big_headers() -> Dict[str, Any]:
            with RawH2Client(sock) as c:
                c.start()
                c.send(((1 << 24) - 1).to_bytes(3, "big") + bytes([wire.HEADERS, wire.FLAG_END_HEADERS])
                       + (1).to_bytes(4, "big"))
                sent = 0
                for _ in range(256):   # keep writing the announced 16 MiB until the proxy hangs up
                    if not c.send(b"\x00" * 65536):
                        break
                    sent += 65536
                return {"goaway": goaway_name(c.goaway_code()), "closed": c.wait_closed(), "sent_bytes": sent}

        cases = [(f"held-stream flood ({streams:,} streams)", flood),
                 ("CONTINUATION flood", continuation),
                 ("DATA past the window", data_past_window),
                 ("16 MiB HEADERS frame", big_headers)]
        out: Dict[str, Any] = {"proxy": "proxy H", "budget_per_connection_bytes": per_conn,
                               "budget_total_bytes": total, "cases": {}}
        for label, attack in cases:
            time.sleep(0.2)
            rss0, fds0 = rss_of(ph), fds(pid)
            log(f"  {label}: RSS {rss0 / MIB:.1f} MB, {fds0} fds before")
            sampler = RssSampler(pid)
            with VersionProbe(f"unix://{sock}") as probe, sampler:
                t0 = time.monotonic()
                outcome = attack()
                took = time.monotonic() - t0
            _, fds1, back_s = settle_rss(pid, rss0, 10.0, fds0)
            time.sleep(0.5)
            rss1 = rss_of(ph)
            res = {"rss_before_mb": rss0 / MIB, "rss_peak_mb": max(rss0, sampler.peak) / MIB,
                   "rss_after_mb": rss1 / MIB, "recovered_s": back_s, "fds_before": fds0, "fds_after": fds1,
                   "version_calls": len(probe.times), "version_worst_ms": probe.worst_ms,
                   "version_p50_ms": pct(probe.times, 0.5) * 1e3 if probe.times else float("nan"),
                   "version_errors": len(probe.errors), "attack_s": took,
                   "alive": ph.proc.poll() is None, **outcome}
            log(f"  {label}: peak {res['rss_peak_mb']:.1f} MB, after {res['rss_after_mb']:.1f} MB, "
                f"fds {fds1}, Version worst {res['version_worst_ms']:.1f} ms of {res['version_calls']}, {outcome}")
            if not res["alive"]:
                self.problems.append(f"hostile {label}: the daemon died")
                out["cases"][label] = res
                break
            out["cases"][label] = res
        # SIGTERM after the attacks: the daemon stops within its drain grace
        out["exit_code"] = ph.stop()
        out["stop_s"] = ph.stop_seconds
        self.results["hostile"] = out

    # ---- report
def machine() -> Dict[str, str]:
    """The machine, its load and the versions of what the benchmark runs, for the report."""
    try:
        ctrd = subprocess.run(["containerd", "--version"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except OSError:
        ctrd = "?"
    try:
        runc = subprocess.run(["runc", "--version"], capture_output=True, text=True,
                              timeout=10).stdout.splitlines()[0]
    except (OSError, IndexError):
        runc = "?"
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    grpc_go = "?"
    try:
        with open("/usr/share/gocode/src/google.golang.org/grpc/version.go") as f:
            for line in f:
                if line.startswith("const Version"):
                    grpc_go = line.split('"')[1]
    except (OSError, IndexError):
        pass
    return {"date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "nproc": str(os.cpu_count()),
            "grpc_go": grpc_go,
            "cpu": cpu, "kernel": platform.release(), "python": platform.python_version(),
            "grpcio": grpc.__version__, "containerd": ctrd, "runc": runc,
            "mem_total_gb": f"{psutil.virtual_memory().total / 2**30:.1f}",
            "loadavg_at_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
            # CPU busy (all processes) over 1 s before anything of ours runs.
            "cpu_busy_before_pct": f"{psutil.cpu_percent(interval=1.0):.0f}"}


# --------------------------------------------------------------------------- the previous full run

# The pass-through figures of the previous full run in docs/benchmarks.md (same machine
# type: 2 vCPU AMD EPYC, containerd 1.6.20, runc 1.1.5, Python 3.11.7), which a full run is
# compared with. The speed of the machine itself differs from run to run (direct Version p50
# was 370 µs in one run, 202 µs in this one), so the ratios proxy/direct are what is checked:
# a ratio worse by more than its tolerance (about the spread of the runs documented there)
# is flagged; added microseconds and CPU per call are shown beside them.
PREVIOUS = {
    "label": "2026-12-01 01:55 UTC",
    "latency": {"Version": (205, 94, 1.46, 92), "Status": (219, 94, 1.43, 95),   # dir p50, add p50,
                "ListContainers": (255, 96, 1.38, 103), "ListPodSandbox": (247, 97, 1.39, 104)},  # x, cpu
    "lists": {"ListContainers x1000": (0.55, 1.21), "ListPodSandbox x1000": (0.54, 1.19),   # dir p50 ms, x
              "ListContainers x5000": (2.12, 1.21)},
    "pod_ratio": 1.001,
    "tput_pct": {"1ch": 101, "16ch": 60},
    "rss_mb": 35.6,
}
TOL_RATIO = 0.15      # latency and list ratios, absolute
TOL_POD = 0.05        # pod start ratio, absolute
TOL_TPUT = 10         # throughput, percentage points
TOL_RSS = 2.0         # MB


def compare_previous(r: Dict[str, Any]) -> List[str]:
    """Lines comparing a full run's pass-through figures with ``PREVIOUS`` (previous -> now)."""
    if r.get("mode") != "full":
        return []
    P = PREVIOUS
    flagged = 0
    checked = 0

    def mark(bad: bool) -> str:
        nonlocal flagged, checked
        checked += 1
        flagged += bad
        return "REGRESSED" if bad else "ok"

    def cols(cells: Sequence[str], widths: Sequence[int]) -> str:
        return "   " + "  ".join(c.ljust(x) if i == 0 else c.rjust(x)
                                 for i, (c, x) in enumerate(zip(cells, widths))).rstrip()

    L = [f"8. Pass-through against the previous full run ({P['label']}, docs/benchmarks.md), previous -> now. "
         "The machine's own speed",
         "   varies between runs (see direct), so the ratios are checked: flagged when worse by more than the "
         "earlier run-to-run spread",
         f"   (x p50 +{TOL_RATIO}, pod start +{TOL_POD}, throughput -{TOL_TPUT} points, RSS +{TOL_RSS:.0f} MB)"]
    lr = r.get("latency_real") or {}
    if lr:
        w = (16, 14, 14, 16, 14, 9)
        L.append(cols(("call", "direct p50 µs", "added p50 µs", "proxy CPU µs/call", "x p50", ""), w))
        for m, s in lr.items():
            d, add, x, cpu = P["latency"][m]
            L.append(cols((m, f"{d} -> {s['direct_p50_us']:.0f}", f"{add:+d} -> {s['added_p50_us']:+.0f}",
                           f"{cpu} -> {s['proxy_cpu_us_per_call']:.0f}", f"{x:.2f} -> {s['ratio_p50']:.2f}",
                           mark(s["ratio_p50"] > x + TOL_RATIO)), w))
    lf = r.get("latency_fake") or {}
    if lf:
        w = (22, 14, 14, 16, 14, 9)
        L.append(cols(("list (fake backend)", "direct p50 ms", "", "", "x p50", ""), w))
        for label, s in lf.items():
            d, x = P["lists"][label]
            L.append(cols((label, f"{d:.2f} -> {s['direct_p50_us'] / 1e3:.2f}", "", "",
                           f"{x:.2f} -> {s['ratio_p50']:.2f}", mark(s["ratio_p50"] > x + TOL_RATIO)), w))
    other: List[Tuple[str, str, bool]] = []
    ps = r.get("pod_start")
    if ps:
        other.append(("pod start, median ratio", f"{P['pod_ratio']:.3f} -> {ps['ratio']:.3f}",
                      ps["ratio"] > P["pod_ratio"] + TOL_POD))
    for k, s in (r.get("throughput") or {}).items():
        then = P["tput_pct"][k]
        other.append((f"throughput, 16 callers on {s['channels']} channel(s), proxy/direct",
                       f"{then} % -> {s['ratio'] * 100:.0f} %", s["ratio"] * 100 < then - TOL_TPUT))
    rs = r.get("rss")
    if rs:
        now = rs["points"][-1]["rss_mb"]
        other.append(("proxy A RSS after 100,000 calls", f"{P['rss_mb']:.1f} -> {now:.1f} MB",
                      now > P["rss_mb"] + TOL_RSS))
    for fig, val, bad in other:
        L.append(cols((fig, val, mark(bad)), (52, 22, 9)))
    L.append(f"   {checked - flagged} of {checked} within the spread of the previous run"
             + ("" if not flagged else f"; {flagged} flagged (look at the other-load line before believing it)"))
    return L

def tree_commit(tree: str) -> str:
    """The commit of a git work tree (with "+changes" when tracked files under anolisnuma/
    have uncommitted changes), or "" when it is not one."""
    try:
        head = subprocess.run(["git", "-C", tree, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        if head.returncode != 0 or os.path.realpath(subprocess.run(
                ["git", "-C", tree, "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                timeout=10).stdout.strip()) != os.path.realpath(tree):
            return ""
        dirty = subprocess.run(["git", "-C", tree, "status", "--porcelain", "--untracked-files=no", "--",
                                "anolisnuma"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return head.stdout.strip() + ("+changes" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return ""


def render_numa_create(nc: Optional[Dict[str, Any]]) -> List[str]:
    """Part 1's CreateContainer with the NUMA hook on (proxy N) against direct (issue 34)."""
    if not nc:
        return []
    c, a = nc["create_ms"], nc["added_mean"]
    pl = nc.get("placed") or {}
    rows = ", ".join(f"{k} p50 {v['p50']:.1f} / mean {v['mean']:.1f}" for k, v in c.items())
    lo, hi = ("nan" if a["lo"] != a["lo"] else f"{a['lo']:.2f}"), ("nan" if a["hi"] != a["hi"] else f"{a['hi']:.2f}")
    ok = nc.get("met")
    return [f"   CreateContainer, ms ({c.get('numa', {}).get('n', 0)} each; numa = proxy N, NUMA hook on for "
            f"{POD_NUMA_NS!r}, {pl.get('placed', 0)} of {pl.get('containers', 0)} containers placed on one node): "
            f"{rows}",
            f"   NUMA on over direct: mean {a['mean']:+.2f} ms [95 %: {lo}, {hi}], p50 {nc['added_p50_ms']:+.2f} ms; "
            f"pod start x direct (medians) {nc['pod_ratio_median']:.3f}   target <= +{nc['target_ms']:g} ms "
            f"{'-' if ok is None else verdict(ok)}"]


def render(r: Dict[str, Any]) -> str:
    L: List[str] = []
    mc = r["machine"]
    L.append(f"anolisnuma proxy benchmark ({r['mode']}) -- {mc['date']}")
    if r.get("proxy_commit"):
        L.append(f"proxies run from this tree ({r['proxy_commit']})")
    if r.get("proxy_tree"):
        L.append(f"'before': proxies from {r['proxy_tree']}" + (f" ({r['before_commit']})" if r.get("before_commit")
                                                                else "") + ", beside this tree's, same loops")
    L.append(f"machine: nproc {mc['nproc']} ({mc['cpu']}), {mc['mem_total_gb']} GB, kernel {mc['kernel']}, "
             f"python {mc['python']}, grpcio {mc['grpcio']}, loadavg at start {mc['loadavg_at_start']}")
    L.append(f"runtime: {mc['containerd']}; {mc['runc']}")
    other = float(mc.get("other_cpu_pct_during_run", "0"))
    L.append(f"other load: processes not ours used {mc.get('other_cpu_pct_during_run', '?')} % of all CPUs during "
             f"the run (machine busy {mc.get('busy_cpu_pct_during_run', '?')} %); CPU busy "
             f"{mc.get('cpu_busy_before_pct')} % in the 1 s before and {mc.get('cpu_busy_after_pct')} % after"
             + ("  ** machine shared: figures are noisy **" if other > BUSY_WARN_PCT else ""))
    L.append("proxies: `python -m anolisnuma -c CONFIG` subprocesses, env "
             + " ".join(f"{k}={v}" for k, v in PROXY_ENV.items()) + "; A (parts 1, 3-5) and B (part 2): no hooks "
             "([qos]/[numa] enabled = false); N (part 1), C (part 6) and H (part 7): NUMA hook on, default "
             "budgets")
    L.append("clients: grpcio sync channels, raw-bytes calls (no client-side decode); "
             "direct and proxied calls interleaved call by call")
    L.append("")

    def row(cols: Sequence[str], widths: Sequence[int]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cols, widths))).rstrip()

    def path_rows(cases: Dict[str, Any], unit: float, fmt: str, target: Callable[[str, str, Dict[str, Any]], str],
                  label_w: int) -> None:
        sfmt = "{:+" + fmt[2:]
        w = (label_w, 7, 8, 8, 8, 8, 8, 6, 6, 9, 30)
        L.append(row(("call", "path", "p50", "p99", "add p50", "add p99", "vs socat", "x p50", "x p99",
                      "cpu/call", "target"), w))
        for label, s in cases.items():
            L.append(row((label, "direct", fmt.format(s["direct_p50_us"] / unit),
                          fmt.format(s["direct_p99_us"] / unit)), w))
            paths = s.get("paths") or {"proxy": {
                "p50_us": s["proxy_p50_us"], "p99_us": s["proxy_p99_us"], "added_p50_us": s["added_p50_us"],
                "added_p99_us": s["added_p99_us"], "ratio_p50": s["ratio_p50"], "ratio_p99": s["ratio_p99"],
                "cpu_us_per_call": s["proxy_cpu_us_per_call"]}}
            floor = paths.get("socat")
            for name, ps in paths.items():
                over = "" if floor is None or name == "socat" else sfmt.format((ps["p50_us"] - floor["p50_us"]) / unit)
                L.append(row(("", name, fmt.format(ps["p50_us"] / unit), fmt.format(ps["p99_us"] / unit),
                              sfmt.format(ps["added_p50_us"] / unit), sfmt.format(ps["added_p99_us"] / unit), over,
                              f"{ps['ratio_p50']:.2f}", f"{ps['ratio_p99']:.2f}",
                              f"{ps['cpu_us_per_call']:.0f}", target(label, name, ps)), w))

    lr = r.get("latency_real")
    if lr:
        n = next(iter(lr.values()))["n"]
        running = r.get("pod_start", {}).get("pods_running")
        L.append(f"1. Unary latency, real containerd ({n} calls on each path after warm-up, interleaved; µs"
                 + (f"; {running} pods with one container each running)" if running else ")"))
        L.append("   add = path minus direct; vs socat = path minus socat (the byte-relay floor); cpu/call = the "
                 "relay process's CPU (µs) over the loop / calls")

        def lat_target(label: str, name: str, ps: Dict[str, Any]) -> str:
            if name == "socat":
                return "floor"
            t = f"cpu <= {T_CPU_US:.0f} {verdict(ps['cpu_us_per_call'] <= T_CPU_US)}"
            if label in ("Version", "Status"):
                t = f"add p50 <= {T_ADDED_P50_US:.0f} {verdict(ps['added_p50_us'] <= T_ADDED_P50_US)}; " + t
            return t

        path_rows(lr, 1.0, "{:.0f}", lat_target, 16)
        L.append("")
    lf = r.get("latency_fake")
    if lf:
        L.append("2. Big lists, fake CRI backend (direct to the fake vs socat, proxy B in front of it; ms; "
                 "cpu/call µs)")

        def list_target(label: str, name: str, ps: Dict[str, Any]) -> str:
            if name == "socat":
                return "floor"
            if label.startswith("ListContainers x1000"):
                return f"x p50 <= {T_LIST_RATIO} {verdict(ps['ratio_p50'] <= T_LIST_RATIO)}"
            return "-"

        path_rows({f"{k} ({v['reply_bytes'] / MIB:.2f} MiB, n={v['n']})": v for k, v in lf.items()}, 1e3,
                  "{:.2f}", list_target, 36)
        if "proxy_b_rss_mb" in r:
            L.append(f"   proxy B RSS after the big lists (its store holds the 1,000 pods and 1,000 "
                     f"containers of its start-up resync): {r['proxy_b_rss_mb']:.1f} MB (info)")
        L.append("")
    ps = r.get("pod_start")
    if ps:
        L.append(f"3. Pod start, real containerd (RunPodSandbox + CreateContainer + StartContainer, host "
                 f"network, cgroup_parent /kubepods/burstable/pod<uid>; {ps['n']} pods each way, interleaved)")
        L.append(f"   direct median {ps['direct_median_ms']:.1f} ms (min {ps['direct_min_ms']:.1f}), "
                 f"proxy median {ps['proxy_median_ms']:.1f} ms (min {ps['proxy_min_ms']:.1f}), "
                 f"ratio {ps['ratio']:.3f}   target <= {T_POD_RATIO} {verdict(ps['ratio'] <= T_POD_RATIO)}")
        L.append(f"   (median of the {ps['n']} paired proxy/direct ratios: {ps['paired_ratio_median']:.3f})")
        if "proxy_overhead_median_ms" in ps:
            L.append("   proxy's share, estimate (client time minus the latency the proxy logged for the 3 calls, "
                     "request arrival to reply;")
            L.append("   what is left: the kubelet-side hop, the proxy's reply-side work, the client's own cost):")
            L.append(f"   median {ps['proxy_overhead_median_ms']:.2f} ms, max {ps['proxy_overhead_max_ms']:.2f} ms "
                     f"per pod start = {ps['proxy_overhead_pct_of_direct']:.1f} % of the direct median (info)")
        L += render_numa_create(r.get("numa_create"))
        L.append("")
    tp = r.get("throughput")
    if tp:
        L.append("4. Throughput, 16 concurrent callers (threads), Version, real containerd; latency of each call "
                 "under that load (µs)")
        for k, s in tp.items():
            L.append(f"   {s['channels']:>2} channel(s): direct {s['direct_calls_s']:.0f}/s"
                     + (f", p50 {s['direct_p50_us']:.0f}, p99 {s['direct_p99_us']:.0f}" if "direct_p50_us" in s
                        else ""))
            paths = s.get("paths") or {"proxy": {"calls_s": s["proxy_calls_s"], "ratio": s["ratio"],
                                                 "cpu_us_per_call": s["proxy_cpu_us_per_call"]}}
            for name, ps in paths.items():
                lat = "" if "p50_us" not in ps else \
                    f", p50 {ps['p50_us']:.0f} ({ps['added_p50_us']:+.0f}), p99 {ps['p99_us']:.0f} " \
                    f"({ps['added_p99_us']:+.0f})"
                tgt = "" if name == "socat" else \
                    f"   target >= {T_TPUT_RATIO * 100:.0f} % {verdict(ps['ratio'] >= T_TPUT_RATIO)}"
                L.append(f"      {name:>6} {ps['calls_s']:.0f}/s = {ps['ratio'] * 100:.0f} %{lat}, CPU "
                         f"{ps['cpu_us_per_call']:.0f} µs/call{tgt}")
        L.append("")
    rs = r.get("rss")
    if rs:
        pts = rs["points"]
        last, prev = pts[-1], pts[-2]
        growth = last["rss_mb"] - prev["rss_mb"]
        L.append(f"5. Proxy A CPU and RSS over {last['calls']:,} calls (Version/Status/ListPodSandbox/"
                 f"ListContainers rotated, {rs['threads']} threads on {rs['channels']} channels)")
        for pt in pts:
            extra = "" if pt["calls"] == 0 else \
                f", {pt['calls_s']:.0f} calls/s, proxy CPU {pt['proxy_cpu_us_per_call']:.0f} µs/call"
            L.append(f"   after {pt['calls']:>7,} calls: RSS {pt['rss_mb']:.1f} MB, {pt['threads']} threads{extra}")
        ok = last["rss_mb"] <= T_RSS_MB and growth <= T_RSS_GROWTH_MB
        L.append(f"   RSS {last['rss_mb']:.1f} MB, {growth:+.1f} MB over the last "
                 f"{last['calls'] - prev['calls']:,} calls   target <= {T_RSS_MB:.0f} MB and not growing "
                 f"(<= {T_RSS_GROWTH_MB:.0f} MB) {verdict(ok)}")
        L.append("")
    lc = r.get("large_creates")
    if lc:
        per_c, tot = lc["budget_per_connection_bytes"], lc["budget_total_bytes"]
        topo = ", ".join(f"node {k} = CPU {v}" for k, v in lc["topology"].items())
        L.append(f"6. Bursts of large CreateContainer, all at once on ONE grpc-go connection (gocri, grpc-go "
                 f"{mc.get('grpc_go', '?')}: the kubelet's stack), real containerd")
        L.append(f"   proxy C: NUMA hook on (holds every CreateContainer; pins namespace {lc['namespace']!r} over a "
                 f"fake topology: {topo}; memory pinning off),")
        L.append(f"   default budgets {per_c // MIB} MiB per connection / {tot // MIB} MiB in all; "
                 f"{lc['pods_each_way']} pods each way; {lc['rounds']} round(s) each way, alternating; "
                 f"deadline {lc['deadline_s']:.0f} s; kubelet-like service-link env")
        L.append("   ms = until the last call of the burst returned (grpc-go's clock, connection up), median of "
                 "the rounds; x = proxy / direct")
        w = (9, 8, 8, 8, 5, 13, 12, 7, 7, 19)
        L.append(row(("case", "req KiB", "dir ms", "prx ms", "x", "prx created", "refused", "stalled", "pinned",
                      "prx RSS MB b/pk/af"), w))
        for label, c in lc["cases"].items():
            prx = [x for x in c["rounds"] if x["way"] == "proxy"]
            pinned = next((f"{x['pinned']}/{x['created']}" for x in prx if "pinned" in x), "-")
            L.append(row((label, f"{c['rounds'][0]['request_bytes'] / KIB:.0f}", f"{c['direct_median_ms']:.0f}",
                          f"{c['proxy_median_ms']:.0f}", f"{c['ratio']:.2f}",
                          ",".join(str(x["created"]) for x in prx), ",".join(str(n) for n in c["refused"]),
                          str(c["stalled"]), pinned,
                          f"{c['proxy_rss_before_mb']:.0f}/{c['proxy_rss_peak_mb']:.0f}/"
                          f"{c['proxy_rss_after_mb']:.0f}"), w))
        for label, c in lc["cases"].items():
            prx = [x for x in c["rounds"] if x["way"] == "proxy"]
            all_pinned = all(x.get("pinned", x["created"]) == x["created"] for x in prx)
            fits = c["calls"] * c["rounds"][0]["request_bytes"] <= per_c
            if fits:
                ok = all(x["created"] == c["calls"] for x in prx) and not c["stalled"] and all_pinned
                tgt = f"fits the budget: all created, pinned, none refused or stalled {verdict(ok)}"
            else:
                ok = not c["stalled"] and not c["other_errors"] and all_pinned
                tgt = f"over the budget: each pinned or refused, none stalled {verdict(ok)}"
            L.append(f"   {label}: {tgt}")
            if "direct_ms_to_same_count" in c:
                L.append(f"   {label}: the proxy created {c['same_count']} (median) and refused the rest; direct had "
                         f"created {c['same_count']} after {c['direct_ms_to_same_count']:.0f} ms (median)")
        L.append("   (refused = RESOURCE_EXHAUSTED from the proxy; stalled = DEADLINE_EXCEEDED; pinned: cpuset in "
                 "the OCI spec containerd recorded, first proxy round)")
        L.append("")
    hs = r.get("hostile")
    if hs:
        per_c, tot = hs["budget_per_connection_bytes"], hs["budget_total_bytes"]
        L.append(f"7. Hostile clients: proxy H's RSS (NUMA hook on, default budgets {per_c // MIB}/{tot // MIB} MiB, "
                 f"real containerd), Version on another connection meanwhile")
        w = (34, 40, 7, 7, 7, 7, 6, 11, 11)
        L.append(row(("case", "outcome", "RSS b", "peak", "after", "back s", "fds", "Version n", "worst ms"), w))
        for label, c in hs["cases"].items():
            if "refused" in c:
                what = f"{c['refused']:,} refused, {c['held_at_most']:,} held at most"
            else:
                what = f"GOAWAY {c['goaway']} after {c['sent_bytes'] / MIB:.2f} MiB"
            back = "-" if c["recovered_s"] is None else f"{c['recovered_s']:.1f}"
            L.append(row((label, what, f"{c['rss_before_mb']:.1f}", f"{c['rss_peak_mb']:.1f}",
                          f"{c['rss_after_mb']:.1f}", back, f"{c['fds_before']}>{c['fds_after']}",
                          f"{c['version_calls']}" + (f" ({c['version_errors']} err)" if c["version_errors"] else ""),
                          f"{c['version_worst_ms']:.1f}"), w))
        cs = list(hs["cases"].values())
        ok_lat = all(c["version_worst_ms"] < 1000 and not c["version_errors"] for c in cs)
        ok_grow = all(c["rss_peak_mb"] - c["rss_before_mb"] < (per_c + 16 * MIB) / MIB for c in cs)
        ok_back = all(c["recovered_s"] is not None and c["fds_after"] <= c["fds_before"] for c in cs)
        L.append(f"   targets (issue 7): Version worst < 1 s {verdict(ok_lat)}; RSS peak growth < per-connection "
                 f"budget + 16 MiB {verdict(ok_grow)}; RSS back within 10 MB and fds back {verdict(ok_back)}")
        stop = hs.get("stop_s")
        L.append(f"   SIGTERM after the attacks: exit {hs.get('exit_code')}"
                 + (f" in {stop:.2f} s" if stop is not None else " (killed: did not stop)"))
        L.append("")
    cmp_lines = compare_previous(r)
    if cmp_lines:
        L += cmp_lines
        L.append("")
    L.append("proxy logs: " + "; ".join(
        f"{name} {info['levels']}" for name, info in r.get("proxy_logs", {}).items()))
    for name, info in r.get("proxy_logs", {}).items():
        for ev, cnt in sorted(info["problems"].items(), key=lambda x: -x[1])[:8]:
            L.append(f"   {name}: {cnt} x {ev}")
    if r.get("problems"):
        L.append("problems: " + "; ".join(r["problems"]))
    L.append(f"total run time {r['elapsed_s']:.0f} s")
    return "\n".join(L)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer iterations (< 60 s), for CI smoke use")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    ap.add_argument("--proxy-tree", metavar="DIR", default="",
                    help="also run proxies from this source tree (e.g. `git archive COMMIT | tar -x -C DIR`) "
                         "beside this tree's, interleaved in the same loops (parts latency, lists, "
                         "throughput): before/after figures from one run")
    ap.add_argument("--only", metavar="PARTS", default=",".join(PHASES),
                    help=f"comma-separated parts to run (default: all of {','.join(PHASES)})")
    args = ap.parse_args(argv)
    only = [x.strip() for x in args.only.split(",") if x.strip()]
    unknown = sorted(set(only) - set(PHASES))
    if unknown:
        ap.error(f"--only: unknown part(s) {unknown}; known: {','.join(PHASES)}")
    if os.geteuid() != 0:
        print("bench_proxy: needs root (containerd, cgroups, mounts)", file=sys.stderr)
        return 1
    try:
        import cri_api.v1.api_pb2  # noqa: F401
    except ImportError as e:
        print(f"bench_proxy: needs the CRI stubs (container-runtime-interface-api): {e}", file=sys.stderr)
        return 1

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    t0 = time.monotonic()
    compare = os.path.abspath(args.proxy_tree) if args.proxy_tree else ""
    b = Bench(args.quick, compare)
    b.results["mode"] = "quick" if args.quick else "full"
    b.results["command"] = " ".join(["scripts/bench_proxy.py"] + (argv if argv is not None else sys.argv[1:]))
    b.results["machine"] = machine()
    b.results["proxy_commit"] = tree_commit(REPO)
    if compare:
        b.results["proxy_tree"] = compare
        b.results["before_commit"] = tree_commit(compare)
    rc = 0
    try:
        b.setup()
        for name in PHASES:   # in this order: the pass-through parts first, on a quiet containerd
            if name in only:
                getattr(b, PHASES[name])()
    except KeyboardInterrupt:
        log("interrupted; cleaning up")
        rc = 130
    except Exception as e:
        log(f"benchmark failed: {e!r}")
        for p in b.proxies():
            log(f"{p.name} log tail:\n{p.tail()}")
        b.problems.append(f"benchmark failed: {e!r}")
        rc = 1
    finally:
        # A second Ctrl-C during clean-up must not leave containerd behind.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        log("cleaning up")
        b.teardown()
        b.results["proxy_logs"] = b.proxy_logs
        b.results["machine"]["cpu_busy_after_pct"] = f"{psutil.cpu_percent(interval=1.0):.0f}"
        b.results["machine"]["loadavg_at_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
        b.results["problems"] = b.problems
        b.results["elapsed_s"] = time.monotonic() - t0
        signal.signal(signal.SIGINT, signal.default_int_handler)
    print(render(b.results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(b.results, f, indent=2, sort_keys=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
