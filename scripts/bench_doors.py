#!/usr/bin/env python3
"""Benchmark: the daemon's other doors (everything but the CRI socket) attacked by an
unprivileged local user, on the daemon as a process in front of a fake containerd.

    sudo .venv/bin/python scripts/bench_doors.py [--quick] [--proxy-tree DIR] [--only PARTS] [--json FILE]

Each part starts a daemon of its own (``python -m anolisnuma``, admin socket and metrics
endpoint on, no hook, an ``anolisnuma.testing.fake_cri.FakeCri`` backend in this process,
RLIMIT_NOFILE lowered to ``--fd-limit``) and the attacker
(``anolisnuma.testing.http_flood``: started as root, it drops to ``nobody`` before it
opens anything). With ``--proxy-tree DIR`` (e.g. ``git archive df888c0 | tar -x -C DIR``)
each part runs on that tree's daemon first ("before"), then on this tree's ("after"):
before/after figures from one run, on one machine state. The attacker and the probes
are always this tree's.

Parts (``--only``, names in ``PARTS``), in this order:

``metrics-flood``
    N half-sent requests (``GET /metrics`` and headers, no blank line) held on the metrics
    port for a while, re-opened as the daemon drops them. The daemon's threads, fds, RSS
    (peaks) and CRI Version p50/p99 (on a connection opened before) before, while held,
    while settling after the attacker let go (and the CPU this took), and once settled;
    at the end of the hold, whether a new CRI connection (a Version on it) and
    ``anolisnuma-ctl status`` worked, and how long they took.
``metrics-scrapes``
    N complete scrapes at once (N threads of the attacker); the daemon's CPU for them,
    how many collections it made (when it counts them), the answers, and CRI Version
    p50/p99 while they ran (``collections``: between a scrape of the bench before and one
    after, which may add one of its own).

Figures are printed as tables (stdout; progress on stderr); the exit code is 0 when the
benchmark ran, whatever the figures (1 when it could not run, 130 when interrupted).
``--quick`` (smaller floods, fd limit 256) takes under 30 s for one tree. Other parts
(other doors) are added as functions of ``PARTS``: a part takes the running
:class:`Daemon` and the settings and returns its figures as a dict of rows.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import grpc  # noqa: E402

from anolisnuma.ctl.client import CtlError, ask  # noqa: E402
from anolisnuma.testing.daemon_probes import fds, rss_bytes  # noqa: E402
from anolisnuma.testing.fake_cri import FakeCri  # noqa: E402
from anolisnuma.testing.http_flood import Flood  # noqa: E402
from anolisnuma.testing.proxy import config_dict, wait_for_socket, write_config  # noqa: E402

VERSION = "/runtime.v1.RuntimeService/Version"
MIB = 1 << 20
PROBE_EVERY = 0.005     # seconds between the Version calls made while an attack runs
PROXY_ENV = {"MALLOC_MMAP_THRESHOLD_": "67108864", "MALLOC_TRIM_THRESHOLD_": "268435456"}   # as the unit sets

FULL = dict(fd_limit=1024, half_sent=3000, hold_seconds=600, observe_seconds=30.0, version_calls=500,
            settle_seconds=240.0, scrapes=200)
QUICK = dict(fd_limit=256, half_sent=600, hold_seconds=120, observe_seconds=5.0, version_calls=150,
             settle_seconds=20.0, scrapes=50)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- measures

def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1)."""
    s = sorted(values)
    if not s:
        return float("nan")
    return s[min(len(s) - 1, max(0, int(math.ceil(q * len(s))) - 1))]


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def cpu_seconds(pid: int) -> float:
    """CPU time of process ``pid`` (all threads), from Linux's per-process CPU clock."""
    return time.clock_gettime(((~pid) << 3) | 2)


def timed(fn: Callable[[], Any]) -> Tuple[bool, float]:
    """(whether ``fn()`` succeeded, milliseconds it took)."""
    started = time.perf_counter()
    try:
        fn()
        ok = True
    except (grpc.RpcError, CtlError, OSError):
        ok = False
    return ok, (time.perf_counter() - started) * 1e3


# --------------------------------------------------------------------------- the daemon

class Daemon:
    """``python -m anolisnuma`` from ``tree`` in front of ``backend``, with the admin
    socket and the metrics endpoint on and its fd limit lowered."""

    def __init__(self, tree: str, workdir: str, backend: str, fd_limit: int) -> None:
        self.tree = tree
        self.dir = workdir
        self.admin = os.path.join(workdir, "admin.sock")
        self.socket = os.path.join(workdir, "cri.sock")
        data = config_dict(workdir, backend, listen=self.socket, extra={
            "admin": {"socket": self.admin}, "metrics": {"listen": "127.0.0.1:0"}, "log": {"stderr": False}})
        self.config = write_config(os.path.join(workdir, "config.toml"), data)
        env = dict(os.environ, PYTHONPATH=tree, **PROXY_ENV)
        # cwd=tree: ``-m`` puts the working directory first on sys.path
        self.proc = subprocess.Popen([sys.executable, "-m", "anolisnuma", "-c", self.config], cwd=tree, env=env,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=open(os.path.join(workdir, "stderr"), "wb"), start_new_session=True)
        self.pid = self.proc.pid
        resource.prlimit(self.pid, resource.RLIMIT_NOFILE, (fd_limit, fd_limit))
        wait_for_socket(self.socket, 30, alive=lambda: self.proc.poll() is None)
        self.host, self.port = self._metrics_address()
        self.channel = grpc.insecure_channel("unix://" + self.socket)

    def _metrics_address(self) -> Tuple[str, int]:
        deadline = time.monotonic() + 30
        while True:
            try:
                url = ask(self.admin, "status", timeout=5)["metrics_url"]
                host, port = url[len("http://"):].split("/")[0].rsplit(":", 1)
                return host, int(port)
            except (CtlError, TypeError):
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"no metrics endpoint on the daemon of {self.tree}")
                time.sleep(0.05)

    def version(self) -> float:
        """A Version on the daemon's held connection; milliseconds."""
        started = time.perf_counter()
        self.channel.unary_unary(VERSION)(b"", timeout=30)
        return (time.perf_counter() - started) * 1e3

    def new_connection_version(self) -> Tuple[bool, float]:
        def call() -> None:
            with grpc.insecure_channel("unix://" + self.socket) as ch:
                ch.unary_unary(VERSION)(b"", timeout=5)
        return timed(call)

    def status(self) -> Tuple[bool, float]:
        return timed(lambda: ask(self.admin, "status", timeout=5))

    def resources(self) -> Dict[str, Any]:
        return {"threads": threads(self.pid), "fds": fds(self.pid), "rss_mb": round(rss_bytes(self.pid) / MIB, 1)}

    def stop(self) -> None:
        self.channel.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


class Probe:
    """Version calls paced at :data:`PROBE_EVERY` (so that the daemon's CPU meanwhile is
    mostly the attack's, and latencies before, during and after compare: calls made back
    to back find the CPUs awake and come out faster), with the daemon's peak resources
    sampled between them."""

    def __init__(self, d: "Daemon") -> None:
        self.d = d
        self.ms: List[float] = []
        self.peak = d.resources()
        self.cpu0 = cpu_seconds(d.pid)

    def until(self, done: Callable[[], bool], least: int = 0) -> "Probe":
        started = time.monotonic()
        while not done() or len(self.ms) < least:
            self.ms.append(self.d.version())
            if len(self.ms) % 10 == 0:
                now = self.d.resources()
                self.peak = {k: max(self.peak[k], now[k]) for k in self.peak}
            due = started + len(self.ms) * PROBE_EVERY
            time.sleep(max(0.0, due - time.monotonic()))
        return self

    def figures(self) -> Dict[str, Any]:
        return dict(self.peak, version_p50_ms=round(pct(self.ms, 0.5), 3),
                    version_p99_ms=round(pct(self.ms, 0.99), 3), version_calls=len(self.ms),
                    cpu_s=round(cpu_seconds(self.d.pid) - self.cpu0, 3))


# --------------------------------------------------------------------------- parts

def quiet(d: Daemon, s: Dict[str, Any]) -> Dict[str, Any]:
    """The probe's figures with nothing else going on (after a warm-up)."""
    Probe(d).until(lambda: True, least=20)
    figures = Probe(d).until(lambda: True, least=s["version_calls"]).figures()
    del figures["cpu_s"], figures["version_calls"]
    return figures


def metrics_flood(d: Daemon, s: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    rows: Dict[str, Dict[str, Any]] = {}
    rows["before"] = quiet(d, s)
    with Flood(d.host, d.port) as flood:
        started = time.monotonic()
        held = flood.ask(f"hold {s['half_sent']} {s['hold_seconds']}")
        log(f"  {held['held']} of {s['half_sent']} connected after {time.monotonic() - started:.1f}s; "
            f"held for {s['observe_seconds']:g}s")
        deadline = time.monotonic() + s["observe_seconds"]
        rows["held"] = Probe(d).until(lambda: time.monotonic() >= deadline).figures()
        new_ok, new_ms = d.new_connection_version()
        st_ok, st_ms = d.status()
        state = flood.ask("held")
        rows["held"].update(new_cri_connection="ok" if new_ok else "FAILED", new_cri_ms=round(new_ms, 1),
                            ctl_status="ok" if st_ok else "FAILED", ctl_status_ms=round(st_ms, 1),
                            attacker_open=state["open"], attacker_connecting=state["connecting"])
        released_at = time.monotonic()
        settle = Probe(d)
        flood.ask("release")
    rows["released"] = _settle(settle, rows["before"], s["settle_seconds"])
    rows["released"]["settle_s"] = round(time.monotonic() - released_at, 1)
    rows["after"] = quiet(d, s)
    return rows


def _settle(probe: Probe, before: Dict[str, Any], seconds: float) -> Dict[str, Any]:
    """Probe until the daemon's threads and fds are back near ``before`` (or ``seconds``)."""
    deadline = time.monotonic() + seconds

    def settled() -> bool:
        now = probe.d.resources()
        return now["threads"] <= before["threads"] + 1 and now["fds"] <= before["fds"] + 2

    probe.until(lambda: settled() or time.monotonic() >= deadline, least=50)
    return dict(probe.figures(), settled="yes" if time.monotonic() < deadline else "NO")


def metrics_scrapes(d: Daemon, s: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    rows: Dict[str, Dict[str, Any]] = {"before": quiet(d, s)}
    collections0 = _collections(d)
    time.sleep(1.1)   # past the endpoint's interval: the page just read is not reused
    with Flood(d.host, d.port) as flood:
        probe = Probe(d)
        flood.send(f"scrape {s['scrapes']} 1")
        probe.until(flood.answered)
        result = flood.reply()
    collections1 = _collections(d)
    served = int(result["statuses"].get("200", 0))
    figures = probe.figures()
    rows[f"{s['scrapes']} scrapes"] = dict(
        figures, wall_s=result["seconds"],
        cpu_ms_per_200=round(figures["cpu_s"] * 1e3 / served, 2) if served else "-",
        answers=" ".join(f"{k}:{v}" for k, v in sorted(result["statuses"].items())) + (
            f" errors:{result['errors']}" if result["errors"] else ""),
        collections=(collections1 - collections0) if collections0 is not None and collections1 is not None
        else "not counted")
    return rows


def _collections(d: Daemon) -> Optional[int]:
    """anolisnuma_metrics_collections_total, scraped as root (None when not exposed)."""
    with urllib.request.urlopen(f"http://{d.host}:{d.port}/metrics", timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("anolisnuma_metrics_collections_total "):
                return int(float(line.split()[1]))
    return None


PARTS: Dict[str, Callable[[Daemon, Dict[str, Any]], Dict[str, Dict[str, Any]]]] = {
    "metrics-flood": metrics_flood,
    "metrics-scrapes": metrics_scrapes,
}


# --------------------------------------------------------------------------- driver

def run_part(name: str, tree: str, settings: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    work = tempfile.mkdtemp(prefix="an-doors-", dir="/tmp")   # unix socket paths stay short
    fake = FakeCri(os.path.join(work, "containerd.sock"), containers=0, sandboxes=0).start()
    daemon: Optional[Daemon] = None
    try:
        daemon = Daemon(tree, work, fake.socket_path, settings["fd_limit"])
        return PARTS[name](daemon, settings)
    finally:
        if daemon is not None:
            daemon.stop()
        fake.stop(0)
        shutil.rmtree(work, ignore_errors=True)


def table(title: str, results: Dict[str, Dict[str, Dict[str, Any]]]) -> str:
    """One column per (tree, phase), one row per figure."""
    columns = [(tree, phase) for tree, rows in results.items() for phase in rows]
    keys: List[str] = []
    for tree, phase in columns:
        keys += [k for k in results[tree][phase] if k not in keys]
    heads = [f"{tree}:{phase}" if len(results) > 1 else phase for tree, phase in columns]
    width = max(len(k) for k in keys) + 2
    cells = [[str(results[t][p].get(k, "")) for t, p in columns] for k in keys]
    colw = [max(len(h), *(len(row[i]) for row in cells)) + 2 for i, h in enumerate(heads)]
    out = [title, "".ljust(width) + "".join(h.rjust(w) for h, w in zip(heads, colw))]
    for k, row in zip(keys, cells):
        out.append(k.ljust(width) + "".join(c.rjust(w) for c, w in zip(row, colw)))
    return "\n".join(out)


def tree_commit(tree: str) -> str:
    """The commit of a git work tree with uncommitted changes marked, or "" (an export)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", tree] + list(args), capture_output=True, text=True).stdout.strip()

    if os.path.realpath(git("rev-parse", "--show-toplevel") or "/nonexistent") != os.path.realpath(tree):
        return ""
    return git("rev-parse", "--short", "HEAD") + ("+changes" if git("status", "--porcelain", "--untracked-files=no")
                                                   else "")


def _interrupted(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller floods (< 30 s a tree)")
    ap.add_argument("--proxy-tree", metavar="DIR", default="",
                    help="also run each part on the daemon of this source tree, first (before/after in one run)")
    ap.add_argument("--only", metavar="PARTS", default=",".join(PARTS), help=f"of {','.join(PARTS)}")
    ap.add_argument("--fd-limit", type=int, default=0, help="the daemon's RLIMIT_NOFILE (default 1024, quick 256)")
    ap.add_argument("--half-sent", type=int, default=0, help="connections held (default 3000, quick 600)")
    ap.add_argument("--scrapes", type=int, default=0, help="concurrent scrapes (default 200, quick 50)")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = ap.parse_args(argv)
    only = [x.strip() for x in args.only.split(",") if x.strip()]
    if set(only) - set(PARTS):
        ap.error(f"--only: unknown part(s) {sorted(set(only) - set(PARTS))}; known: {','.join(PARTS)}")
    if os.geteuid() != 0:
        print("bench_doors: needs root (the attacker drops to nobody; the daemon's fd limit is lowered)",
              file=sys.stderr)
        return 1
    settings = dict(QUICK if args.quick else FULL)
    for key in ("fd_limit", "half_sent", "scrapes"):
        if getattr(args, key):
            settings[key] = getattr(args, key)
    trees = {"after": REPO}
    if args.proxy_tree:
        trees = {"before": os.path.abspath(args.proxy_tree), "after": REPO}
    signal.signal(signal.SIGTERM, _interrupted)
    report: Dict[str, Any] = {"command": " ".join(["scripts/bench_doors.py"] + (argv or sys.argv[1:])),
                              "settings": settings, "trees": {k: [v, tree_commit(v)] for k, v in trees.items()},
                              "cpus": os.cpu_count(), "parts": {}}
    print(f"# {report['command']}\n# trees: " + ", ".join(f"{k}={v} {c}" for k, (v, c) in report["trees"].items())
          + f"\n# settings: {json.dumps(settings)}; {os.cpu_count()} CPUs\n")
    started = time.monotonic()
    try:
        for name in only:
            results = {}
            for label, tree in trees.items():
                log(f"{name} on {label} ({tree})")
                results[label] = run_part(name, tree, settings)
            report["parts"][name] = results
            print(table(f"== {name}", results) + "\n", flush=True)
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    except Exception as e:
        log(f"benchmark failed: {e!r}")
        return 1
    log(f"done in {time.monotonic() - started:.0f}s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
