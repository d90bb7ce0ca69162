#!/usr/bin/env python3
"""Churn soak: pod lifecycles through the proxy on the real containerd, and what the daemon
keeps of them.

    sudo .venv/bin/python scripts/bench_churn.py [--quick] [--lifecycles N] [--every K]
                                                 [--proxy-tree DIR] [--json FILE]

Needs root, containerd/runc/ctr (scripts/install-deps.sh) and the test extras (grpcio,
psutil, container-runtime-interface-api). It starts, and always removes again, a private
containerd (``PrivateContainerd``, no CNI: pods use the node's network) under
/tmp/anolisnuma-churn-<pid> and /run/anolisnuma-churn-<pid>, and the daemon as a subprocess
in front of it with every policy on: QoS on a fake kernel tree (cgroup v1 with the Anolis
files, /proc, Intel resctrl; the soak makes the fake pod and container cgroups as the
kubelet and runc make the real ones), NUMA over a fake 2-node topology of this machine's
CPUs (real cpusets; memory pinning off), traffic affinity every second, the metrics
endpoint and the admin socket, and ``[runtime] resync_interval_seconds`` short (3 s) so
that the resync finds what is gone during the run and at its end.

Four callers share one connection to the proxy, as the kubelet does, and run N lifecycles
(RunPodSandbox, CreateContainer, StartContainer, StopContainer, RemoveContainer,
StopPodSandbox, RemovePodSandbox), of which a share has its teardown lost (StopPodSandbox
and RemovePodSandbox sent straight to containerd) and a share a RunPodSandbox that fails
(an unknown runtime handler) and is never retried. Every K lifecycles it prints the
daemon's RSS, fds, threads, state file sizes, metrics series and the size of every
structure it keeps per pod (``anolisnuma-ctl status -o json``, section ``structures``); at
the end, the slope of each per 1,000 lifecycles after the warm-up, and, after two more
resyncs with no call, whether every structure is back to empty.

``--proxy-tree DIR`` runs the daemon of another source tree instead (e.g. ``git archive
COMMIT | tar -x -C DIR``): a tree without the ``structures`` section reports what its
status, ``pods`` and ``numa`` show (the journal's pods, the store, the NUMA allocations).
``--quick`` runs 150 lifecycles (about a minute) for CI smoke use. The exit code is 0 even
when a target is missed (it is a benchmark, not a test); 1 when the soak could not run,
130 when interrupted. The daemon's log is kept at /tmp/anolisnuma-churn-last-daemon.log. ``tests/e2e/test_churn_e2e.py`` runs a short soak with this code.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import grpc  # noqa: E402
import psutil  # noqa: E402

from bench_proxy import REPO, ProxyProc, log, machine, numa_nodes, tree_commit  # noqa: E402
from cri_client import KubeletLike, pb, pbg  # noqa: E402  (bench_proxy put tests/e2e on the path)

from anolisnuma.testing.containerd import PrivateContainerd, cleanup_dead_instances  # noqa: E402
from anolisnuma.testing.fake_kernel import FakeKernel  # noqa: E402
from anolisnuma.testing.fake_sysfs import GIB, FakeTopology  # noqa: E402
from anolisnuma.testing.waiting import wait_until  # noqa: E402

BASE_PREFIX = "/tmp/anolisnuma-churn-"
RUN_PREFIX = "/run/anolisnuma-churn-"
STATUS_POLL = 0.2   # seconds between two waits' looks at `anolisnuma-ctl status` (a process each)
LAST_LOG = "/tmp/anolisnuma-churn-last-daemon.log"
NS = "churn"                        # the namespace NUMA manages
BAD_HANDLER = "churn-no-such-runtime-handler"
QOS_LEVELS = ("BE", "LS", "LSR", "LSE")

# Targets. RSS: the issue measured +0.15 MB per 1,000 lifecycles once warm.
T_RSS_SLOPE_MB = 0.5                # per 1,000 lifecycles, after the warm-up
T_FLAT_SLOPE = 0.5                  # fds, threads, metrics series per 1,000 lifecycles


@dataclass
class SoakPlan:
    lifecycles: int = 3000
    every: int = 250                # a checkpoint every this many lifecycles
    callers: int = 4
    lost_every: int = 15            # every 15th lifecycle's pod teardown goes behind the proxy's back
    failed_every: int = 50          # every 50th RunPodSandbox fails (never retried)
    resync_seconds: float = 3.0
    warmup: float = 0.2             # share of the lifecycles left out of the slopes

    def kind(self, i: int) -> str:
        if i % self.failed_every == self.failed_every // 2:
            return "failed"
        if i % self.lost_every == self.lost_every // 3:
            return "lost"
        return "normal"


QUICK = SoakPlan(lifecycles=150, every=50)


@dataclass
class Sample:
    lifecycles: int
    seconds: float
    rss_mb: float
    fds: int
    threads: int
    state_bytes: Dict[str, int]
    metrics_series: int
    structures: Dict[str, int]        # "holder.structure" -> count

    def row(self) -> Dict[str, Any]:
        return {"lifecycles": self.lifecycles, "seconds": round(self.seconds, 1), "rss_mb": round(self.rss_mb, 2),
                "fds": self.fds, "threads": self.threads, **{f"{k}_bytes": v for k, v in self.state_bytes.items()},
                "metrics_series": self.metrics_series, **self.structures}


@dataclass
class Outcome:
    samples: List[Sample] = field(default_factory=list)
    final: Optional[Sample] = None     # after the resyncs that followed the last call
    kinds: Dict[str, int] = field(default_factory=dict)
    problems: List[str] = field(default_factory=list)
    seconds: float = 0.0

    def slope(self, key: Callable[[Sample], float], warmup: float) -> float:
        """Least-squares slope of ``key`` per 1,000 lifecycles over the samples after the
        warm-up (0 with fewer than two)."""
        last = self.samples[-1].lifecycles if self.samples else 0
        pts = [(s.lifecycles, key(s)) for s in self.samples if s.lifecycles >= warmup * last]
        if len(pts) < 2:
            return 0.0
        mx = sum(x for x, _ in pts) / len(pts)
        my = sum(y for _, y in pts) / len(pts)
        var = sum((x - mx) ** 2 for x, _ in pts)
        return 1000 * sum((x - mx) * (y - my) for x, y in pts) / var if var else 0.0

    def not_empty(self) -> Dict[str, int]:
        """The structures still holding something after the final resyncs."""
        return {k: v for k, v in (self.final.structures if self.final else {}).items() if v}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ChurnSoak:
    """The daemon in front of ``pc`` with every policy on, the callers, the samples. Use
    :meth:`start`, :meth:`run`, :meth:`stop` (also on failure)."""

    def __init__(self, pc: PrivateContainerd, workdir: str, plan: SoakPlan, tree: str = REPO) -> None:
        self.pc = pc
        self.plan = plan
        self.tree = tree
        self.work = workdir
        os.makedirs(workdir, exist_ok=True)
        self.kernel = FakeKernel(os.path.join(workdir, "fakehost"), cgroup_version=1, vendor="intel", resctrl={})
        nodes = numa_nodes()
        FakeTopology(name="2n-churn", node_cpus=nodes, distances=[[10, 20], [20, 10]],
                     memory_bytes={0: 2 * GIB, 1: 2 * GIB}).write(self.kernel.paths.sys_root)
        self.admin_socket = os.path.join(workdir, "admin.sock")
        self.metrics_url = ""
        self.daemon: Optional[ProxyProc] = None
        self.channel: Optional[grpc.Channel] = None
        self.direct: Optional[grpc.Channel] = None
        self.kl: Optional[KubeletLike] = None      # config builders, on the proxy's connection
        self.outcome = Outcome()
        self._lock = threading.Lock()
        self._next = 0
        self._done = 0
        self._t0 = 0.0

    # ---------------------------------------------------------------- the daemon
    def config(self, metrics_port: int) -> Dict[str, Any]:
        p = self.kernel.paths
        return {
            "runtime": {"endpoint": self.pc.socket, "resync_interval_seconds": self.plan.resync_seconds},
            "paths": {"cgroup_root": p.cgroup_root, "resctrl_root": p.resctrl_root, "sys_root": p.sys_root,
                      "proc_root": p.proc_root, "kubelet_cpu_manager_state": p.kubelet_cpu_manager_state},
            # No QoS reconciler: its "cgroup gone" check would hide state that nothing else frees.
            "qos": {"enabled": True, "reconcile_interval_seconds": 0.0},
            "numa": {"enabled": True, "namespaces": [NS], "memory_pinning": "off", "poll_interval_seconds": 1.0,
                     "affinity": {"enabled": True, "interval_seconds": 1.0}},
            "admin": {"socket": self.admin_socket},
            "metrics": {"listen": f"127.0.0.1:{metrics_port}"},
        }

    def start(self) -> None:
        port = free_port()
        self.metrics_url = f"http://127.0.0.1:{port}/metrics"
        self.daemon = ProxyProc("daemon", self.work, self.pc.socket, tree=self.tree, config=self.config(port))
        self.daemon.start()
        if not self.daemon.wait_log("background loop started", 30):
            raise RuntimeError(f"the daemon did not start its loops: {self.daemon.tail()}")
        wait_until(lambda: self.status().get("resynced"), "the start-up resync", 30, STATUS_POLL)
        self.channel = grpc.insecure_channel(f"unix://{self.daemon.socket}")
        self.direct = grpc.insecure_channel(f"unix://{self.pc.socket}")
        self.kl = KubeletLike(self.daemon.socket, harness=self.pc)
        self.kl.channel.close()       # only its builders are used; the calls share self.channel

    def stop(self) -> None:
        for ch in (self.channel, self.direct):
            if ch is not None:
                ch.close()
        if self.daemon is not None:
            rc = self.daemon.stop()
            if rc not in (0, None):
                self.outcome.problems.append(f"daemon exited with {rc} on SIGTERM")
        self.kernel.close()

    def ctl(self, *args: str) -> Any:
        """``anolisnuma-ctl -o json ARGS`` of the daemon's tree, as an operator runs it."""
        assert self.daemon is not None
        r = subprocess.run([sys.executable, "-m", "anolisnuma.ctl.main", "--admin-socket", self.admin_socket,
                            "-o", "json"] + list(args), cwd=self.tree, env=self.daemon.env(),
                           capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise RuntimeError(f"anolisnuma-ctl {' '.join(args)}: {r.stderr.strip()}")
        return json.loads(r.stdout)

    def status(self) -> Dict[str, Any]:
        return self.ctl("status")

    def structures(self, status: Dict[str, Any]) -> Dict[str, int]:
        """Every per-pod structure's size, flat ("journal.pods"); for a tree whose status has
        no ``structures``, what its status, ``pods`` and ``numa`` show."""
        if "structures" in status:
            return {f"{holder}.{k}": n for holder, sizes in status["structures"].items() for k, n in sizes.items()}
        pods = self.ctl("pods")
        return {"store.pods": len(pods), "store.containers": sum(len(p["containers"]) for p in pods),
                "journal.pods": status.get("journal_pods", 0), "numa.allocations": self.ctl("numa")["allocations"]}

    def sample(self) -> Sample:
        assert self.daemon is not None and self.daemon.ps is not None
        ps = self.daemon.ps
        state_dir = os.path.join(self.daemon.dir, "state")
        sizes = {}
        for name in ("store.json", "numa.json"):
            try:
                sizes[name.split(".")[0]] = os.path.getsize(os.path.join(state_dir, name))
            except OSError:
                sizes[name.split(".")[0]] = 0
        with urllib.request.urlopen(self.metrics_url, timeout=10) as r:
            series = sum(1 for line in r.read().decode().splitlines() if line and not line.startswith("#"))
        status = self.status()
        return Sample(self._done, time.monotonic() - self._t0, ps.memory_info().rss / 2 ** 20, ps.num_fds(),
                      ps.num_threads(), sizes, series, self.structures(status))

    # ---------------------------------------------------------------- the lifecycles
    def run(self, report: Callable[[Sample], None] = lambda s: None) -> Outcome:
        """Run the plan; sample every ``plan.every`` lifecycles (``report`` is shown each),
        then wait for two resyncs after the last call and for every structure to be empty."""
        self._t0 = time.monotonic()
        first = self.sample()
        self.outcome.samples.append(first)
        report(first)
        callers = [threading.Thread(target=self._caller, args=(report,), name=f"caller-{n}")
                   for n in range(self.plan.callers)]
        for t in callers:
            t.start()
        for t in callers:
            t.join()
        self.outcome.seconds = time.monotonic() - self._t0
        if self.outcome.samples[-1].lifecycles != self._done:
            last = self.sample()
            self.outcome.samples.append(last)
            report(last)
        self.outcome.final = self._after_resyncs()
        return self.outcome

    def _caller(self, report: Callable[[Sample], None]) -> None:
        rt = pbg.RuntimeServiceStub(self.channel)
        direct = pbg.RuntimeServiceStub(self.direct)
        while True:
            with self._lock:
                i = self._next
                if i >= self.plan.lifecycles:
                    return
                self._next += 1
            kind = self.plan.kind(i)
            try:
                self.lifecycle(i, kind, rt, direct)
            except Exception as e:   # counted; the soak goes on
                with self._lock:
                    self.outcome.problems.append(f"lifecycle {i} ({kind}): {e!r}"[:300])
            with self._lock:
                self._done += 1
                self.outcome.kinds[kind] = self.outcome.kinds.get(kind, 0) + 1
                checkpoint = self._done % self.plan.every == 0
            if checkpoint:
                s = self.sample()
                with self._lock:
                    self.outcome.samples.append(s)
                report(s)

    def lifecycle(self, i: int, kind: str, rt: Any, direct: Any) -> None:
        """One pod as the kubelet runs it (its cgroups made and removed around the calls,
        the fake ones for the QoS hook beside the real ones for runc)."""
        assert self.kl is not None
        uid = str(uuid.uuid4())
        qos = "besteffort" if i % 3 == 0 else "burstable"
        cfg = self.kl.sandbox_config(f"churn-{i}", namespace=NS, uid=uid, network="node", qos=qos,
                                     annotations={"anolisbox.sh/qoslevel": QOS_LEVELS[i % len(QOS_LEVELS)]})
        parent = cfg.linux.cgroup_parent
        self.pc.make_pod_cgroup(parent)
        pod_rel = self.kernel.make_pod(parent).rel
        os.makedirs(cfg.log_directory, exist_ok=True)
        sid = ""
        try:
            if kind == "failed":
                try:
                    rt.RunPodSandbox(pb.RunPodSandboxRequest(config=cfg, runtime_handler=BAD_HANDLER), timeout=60)
                except grpc.RpcError:
                    return
                raise RuntimeError(f"a RunPodSandbox with runtime handler {BAD_HANDLER!r} succeeded")
            sid = rt.RunPodSandbox(pb.RunPodSandboxRequest(config=cfg), timeout=120).pod_sandbox_id
            res = self.kl.resources(cpu_shares=102 + 100 * (i % 4), cpu_period=100000)
            ccfg = self.kl.container_config("app", res, network="node")
            cid = rt.CreateContainer(pb.CreateContainerRequest(pod_sandbox_id=sid, config=ccfg, sandbox_config=cfg),
                                     timeout=120).container_id
            ctr_rel = self.kernel.make_container(parent, cid)
            rt.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=120)
            rt.StopContainer(pb.StopContainerRequest(container_id=cid, timeout=2), timeout=60)
            self.kernel.cgroup.remove(ctr_rel)       # runc removes the container's cgroup
            rt.RemoveContainer(pb.RemoveContainerRequest(container_id=cid), timeout=60)
            teardown = direct if kind == "lost" else rt
            teardown.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid), timeout=60)
            teardown.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid), timeout=60)
            sid = ""
        finally:
            if sid:   # a call failed half-way: the pod goes anyway (behind the proxy's back)
                for call, req in ((direct.StopPodSandbox, pb.StopPodSandboxRequest(pod_sandbox_id=sid)),
                                  (direct.RemovePodSandbox, pb.RemovePodSandboxRequest(pod_sandbox_id=sid))):
                    try:
                        call(req, timeout=60)
                    except grpc.RpcError:
                        pass
            self.kernel.cgroup.remove(pod_rel)
            self.pc.remove_pod_cgroup(parent)
            shutil.rmtree(cfg.log_directory, ignore_errors=True)

    # ---------------------------------------------------------------- the end
    def _after_resyncs(self) -> Sample:
        """Two resync passes with no call in between (the windows of what calls named turn
        twice), then every structure empty, each wait bounded by resync intervals."""
        interval = self.plan.resync_seconds
        runs = self._resync_runs()
        wait_until(lambda: self._resync_runs() >= runs + 2, "two resyncs after the last call", 10 * interval + 30,
                   STATUS_POLL)
        try:
            wait_until(lambda: not any(self.structures(self.status()).values()), "every structure to be empty",
                       4 * interval + 10, STATUS_POLL)
            # and the state files written (the writers gather half a second of changes: one
            # still writing holds its temporary file open, which is not a leak)
            wait_until(lambda: not any(c.get("dirty") for c in (self.status().get("controllers") or {}).values()),
                       "the state files written", 30, STATUS_POLL)
        except AssertionError as e:   # the wait's deadline: a finding of the soak, not a crash
            self.outcome.problems.append(str(e))
        return self.sample()

    def _resync_runs(self) -> int:
        return int((self.status().get("controllers") or {}).get("runtime-resync", {}).get("runs", 0))


# --------------------------------------------------------------------------- the report

def render(outcome: Outcome, plan: SoakPlan) -> Tuple[str, Dict[str, Any]]:
    """The table of samples, the slopes and the verdicts, as text and as data."""
    rows = [s.row() for s in outcome.samples + ([outcome.final] if outcome.final else [])]
    keys = list(rows[0]) if rows else []
    for r in rows[1:]:
        keys += [k for k in r if k not in keys]
    widths = {k: max(len(k), *(len(str(r.get(k, ""))) for r in rows)) for k in keys}
    lines = ["  ".join(k.rjust(widths[k]) for k in keys)]
    for n, r in enumerate(rows):
        label = "  <- after the final resyncs" if outcome.final is not None and n == len(rows) - 1 else ""
        lines.append("  ".join(str(r.get(k, "")).rjust(widths[k]) for k in keys) + label)
    w = plan.warmup
    slopes = {"rss_mb": outcome.slope(lambda s: s.rss_mb, w), "fds": outcome.slope(lambda s: s.fds, w),
              "threads": outcome.slope(lambda s: s.threads, w),
              "metrics_series": outcome.slope(lambda s: s.metrics_series, w)}
    for name in ("store", "numa"):
        slopes[f"{name}_bytes"] = outcome.slope(lambda s, n=name: s.state_bytes.get(n, 0), w)
    for k in (outcome.samples[-1].structures if outcome.samples else {}):
        slopes[k] = outcome.slope(lambda s, k=k: s.structures.get(k, 0), w)
    left = outcome.not_empty()
    verdicts = {
        "every structure empty after the final resyncs": (not left and outcome.final is not None,
                                                          ", ".join(f"{k}={v}" for k, v in left.items()) or "all 0"),
        f"RSS slope <= {T_RSS_SLOPE_MB} MB / 1,000 after warm-up": (slopes["rss_mb"] <= T_RSS_SLOPE_MB,
                                                                  f"{slopes['rss_mb']:+.3f} MB"),
        f"fds, threads, metrics series flat (|slope| <= {T_FLAT_SLOPE} / 1,000)": (
            all(abs(slopes[k]) <= T_FLAT_SLOPE for k in ("fds", "threads", "metrics_series")),
            ", ".join(f"{k} {slopes[k]:+.2f}" for k in ("fds", "threads", "metrics_series"))),
    }
    lines += ["", f"{sum(outcome.kinds.values())} lifecycles in {outcome.seconds:.0f} s "
                  f"({', '.join(f'{n} {k}' for k, n in sorted(outcome.kinds.items()))}); "
                  f"slopes per 1,000 lifecycles after the first {w:.0%}:",
              "  " + ", ".join(f"{k} {v:+.3g}" for k, v in slopes.items())]
    lines += [f"{'PASS' if ok else 'MISS'}  {what}: {detail}" for what, (ok, detail) in verdicts.items()]
    if outcome.problems:
        lines += ["problems:"] + [f"  {p}" for p in outcome.problems[:20]]
    data = {"samples": rows, "slopes_per_1000": slopes, "kinds": outcome.kinds, "seconds": outcome.seconds,
            "verdicts": {k: {"pass": ok, "detail": d} for k, (ok, d) in verdicts.items()},
            "left_after_resyncs": left, "problems": outcome.problems}
    return "\n".join(lines), data


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help=f"{QUICK.lifecycles} lifecycles, for CI smoke use")
    ap.add_argument("--lifecycles", type=int, default=0, help=f"how many (default {SoakPlan.lifecycles})")
    ap.add_argument("--every", type=int, default=0, help="a checkpoint every this many lifecycles")
    ap.add_argument("--proxy-tree", metavar="DIR", default="", help="run the daemon of this source tree instead")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_churn: needs root (containerd, cgroups, mounts)", file=sys.stderr)
        return 1
    if pb is None:
        print("bench_churn: needs the CRI stubs (container-runtime-interface-api)", file=sys.stderr)
        return 1
    plan = dataclasses.replace(QUICK if args.quick else SoakPlan())
    if args.lifecycles:
        plan.lifecycles = args.lifecycles
    if args.every:
        plan.every = args.every
    tree = os.path.abspath(args.proxy_tree) if args.proxy_tree else REPO

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    results: Dict[str, Any] = {"command": " ".join(["scripts/bench_churn.py"] + (argv if argv is not None else sys.argv[1:])),
                               "machine": machine(), "tree": tree, "commit": tree_commit(tree), "plan": plan.__dict__}
    left = cleanup_dead_instances(BASE_PREFIX, RUN_PREFIX)
    if left:
        log(f"cleaned leftovers of crashed runs: {left}")
    base, run = f"{BASE_PREFIX}{os.getpid()}", f"{RUN_PREFIX}{os.getpid()}"
    pc = PrivateContainerd(base, run, cni=False)
    soak: Optional[ChurnSoak] = None
    rc = 0
    try:
        log(f"starting private containerd under {base}")
        pc.write_config()
        pc.start()
        pc.import_images()
        soak = ChurnSoak(pc, os.path.join(base, "soak"), plan, tree)
        soak.start()
        log(f"daemon pid {soak.daemon.proc.pid} from {tree} ({results['commit'] or 'not a git tree'}); "
            f"{plan.lifecycles} lifecycles, {plan.callers} callers on one connection")
        outcome = soak.run(lambda s: log(" ".join(f"{k}={v}" for k, v in s.row().items())))
        text, data = render(outcome, plan)
        results.update(data)
        print(text)
    except KeyboardInterrupt:
        log("interrupted; cleaning up")
        rc = 130
    except Exception as e:
        log(f"soak failed: {e!r}")
        if soak is not None and soak.daemon is not None:
            log(f"daemon log tail:\n{soak.daemon.tail()}")
        rc = 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if soak is not None:
            soak.stop()
            if soak.daemon is not None:
                results["daemon_log"] = soak.daemon.log_problems()
                try:   # kept: the base directory goes
                    shutil.copyfile(soak.daemon.log_path, LAST_LOG)
                    results["daemon_log"]["kept_at"] = LAST_LOG
                except OSError:
                    pass
                problems = results["daemon_log"]["problems"]
                if problems:
                    print("daemon warnings and errors: " + "; ".join(f"{n}x {k}" for k, n in problems.items()))
        left = pc.cleanup()
        if left:
            log(f"containerd cleanup problems: {left}")
        shutil.rmtree(base, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
    return rc


if __name__ == "__main__":
    sys.exit(main())
