"""The CRI conformance suite (critest of cri-tools) against a private containerd, directly
and through anolisnuma: what ``scripts/critest/run.py`` and ``tests/conformance`` share.

:class:`ConformanceLab` holds one private containerd of a given build (with a CNI network
the host can reach, and registry mirrors pointing at the loopback registry of stand-in
images, ``critest_registry.py``) and runs critest on it, directly or through a daemon it
starts with a configuration it is given, each run starting alike (no pod; no image but the
harness's). :func:`run_critest` returns each spec's outcome; :func:`differences` compares two
runs spec by spec.

critest and crictl: ``$ANOLISNUMA_CRI_TOOLS_DIR``, else ``<repo>/../shared/cri-tools``, else
``/work/shared/cri-tools`` (cri-tools ``ba03eabc``, see its README), or any built pair.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from anolisnuma.configfile import load_toml
from anolisnuma.testing.containerd import IMAGES, PrivateContainerd
from anolisnuma.testing.containerd_builds import DEBIAN, ContainerdBuild, shared_dir
from anolisnuma.testing.critest_registry import NONEWPRIVS_GO, Registry, critest_images, write_hosts_toml
from anolisnuma.testing.proxy import REPO_ROOT, SubprocessProxy

FAILED_STATES = ("failed", "panicked", "timedout", "aborted", "interrupted")
PORTMAP_CHAINS = ("CNI-HOSTPORT-DNAT", "CNI-HOSTPORT-SNAT", "CNI-HOSTPORT-SETMARK", "CNI-HOSTPORT-MASQ")
SHIPPED_CONFIG = os.path.join(REPO_ROOT, "config.toml")

Results = Dict[str, Dict[str, Any]]   # spec name -> {state, seconds, failure, start, end}
# The tables of a test session's runs (build -> lines), for its closing summary.
TABLES: Dict[str, List[str]] = {}


def cri_tools() -> Tuple[str, str]:
    """(critest, crictl) of ``../shared/cri-tools`` (or ``$ANOLISNUMA_CRI_TOOLS_DIR``)."""
    where = shared_dir("cri-tools", "ANOLISNUMA_CRI_TOOLS_DIR")
    return os.path.join(where, "critest"), os.path.join(where, "crictl")


def cri_tools_missing() -> Optional[str]:
    for path in cri_tools():
        if not os.access(path, os.X_OK):
            return f"{path} not found (set ANOLISNUMA_CRI_TOOLS_DIR to critest and crictl of cri-tools)"
    return None


def log_line(msg: str) -> None:
    import sys
    print(f"[critest {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


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


def ensure_nonewprivs(cache: str) -> Optional[str]:
    """The static "Effective uid: N" program of the nonewprivs stand-in image (cached in
    ``cache``); None without a Go toolchain (its specs then fail both ways alike)."""
    from anolisnuma.testing.goclient import find_go

    out = os.path.join(cache, "nonewprivs")
    if os.access(out, os.X_OK):
        return out
    try:
        go = find_go()
    except RuntimeError as e:
        log_line(f"no nonewprivs image (its NoNewPrivs specs fail both ways): {e}")
        return None
    os.makedirs(cache, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="critest-nnp-", dir="/tmp")
    try:
        with open(os.path.join(scratch, "main.go"), "w") as f:
            f.write(NONEWPRIVS_GO)
        env = go_env(cache)
        env["GO111MODULE"] = "off"
        r = subprocess.run([go, "build", "-trimpath", "-o", out + ".tmp", "main.go"], cwd=scratch, env=env,
                           capture_output=True, text=True)
        if r.returncode != 0:
            log_line(f"no nonewprivs image: go build failed: {r.stderr.strip()}")
            return None
        os.rename(out + ".tmp", out)
        return out
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def go_env(cache: str) -> Dict[str, str]:
    env = dict(os.environ)
    env.setdefault("GOTOOLCHAIN", "local")
    env["CGO_ENABLED"] = "0"
    env["GOCACHE"] = os.path.join(cache, "gocache")
    env["GOPATH"] = os.path.join(cache, "gopath")
    env["GOFLAGS"] = "-modcacherw"
    return env


# --------------------------------------------------------------------------- the daemon

def shipped_config(workdir: str, backend: str, listen: str, admin: str) -> Dict[str, Any]:
    """The repository's ``config.toml`` as it ships (QoS on, NUMA off, every limit at its
    default), with only what a private run must own moved under ``workdir``: the sockets,
    the runtime endpoint, the state, the log and the (absent) kubelet CPU manager state."""
    data = load_toml(SHIPPED_CONFIG)
    data.setdefault("server", {})["listen"] = listen
    data.setdefault("runtime", {})["endpoint"] = backend
    data.setdefault("admin", {})["socket"] = admin
    data.setdefault("log", {}).update(file=os.path.join(workdir, "anolisnuma.log"), stderr=False)
    paths = data.setdefault("paths", {})
    paths["state_dir"] = os.path.join(workdir, "state")
    paths["kubelet_cpu_manager_state"] = os.path.join(workdir, "kubelet", "cpu_manager_state")
    return data


# --------------------------------------------------------------------------- critest

def go_regexp_escape(text: str) -> str:
    return re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\1", text)


def spec_name(report: Dict[str, Any]) -> str:
    return " ".join([t for t in report.get("ContainerHierarchyTexts") or []] + [report.get("LeafNodeText", "")])


def timestamp(value: str) -> float:
    """ginkgo's RFC 3339 time with nanoseconds -> epoch seconds."""
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$", value or "")
    if not m:
        return 0.0
    tz = "+00:00" if m.group(3) == "Z" else m.group(3)
    base = datetime.datetime.fromisoformat(m.group(1) + tz).timestamp()
    return base + (float("0" + m.group(2)) if m.group(2) else 0.0)


def run_critest(critest: str, sock: str, out_dir: str, tag: str, seed: int = 1, focus: Optional[List[str]] = None,
                skip: Optional[List[str]] = None, timeout: str = "3h") -> Results:
    """One critest run (serial, one seed: the same spec order each run); its output and
    ginkgo's JSON report are kept in ``out_dir`` as ``<tag>.critest.log`` and ``<tag>.json``."""
    report = os.path.join(out_dir, f"{tag}.json")
    cmd = [critest, "-runtime-endpoint", "unix://" + sock, "-image-endpoint", "unix://" + sock,
           "-ginkgo.no-color", "-ginkgo.v", f"-ginkgo.seed={seed}",
           f"-ginkgo.timeout={timeout}", f"-ginkgo.json-report={report}"]
    cmd += [f"-ginkgo.focus={f}" for f in focus or []]
    cmd += [f"-ginkgo.skip={s}" for s in skip or []]
    log_line(f"{tag}: critest on {sock} (output: {tag}.critest.log)")
    t0 = time.monotonic()
    with open(os.path.join(out_dir, f"{tag}.critest.log"), "w") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        # critest writes temporary files (log dirs, seccomp profiles) under TMPDIR
        subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=out_dir, stdin=subprocess.DEVNULL)
    results: Results = {}
    try:
        with open(report) as f:
            suites = json.load(f)
    except (OSError, ValueError) as e:
        log_line(f"{tag}: no JSON report ({e}); see {tag}.critest.log")
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
                                     "failure": msg, "start": timestamp(s.get("StartTime", "")),
                                     "end": timestamp(s.get("EndTime", ""))}
    n = counts(results)
    log_line(f"{tag}: {n['passed']} passed, {n['failed']} failed, {n['skipped']} skipped "
             f"in {time.monotonic() - t0:.0f}s")
    return results


def outcome(r: Optional[Dict[str, Any]]) -> str:
    if r is None:
        return "-"
    return "failed" if r["state"] in FAILED_STATES else r["state"]


def counts(results: Results) -> Dict[str, int]:
    out = {"passed": 0, "failed": 0, "skipped": 0}
    for r in results.values():
        o = outcome(r)
        out[o if o in out else "skipped"] += 1
    return out


def differences(base: Results, other: Results) -> List[str]:
    """Specs whose outcome differs between two runs, sorted."""
    return sorted(n for n in set(base) | set(other) if outcome(base.get(n)) != outcome(other.get(n)))


def regressions(direct: Results, proxied: Results) -> List[str]:
    """Specs that pass direct and do not pass through the proxy."""
    return sorted(n for n, r in direct.items() if outcome(r) == "passed" and outcome(proxied.get(n)) != "passed")


def failing_directly(direct: Results, proxied: Results) -> List[str]:
    """The lines that say, before a table's "failed" counts, which specs fail on containerd
    itself and how each fared through the daemon: a reader of a green run's "failed 5"
    otherwise cannot tell them from a regression. The gate does not count them (it fails
    on a spec that passes directly and not through the daemon); why each fails here is in
    docs/conformance.md."""
    failed = [n for n in sorted(direct) if outcome(direct[n]) == "failed"]
    if not failed:
        return []
    alike = all(outcome(proxied.get(n)) == "failed" for n in failed)
    head = (f"{len(failed)} spec(s) fail on containerd itself" + (", and the same through the daemon" if alike else "")
            + ": expected here (why each: docs/conformance.md, \"Failing every way\"); the gate fails only on a spec that passes "
              "directly and not through the daemon")
    return [head] + [f"- {short_spec(n)}" + ("" if outcome(proxied.get(n)) == "failed"
                                             else f" (through the daemon: {outcome(proxied.get(n))})")
                     for n in failed]


def short_spec(name: str) -> str:
    """A spec's name without the tags every one of them has."""
    for tag in ("[k8s.io] ", "[sig-node] "):
        if name.startswith(tag):
            name = name[len(tag):]
    return name[:-len(" [Conformance]")] if name.endswith(" [Conformance]") else name


# --------------------------------------------------------------------------- the lab

ConfigMaker = Callable[[str, str, str, str], Dict[str, Any]]   # (workdir, backend, listen, admin) -> config


class ConformanceLab:
    """A private containerd of ``build`` and the loopback registry, for critest runs.

    ``with ConformanceLab(...) as lab: lab.direct("direct"); lab.proxied("proxy", shipped_config)``.
    Everything started is stopped and removed on exit (containerd, shims, mounts, bridge,
    cgroups, the registry, the portmap plugin's iptables chains)."""

    def __init__(self, critest: str, crictl: str, out_dir: str, build: ContainerdBuild = DEBIAN,
                 cache: Optional[str] = None, seed: int = 1, timeout: str = "3h",
                 proxy_python: Optional[str] = None) -> None:
        self.critest = critest
        self.crictl = crictl
        self.out = out_dir
        self.build = build
        self.cache = cache or os.path.join(os.path.expanduser("~"), ".cache", "anolisnuma", "critest")
        self.seed = seed
        self.timeout = timeout
        self.proxy_python = proxy_python
        self.proxy_logs: Dict[str, str] = {}   # tag -> the daemon's log, kept in out_dir
        self._chains_before: List[str] = []
        self._registry: Optional[Registry] = None
        self.pc: Optional[CritestContainerd] = None
        self._seq = 0

    def __enter__(self) -> "ConformanceLab":
        os.makedirs(self.out, exist_ok=True)
        self._chains_before = iptables_chains()
        try:
            self._registry = Registry(critest_images(nonewprivs=ensure_nonewprivs(self.cache)),
                                      log_path=os.path.join(self.out, "registry.log")).start()
            where = f"{os.getpid()}-{self.build.name.replace('.', '')}"
            self.pc = CritestContainerd(f"/tmp/anolisnuma-critest-{where}", f"/run/anolisnuma-critest-{where}",
                                        cni=True, build=self.build)
            self.pc.registry_url = self._registry.url
            self.pc.start()
            self.pc.import_images()
            log_line(f"containerd {self.build.version()} on {self.pc.socket} (bridge {self.pc.bridge}, "
                     f"{self.pc.subnet}); registry {self._registry.url}")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        problems: List[str] = []
        if self.pc is not None:
            problems = self.pc.cleanup(save_log=os.path.join(self.out, f"containerd-{self.build.name}.log"))
        if self._registry is not None:
            self._registry.stop()
        remove_portmap_chains(self._chains_before)
        for p in problems:
            log_line(f"cleanup: {p}")

    @property
    def socket(self) -> str:
        assert self.pc is not None
        return self.pc.socket

    def direct(self, tag: str, focus: Optional[List[str]] = None, skip: Optional[List[str]] = None) -> Results:
        reset_containerd(self.crictl, self.socket)
        return run_critest(self.critest, self.socket, self.out, tag, self.seed, focus, skip, self.timeout)

    def proxied(self, tag: str, make_config: ConfigMaker, focus: Optional[List[str]] = None,
                skip: Optional[List[str]] = None, after: Optional[Callable[[str], None]] = None) -> Results:
        """critest through a daemon run on ``make_config(workdir, backend, listen, admin)``;
        ``after(admin socket)`` runs while the daemon still does (e.g. to ask its status)."""
        assert self.pc is not None
        reset_containerd(self.crictl, self.socket)
        self._seq += 1
        workdir = os.path.join(self.pc.base_dir, f"proxy-{self._seq}")
        listen = os.path.join(self.pc.run_dir, f"an{self._seq}.sock")
        admin = os.path.join(self.pc.run_dir, f"adm{self._seq}.sock")
        data = make_config(workdir, self.socket, listen, admin)
        proxy = SubprocessProxy(data, workdir, python=self.proxy_python)
        proxy.start(timeout=30)
        log_line(f"{tag}: anolisnuma pid {proxy.proc.pid} on {listen}")
        try:
            results = run_critest(self.critest, listen, self.out, tag, self.seed, focus, skip, self.timeout)
            if after is not None:
                after(admin)
        finally:
            code = proxy.stop()
            for src, suffix in ((data["log"]["file"], "anolisnuma.log"), (proxy.stderr_path, "anolisnuma.stderr")):
                if os.path.exists(src):
                    shutil.copyfile(src, os.path.join(self.out, f"{tag}.{suffix}"))
            shutil.copyfile(proxy.config_path, os.path.join(self.out, f"{tag}.anolisnuma.toml"))
            log_line(f"{tag}: anolisnuma exited {code}")
        self.proxy_logs[tag] = os.path.join(self.out, f"{tag}.anolisnuma.log")
        return results
