#!/usr/bin/env python3
"""Restarts, reloads, upgrades and kill -9 under a kubelet's load: how many calls fail.

A private real containerd; anolisnuma (NUMA placement on, a fake two-node topology mapped
onto CPUs 0 and 1) under a socket supervisor that holds the kubelet's socket as systemd's
anolisnuma.socket does (anolisnuma/testing/socket_supervisor.py: these machines do not run
systemd as PID 1); the grpc-go client's load mode (tests/tools/gocri/load.go) doing what a
kubelet does through the proxy: Version+Status every 100 ms, ListPodSandbox+ListContainers
every second, pod lifecycles back to back (CreateContainer in flight at the events),
containerd's event stream kept open and re-opened on error (with a reference subscription
on containerd's own socket to find lost events) and CRI GetContainerEvents (containerd
1.6 answers UNIMPLEMENTED, as it does direct). Meanwhile the daemon is

  restarted (SIGTERM, start again: ``systemctl restart``)   --restarts
  reloaded (SIGHUP: ``systemctl reload``)                     --reloads
  upgraded (SIGTERM, start from another tree)                 --upgrades
  killed (SIGKILL, started again after RestartSec=1)          --kills

The upgrade replaces the installed tree: two ``git archive`` trees of HEAD that differ in
their version string, alternately (an rpm upgrade needs rpm's database and scriptlets on
an rpm distribution; on Debian the tree replacement is what is measured).

Prints one row per kind of event: failed calls (for kill -9: UNAVAILABLE calls cut in
flight, and teardown calls that then met containerd still finishing a cut call), the time
the event took until the next daemon sent READY=1, the slowest call made meanwhile, then
the event stream's re-opens and lost events, and whether every running pod kept its
placement. Exit status 0 unless the run itself broke.

    .venv/bin/python scripts/bench_restart.py            # 20/20/5/5
    .venv/bin/python scripts/bench_restart.py --quick    # 2 of each (CI smoke run)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Tuple

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)

from anolisnuma.testing.containerd import PrivateContainerd, cleanup_dead_instances  # noqa: E402
from anolisnuma.testing.daemon_probes import wait_until  # noqa: E402
from anolisnuma.testing.goclient import GoLoad  # noqa: E402
from anolisnuma.testing.restart_lab import (  # noqa: E402
    EVENTS_SUBSCRIBE, GET_CONTAINER_EVENTS, RestartLab, stream_report)
from anolisnuma.testing.socket_supervisor import export_tree  # noqa: E402

BASE_PREFIX = "/tmp/anolisnuma-bench-restart-"
RUN_PREFIX = "/run/anolisnuma-bench-restart-"
KINDS = ("restart", "reload", "upgrade", "kill -9")
_HEX = re.compile(r"[0-9a-f]{12,}")


def machine() -> str:
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    return f"{platform.node()}: {os.cpu_count()} vCPU {cpu}, Linux {platform.release()}, Python {platform.python_version()}"


def run(args: argparse.Namespace) -> Dict[str, Any]:
    cleanup_dead_instances(BASE_PREFIX, RUN_PREFIX)
    pid = os.getpid()
    work = tempfile.mkdtemp(prefix="anolisnuma-bench-restart-work-")
    pc = PrivateContainerd(f"{BASE_PREFIX}{pid}", f"{RUN_PREFIX}{pid}", cni=False)
    lab = None
    try:
        pc.start()
        pc.import_images()
        trees = [export_tree(HERE, os.path.join(work, name), version_suffix=f"+{name}") for name in ("a", "b")]
        lab = RestartLab(pc, os.path.join(work, "lab"), tree=trees[0])
        lab.start()
        steady = [lab.run_pod(f"steady-{i}") for i in range(args.steady)]
        pods = [lab.pod_template(f"churn-{i}")[:2] for i in range(args.workers)]
        load = GoLoad(lab.socket, pods=pods, trace=True, poll_interval_ms=100, list_interval_ms=1000,
                      streams=[("events", EVENTS_SUBSCRIBE, b"", ""),
                               ("direct", EVENTS_SUBSCRIBE, b"", pc.socket),
                               ("cri-events", GET_CONTAINER_EVENTS, b"", "")], reopen_ms=1000).start()
        plan = (["restart"] * args.restarts + ["reload"] * args.reloads + ["upgrade"] * args.upgrades
                + ["kill -9"] * args.kills)
        events: List[Tuple[str, float, float]] = []
        try:
            lifecycles(load, 2)
            for i, kind in enumerate(plan):
                t0 = time.time()
                if kind == "restart":
                    lab.supervisor.restart()
                elif kind == "reload":
                    lab.supervisor.reload()
                elif kind == "upgrade":
                    lab.upgrade(trees[(sum(1 for e in events if e[0] == "upgrade") + 1) % 2])
                else:
                    lab.supervisor.kill9()
                events.append((kind, t0, time.time()))
                lifecycles(load, 1)   # the load goes on between events: a CreateContainer in flight at each
            lifecycles(load, 1)
        finally:
            records = load.stop()
        missing = lab.placements_missing()
        log = lab.log()
        return {"records": records, "events": events, "missing": missing, "steady": len(steady), "log": log,
                "versions": sorted({e.get("version") for e in log if e.get("message") == "anolisnuma listening"})}
    finally:
        if lab is not None:
            problems = lab.close()
            if problems:
                print(f"cleanup problems: {problems}", file=sys.stderr)
        pc.cleanup(save_log="/tmp/anolisnuma-bench-restart-last-containerd.log")
        shutil.rmtree(work, ignore_errors=True)


def lifecycles(load: GoLoad, n: int) -> None:
    start = sum(1 for r in load.records() if r["kind"] == "create")
    wait_until(lambda: sum(1 for r in load.records() if r["kind"] == "create") >= start + n,
               f"{n} more pod lifecycles", 120)


def summarize(result: Dict[str, Any]) -> Dict[str, Any]:
    records, events = result["records"], result["events"]
    calls = [r for r in records if r["kind"] == "call" and not r["method"].endswith("/GetContainerEvents")]
    fails = [r for r in records if r["kind"] == "fail"]
    # A failure belongs to the last event begun before the client saw it fail.
    starts = [t0 for _, t0, _ in events]
    owner: Dict[str, List[Dict[str, Any]]] = {k: [] for k in KINDS}
    for r in fails:
        seen = r["t"] + r["ms"] / 1000
        before = [i for i, t0 in enumerate(starts) if t0 <= seen]
        if before:
            owner[events[before[-1]][0]].append(r)
    rows = {}
    for kind in KINDS:
        mine = [(t0, t1) for k, t0, t1 in events if k == kind]
        if not mine:
            continue
        cut = [r for r in owner[kind] if r["code"] == 14]
        after = [r for r in owner[kind] if r["code"] != 14]
        # calls begun from the event until 2 s after it ended: those that waited for the next daemon
        during = [r for r in calls if any(t0 <= r["t"] <= t1 + 2.0 for t0, t1 in mine)]
        rows[kind] = {
            "events": len(mine),
            "failed": len(owner[kind]),
            "cut_unavailable": len(cut),
            "follow_on": len(after),
            "follow_on_kinds": sorted({f'{r["method"].rsplit("/", 1)[1]}: {_HEX.sub("<id>", r["msg"])[:120]}'
                                       for r in after}),
            "event_ms_mean": round(1000 * sum(t1 - t0 for t0, t1 in mine) / len(mine), 1),
            "event_ms_max": round(1000 * max(t1 - t0 for t0, t1 in mine), 1),
            "slowest_call_ms": round(max((r["ms"] for r in during), default=0.0), 1),
        }
    attributed = sum(row["failed"] for row in rows.values())
    report = stream_report(records)
    creates = [r for r in records if r["kind"] == "create"]
    cri = sorted({r.get("code") for r in records if r["kind"] == "closed" and r.get("stream") == "cri-events"})
    stopped = [e for e in result["log"] if e.get("message") == "anolisnuma stopped"]
    return {
        "rows": rows,
        "calls": len(calls),
        "failed_total": len(fails),
        "failed_unattributed": len(fails) - attributed,
        "creates": len(creates),
        "creates_failed": sum(1 for r in creates if r["code"] != 0),
        "stream": dict(report, lost=len(report["lost"])),
        "cri_events_codes": cri,
        "placements_missing": result["missing"],
        "steady_pods": result["steady"],
        "versions": result["versions"],
        "calls_cut_at_shutdown": sum(e.get("calls_cut", 0) for e in stopped),
        "drain_ms_max": max((e.get("drained_in_ms", 0.0) for e in stopped), default=0.0),
    }


def print_table(s: Dict[str, Any], args: argparse.Namespace) -> None:
    print(f"machine: {machine()}")
    print(f"load: Version+Status every 100 ms, ListPodSandbox+ListContainers every 1 s, {args.workers} pod "
          f"lifecycle workers, containerd's event stream + CRI GetContainerEvents; {args.steady} steady pods")
    print()
    print("| event | count | failed calls | of which cut in flight (UNAVAILABLE) | follow-on | "
          "event until READY=1, mean / max ms | slowest call begun then (to +2 s), ms |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for kind, row in s["rows"].items():
        print(f"| {kind} | {row['events']} | {row['failed']} | {row['cut_unavailable']} | {row['follow_on']} | "
              f"{row['event_ms_mean']} / {row['event_ms_max']} | {row['slowest_call_ms']} |")
    print()
    st = s["stream"]
    print(f"calls: {s['calls']} ({s['failed_total']} failed, {s['failed_unattributed']} outside any event's window); "
          f"pod lifecycles: {s['creates']} CreateContainer ({s['creates_failed']} failed)")
    print(f"event stream through the proxy: opened {st.get('opens')} times, {st.get('events')} events "
          f"(reference {st.get('reference_events')}), lost after a re-open: {st.get('lost')}")
    print(f"CRI GetContainerEvents: closed with codes {s['cri_events_codes']} (12 = UNIMPLEMENTED: containerd 1.6)")
    print(f"calls cut by a shutdown's grace: {s['calls_cut_at_shutdown']}; longest drain: {s['drain_ms_max']} ms")
    print(f"trees run: {', '.join(v for v in s['versions'] if v)}")
    missing = s["placements_missing"]
    print(f"every pod has its placement at the end: {'yes' if not missing else 'NO: ' + '; '.join(missing)} "
          f"({s['steady_pods']} steady pods checked against numa.json and their real cpuset.cpus)")
    for kind, row in s["rows"].items():
        if row["follow_on_kinds"]:
            print(f"{kind} follow-on failures: {row['follow_on_kinds']}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--restarts", type=int, default=20)
    p.add_argument("--reloads", type=int, default=20)
    p.add_argument("--upgrades", type=int, default=5)
    p.add_argument("--kills", type=int, default=5)
    p.add_argument("--workers", type=int, default=2, help="pod lifecycle workers")
    p.add_argument("--steady", type=int, default=4, help="long-lived pods whose placement is checked at the end")
    p.add_argument("--quick", action="store_true", help="2 events of each kind (a smoke run)")
    p.add_argument("--json", help="write the summary here")
    args = p.parse_args()
    if args.quick:
        args.restarts = args.reloads = args.upgrades = args.kills = 2
        args.steady = 2
    if os.geteuid() != 0 or shutil.which("containerd") is None:
        print("bench_restart: needs root and containerd (scripts/install-deps.sh); skipped")
        return 0
    try:
        subprocess.run(["git", "-C", HERE, "rev-parse", "HEAD"], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        print("bench_restart: needs a git checkout (the upgrade runs a git archive of HEAD); skipped")
        return 0
    started = time.monotonic()
    summary = summarize(run(args))
    print_table(summary, args)
    print(f"(run took {time.monotonic() - started:.0f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
