#!/usr/bin/env python3
"""What a CreateContainer waits for in the NUMA placement service: numa.json written on its
path (synchronous) or behind it (write-behind), in one run.

    .venv/bin/python scripts/bench_placement.py [--pods N] [--population P] [--gap-ms G]
                                                [--state-dir DIR] [--json FILE]

Times ``PlacementService.place_container`` + ``container_created`` (what the NUMA hook's
pre- and post-hook of a CreateContainer call) for N new pods of one container on a fake
Kunpeng 920 topology (4 nodes x 32 CPUs), with a real state directory on this machine's
disk (default: a new directory under /var/tmp, removed after). At most P pods are kept
placed: beyond that the oldest is released (untimed), so every sample sees about the same
ledger. Between two pods the script waits G ms (untimed; default 2), as the kubelet's
calls are spaced by their trips to containerd: without a gap the writer thread would hardly
get the service's lock (Python's locks are not fair) and the run would measure one write
at the end. The same sequence runs twice, each on a fresh service and directory:
``synchronous`` (the writer thread not started: each change written, fsync included, before
the call returns, as before write-behind) and ``write-behind`` (the thread started, as the
daemon runs it). Prints p50/p99/mean per mode, how many writes each made, and the ratio.
Needs nothing but this tree (no root, no containerd).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import structlog  # noqa: E402

from anolisnuma.placement.service import PlacementService  # noqa: E402
from anolisnuma.policies.numa.balance import PodRequest  # noqa: E402
from anolisnuma.policies.numa.config import NumaConfig  # noqa: E402
from anolisnuma.policies.numa.ledger import ContainerShare  # noqa: E402
from anolisnuma.state.numa_state import NumaStateFile  # noqa: E402
from anolisnuma.state.records import PodRecord  # noqa: E402
from anolisnuma.system.cgroups import CgroupFs  # noqa: E402
from anolisnuma.system.kubelet_state import CpuManagerStateFile  # noqa: E402
from anolisnuma.testing import fake_sysfs  # noqa: E402


def service(base: str) -> PlacementService:
    """A placement service on a fake Kunpeng 920 (no kubelet checkpoint: the whole machine
    is the shared pool), its state in ``<base>/state``."""
    topology = fake_sysfs.kunpeng920().topology(os.path.join(base, "sys"))
    return PlacementService(NumaConfig(enabled=True, namespaces=["bench"]), topology,
                            CpuManagerStateFile(os.path.join(base, "cpu_manager_state")),
                            NumaStateFile(os.path.join(base, "state")), CgroupFs(os.path.join(base, "cgroup")))


def run(mode: str, base: str, pods: int, population: int, gap: float) -> Dict[str, Any]:
    """One mode's samples (seconds per place_container + container_created)."""
    svc = service(base)
    if mode == "write-behind":
        svc.writer.start()
    samples: List[float] = []
    placed: List[str] = []
    pool = svc.shared_pool
    share = ContainerShare("app", 100, 64 << 20)
    demand = PodRequest(100, 64 << 20)
    for i in range(pods):
        uid = f"{i:08x}-0000-4000-8000-{mode[:1]}{i:011x}"
        sid = f"{i:064x}"
        pod = PodRecord(sandbox_id=sid, uid=uid, name=f"bench-{i}", namespace="bench")
        started = time.perf_counter()
        answer = svc.place_container(pod, sid, share, demand, pool, "")
        svc.container_created(uid, "app", f"{i:064x}"[::-1], answer.cpus)
        samples.append(time.perf_counter() - started)
        placed.append(sid)
        if len(placed) > population:
            svc.release_sandbox(placed.pop(0))
        if gap:
            time.sleep(gap)   # (the time between two calls, not a wait for a condition)
    assert svc.flush(30), "numa.json not written"
    svc.close()
    with open(os.path.join(base, "state", "numa.json")) as f:
        on_disk = json.load(f)["allocations"]
    assert on_disk == svc.ledger.to_json(), "numa.json is not the ledger"
    return {"samples": samples, "writes": svc.writer.writes, "allocations": len(on_disk)}


def quantile(samples: List[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: Any = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=2000, help="pods placed per mode (default 2000)")
    ap.add_argument("--population", type=int, default=200, help="pods kept placed (default 200)")
    ap.add_argument("--gap-ms", type=float, default=2.0, help="time between two pods, untimed (default 2)")
    ap.add_argument("--state-dir", default="", help="where to make the state directories (default /var/tmp)")
    ap.add_argument("--json", default="", help="write the summary here as JSON")
    args = ap.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    top = tempfile.mkdtemp(prefix="anolisnuma-bench-placement-", dir=args.state_dir or "/var/tmp")
    summary: Dict[str, Any] = {"pods": args.pods, "population": args.population, "gap_ms": args.gap_ms,
                               "state_dir": top}
    try:
        for mode in ("synchronous", "write-behind"):
            r = run(mode, os.path.join(top, mode), args.pods, args.population, args.gap_ms / 1000)
            s = r["samples"]
            summary[mode] = {"p50_ms": round(quantile(s, 0.50) * 1000, 4), "p99_ms": round(quantile(s, 0.99) * 1000, 4),
                             "mean_ms": round(statistics.fmean(s) * 1000, 4), "writes": r["writes"],
                             "allocations_at_end": r["allocations"]}
    finally:
        shutil.rmtree(top, ignore_errors=True)
    sync, wb = summary["synchronous"], summary["write-behind"]
    summary["ratio_p50"] = round(sync["p50_ms"] / wb["p50_ms"], 1)
    summary["ratio_p99"] = round(sync["p99_ms"] / wb["p99_ms"], 1)
    print(f"place_container + container_created, {args.pods} pods ({args.population} kept placed), "
          f"{args.gap_ms:g} ms between pods, state under {os.path.dirname(top)}")
    for mode in ("synchronous", "write-behind"):
        m = summary[mode]
        print(f"  {mode:<13} p50 {m['p50_ms']:.3f} ms  p99 {m['p99_ms']:.3f} ms  mean {m['mean_ms']:.3f} ms  "
              f"numa.json writes {m['writes']}")
    print(f"  synchronous / write-behind: p50 x{summary['ratio_p50']}, p99 x{summary['ratio_p99']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
