#!/usr/bin/env python3
"""The cluster side measured: a daemon (subprocess) with ``[kubernetes]`` on against a
private real kube-apiserver, FakeCri as containerd, NUMA on a fake 4-node topology.

- ``rss``: the daemon's resident memory with ``[kubernetes]`` off, and on once it has
  listed ``--crs`` CRs (default 1,000) that all name its node, made their rules and
  written their status entries;
- ``flood``: ``--events`` spec changes (default 10,000) to those CRs from 8 threads: the
  daemon's CPU per watch event and its RSS after; then half as many again while Version
  is called through the proxy, alternately on this daemon and on one with ``[kubernetes]``
  off beside it (the same machine, as loaded by the API server, etcd and the writers), p50/p99;
- ``latency``: ``--runs`` times (default 20) a CR re-pinning a running pod is applied with
  ``kubectl apply``; the time until containerd (FakeCri) is asked for the new cpuset, from
  the start of ``kubectl apply`` and from its return (p50/p99).

    python3 scripts/bench_cluster.py [--crs 1000] [--events 10000] [--runs 20] [--py-spy OUT]
    python3 scripts/bench_cluster.py --hostile [--hostile-seconds 60] [--hostile-rounds 300]

``--hostile`` (``bench_hostile.py``): CRs at the node's caps and over them, Version p99 and
CreateContainer time through the proxy while they are applied and once they are in force,
against a baseline taken before them in the same run (and against a daemon with
``[kubernetes]`` off beside it, under the same load).

``--py-spy OUT``: the flood's first part is sampled in the daemon by py-spy (on PATH; not a
dependency of the project), every thread, into OUT (py-spy's "raw" format: one line per
stack, folded, with its count; sort by count, or feed it to a flame graph tool).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from anolisnuma.ctl.client import CtlError, ask  # noqa: E402
from anolisnuma.testing.fake_cri import FakeCri  # noqa: E402
from anolisnuma.testing.fake_sysfs import GIB, FakeTopology  # noqa: E402
from anolisnuma.testing.kube_apiserver import PrivateControlPlane  # noqa: E402
from anolisnuma.testing.kubelet_client import Kubelet, sent_cpusets  # noqa: E402
from anolisnuma.testing.proxy import SubprocessProxy, config_dict  # noqa: E402
from anolisnuma.testing.waiting import wait_until  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
G, V = "resource.sop.huawei.com", "v1alpha1"
NODE = "bench-node"
WAIT_SECONDS = 300.0   # a wait's deadline unless said: thousands of CRs take a while
POLL = 0.01            # between a wait's looks: the resolution of the times it measures
TOPOLOGY = FakeTopology(name="4x4", node_cpus={0: "0-3", 1: "4-7", 2: "8-11", 3: "12-15"},
                        distances=[[10, 20, 20, 20], [20, 10, 20, 20], [20, 20, 10, 20], [20, 20, 20, 10]],
                        memory_bytes={n: 8 * GIB for n in range(4)})


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> Dict[str, float]:
    """CPU seconds per thread name (the loops' threads are named after them)."""
    out: Dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def pct(values: List[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


class Daemon:
    def __init__(self, base: str, fake: FakeCri, kubeconfig: str, **kubernetes: Any) -> None:
        self.admin = os.path.join(base, "admin.sock")
        data = config_dict(base, fake.socket_path, listen=os.path.join(base, "cri.sock"), extra={
            "log": {"stderr": False},
            "admin": {"socket": self.admin},
            "runtime": {"resync_interval_seconds": 0.0},
            "numa": {"enabled": True, "namespaces": ["bench"], "node_name": NODE, "memory_pinning": "strict",
                     "poll_interval_seconds": 1.0},
            "kubernetes": dict({"kubeconfig": kubeconfig}, **kubernetes) if kubeconfig else {},
        })
        TOPOLOGY.write(data["paths"]["sys_root"])
        self.proxy = SubprocessProxy(data, base).start()
        self.pid = self.proxy.proc.pid
        self.kubelet = Kubelet(self.proxy.address)

    def cluster(self) -> Dict[str, Any]:
        try:
            return ask(self.admin, "status", {}, timeout=30)["cluster"] or {}
        except CtlError:   # (the admin socket comes up after the CRI socket)
            return {}

    def rules_passes(self) -> int:
        return ask(self.admin, "status", {}, timeout=30)["controllers"]["cluster-rules"]["runs"]

    def version_latencies(self, n: int) -> List[float]:
        out = []
        for _ in range(n):
            t = time.perf_counter()
            self.kubelet.version()
            out.append((time.perf_counter() - t) * 1e6)
        return out

    def stop(self) -> None:
        self.kubelet.close()
        self.proxy.stop()


def cr(i: int, numa: int, pod: str) -> Dict[str, Any]:
    return {"apiVersion": f"{G}/{V}", "kind": "Oenuma", "metadata": {"name": f"cr-{i}", "namespace": "bench"},
            "spec": {"node": [{"name": NODE, "podAffinity": [{"podName": pod, "numaNum": numa}]}]}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--crs", type=int, default=1000)
    ap.add_argument("--events", type=int, default=10000)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--py-spy", default="", metavar="OUT", help="sample the daemon during the flood into OUT")
    ap.add_argument("--hostile", action="store_true", help="CRs at the caps and over them (bench_hostile.py)")
    ap.add_argument("--hostile-seconds", type=float, default=60.0, help="how long the CRs are applied again")
    ap.add_argument("--no-pin", dest="pin", action="store_false",
                    help="--hostile: leave the control plane on the node's CPUs (bench_hostile.py)")
    ap.add_argument("--hostile-rounds", type=int, default=300,
                    help="rounds (10 Versions, 1 CreateContainer) before the CRs and once they are in force")
    args = ap.parse_args()
    base = tempfile.mkdtemp(prefix="anolisnuma-bench-cluster-")
    # etcd on tmpfs: its fsyncs would slow the daemons' own state writes on this disk, which
    # a node does not share with the control plane
    cp = PrivateControlPlane.start_new(parent="/dev/shm" if args.hostile and args.pin else "/tmp")
    fake = FakeCri(os.path.join(base, "containerd.sock"), containers=0, sandboxes=0).start()
    try:
        cp.kubectl("apply", "-f", os.path.join(REPO, "deploy", "crd-oenuma.yaml"))
        cp.kubectl("wait", "--for=condition=Established", f"crd/oenumas.{G}")
        cp.kubectl("create", "namespace", "bench")
        plain = Daemon(os.path.join(base, "off"), fake, "")
        try:
            time.sleep(2)   # settle: what the daemon allocates at start is done
            rss_off = rss(plain.pid)
            if args.hostile:
                from bench_hostile import run_hostile

                run_hostile(cp, fake, args, base, plain, Daemon, cpu_seconds)
            else:
                run_on(cp, fake, args, base, plain, rss_off)
        finally:
            plain.stop()
    finally:
        fake.stop(0)
        cp.close()
        shutil.rmtree(base, ignore_errors=True)


def run_on(cp: PrivateControlPlane, fake: FakeCri, args: argparse.Namespace, base: str, plain: Daemon,
           rss_off: int) -> None:
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: cp.request("POST", f"/apis/{G}/{V}/namespaces/bench/oenumas",
                                           cr(i, i % 4, f"bench-{i}")), range(args.crs)))
    d = Daemon(os.path.join(base, "on"), fake, cp.admin_kubeconfig)
    try:
        measure(d, cp, fake, args, rss_off, plain)
    finally:
        d.stop()


def measure(d: Daemon, cp: PrivateControlPlane, fake: FakeCri, args: argparse.Namespace, rss_off: int,
            plain: Daemon) -> None:
    ctx = cp.ssl_context()
    t0 = time.monotonic()
    wait_until(lambda: len(d.cluster().get("rules") or []) == args.crs, "every CR's rules", WAIT_SECONDS, POLL)
    t_rules = time.monotonic() - t0
    wait_until(lambda: d.cluster().get("status_writes", 0) >= args.crs, "every CR's status entry", WAIT_SECONDS,
               POLL)
    t_status = time.monotonic() - t0
    time.sleep(2)
    rss_on = rss(d.pid)
    print(f"rss: off {rss_off / 1e6:.1f} MB, on with {args.crs} CRs naming the node {rss_on / 1e6:.1f} MB "
          f"(+{(rss_on - rss_off) / 1e6:.1f} MB); rules in force {t_rules:.1f} s, statuses written {t_status:.1f} s "
          "after start")

    before = d.version_latencies(200)
    c0 = d.cluster()
    events0, writes0, cpu0 = c0["events"], c0["status_writes"], cpu_seconds(d.pid)
    threads0 = thread_cpu(d.pid)
    passes0 = d.rules_passes()

    def patch(i: int) -> None:
        req = urllib.request.Request(f"{cp.server}/apis/{G}/{V}/namespaces/bench/oenumas/cr-{i % args.crs}",
                                     data=json.dumps({"spec": {"replicas": i + 1}}).encode(), method="PATCH",
                                     headers={"Content-Type": "application/merge-patch+json"})
        urllib.request.urlopen(req, context=ctx, timeout=60).read()
    spy = None
    if args.py_spy:
        spy = subprocess.Popen(["py-spy", "record", "--pid", str(d.pid), "--format", "raw", "--output", args.py_spy,
                                "--rate", "250", "--threads", "--nonblocking"], stdout=subprocess.DEVNULL)
        time.sleep(1)   # (attached)
    with ThreadPoolExecutor(8) as pool:     # the daemon's CPU per event: no CRI call meanwhile
        list(pool.map(patch, range(args.events)))
    last = int(cp.request("GET", f"/apis/{G}/{V}/namespaces/bench/oenumas/cr-0")["metadata"]["resourceVersion"])
    wait_until(lambda: int(d.cluster()["resource_version"] or 0) >= last, "the last change watched", 600, POLL)
    wait_until(lambda: not d.cluster().get("status_failures") and d.cluster()["status_writes"] > writes0,
               "the statuses written", WAIT_SECONDS, POLL)
    time.sleep(1)
    if spy is not None:
        spy.send_signal(2)   # (SIGINT: py-spy writes what it sampled)
        spy.wait(60)
    c1 = d.cluster()
    events, writes = c1["events"] - events0, c1["status_writes"] - writes0
    passes = d.rules_passes() - passes0
    cpu = cpu_seconds(d.pid) - cpu0
    threads = {k: v - threads0.get(k, 0.0) for k, v in thread_cpu(d.pid).items()}
    busiest = ", ".join(f"{k} {v * 1e6 / events:.0f}" for k, v in sorted(threads.items(), key=lambda kv: -kv[1])[:4])
    print(f"flood: {args.events} spec changes -> {events} watch events (with those of the daemon's own "
          f"{writes} status writes; {passes} passes of the rules loop), daemon CPU {cpu * 1e6 / events:.0f} us per event "
          f"(by thread, us per event: {busiest}), RSS after "
          f"{rss(d.pid) / 1e6:.1f} MB")
    during: List[float] = []
    off: List[float] = []
    with ThreadPoolExecutor(8) as pool:     # Version through the proxy during a flood
        futures = [pool.submit(patch, args.events + i) for i in range(args.events // 2)]
        while not all(f.done() for f in futures):
            during.extend(d.version_latencies(1))
            off.extend(plain.version_latencies(1))
            time.sleep(0.005)
        for f in futures:
            f.result()
    print(f"Version through the proxy p50/p99: before the flood {pct(before, 50):.0f}/{pct(before, 99):.0f} us; "
          f"during {args.events // 2} more changes {pct(during, 50):.0f}/{pct(during, 99):.0f} us, and "
          f"{pct(off, 50):.0f}/{pct(off, 99):.0f} us on the daemon with [kubernetes] off beside it "
          f"({len(during)} calls each)")
    time.sleep(5)   # the status writes of the flood are done

    pod = d.kubelet.run("lat-0", namespace="bench")
    cid = pod.containers["c0"]
    from_start: List[float] = []
    from_return: List[float] = []
    for run in range(args.runs):
        numa = (run + 1) % 4
        want = TOPOLOGY.node_cpus[numa]
        doc = json.dumps({"apiVersion": f"{G}/{V}", "kind": "Oenuma",
                          "metadata": {"name": "lat", "namespace": "bench"},
                          "spec": {"node": [{"name": NODE, "podAffinity": [{"podName": "lat-0", "numaNum": numa}]}]}})
        t = time.monotonic()
        cp.kubectl("apply", "-f", "-", input=doc)
        returned = time.monotonic()
        wait_until(lambda: sent_cpusets(fake, cid)[-1:] == [want], "the cpuset", 60, POLL)
        done = time.monotonic()
        from_start.append((done - t) * 1e3)
        from_return.append((done - returned) * 1e3)
    print(f"latency: kubectl apply -> containerd asked for the new cpuset, {args.runs} runs: "
          f"p50/p99 {pct(from_start, 50):.0f}/{pct(from_start, 99):.0f} ms from the start of kubectl apply, "
          f"{pct(from_return, 50):.0f}/{pct(from_return, 99):.0f} ms from its return "
          f"(median {statistics.median(from_return):.0f} ms)")


if __name__ == "__main__":
    main()
