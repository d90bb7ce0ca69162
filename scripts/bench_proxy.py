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
  synthetic containers, and proxy B in front of it.

The proxies run as subprocesses (their CPU time and RSS are their own) with no hook enabled
and with ``MALLOC_MMAP_THRESHOLD_=67108864 MALLOC_TRIM_THRESHOLD_=268435456`` in their
environment, as the systemd unit sets them. Clients are grpcio sync channels calling with
raw bytes (no protobuf decode on the client, so the client's own cost does not dilute the
ratios). Direct and proxied calls are interleaved call by call (the order alternates) after
a warm-up, so drift on the machine hits both sides alike.

It prints a table with the targets of issue 2 beside the figures (PASS/MISS); ``--quick``
runs fewer iterations (well under a minute) for CI smoke use; the full run takes about
1.5-2 minutes on 2 CPUs. Other load on the machine shows in the figures: the report says
how much CPU processes other than the benchmark's own took during the run. The exit code
is 0 even when a target is missed (it is a benchmark, not a test); 1 when the benchmark
itself could not run, 130 when interrupted.
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
MIB = 1 << 20
PROXY_ENV = {"MALLOC_MMAP_THRESHOLD_": "67108864", "MALLOC_TRIM_THRESHOLD_": "268435456"}
CLIENT_OPTIONS = [("grpc.max_receive_message_length", 64 * MIB),
                  ("grpc.max_send_message_length", 64 * MIB),
                  # separate connections per channel object (no global subchannel sharing)
                  ("grpc.use_local_subchannel_pool", 1)]

# Targets of issue 2.
T_ADDED_P50_US = 250.0
T_ADDED_GOAL_US = 100.0
T_LIST_RATIO = 1.5
T_POD_RATIO = 1.05
T_TPUT_RATIO = 0.50
T_RSS_MB = 60.0
T_RSS_GROWTH_MB = 2.0
TPUT_SLICE_S = 0.5
BUSY_WARN_PCT = 10.0   # "not growing": at most this much between the last two checkpoints

FULL = dict(lat_warmup=200, lat_iters=5000, fake_warmup=10,
            fake_iters={"ListContainers x1000": 1000, "ListContainers x5000": 200,
                        "ListPodSandbox x1000": 1000},
            pods=20, tput_seconds=3.0, tput_modes=(1, 16), rss_checkpoints=(10_000, 50_000, 100_000),
            rss_threads=8, rss_channels=2)
QUICK = dict(lat_warmup=50, lat_iters=300, fake_warmup=3,
             fake_iters={"ListContainers x1000": 40, "ListContainers x5000": 12,
                         "ListPodSandbox x1000": 40},
             pods=3, tput_seconds=1.0, tput_modes=(1,), rss_checkpoints=(1_000, 5_000, 10_000),
             rss_threads=8, rss_channels=2)


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


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


# --------------------------------------------------------------------------- the proxy

class ProxyProc:
    """``python -m anolisnuma -c CONFIG`` as a subprocess."""

    def __init__(self, name: str, workdir: str, endpoint: str) -> None:
        self.name = name
        self.dir = os.path.join(workdir, name)
        os.makedirs(self.dir, exist_ok=True)
        self.socket = os.path.join(self.dir, "proxy.sock")
        self.log_path = os.path.join(self.dir, "proxy.log")
        self.out_path = os.path.join(self.dir, "proxy.out")
        self.config_path = os.path.join(self.dir, "config.toml")
        self.endpoint = endpoint
        self.proc: Optional[subprocess.Popen] = None
        self.ps: Optional[psutil.Process] = None
        self.exit_code: Optional[int] = None
        with open(self.config_path, "w") as f:
            f.write(f"""[server]
listen = {json.dumps(self.socket)}

[runtime]
endpoint = {json.dumps(endpoint)}

[log]
file = {json.dumps(self.log_path)}
level = "info"
stderr = false

[paths]
state_dir = {json.dumps(os.path.join(self.dir, "state"))}

[qos]
enabled = false

[numa]
enabled = false
""")

    def argv(self) -> List[str]:
        return [sys.executable, "-m", "anolisnuma", "-c", self.config_path]

    def check_config(self, retries: int = 10, wait: float = 30.0) -> None:
        """``--check-config``; retried for a while when a module is still missing (other
        parts of the package may be in flux while the benchmark is developed)."""
        for attempt in range(retries):
            r = subprocess.run(self.argv() + ["--check-config"], cwd=REPO, capture_output=True,
                               text=True, timeout=60)
            if r.returncode == 0:
                return
            if "ModuleNotFoundError" not in r.stderr and "ImportError" not in r.stderr:
                raise RuntimeError(f"proxy config refused: {r.stderr.strip() or r.stdout.strip()}")
            log(f"proxy --check-config: import problem, retrying in {wait:.0f}s: "
                f"{r.stderr.strip().splitlines()[-1]}")
            time.sleep(wait)
        raise RuntimeError("proxy --check-config kept failing on an import")

    def start(self, timeout: float = 30.0) -> None:
        env = dict(os.environ)
        env.update(PROXY_ENV)
        env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        out = open(self.out_path, "wb")
        try:
            self.proc = subprocess.Popen(self.argv(), cwd=REPO, env=env, stdin=subprocess.DEVNULL,
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
        t = self.ps.cpu_times()
        return t.user + t.system

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
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.exit_code = self.proc.wait(timeout)
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


def interleaved(call_d: Callable, call_p: Callable, req: bytes, iters: int, warmup: int,
                proxy: Optional[ProxyProc] = None) -> Tuple[List[int], List[int], float, bytes, bytes]:
    """Alternate direct/proxy calls (order flipped every iteration). Returns latencies (ns)
    of both, the proxy's CPU seconds over the measured loop, and one reply of each side."""
    rd = rp = b""
    for _ in range(warmup):
        rd = call_d(req, timeout=30)
        rp = call_p(req, timeout=30)
    d: List[int] = []
    p: List[int] = []
    clock = time.perf_counter_ns
    cpu0 = proxy.cpu() if proxy else 0.0
    gc.disable()
    try:
        for i in range(iters):
            if i & 1:
                t0 = clock(); call_p(req, timeout=30); t1 = clock()  # noqa: E702
                call_d(req, timeout=30); t2 = clock()  # noqa: E702
                p.append(t1 - t0)
                d.append(t2 - t1)
            else:
                t0 = clock(); call_d(req, timeout=30); t1 = clock()  # noqa: E702
                call_p(req, timeout=30); t2 = clock()  # noqa: E702
                d.append(t1 - t0)
                p.append(t2 - t1)
    finally:
        gc.enable()
    cpu = (proxy.cpu() - cpu0) if proxy else 0.0
    return d, p, cpu, rd, rp


def run_callers(chans: List[grpc.Channel], method: Any, req: bytes, threads: int,
                seconds: Optional[float] = None, total: Optional[int] = None) -> Tuple[int, float, int]:
    """``threads`` callers on the connected channels ``chans`` (round robin) calling
    ``method`` (a name, or a list of names rotated per call) for ``seconds`` or until
    ``total`` calls. Returns (calls completed, elapsed seconds, errors)."""
    channels = len(chans)
    methods = [method] if isinstance(method, str) else list(method)
    reqs = requests()
    counts = [0] * threads
    errors = [0] * threads
    stop = threading.Event()
    start = threading.Barrier(threads + 1)
    lock = threading.Lock()
    left = [total if total is not None else -1]

    def worker(i: int) -> None:
        calls = [(chans[i % channels].unary_unary(RUNTIME + m), reqs.get(m, req)) for m in methods]
        k = i
        start.wait()
        while not stop.is_set():
            if total is not None:
                with lock:
                    if left[0] <= 0:
                        return
                    left[0] -= 1
            fn, rq = calls[k % len(calls)]
            k += 1
            try:
                fn(rq, timeout=30)
            except grpc.RpcError:
                errors[i] += 1
                continue
            if total is not None or not stop.is_set():
                counts[i] += 1

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


# --------------------------------------------------------------------------- phases

class Bench:
    def __init__(self, quick: bool) -> None:
        self.quick = quick
        self.cfg = QUICK if quick else FULL
        pid = os.getpid()
        self.base = f"{BASE_PREFIX}{pid}"
        self.run = f"{RUN_PREFIX}{pid}"
        self.work = os.path.join(self.base, "bench")
        self.pc: Optional[PrivateContainerd] = None
        self.proxy_a: Optional[ProxyProc] = None
        self.proxy_b: Optional[ProxyProc] = None
        self.fake: Any = None
        self.kubelets: List[Any] = []
        self.channels: List[grpc.Channel] = []
        self.results: Dict[str, Any] = {}
        self.problems: List[str] = []
        self.proxy_logs: Dict[str, Any] = {}

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
        for p in (self.proxy_a, self.proxy_b):
            if p is not None and p.proc is not None and p.proc.poll() is None:
                try:
                    total += p.cpu()
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
        for p in (self.proxy_a, self.proxy_b):
            if p is None:
                continue
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
        kd = KubeletLike(self.pc.socket, harness=self.pc)
        self.kubelets.append(kd)
        kp = KubeletLike(self.proxy_a.socket, harness=self.pc)
        self.kubelets.append(kp)
        times: Dict[str, List[float]] = {"direct": [], "proxy": []}

        proxied: Dict[str, float] = {}   # pod name -> client-measured seconds, via the proxy

        def one(kl: Any, tag: str) -> float:
            uid = str(uuid.uuid4())
            name = f"bench-{tag}-{uid[:8]}"
            cfg = kl.sandbox_config(name, namespace="bench", uid=uid,
                                    network="node", qos="burstable")
            # The kubelet creates the pod cgroup (cgroupfs driver) before RunPodSandbox; the
            # harness records it, so its cleanup removes it even after a crash.
            self.pc.make_pod_cgroup(cfg.linux.cgroup_parent)
            os.makedirs(cfg.log_directory, exist_ok=True)
            ccfg = kl.container_config("main", network="node")
            rt = kl.runtime
            # Only the three CRI calls are timed (no client-side bookkeeping inside).
            t0 = time.perf_counter()
            pod_id = rt.RunPodSandbox(pb.RunPodSandboxRequest(config=cfg), timeout=120).pod_sandbox_id
            kl.pods.append(Pod(id=pod_id, uid=uid, name=name, namespace="bench",
                               cgroup_parent=cfg.linux.cgroup_parent, network="node", config=cfg))
            cid = rt.CreateContainer(pb.CreateContainerRequest(
                pod_sandbox_id=pod_id, config=ccfg, sandbox_config=cfg), timeout=120).container_id
            kl.containers.append(cid)
            rt.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=120)
            took = time.perf_counter() - t0
            if tag == "proxy":
                proxied[name] = took
            return took

        log(f"pod start: 1 warm-up + {n} pods each way, interleaved")
        one(kd, "warm")
        one(kp, "warm")
        for i in range(n):
            order = (("direct", kd), ("proxy", kp)) if i % 2 == 0 else (("proxy", kp), ("direct", kd))
            for tag, kl in order:
                times[tag].append(one(kl, tag))
        d, p = statistics.median(times["direct"]), statistics.median(times["proxy"])
        paired = statistics.median(b / a for a, b in zip(times["direct"], times["proxy"]))
        self.results["pod_start"] = {
            "paired_ratio_median": paired,
            "n": n, "direct_median_ms": d * 1e3, "proxy_median_ms": p * 1e3,
            "direct_min_ms": min(times["direct"]) * 1e3, "proxy_min_ms": min(times["proxy"]) * 1e3,
            "ratio": p / d, "pods_running": len(kd.pods) + len(kp.pods)}
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

    # ---- 2. unary latency on the real containerd
    def latency_real(self) -> None:
        assert self.pc is not None and self.proxy_a is not None
        cd, cp = channel(self.pc.socket), channel(self.proxy_a.socket)
        self.channels += [cd, cp]
        reqs = requests()
        out = {}
        for m in ("Version", "Status", "ListContainers", "ListPodSandbox"):
            log(f"latency {m}: {self.cfg['lat_warmup']} warm-up + {self.cfg['lat_iters']} each way")
            d, p, cpu, rd, rp = interleaved(cd.unary_unary(RUNTIME + m), cp.unary_unary(RUNTIME + m),
                                            reqs[m], self.cfg["lat_iters"], self.cfg["lat_warmup"],
                                            self.proxy_a)
            s = lat_summary(d, p)
            s["reply_bytes"] = len(rd)
            s["proxy_cpu_us_per_call"] = cpu / len(p) * 1e6
            if m == "Version" and rd != rp:
                self.problems.append("Version reply through the proxy differs from direct")
            out[m] = s
        self.results["latency_real"] = out

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
        cd, cp = channel(sock), channel(self.proxy_b.socket)
        self.channels += [cd, cp]
        out = {}
        cases = [("ListContainers x1000", "ListContainers", lc1000),
                 ("ListPodSandbox x1000", "ListPodSandbox", lps1000),
                 ("ListContainers x5000", "ListContainers", lc5000)]
        for label, m, body in cases:
            self.fake.set_reply(RUNTIME + m, body)
            iters = self.cfg["fake_iters"][label]
            log(f"fake {label} ({len(body) / MIB:.2f} MiB): {iters} each way")
            d, p, cpu, rd, rp = interleaved(cd.unary_unary(RUNTIME + m), cp.unary_unary(RUNTIME + m),
                                            b"", iters, self.cfg["fake_warmup"], self.proxy_b)
            if rd != body or rp != body:
                self.problems.append(f"fake {label}: reply bytes differ (direct {len(rd)}, proxy {len(rp)},"
                                     f" sent {len(body)})")
            s = lat_summary(d, p)
            s["reply_bytes"] = len(body)
            s["proxy_cpu_us_per_call"] = cpu / len(p) * 1e6
            out[label] = s
        self.results["latency_fake"] = out
        self.results["proxy_b_rss_mb"] = self.proxy_b.rss_mb()

    # ---- 4. 16-way throughput
    def throughput(self) -> None:
        assert self.pc is not None and self.proxy_a is not None
        secs = self.cfg["tput_seconds"]
        out = {}
        for chans in self.cfg["tput_modes"]:
            tot = {"direct": [0, 0.0], "proxy": [0, 0.0]}
            errs = 0
            cpu = 0.0
            slices = max(2, int(round(secs / TPUT_SLICE_S)))
            log(f"throughput: 16 callers on {chans} channel(s), Version, {secs:.0f}s each way "
                f"in {slices} alternating slices")
            conns = {"direct": [channel(self.pc.socket) for _ in range(chans)],
                     "proxy": [channel(self.proxy_a.socket) for _ in range(chans)]}
            try:
                for way in ("direct", "proxy"):   # warm-up: threads, connections, caches
                    run_callers(conns[way], "Version", b"", 16, seconds=0.2)
                # D P P D D P P D ...: slow drift and bursts of other load hit both sides alike.
                for i in range(slices):
                    for way in (("direct", "proxy") if i % 2 == 0 else ("proxy", "direct")):
                        c0 = self.proxy_a.cpu()
                        n, el, e = run_callers(conns[way], "Version", b"", 16, seconds=secs / slices)
                        if way == "proxy":
                            cpu += self.proxy_a.cpu() - c0
                        tot[way][0] += n
                        tot[way][1] += el
                        errs += e
            finally:
                for ch in conns["direct"] + conns["proxy"]:
                    ch.close()
            d = tot["direct"][0] / tot["direct"][1]
            p = tot["proxy"][0] / tot["proxy"][1]
            out[f"{chans}ch"] = {"channels": chans, "direct_calls_s": d, "proxy_calls_s": p,
                                 "ratio": p / d, "errors": errs,
                                 "proxy_cpu_us_per_call": cpu / max(1, tot["proxy"][0]) * 1e6}
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

    # ---- report
    def machine(self) -> Dict[str, str]:
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
        return {"date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "nproc": str(os.cpu_count()),
                "cpu": cpu, "kernel": platform.release(), "python": platform.python_version(),
                "grpcio": grpc.__version__, "containerd": ctrd, "runc": runc,
                "mem_total_gb": f"{psutil.virtual_memory().total / 2**30:.1f}",
                "loadavg_at_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
                # CPU busy (all processes) over 1 s before anything of ours runs.
                "cpu_busy_before_pct": f"{psutil.cpu_percent(interval=1.0):.0f}"}


def render(r: Dict[str, Any]) -> str:
    L: List[str] = []
    mc = r["machine"]
    L.append(f"anolisnuma proxy benchmark ({r['mode']}) -- {mc['date']}")
    L.append(f"machine: nproc {mc['nproc']} ({mc['cpu']}), {mc['mem_total_gb']} GB, kernel {mc['kernel']}, "
             f"python {mc['python']}, grpcio {mc['grpcio']}, loadavg at start {mc['loadavg_at_start']}")
    L.append(f"runtime: {mc['containerd']}; {mc['runc']}")
    other = float(mc.get("other_cpu_pct_during_run", "0"))
    L.append(f"other load: processes not ours used {mc.get('other_cpu_pct_during_run', '?')} % of all CPUs during "
             f"the run (machine busy {mc.get('busy_cpu_pct_during_run', '?')} %); CPU busy "
             f"{mc.get('cpu_busy_before_pct')} % in the 1 s before and {mc.get('cpu_busy_after_pct')} % after"
             + ("  ** machine shared: figures are noisy **" if other > BUSY_WARN_PCT else ""))
    L.append("proxy: `python -m anolisnuma -c CONFIG` subprocess, no hooks ([qos]/[numa] enabled = false), "
             "env " + " ".join(f"{k}={v}" for k, v in PROXY_ENV.items()))
    L.append("clients: grpcio sync channels, raw-bytes calls (no client-side decode); "
             "direct and proxied calls interleaved call by call")
    L.append("")

    def row(cols: Sequence[str], widths: Sequence[int]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cols, widths))).rstrip()

    lr = r.get("latency_real")
    if lr:
        n = next(iter(lr.values()))["n"]
        running = r.get("pod_start", {}).get("pods_running")
        L.append(f"1. Unary latency, real containerd ({n} calls each way after warm-up; µs"
                 + (f"; {running} pods with one container each running)" if running else ")"))
        w = (16, 7, 9, 9, 9, 9, 9, 7, 9, 9, 26)
        L.append(row(("call", "bytes", "dir p50", "dir p99", "prx p50", "prx p99", "add p50", "x p50",
                      "add p99", "cpu/call", "target"), w))
        for m, s in lr.items():
            if m in ("Version", "Status"):
                tgt = f"add p50 <= {T_ADDED_P50_US:.0f} {verdict(s['added_p50_us'] <= T_ADDED_P50_US)}" + \
                      f" (goal {T_ADDED_GOAL_US:.0f}: {verdict(s['added_p50_us'] <= T_ADDED_GOAL_US)})"
            else:
                tgt = "-"
            L.append(row((m, str(s["reply_bytes"]), f"{s['direct_p50_us']:.0f}", f"{s['direct_p99_us']:.0f}",
                          f"{s['proxy_p50_us']:.0f}", f"{s['proxy_p99_us']:.0f}", f"{s['added_p50_us']:+.0f}",
                          f"{s['ratio_p50']:.2f}", f"{s['added_p99_us']:+.0f}",
                          f"{s['proxy_cpu_us_per_call']:.0f}", tgt), w))
        L.append("")
    lf = r.get("latency_fake")
    if lf:
        L.append("2. Big lists, fake CRI backend (direct to the fake vs proxy B in front of it; ms)")
        w = (29, 5, 8, 8, 8, 8, 8, 6, 6, 9, 18)
        L.append(row(("call", "MiB", "dir p50", "dir p99", "prx p50", "prx p99", "add p50", "x p50", "x p99",
                      "cpu/call", "target"), w))
        for label, s in lf.items():
            L.append(row((f"{label} (n={s['n']})", f"{s['reply_bytes'] / MIB:.2f}",
                          f"{s['direct_p50_us'] / 1e3:.2f}", f"{s['direct_p99_us'] / 1e3:.2f}",
                          f"{s['proxy_p50_us'] / 1e3:.2f}", f"{s['proxy_p99_us'] / 1e3:.2f}",
                          f"{s['added_p50_us'] / 1e3:+.2f}", f"{s['ratio_p50']:.2f}", f"{s['ratio_p99']:.2f}",
                          f"{s['proxy_cpu_us_per_call'] / 1e3:.2f}ms",
                          f"x p50 <= {T_LIST_RATIO} {verdict(s['ratio_p50'] <= T_LIST_RATIO)}"), w))
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
        L.append("")
    tp = r.get("throughput")
    if tp:
        L.append("4. Throughput, 16 concurrent callers (threads), Version, real containerd")
        for k, s in tp.items():
            L.append(f"   {s['channels']:>2} channel(s): direct {s['direct_calls_s']:.0f}/s, proxy "
                     f"{s['proxy_calls_s']:.0f}/s = {s['ratio'] * 100:.0f} % (proxy CPU "
                     f"{s['proxy_cpu_us_per_call']:.0f} µs/call)   target >= {T_TPUT_RATIO * 100:.0f} % "
                     f"{verdict(s['ratio'] >= T_TPUT_RATIO)}")
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
    args = ap.parse_args(argv)
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
    b = Bench(args.quick)
    b.results["mode"] = "quick" if args.quick else "full"
    b.results["command"] = " ".join(["scripts/bench_proxy.py"] + (argv if argv is not None else sys.argv[1:]))
    b.results["machine"] = b.machine()
    rc = 0
    try:
        b.setup()
        b.pod_start()
        b.latency_real()
        b.throughput()
        b.rss()
        b.latency_fake()
    except KeyboardInterrupt:
        log("interrupted; cleaning up")
        rc = 130
    except Exception as e:
        log(f"benchmark failed: {e!r}")
        for p in (b.proxy_a, b.proxy_b):
            if p is not None:
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
