#!/usr/bin/env python3
"""Benchmark: the daemon's own client to containerd, this tree's against another tree's, in
one run (issue 20: the hand-written HTTP/2 client replaced by grpcio).

    sudo .venv/bin/python scripts/bench_cri_client.py --before-tree DIR [--quick] [--json FILE]

``DIR`` is the source tree to compare with (``git archive COMMIT | tar -x -C DIR``); the
figures of both trees come from the same loops, interleaved. Needs root, the private real
containerd's binaries (scripts/install-deps.sh) and the test extras. Two parts:

- ``client``: a worker process per tree (``PYTHONPATH`` = that tree) in front of a fake CRI
  backend that lives in this process, so the worker's CPU is the client's alone. It
  measures the start-up resync (``resync_store`` into an empty store: two listings, then a
  verbose status per pod and per container, each with ~6 KB of info JSON like
  containerd's) for N pods and N containers; the CPU (user + system, every thread of the
  worker: grpc's core included) and latency of a re-pin (``UpdateContainerResources``); and
  the worker's RSS and threads after them. Rounds alternate the trees.
- ``daemon``: two daemons per tree (``python -m anolisnuma``) in front of one private real
  containerd: "plain" as bench_proxy.py's proxy A (no hook, the default resync a minute:
  the daemon the RSS target is set for) and "numa" (NUMA hook on over a fake 2-node
  topology, resync every second: a client opened and closed each second, the re-pinner's
  held). RSS (and its anonymous part) and threads at rest, then over 100,000 calls relayed
  through each (Version / Status / ListPodSandbox / ListContainers rotated, 8 threads on 2
  connections, 10,000 calls per daemon in turn); then the CPU of a re-pin on a real
  container by each tree's client (a worker as above, against the real containerd).

Prints the figures and the target (RSS <= 48 MB, flat over the calls). A benchmark, not a
test: exit 0 even when a target is missed, 1 when it could not run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Union

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1 << 20
T_RSS_MB = 48.0
T_RSS_GROWTH_MB = 2.0
INFO_BYTES = 6000   # containerd's verbose info JSON is a few KB (runtimeSpec, config)


# --------------------------------------------------------------------------- worker
# Runs in a subprocess with PYTHONPATH = the tree measured; imports only that tree.

def _rusage_cpu() -> float:
    import resource
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def worker(spec: Dict[str, Any]) -> Dict[str, Any]:
    import structlog

    def drop(*_: Any) -> Any:
        raise structlog.DropEvent

    structlog.configure(processors=[drop])
    from anolisnuma.cri.client import CriClient
    from anolisnuma.reconcile.resync import resync_store
    from anolisnuma.state.store import Store
    from cri_proto import api_pb2

    out: Dict[str, Any] = {"rss_after_import_mb": _rss_mb()}
    client = CriClient(spec["socket"], timeout_seconds=30.0)
    client.version()
    if spec.get("resync"):
        times = []
        for _ in range(spec["resync_rounds"]):
            store = Store()
            t0, c0 = time.perf_counter(), _rusage_cpu()
            pods, ctrs, changes = resync_store(client, store)
            times.append((time.perf_counter() - t0, _rusage_cpu() - c0))
            assert changes["adopted_pods"] == spec["resync"] and changes["adopted_containers"] == spec["resync"], changes
        out["resync_s"] = statistics.median(t for t, _ in times)
        out["resync_cpu_s"] = statistics.median(c for _, c in times)
    if spec.get("repins"):
        cid = spec["container_id"]
        status, _ = client.container_status(cid)
        res = api_pb2.LinuxContainerResources()
        res.CopyFrom(status.resources.linux)
        cpus = spec["cpus"]
        for i in range(min(20, spec["repins"])):   # warm-up
            res.cpuset_cpus = cpus[i % len(cpus)]
            client.update_container_resources(cid, res)
        lat = []
        c0 = _rusage_cpu()
        for i in range(spec["repins"]):
            res.cpuset_cpus = cpus[i % len(cpus)]
            t0 = time.perf_counter()
            client.update_container_resources(cid, res)
            lat.append(time.perf_counter() - t0)
        out["repin_cpu_us"] = (_rusage_cpu() - c0) / len(lat) * 1e6
        out["repin_p50_us"] = statistics.median(lat) * 1e6
    client.close()
    out["rss_mb"] = _rss_mb()
    out["tasks"] = _comms("self")
    return out


def run_worker(tree: str, spec: Dict[str, Any]) -> Dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=tree)
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)], cwd=tree,
                       env=env, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"worker for {tree} failed: {r.stderr.strip()[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- parent

def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _fake_with_status(path: str, n: int) -> Any:
    from anolisnuma.testing.fake_cri import FakeCri, runtime_path
    from cri_proto import api_pb2

    fake = FakeCri(path, containers=n, sandboxes=n, max_workers=8)
    pad = "x" * INFO_BYTES

    def pod_status(request: bytes, context: Any) -> Any:
        req = api_pb2.PodSandboxStatusRequest.FromString(request)
        reply = api_pb2.PodSandboxStatusResponse()
        reply.status.id = req.pod_sandbox_id
        reply.info["info"] = json.dumps({"pid": 4242, "config": {"linux": {"cgroup_parent": "/kubepods/pod1"}},
                                         "pad": pad})
        return reply

    def container_status(request: bytes, context: Any) -> Any:
        req = api_pb2.ContainerStatusRequest.FromString(request)
        reply = api_pb2.ContainerStatusResponse()
        reply.status.id = req.container_id
        reply.status.resources.linux.cpuset_cpus = "0-1"
        reply.info["info"] = json.dumps({"pid": 4343, "runtimeSpec": {"linux": {"resources": {
            "cpu": {"shares": 1024, "cpus": "0-1"}, "memory": {"limit": 1 << 30}}}}, "pad": pad})
        return reply

    fake.set_reply(runtime_path("PodSandboxStatus"), pod_status)
    fake.set_reply(runtime_path("ContainerStatus"), container_status)
    fake.keep_requests = 10
    return fake.start()


def client_part(trees: Dict[str, str], quick: bool, work: str) -> Dict[str, Any]:
    sizes = (100, 300) if quick else (100, 1000)
    rounds = 2 if quick else 3
    repins = 2000 if quick else 10000
    out: Dict[str, Any] = {"sizes": list(sizes), "rounds": rounds, "repins": repins, "trees": {}}
    fakes = {n: _fake_with_status(os.path.join(work, f"fake-{n}.sock"), n) for n in sizes}
    try:
        runs: Dict[str, List[Dict[str, Any]]] = {label: [] for label in trees}
        for r in range(rounds):
            order = list(trees) if r % 2 == 0 else list(trees)[::-1]
            for label in order:
                res: Dict[str, Any] = {}
                for n in sizes:
                    got = run_worker(trees[label], {"socket": fakes[n].socket_path, "resync": n, "resync_rounds": 3})
                    res[f"resync_{n}_s"] = got["resync_s"]
                    res[f"resync_{n}_cpu_s"] = got["resync_cpu_s"]
                got = run_worker(trees[label], {"socket": fakes[sizes[0]].socket_path, "repins": repins,
                                                "container_id": fakes[sizes[0]].container_ids()[0],
                                                "cpus": ["0", "1", "0-1"]})
                res.update(repin_cpu_us=got["repin_cpu_us"], repin_p50_us=got["repin_p50_us"],
                           worker_rss_mb=got["rss_mb"], worker_rss_after_import_mb=got["rss_after_import_mb"],
                           worker_tasks=got["tasks"])
                runs[label].append(res)
                log(f"client {label} round {r + 1}: " + ", ".join(
                    f"{k} {v:.4g}" for k, v in res.items() if isinstance(v, float)))
        for label, rs in runs.items():
            summary = {k: statistics.median(x[k] for x in rs) for k in rs[0] if isinstance(rs[0][k], float)}
            summary["worker_tasks"] = rs[-1]["worker_tasks"]
            out["trees"][label] = summary
    finally:
        for f in fakes.values():
            f.stop(0)
    return out


def _comms(pid: Union[int, str]) -> Dict[str, int]:
    """Threads of process ``pid`` (or "self") by name."""
    out: Dict[str, int] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        out[name] = out.get(name, 0) + 1
    return out


def _anon_mb(pid: int) -> float:
    """The anonymous part of the RSS (the rest is file pages: code and data of the
    interpreter and the extension modules, e.g. grpc's core)."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Anonymous:"):
                return int(line.split()[1]) / 1024
    return 0.0


def daemon_part(trees: Dict[str, str], quick: bool, work: str) -> Dict[str, Any]:
    sys.path[:0] = [os.path.join(REPO, "scripts"), os.path.join(REPO, "tests", "e2e")]
    import bench_proxy as bp
    from anolisnuma.testing.containerd import PrivateContainerd, cleanup_dead_instances
    from anolisnuma.testing.daemon_probes import rss_bytes

    checkpoints = (2_000, 10_000, 20_000) if quick else (10_000, 50_000, 100_000)
    chunk = 2_000 if quick else 10_000
    out: Dict[str, Any] = {"checkpoints": list(checkpoints), "trees": {}}
    cleanup_dead_instances(bp.BASE_PREFIX, bp.RUN_PREFIX)
    pid = os.getpid()
    pc = PrivateContainerd(f"{bp.BASE_PREFIX}{pid}", f"{bp.RUN_PREFIX}{pid}", cni=False)
    procs: Dict[str, Any] = {}
    chans: Dict[str, List[Any]] = {}
    kl = None
    try:
        pc.write_config()
        pc.start()
        pc.import_images()
        nodes = bp.numa_nodes()
        for label, tree in trees.items():
            # bench_proxy's proxy A (no hook, the default resync a minute), the daemon the
            # RSS target is set for
            p = bp.ProxyProc(f"plain-{label}", work, pc.socket, tree=tree)
            p.check_config()
            p.start()
            if not p.wait_log("store reconciled with containerd", 30):
                raise RuntimeError(f"daemon plain {label}: no start-up resync: {p.tail()}")
            procs[f"plain {label}"] = p
            config = {"runtime": {"endpoint": pc.socket, "resync_interval_seconds": 1.0},
                      "qos": {"enabled": False}, "admin": {"socket": ""}, "server": {}, "paths": {}}
            p = bp.ProxyProc(f"numa-{label}", work, pc.socket, numa_nodes=nodes, numa_namespace="bench-numa",
                             tree=tree, config=config)
            p.check_config()
            p.start()
            if not p.wait_log("background loop started", 30):
                raise RuntimeError(f"daemon numa {label}: its loops did not start: {p.tail()}")
            procs[f"numa {label}"] = p
        time.sleep(3.0)   # a few resync passes: the figures at rest include them
        for label, p in procs.items():
            out["trees"][label] = {"idle_rss_mb": rss_bytes(p.proc.pid) / MIB, "idle_anon_mb": _anon_mb(p.proc.pid),
                                   "idle_threads": _comms(p.proc.pid), "points": []}
            chans[label] = [bp.channel(p.socket) for _ in range(2)]
        mix = ["Version", "Status", "ListPodSandbox", "ListContainers"]
        done = {label: 0 for label in procs}
        errors = {label: 0 for label in procs}
        for cp in checkpoints:
            while any(done[label] < cp for label in procs):
                for label, p in procs.items():
                    if done[label] >= cp:
                        continue
                    c0 = p.cpu()
                    n, el, e = bp.run_callers(chans[label], mix, b"", 8, total=min(chunk, cp - done[label]))
                    done[label] += n + e
                    errors[label] += e
                    out["trees"][label].setdefault("relay_cpu_s", 0.0)
                    out["trees"][label]["relay_cpu_s"] += p.cpu() - c0
            for label, p in procs.items():
                pt = {"calls": done[label], "rss_mb": rss_bytes(p.proc.pid) / MIB, "anon_mb": _anon_mb(p.proc.pid),
                      "threads": p.threads()}
                out["trees"][label]["points"].append(pt)
                log(f"daemon {label}: {pt['calls']} calls, RSS {pt['rss_mb']:.1f} MB, {pt['threads']} threads")
        for label in procs:
            out["trees"][label]["errors"] = errors[label]
            out["trees"][label]["threads_after"] = _comms(procs[label].proc.pid)
        # A re-pin on a real container, by each tree's client (runc applies it: the CPU
        # figure is the client's own, the latency containerd's).
        from cri_client import KubeletLike
        kl = KubeletLike(pc.socket, harness=pc)
        pod = kl.run_pod(name="bench-repin", namespace="bench-repin")
        cid = kl.run_container(pod, "main", kl.resources(cpu_shares=256))
        cpus = sorted(os.sched_getaffinity(0))
        sets = [str(cpus[0]), str(cpus[-1]), f"{cpus[0]}-{cpus[-1]}"]
        real: Dict[str, List[Dict[str, Any]]] = {label: [] for label in trees}
        for r in range(2):
            for label in (list(trees) if r % 2 == 0 else list(trees)[::-1]):
                real[label].append(run_worker(trees[label], {"socket": pc.socket, "repins": 50 if quick else 200,
                                                             "container_id": cid, "cpus": sets}))
        out["real_repin"] = {label: {"cpu_us": statistics.median(x["repin_cpu_us"] for x in rs),
                                     "p50_ms": statistics.median(x["repin_p50_us"] for x in rs) / 1e3}
                             for label, rs in real.items()}
    finally:
        for cl in chans.values():
            for ch in cl:
                ch.close()
        if kl is not None:
            kl.cleanup()
            kl.close()
        for label, p in procs.items():
            rc = p.stop()
            if label in out["trees"]:
                out["trees"][label]["exit_code"] = rc
                out["trees"][label]["log_errors"] = p.log_problems()
        pc.cleanup()
    return out


def render(r: Dict[str, Any]) -> str:
    L = [f"bench_cri_client: {r['when']}, {r['machine']}", f"  before = {r['trees']['before']}",
         f"  after  = {r['trees']['after']}", ""]
    c = r.get("client")
    if c:
        b, a = c["trees"]["before"], c["trees"]["after"]
        L.append(f"client (worker process per tree against the fake backend; medians of {c['rounds']} rounds)")
        L.append(f"  {'':38} {'before':>12} {'after':>12}")
        for n in c["sizes"]:
            L.append(f"  {f'start-up resync, {n} pods + {n} containers':38} "
                     f"{b[f'resync_{n}_s'] * 1e3:>9.1f} ms {a[f'resync_{n}_s'] * 1e3:>9.1f} ms")
            L.append(f"  {'  its CPU':38} {b[f'resync_{n}_cpu_s'] * 1e3:>9.1f} ms {a[f'resync_{n}_cpu_s'] * 1e3:>9.1f} ms")
        L.append(f"  {'re-pin CPU per call (all threads)':38} {b['repin_cpu_us']:>9.1f} us {a['repin_cpu_us']:>9.1f} us")
        L.append(f"  {'re-pin latency p50':38} {b['repin_p50_us']:>9.1f} us {a['repin_p50_us']:>9.1f} us")
        L.append(f"  {'worker RSS after imports':38} {b['worker_rss_after_import_mb']:>9.1f} MB "
                 f"{a['worker_rss_after_import_mb']:>9.1f} MB")
        L.append(f"  {'worker RSS at the end':38} {b['worker_rss_mb']:>9.1f} MB {a['worker_rss_mb']:>9.1f} MB")
        L.append(f"  worker threads: before {b['worker_tasks']}, after {a['worker_tasks']}")
        L.append("")
    d = r.get("daemon")
    if d:
        L.append("daemons in front of the real containerd: 'plain' as bench_proxy's proxy A (no hook, resync a "
                 "minute), 'numa' with the NUMA hook on and a resync every second")
        for label, t in d["trees"].items():
            pts = t["points"]
            growth = pts[-1]["rss_mb"] - pts[-2]["rss_mb"] if len(pts) > 1 else 0.0
            ok = pts[-1]["rss_mb"] <= T_RSS_MB and growth <= T_RSS_GROWTH_MB
            calls = sum(1 for _ in pts)
            L.append(f"  {label}: RSS at rest {t['idle_rss_mb']:.1f} MB ({t['idle_anon_mb']:.1f} anonymous); " + ", ".join(
                f"{p['calls']:,} calls {p['rss_mb']:.1f} MB ({p['anon_mb']:.1f})" for p in pts) +
                f"; {growth:+.1f} MB over the last {pts[-1]['calls'] - pts[-2]['calls'] if calls > 1 else 0:,}"
                f" calls; target <= {T_RSS_MB:.0f} MB flat: {'PASS' if ok else 'MISS'}")
            L.append(f"    relay CPU {t['relay_cpu_s'] / max(1, pts[-1]['calls']) * 1e6:.0f} us/call, "
                     f"{t['errors']} errors; threads at rest {t['idle_threads']}")
        for label, t in (d.get("real_repin") or {}).items():
            L.append(f"  re-pin on a real container by the {label} client: its CPU {t['cpu_us']:.0f} us/call, "
                     f"latency p50 {t['p50_ms']:.1f} ms (runc)")
    return "\n".join(L)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before-tree", required=True, help="the source tree to compare with")
    ap.add_argument("--quick", action="store_true", help="fewer calls and rounds (a few minutes)")
    ap.add_argument("--only", default="client,daemon", help="comma-separated parts: client,daemon")
    ap.add_argument("--json", help="also write the results as JSON to this file")
    args = ap.parse_args(argv)
    if os.geteuid() != 0 and "daemon" in args.only:
        print("bench_cri_client: the daemon part needs root (a private containerd)", file=sys.stderr)
        return 1
    sys.path.insert(0, REPO)
    import platform
    trees = {"before": os.path.abspath(args.before_tree), "after": REPO}
    r: Dict[str, Any] = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                         "machine": f"{os.cpu_count()} CPUs, Python {platform.python_version()}, "
                                    f"load average {os.getloadavg()[0]:.2f} at the start",
                         "trees": trees}
    work = tempfile.mkdtemp(prefix="an-bcc-", dir="/tmp")
    try:
        parts = args.only.split(",")
        if "client" in parts:
            r["client"] = client_part(trees, args.quick, work)
        if "daemon" in parts:
            r["daemon"] = daemon_part(trees, args.quick, work)
    except Exception as e:
        print(f"bench_cri_client: {e!r}", file=sys.stderr)
        return 1
    finally:
        subprocess.run(["rm", "-rf", work])
    r["machine"] += f", {os.getloadavg()[0]:.2f} at the end"
    print(render(r))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=1)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        print(json.dumps(worker(json.loads(sys.argv[2]))))
        sys.exit(0)
    sys.exit(main())
