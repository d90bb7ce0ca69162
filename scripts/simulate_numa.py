#!/usr/bin/env python3
"""Replay pod arrivals and departures on fixture topologies: kubelet default vs balance.

    .venv/bin/python scripts/simulate_numa.py [--pods 500] [--seed 1] [--hook]

Two scenarios per topology:

churn   ``--pods`` arrivals (sizes 1-8 CPUs, 15 % without resources); before each arrival
        random pods depart until the new one fits in 80 % of the machine. The same event
        list is replayed for every policy. Reported: the per-node load spread (max - min
        free CPUs over the nodes, sampled after every arrival: mean / p95 / max) and the
        share of pods whose CPUs span more than one node.
scale   ``--pods`` pods that all stay (the machine is overcommitted on purpose): the time
        of each balance decision (pure decision + ledger update) as the ledger grows to
        ``--pods`` allocations, p50 / p99 in microseconds (each decision the fastest of 3
        identical runs). ``--hook`` also times the whole CreateContainer pre-hook including
        the atomic state-file write with fsync (on /dev/shm, so without disk latency).

Policies:

kubelet-static  the kubelet's static CPU manager: every pod with resources gets whole CPUs,
                the lowest-numbered free ones first (packing from NUMA-0); pods without
                resources run unpinned on the shared pool.
kubelet-none    no pinning at all: every pod runs on every CPU.
balance         anolisnuma: each pod on the node with the most free capacity, pinned to it.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from anolisnuma.policies.numa.balance import PodRequest, balance, free_capacity  # noqa: E402
from anolisnuma.policies.numa.cpuset import CpuSet  # noqa: E402
from anolisnuma.policies.numa.ledger import Allocation, Ledger  # noqa: E402
from anolisnuma.policies.numa.topology import NumaTopology  # noqa: E402
from anolisnuma.testing import fake_sysfs as F  # noqa: E402

MAX_POD = 8
NO_RESOURCES = 0.15
FILL = 0.8

Event = Tuple[str, int]


def pod_sizes(n: int, rng: random.Random, max_size: int) -> List[int]:
    return [0 if rng.random() < NO_RESOURCES else rng.randint(1, max_size) for _ in range(n)]


def churn_events(sizes: Sequence[int], capacity: int, rng: random.Random) -> List[Event]:
    """Arrivals in order; before each, random departures until it fits in FILL of the machine."""
    events: List[Event] = []
    live: List[int] = []
    used = 0
    for i, size in enumerate(sizes):
        while live and used + size > FILL * capacity:
            j = live.pop(rng.randrange(len(live)))
            used -= sizes[j]
            events.append(("del", j))
        live.append(i)
        used += size
        events.append(("add", i))
    return events


def pct(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


class KubeletStatic:
    """Whole CPUs, lowest free first; pods without resources float on the shared pool."""

    name = "kubelet-static (packing from NUMA-0)"

    def __init__(self, topo: NumaTopology) -> None:
        self.topo = topo
        self.free = topo.cpus
        self.owned: Dict[int, CpuSet] = {}

    def add(self, pod: int, size: int) -> bool:
        """True when the pod's CPUs span more than one node."""
        if size == 0:
            return len(self.topo.nodes_of_cpus(self.free)) > 1
        mine = CpuSet(list(self.free)[:size])
        self.free = self.free - mine
        self.owned[pod] = mine
        return len(self.topo.nodes_of_cpus(mine)) > 1

    def remove(self, pod: int) -> None:
        self.free = self.free | self.owned.pop(pod, CpuSet())

    def free_per_node(self) -> List[float]:
        return [len(n.cpus & self.free) for n in self.topo.nodes if n.cpus]


class Balance:
    name = "anolisnuma balance"

    def __init__(self, topo: NumaTopology) -> None:
        self.topo = topo
        self.ledger = Ledger(topo, topo.cpus)
        self.times: List[float] = []

    def add(self, pod: int, size: int) -> bool:
        t0 = time.perf_counter()
        p = balance(self.topo, self.ledger.pool, self.ledger.loads(), PodRequest(size * 1000))
        self.ledger.add(Allocation(str(pod), "sim", f"pod{pod}", f"sb{pod}", p.nodes, p.home, p.mems,
                                   pod_millicpu=size * 1000))
        self.times.append(time.perf_counter() - t0)
        return len(p.nodes) > 1

    def remove(self, pod: int) -> None:
        self.ledger.remove(str(pod))

    def free_per_node(self) -> List[float]:
        free = free_capacity(self.topo, self.ledger.pool, self.ledger.loads())
        return [free[n.id] / 1000 for n in self.topo.nodes if n.cpus]


def run_churn(topo: NumaTopology, make: Callable[[NumaTopology], object], sizes: Sequence[int],
              events: Sequence[Event]) -> Dict[str, float]:
    policy = make(topo)
    spreads: List[float] = []
    spans = 0
    for kind, i in events:
        if kind == "del":
            policy.remove(i)
            continue
        spans += bool(policy.add(i, sizes[i]))
        free = policy.free_per_node()
        spreads.append(max(free) - min(free))
    return {"spread_mean": statistics.mean(spreads), "spread_p95": pct(spreads, 0.95),
            "spread_max": max(spreads), "span": spans / len(sizes)}


REPEATS = 3


def best_of(runs: Sequence[Sequence[float]]) -> List[float]:
    """Per decision, the fastest of the repeated runs (the same ledger state each time): the
    usual way to keep other processes' scheduling noise out of a micro-benchmark."""
    return [min(ts) for ts in zip(*runs)]


def run_scale(topo: NumaTopology, sizes: Sequence[int]) -> Tuple[float, float]:
    runs = []
    for _ in range(REPEATS):
        policy = Balance(topo)
        for i, size in enumerate(sizes):
            policy.add(i, size)
        runs.append([t * 1e6 for t in policy.times])
    us = best_of(runs)
    return pct(us, 0.5), pct(us, 0.99)


def run_hook_scale(spec: F.FakeTopology, sizes: Sequence[int]) -> Tuple[float, float]:
    """Time NumaHook.pre(CreateContainer) with persistence, as the ledger grows."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    runs = []
    for _ in range(REPEATS):
        runs.append(_hook_run(spec, sizes, base))
    us = best_of(runs)
    return pct(us, 0.5), pct(us, 0.99)


def _hook_run(spec: F.FakeTopology, sizes: Sequence[int], base: Optional[str]) -> List[float]:
    from anolisnuma.config import PathsConfig
    from anolisnuma.hooks.numa import NumaHook
    from anolisnuma.pipeline import hooks as H
    from anolisnuma.policies.numa.config import NumaConfig
    from anolisnuma.state.records import PodRecord
    from cri_proto import api_pb2 as pb
    with tempfile.TemporaryDirectory(prefix="numa-sim-", dir=base) as tmp:
        topo = spec.topology(os.path.join(tmp, "sys"))
        paths = PathsConfig(sys_root=os.path.join(tmp, "sys"), state_dir=os.path.join(tmp, "state"),
                            kubelet_cpu_manager_state=os.path.join(tmp, "cpu_manager_state"))
        hook = NumaHook(NumaConfig(enabled=True, namespaces=["sim"]), paths, topo)
        times = []
        for i, size in enumerate(sizes):
            uid = f"00000000-0000-0000-0000-{i:012d}"
            sid = f"{i:064x}"
            req = pb.CreateContainerRequest(pod_sandbox_id=sid)
            req.config.metadata.name = "app"
            req.config.linux.resources.cpu_shares = max(size * 1024, 2)
            pod = PodRecord(sandbox_id=sid, uid=uid, name=f"pod{i}", namespace="sim")
            call = H.Call(H.CREATE_CONTAINER, req, pod=pod)
            t0 = time.perf_counter()
            hook.pre(call)
            times.append((time.perf_counter() - t0) * 1e6)
        hook.close()
    return times


def main(argv: Optional[Sequence[str]] = None) -> int:
    import logging

    import structlog
    # the hook's info lines would interleave with the table
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pods", type=int, default=500)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--hook", action="store_true", help="also time the whole pre-hook with persistence")
    args = ap.parse_args(argv)

    machines = [(F.kunpeng920(), MAX_POD), (F.x86_two_socket(), MAX_POD), (F.seed_16cpu(), 4)]
    header = (f"{'topology':<30} {'policy':<38} {'spread mean/p95/max':>20} {'multi-node':>10} "
              f"{'decision p50/p99 us':>20}")
    print(f"pods={args.pods} seed={args.seed} sizes=1-{MAX_POD} CPUs ({int(NO_RESOURCES * 100)}% without "
          f"resources), fill {int(FILL * 100)}%")
    print(header)
    print("-" * len(header))
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for spec, max_size in machines:
            topo = spec.topology(os.path.join(tmp, spec.name))
            rng = random.Random(args.seed)
            sizes = pod_sizes(args.pods, rng, max_size)
            events = churn_events(sizes, len(topo.cpus), rng)
            static = run_churn(topo, KubeletStatic, sizes, events)
            bal = run_churn(topo, Balance, sizes, events)
            p50, p99 = run_scale(topo, sizes)
            hook_times = run_hook_scale(spec, sizes) if args.hook else None
            rows = [
                (KubeletStatic.name, f"{static['spread_mean']:.1f}/{static['spread_p95']:.0f}/{static['spread_max']:.0f}",
                 f"{static['span'] * 100:.0f}%", "-"),
                ("kubelet-none (no pinning)", "-", "100%", "-"),
                (Balance.name, f"{bal['spread_mean']:.1f}/{bal['spread_p95']:.1f}/{bal['spread_max']:.1f}",
                 f"{bal['span'] * 100:.0f}%", f"{p50:.0f}/{p99:.0f}"),
            ]
            if hook_times is not None:
                rows.append(("  balance via NumaHook.pre (+persist)", "", "", f"{hook_times[0]:.0f}/{hook_times[1]:.0f}"))
            for i, (name, spread, span, dec) in enumerate(rows):
                label = f"{spec.name} ({len(topo.nodes)}n/{len(topo.cpus)}c)" if i == 0 else ""
                print(f"{label:<30} {name:<38} {spread:>20} {span:>10} {dec:>20}")
            ok = ok and bal["spread_p95"] <= max_size and p99 <= 1000
    print()
    print("targets: balance spread (p95) <= one pod (max pod size); decision p99 <= 1000 us at "
          f"{args.pods} pods: {'met' if ok else 'NOT met'}")
    return 0  # a benchmark reports a miss; only a broken run exits non-zero


if __name__ == "__main__":
    sys.exit(main())
