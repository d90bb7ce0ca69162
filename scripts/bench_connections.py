#!/usr/bin/env python3
"""Benchmark: many connections at once, as the CRI conformance suite holds them, on a real
private containerd, directly and through the daemon, measured in one run.

    sudo .venv/bin/python scripts/bench_connections.py [--quick] [--containerd 1.6|2.2] [--json FILE]

Parts:

``idle``
    N connections opened one after another, each making one Version call and then held
    idle (what critest does with its clients): first on containerd's socket, then through
    the daemon (its default cap). Per connection: the daemon's RSS and descriptors, and
    containerd's RSS, each direct and through the daemon; and a grpc client's Version
    latency (p50/p99 over ``calls``) with the N connections held, direct and through the
    daemon, and the ratio.
``flood``
    The daemon with ``server.max_connections = cap``: ``flood`` connections opened as above
    and held without being read; every ``every`` of them a new grpc client makes a call.
    How many new clients were served, how many connections were shed (graceful goodbye)
    or refused, and the daemon's descriptors at the end against what the cap allows.

Figures are printed as a table; the exit code is 0 when the benchmark ran, whatever the
figures (1 when it could not run). ``--quick`` (N = 200, a flood of 300) takes about 20 s.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import grpc  # noqa: E402

from anolisnuma.ctl.client import ask  # noqa: E402
from anolisnuma.testing.channel_options import CLIENT_OPTIONS  # noqa: E402
from anolisnuma.testing.containerd import PrivateContainerd  # noqa: E402
from anolisnuma.testing.containerd_builds import build_named, known_builds  # noqa: E402
from anolisnuma.testing.daemon_probes import fds, rss_bytes  # noqa: E402
from anolisnuma.testing.h2raw import RawH2Client  # noqa: E402
from anolisnuma.testing.proxy import SubprocessProxy, config_dict  # noqa: E402
from anolisnuma.transport import h2 as wire  # noqa: E402
from anolisnuma.transport.connection_cap import ConnectionCap  # noqa: E402

VERSION = "/runtime.v1.RuntimeService/Version"
KIB = 1024
FULL = dict(connections=2000, calls=500, cap=256, flood=3000, every=25)
QUICK = dict(connections=200, calls=100, cap=64, flood=300, every=10)


def log(msg: str) -> None:
    print(f"[bench_connections {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def pct(values: List[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def hold(sock: str, n: int) -> List[RawH2Client]:
    """``n`` connections, each after one answered Version call; the caller closes them."""
    held = []
    for _ in range(n):
        c = RawH2Client(sock, timeout=30)
        held.append(c)
        c.start()
        c.send(c.headers(1, VERSION) + c.frame(wire.DATA, wire.FLAG_END_STREAM, 1, b"\x00" * 5))
        c.read(until=lambda f: f.stream == 1 and f.flags & wire.FLAG_END_STREAM)
    return held


def latencies(sock: str, calls: int) -> List[float]:
    with grpc.insecure_channel(f"unix://{sock}", options=CLIENT_OPTIONS) as ch:
        call = ch.unary_unary(VERSION)
        call(b"", timeout=30)
        out = []
        for _ in range(calls):
            t0 = time.perf_counter()
            call(b"", timeout=30)
            out.append((time.perf_counter() - t0) * 1e3)
    return out


def idle(pc: PrivateContainerd, work: str, s: Dict[str, Any]) -> Dict[str, Any]:
    n = s["connections"]
    cpid = pc.pid
    assert cpid is not None
    before = rss_bytes(cpid)
    held = hold(pc.socket, n)
    containerd_direct = (rss_bytes(cpid) - before) / n
    direct_ms = latencies(pc.socket, s["calls"])
    for c in held:
        c.close()
    cfg = config_dict(work, pc.socket, extra={"admin": {"socket": os.path.join(work, "admin.sock")},
                                              "log": {"stderr": False}})
    proxy = SubprocessProxy(cfg, work).start(timeout=30)
    try:
        ppid = proxy.proc.pid
        latencies(proxy.socket_path, 20)   # the daemon's own first calls, before measuring
        p_rss, p_fds, c_rss = rss_bytes(ppid), fds(ppid), rss_bytes(cpid)
        held = hold(proxy.socket_path, n)
        row = {"connections": n,
               "daemon RSS per connection (KiB)": round((rss_bytes(ppid) - p_rss) / n / KIB, 1),
               "daemon fds per connection": round((fds(ppid) - p_fds) / n, 2),
               "containerd RSS per connection, through (KiB)": round((rss_bytes(cpid) - c_rss) / n / KIB, 1),
               "containerd RSS per connection, direct (KiB)": round(containerd_direct / KIB, 1)}
        via_ms = latencies(proxy.socket_path, s["calls"])
        row.update({"Version p50 direct (ms)": round(pct(direct_ms, 0.5), 3),
                    "Version p50 through (ms)": round(pct(via_ms, 0.5), 3),
                    "Version p99 direct (ms)": round(pct(direct_ms, 0.99), 3),
                    "Version p99 through (ms)": round(pct(via_ms, 0.99), 3),
                    "p50 ratio": round(pct(via_ms, 0.5) / pct(direct_ms, 0.5), 2),
                    "cap (status)": ask(cfg["admin"]["socket"], "status")["relay"]["max_connections"]})
        for c in held:
            c.close()
        return row
    finally:
        proxy.stop()


def flood(pc: PrivateContainerd, work: str, s: Dict[str, Any]) -> Dict[str, Any]:
    cap = s["cap"]
    cfg = config_dict(work, pc.socket, extra={"admin": {"socket": os.path.join(work, "admin.sock")},
                                              "server": {"max_connections": cap}, "log": {"stderr": False}})
    proxy = SubprocessProxy(cfg, work).start(timeout=30)
    held: List[RawH2Client] = []
    served = failed = 0
    try:
        base_fds = fds(proxy.proc.pid)
        t0 = time.monotonic()
        for i in range(s["flood"]):
            held += hold(proxy.socket_path, 1)
            if i % s["every"] == 0:
                with grpc.insecure_channel(f"unix://{proxy.socket_path}", options=CLIENT_OPTIONS) as ch:
                    try:
                        ch.unary_unary(VERSION)(b"", timeout=30)
                        served += 1
                    except grpc.RpcError:
                        failed += 1
        seconds = time.monotonic() - t0
        relay = ask(cfg["admin"]["socket"], "status")["relay"]
        bound = cap + ConnectionCap(cap).max_shedding
        return {"flood connections": s["flood"], "cap": cap, "seconds": round(seconds, 1),
                "new clients served": served, "new clients failed": failed,
                "shed (graceful)": relay["counters"].get("connections_shed_idle", 0),
                "goodbyes cut short": relay["counters"].get("connections_shed_cut_short", 0),
                "refused": relay["counters"].get("connections_refused_over_cap", 0),
                "connections at the end": relay["connections"], "at most (cap + goodbyes)": bound,
                "daemon fds over its baseline": fds(proxy.proc.pid) - base_fds}
    finally:
        for c in held:
            c.close()
        proxy.stop()


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="bench_connections.py", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--containerd", default="1.6", choices=[b.name for b in known_builds()])
    ap.add_argument("--json", help="write the figures here too")
    a = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_connections: must run as root (a private containerd)", file=sys.stderr)
        return 1
    build = build_named(a.containerd)
    if build.missing():
        print(f"bench_connections: {build.missing()}", file=sys.stderr)
        return 1
    s = QUICK if a.quick else FULL
    work = tempfile.mkdtemp(prefix="an-conns-", dir="/tmp")
    pc = PrivateContainerd(os.path.join(work, "containerd"), f"/run/an-conns-{os.getpid()}", build=build)
    results: Dict[str, Dict[str, Any]] = {}
    try:
        pc.start()
        log(f"containerd {build.version()} on {pc.socket}")
        results["idle"] = idle(pc, os.path.join(work, "idle"), s)
        results["flood"] = flood(pc, os.path.join(work, "flood"), s)
    finally:
        pc.cleanup()
    print(f"# connections: containerd {build.name} ({build.version()}), {os.cpu_count()} CPUs"
          f"{' (--quick)' if a.quick else ''}")
    for part, row in results.items():
        print(f"\n## {part}\n")
        for k, v in row.items():
            print(f"| {k} | {v} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
