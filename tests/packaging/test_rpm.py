"""The rpm (scripts/build-rpm.sh, rpm/): built once for this module, inspected with rpm -qp,
installed into a scratch root, and run from there with this machine's Python, with nothing
but the standard library and the package's own bundle on sys.path.

Needs root, rpm/rpmbuild (Debian's `rpm`) and access to PyPI (the build downloads wheels).
A Python 3.9 (python3.9 on PATH, ~/.pyenv/versions/3.9*, or $ANOLISNUMA_TEST_PYTHON39)
also runs the cp39 bundle, the one openEuler/Anolis/Alinux nodes use; without one those
cases skip.
"""

from __future__ import annotations

import glob
import json
import os
import platform
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LIB = "/usr/lib/anolisnuma"
ARCHES = {"x86_64": 62, "aarch64": 183}  # ELF e_machine
NATIVE = platform.machine()
FOREIGN = {"x86_64": "aarch64", "aarch64": "x86_64"}.get(NATIVE, "")
LOCAL = "%d.%d" % sys.version_info[:2]
# The runtime dependencies and a module each provides (pyproject.toml's [project] dependencies).
RUNTIME_MODULES = ["grpc", "h2", "google.protobuf", "hpack", "structlog", "psutil", "pyroute2", "yaml", "lightkube",
                   "prometheus_client"]

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="installs into a scratch root with rpm: needs root"),
    pytest.mark.skipif(not (shutil.which("rpmbuild") and shutil.which("rpm")), reason="needs rpm and rpmbuild (apt-get install rpm)"),
    pytest.mark.skipif(NATIVE not in ARCHES, reason=f"the rpm is built for x86_64 and aarch64, not {NATIVE}"),
]


def repo_version() -> str:
    with open(os.path.join(REPO, "anolisnuma", "__init__.py")) as f:
        return re.search(r'^__version__ = "(.*)"', f.read(), re.M).group(1)


def run(cmd: List[str], timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                          timeout=timeout, **kw)


def python_version_of(exe: str) -> Optional[str]:
    try:
        r = run([exe, "-c", 'import sys; print("%d.%d" % sys.version_info[:2])'], timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def find_python39() -> Optional[str]:
    candidates = [os.environ.get("ANOLISNUMA_TEST_PYTHON39", ""), shutil.which("python3.9") or "",
                  "/usr/bin/python3.9"]
    candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.9*/bin/python3.9")), reverse=True)
    for c in candidates:
        if c and os.path.exists(c) and python_version_of(c) == "3.9":
            return c
    return None


PY39 = None if LOCAL == "3.9" else find_python39()
# (label, interpreter) that run the installed package: this machine's, and a 3.9 if there is one.
INTERPRETERS = [pytest.param(sys.executable, id=f"python{LOCAL}")]
INTERPRETERS.append(pytest.param(PY39, id="python3.9", marks=pytest.mark.skipif(
    PY39 is None, reason="no Python 3.9 here (set ANOLISNUMA_TEST_PYTHON39) to run the cp39 bundle")))

TIMINGS: Dict[str, float] = {}


def build(arch: str, outdir: str, wheelhouse: str) -> str:
    pythons = "3.9" + (f"={PY39}" if PY39 else "")
    if LOCAL != "3.9":
        pythons += f",{LOCAL}"
    t = time.monotonic()
    r = run(["bash", os.path.join(REPO, "scripts", "build-rpm.sh"), "--arch", arch, "--python", pythons,
             "--outdir", outdir, "--wheelhouse", wheelhouse],
            timeout=600, env=dict(os.environ, PYTHON=sys.executable))
    TIMINGS[f"build {arch}"] = time.monotonic() - t
    assert r.returncode == 0, f"build-rpm.sh failed:\n{r.stderr[-4000:]}"
    rpms = [line for line in r.stdout.split() if line.endswith(f".{arch}.rpm")]
    assert len(rpms) == 1 and os.path.isfile(rpms[0]), r.stdout
    return rpms[0]


@pytest.fixture(scope="module")
def workdir():
    d = tempfile.mkdtemp(prefix="an-rpm-", dir="/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)
    if TIMINGS:
        sys.stderr.write("\npackaging timings: " + ", ".join(f"{k} {v:.1f}s" for k, v in TIMINGS.items()) + "\n")


def checkout_modules() -> List[str]:
    """The checkout's modules but the test helpers, as paths relative to it."""
    out = []
    for base in ["anolisnuma", "cri_proto", "nri_proto"]:
        for dirpath, dirs, names in os.walk(os.path.join(REPO, base)):
            dirs[:] = [d for d in dirs if d not in ("__pycache__", "testing")]
            out += [os.path.relpath(os.path.join(dirpath, n), REPO) for n in names if n.endswith(".py")]
    return out


@pytest.fixture(scope="module")
def native_rpm(workdir) -> str:
    global MODULES_AT_BUILD
    MODULES_AT_BUILD = checkout_modules()   # before: files others add meanwhile are not in this build
    return build(NATIVE, os.path.join(workdir, "out"), os.path.join(workdir, "wheels"))


MODULES_AT_BUILD: List[str] = []


@pytest.fixture(scope="module")
def foreign_rpm(workdir) -> str:
    return build(FOREIGN, os.path.join(workdir, "out"), os.path.join(workdir, "wheels"))


def rpm_install(rpm: str, root: str, *extra: str) -> None:
    os.makedirs(root, exist_ok=True)
    t = time.monotonic()
    # --dbpath is inside --root: the scratch root has its own rpm database.
    r = run(["rpm", "-i", "--root", root, "--dbpath", "/var/lib/rpm", "--nodeps", "--noscripts", *extra, rpm],
            timeout=120)
    TIMINGS[f"install {os.path.basename(rpm)}"] = time.monotonic() - t
    assert r.returncode == 0, r.stderr
    r = run(["rpm", "-V", "--root", root, "--dbpath", "/var/lib/rpm", "--nodeps", "anolisnuma"])
    assert r.returncode == 0 and r.stdout == "", r.stdout + r.stderr


@pytest.fixture(scope="module")
def installed(native_rpm, workdir) -> str:
    root = os.path.join(workdir, "root")
    rpm_install(native_rpm, root)
    return root


def query(rpm: str, *args: str) -> str:
    r = run(["rpm", "-qp", *args, rpm])
    assert r.returncode == 0, r.stderr
    return r.stdout


def clean_env(python: Optional[str], **extra: str) -> Dict[str, str]:
    """What the launcher sees: no PYTHONPATH, no virtualenv, a system PATH."""
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
    if python:
        env["ANOLISNUMA_PYTHON"] = python
    env.update(extra)
    return env


# ---- what the rpm holds -------------------------------------------------------------------

def test_contents(native_rpm):
    files = set(query(native_rpm, "-l").split())
    for path in ["/usr/bin/anolisnuma", "/usr/bin/anolisnuma-ctl", f"{LIB}/launch.py",
                 f"{LIB}/app/anolisnuma/cli.py", f"{LIB}/app/anolisnuma/daemon.py", f"{LIB}/app/cri_proto/api_pb2.py",
                 f"{LIB}/app/nri_proto/api_pb2.py", f"{LIB}/app/nri_proto/ttrpc_pb2.py",
                 "/etc/anolisnuma/config.toml", "/usr/lib/systemd/system/anolisnuma.service",
                 "/usr/lib/systemd/system/anolisnuma.socket", "/usr/share/anolisnuma/deploy/crd-oenuma.yaml",
                 "/etc/logrotate.d/anolisnuma", "/usr/share/anolisnuma/kubelet-99-anolisnuma-endpoint.conf",
                 "/usr/share/doc/anolisnuma/README.md", "/usr/share/doc/anolisnuma/bundled.txt", "/var/lib/anolisnuma"]:
        assert path in files, path
    # A bundle per Python version: the nodes' 3.9 and this machine's.
    for v in {"3.9", LOCAL}:
        xy = v.replace(".", "")
        assert f"{LIB}/python{v}/google/protobuf/__init__.py" in files
        assert f"{LIB}/python{v}/h2/__init__.py" in files and f"{LIB}/python{v}/hyperframe/__init__.py" in files
        assert any(re.match(rf"{LIB}/python{v}/yaml/_yaml\.cpython-{xy}-{NATIVE}-linux-gnu\.so$", f)
                   for f in files), f"no _yaml for cp{xy}"
        # grpcio: the daemon's own calls to containerd (anolisnuma/cri/client.py)
        assert any(re.match(rf"{LIB}/python{v}/grpc/_cython/cygrpc\.cpython-{xy}-{NATIVE}-linux-gnu\.so$", f)
                   for f in files), f"no cygrpc for cp{xy}"
        assert f"{LIB}/app/cri_proto/runtime_service_pb2_grpc.py" in files
        if v == "3.9":
            assert f"{LIB}/python{v}/tomli/__init__.py" in files  # tomli; python_version < '3.11'
    # No test helpers, no tests, no build tools, nothing of the build machine.
    assert not [f for f in files if "/anolisnuma/testing" in f or "/tests/" in f or f.endswith("/tests")]
    assert not [f for f in files if f.endswith((".pyx", ".pxd", ".pxi"))]   # (Cython sources of the wheels)
    assert not [f for f in files if "grpc_tools" in f or "/pip/" in f or "site-packages" in f]
    assert not [f for f in files if re.match(rf"{LIB}/python[^/]+/bin/", f)]
    # Every module of the checkout (but the test helpers) is in it.
    assert MODULES_AT_BUILD
    for rel in MODULES_AT_BUILD:
        assert f"{LIB}/app/{rel}" in files, rel


def test_file_flags_and_modes(native_rpm):
    flags = {}
    for line in query(native_rpm, "--qf", "[%{FILEFLAGS:fflags} %{FILEMODES:perms} %{FILENAMES}\n]").splitlines():
        parts = line.split()
        if len(parts) == 2:
            parts.insert(0, "")
        flags[parts[2]] = (parts[0], parts[1])
    assert flags["/etc/anolisnuma/config.toml"][0] == "cn"   # %config(noreplace)
    assert flags["/etc/logrotate.d/anolisnuma"][0] == "cn"
    assert "d" in flags["/usr/share/doc/anolisnuma/README.md"][0]
    assert flags["/usr/bin/anolisnuma"][1] == "-rwxr-xr-x"
    assert flags["/usr/bin/anolisnuma-ctl"][1] == "-rwxr-xr-x"
    assert flags["/var/lib/anolisnuma"][1] == "drwx------"
    assert query(native_rpm, "--qf", "%{ARCH}") == NATIVE
    assert query(native_rpm, "--qf", "%{VERSION}") == repo_version()


def test_requires_only_what_the_distributions_have(native_rpm):
    requires = [r.strip() for r in query(native_rpm, "--requires").splitlines()]
    text = "\n".join(requires)
    for banned in ["python3-protobuf", "python3-grpcio", "python3-pyyaml", "python3-structlog", "pip",
                   "python(abi)", "python3dist", "containerd", ".so"]:
        assert banned not in text, f"{banned} required:\n{text}"
    python = [r for r in requires if r.startswith("(")]
    assert len(python) == 1, text
    assert "(python3 >= 3.9 with python3 < 3.10)" in python[0] and "python39" in python[0]
    if LOCAL != "3.9":
        assert f"python{LOCAL}" in python[0] or f"python3{LOCAL[2:]}" in python[0]
    others = {r for r in requires if r not in python and not r.startswith("rpmlib(")}
    assert others <= {"/bin/sh", "systemd", "glibc >= 2.17"}, others
    provides = query(native_rpm, "--provides")
    assert "bundled(python3dist(h2))" in provides and "bundled(python3dist(protobuf))" in provides
    assert "bundled(python3dist(grpcio))" in provides


def test_scriptlets_are_systemd_housekeeping_without_network(native_rpm):
    scripts = query(native_rpm, "--scripts")
    assert "postinstall scriptlet" in scripts and "preuninstall scriptlet" in scripts
    assert "postuninstall scriptlet" in scripts
    assert "systemctl daemon-reload" in scripts
    assert "systemctl --no-reload preset anolisnuma.socket anolisnuma.service" in scripts   # the site's policy
    assert "systemctl --no-reload disable --now anolisnuma.service" in scripts   # erase
    assert "systemctl --no-reload disable --now anolisnuma.socket" in scripts
    assert "systemctl try-restart anolisnuma.service" in scripts   # upgrade: the new code runs
    # The kubelet is never stopped or restarted (it Wants the proxy; an upgrade restarts only us).
    assert not re.search(r"systemctl[^\n]*\b(start|stop|restart|try-restart|reload|kill)\b[^\n]*kubelet", scripts)
    for net in ["pip", "curl", "wget", "yum", "dnf", "http", "easy_install"]:
        assert net not in scripts, net


# ---- installed into a scratch root, run from there ---------------------------------------

@pytest.mark.parametrize("python", INTERPRETERS)
def test_installed_version_and_check_config(installed, python, tmp_path):
    t = time.monotonic()
    exe = os.path.join(installed, "usr/bin/anolisnuma")
    r = run([exe, "--version"], cwd=str(tmp_path), env=clean_env(python, ANOLISNUMA_LAUNCHER_DEBUG="1"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"anolisnuma {repo_version()}"
    # sys.path: the installed app and bundle, then the interpreter's standard library only.
    trace = [line for line in r.stderr.splitlines() if "sys.path" in line]
    assert len(trace) == 1, r.stderr
    path = trace[0].split("sys.path ", 1)[1].split(os.pathsep)
    version = python_version_of(python)
    assert path[:2] == [f"{installed}{LIB}/app", f"{installed}{LIB}/python{version}"]
    assert not [p for p in path if "site-packages" in p or p.startswith(REPO) or p in ("", ".")], path

    config = os.path.join(installed, "etc/anolisnuma/config.toml")
    r = run([exe, "--check-config", "-c", config], cwd=str(tmp_path), env=clean_env(python))
    assert r.returncode == 0, r.stderr
    assert "is valid" in r.stdout
    TIMINGS[f"--version, --check-config with python{version}"] = time.monotonic() - t


IMPORT_ALL = r"""
import importlib, json, pkgutil, sys, sysconfig
sys.path[:0] = sys.argv[1:3]
import anolisnuma
names = ["cri_proto", "cri_proto.api_pb2", "nri_proto", "nri_proto.api_pb2", "nri_proto.ttrpc_pb2"] + sys.argv[3].split(",")
names += [m.name for m in pkgutil.walk_packages(anolisnuma.__path__, "anolisnuma.")
          if not m.name.endswith(".__main__")]
for n in names:
    importlib.import_module(n)
stdlib = {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]}
print(json.dumps({"imported": names, "stdlib": sorted(stdlib),
                  "files": sorted({getattr(m, "__file__", None) or "" for m in list(sys.modules.values())} - {""})}))
"""


@pytest.mark.parametrize("python", INTERPRETERS)
def test_every_module_imports_from_the_bundle_alone(installed, python, tmp_path):
    """Every module of the installed package, and every runtime dependency, imports with
    only the standard library and the bundle (-I -S, as the launcher runs it); nothing
    comes from a site-packages or from this checkout."""
    version = python_version_of(python)
    modules = RUNTIME_MODULES + (["tomli"] if version == "3.9" else [])
    r = run([python, "-I", "-S", "-B", "-c", IMPORT_ALL, f"{installed}{LIB}/app", f"{installed}{LIB}/python{version}",
             ",".join(modules)], cwd=str(tmp_path), env=clean_env(None))
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert "anolisnuma.daemon" in out["imported"] and "anolisnuma.cli" in out["imported"]
    assert not [n for n in out["imported"] if n.startswith("anolisnuma.testing")]
    strays = [f for f in out["files"] if not f.startswith(installed + LIB) and not any(f.startswith(s) for s in out["stdlib"])]
    assert not strays, strays


def free_config(tmp: str) -> str:
    """The installed default configuration with every host path moved under tmp."""
    with open(os.path.join(REPO, "config.toml")) as f:
        text = f.read()
    text = re.sub(r'"(/(?:var|run|sys|proc|etc)(?:/[^"]*)?)"', lambda m: f'"{tmp}{m.group(1)}"', text)
    for d in ["sys/fs/cgroup", "var/lib/anolisnuma", "var/log", "proc/sys"]:
        os.makedirs(os.path.join(tmp, d), exist_ok=True)
    path = os.path.join(tmp, "config.toml")
    with open(path, "w") as f:
        f.write(text)
    return path


@pytest.mark.parametrize("python", INTERPRETERS)
def test_installed_daemon_runs(installed, python):
    """The installed daemon starts under the launcher, tells systemd READY=1 (Type=notify),
    relays a kubelet's call (UNAVAILABLE here: no containerd behind it) and stops on SIGTERM."""
    import grpc

    tmp = tempfile.mkdtemp(prefix="an-run-", dir="/tmp")
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    proc = None
    try:
        notify.bind(os.path.join(tmp, "notify"))
        config = free_config(tmp)
        listen = os.path.join(tmp, "var/run/anolisnuma/anolisnuma.sock")
        t = time.monotonic()
        proc = subprocess.Popen([os.path.join(installed, "usr/bin/anolisnuma"), "-c", config], cwd=tmp,
                                env=clean_env(python, NOTIFY_SOCKET=os.path.join(tmp, "notify")),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
        notify.settimeout(30)
        try:
            while b"READY=1" not in notify.recv(4096):
                pass
        except socket.timeout:
            proc.kill()
            pytest.fail(f"no READY=1 within 30 s: {proc.communicate()}")
        ready = time.monotonic() - t
        assert os.path.exists(listen)
        with grpc.insecure_channel(f"unix:{listen}") as ch:
            version = ch.unary_unary("/runtime.v1.RuntimeService/Version")
            with pytest.raises(grpc.RpcError) as e:
                version(b"", timeout=10)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        TIMINGS[f"daemon READY with python{python_version_of(python)}"] = ready
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        notify.close()
        shutil.rmtree(tmp, ignore_errors=True)


def test_running_writes_nothing_into_the_installed_tree(installed):
    """-B: the runs above left no __pycache__ (or anything else) that rpm does not own."""
    r = run(["rpm", "-ql", "--root", installed, "--dbpath", "/var/lib/rpm", "anolisnuma"])
    assert r.returncode == 0, r.stderr
    owned = set(r.stdout.split())
    found = set()
    for dirpath, dirs, names in os.walk(os.path.join(installed, LIB.lstrip("/"))):
        found.update(os.path.join(dirpath, n)[len(installed):] for n in dirs + names)
    assert found - owned == set()


def test_ctl_launcher(installed, tmp_path):
    r = run([os.path.join(installed, "usr/bin/anolisnuma-ctl"), "--help"], cwd=str(tmp_path),
            env=clean_env(sys.executable))
    if not os.path.exists(os.path.join(installed, LIB.lstrip("/"), "app/anolisnuma/ctl/main.py")):
        assert r.returncode == 1 and "has no anolisnuma.ctl.main" in r.stderr, r.stderr
        pytest.skip("anolisnuma.ctl.main is not written yet: anolisnuma-ctl says so in one line")
    assert r.returncode == 0, r.stderr
    assert "anolisnuma-ctl" in r.stdout


def fake_python(bindir: str, name: str, version: str) -> None:
    path = os.path.join(bindir, name)
    if os.path.lexists(path):
        os.unlink(path)   # never write through a symlink to a real interpreter
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\necho {version}\n")
    os.chmod(os.path.join(bindir, name), 0o755)


def test_launcher_picks_a_bundled_python(installed, tmp_path):
    """python3.9 first, then python3, then the python3.X of each bundle; one clear line and
    exit 1 when none fits."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ["readlink", "dirname"]:
        os.symlink(shutil.which(tool), str(bindir / tool))
    exe = os.path.join(installed, "usr/bin/anolisnuma")
    env = {"PATH": str(bindir)}

    fake_python(str(bindir), "python3", "3.6")       # Anolis 8's platform python
    r = run([exe, "--version"], env=env, cwd=str(tmp_path))
    assert r.returncode == 1 and r.stdout == ""
    assert len(r.stderr.splitlines()) == 1, r.stderr
    assert "no Python >= 3.9 with a bundle" in r.stderr and "python3(3.6: too old)" in r.stderr
    assert "python3.9(not found)" in r.stderr

    os.symlink(sys.executable, str(bindir / f"python{LOCAL}"))   # e.g. python3.11 beside it
    r = run([exe, "--version"], env=dict(env, ANOLISNUMA_LAUNCHER_DEBUG="1"), cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert f"python{LOCAL}" in r.stderr

    fake_python(str(bindir), "python3.10", "3.10")   # no bundle for it
    if LOCAL != "3.9":
        os.symlink("python3.10", str(bindir / "python3.9"))   # a wrong python3.9, tried first: skipped
        r = run([exe, "--version"], env=env, cwd=str(tmp_path))
        assert r.returncode == 0, r.stderr

    r = run([exe, "--version"], env=dict(env, ANOLISNUMA_PYTHON=str(bindir / "python3.10")), cwd=str(tmp_path))
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1
    assert "is Python 3.10" in r.stderr and "bundled:" in r.stderr

    r = run([exe, "--version"], env=dict(env, ANOLISNUMA_PYTHON="/nonexistent/python3"), cwd=str(tmp_path))
    assert r.returncode == 1 and "not a working Python" in r.stderr


# ---- the unit, the kubelet drop-in, logrotate ---------------------------------------------

def unit_lines(path: str) -> List[str]:
    with open(path) as f:
        return [line.strip() for line in f if line.strip() and not line.startswith(("#", ";"))]


def verify_root(installed: str, tmp: str) -> str:
    """A root for systemd-analyze verify --root: the host's units (sysinit.target ...), the
    installed files, /bin/kill; /bin and /lib as on the merged-/usr distributions."""
    root = os.path.join(tmp, "vroot")
    units = os.path.join(root, "usr/lib/systemd/system")
    host_units = "/usr/lib/systemd/system" if os.path.isdir("/usr/lib/systemd/system/") else "/lib/systemd/system"
    shutil.copytree(host_units, units, symlinks=True)
    os.makedirs(os.path.join(root, "usr/bin"))
    os.makedirs(os.path.join(root, "etc/systemd/system"))
    os.symlink("usr/bin", os.path.join(root, "bin"))
    shutil.copy2(os.path.join(installed, "usr/lib/systemd/system/anolisnuma.service"), units)
    shutil.copy2(os.path.join(installed, "usr/lib/systemd/system/anolisnuma.socket"), units)
    for exe in ["usr/bin/anolisnuma", "usr/bin/anolisnuma-ctl"]:
        shutil.copy2(os.path.join(installed, exe), os.path.join(root, exe))
    shutil.copy2(os.path.realpath(shutil.which("kill") or "/bin/kill"), os.path.join(root, "usr/bin/kill"))
    return root


def analyze_verify(root: str, unit: str) -> subprocess.CompletedProcess:
    return run(["systemd-analyze", "verify", "--man=no", f"--root={root}", unit], timeout=60)


def test_the_installed_readme_and_docs_link_to_files_that_are_there(installed):
    """The README's links to docs/ (and the docs' to each other and back) resolve in the
    installed layout, /usr/share/doc/anolisnuma, as they do in the repository."""
    doc = os.path.join(installed, "usr/share/doc/anolisnuma")
    pages = [os.path.join(doc, "README.md")] + sorted(glob.glob(os.path.join(doc, "docs", "*.md")))
    assert len(pages) > 5
    checked, broken = 0, []
    for page in pages:
        with open(page, encoding="utf-8") as f:
            text = f.read()
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if "://" in target or target.startswith("mailto:"):
                continue
            path = os.path.normpath(os.path.join(os.path.dirname(page), target))
            if not path.startswith(doc):
                continue   # a link into the source tree (scripts/, tests/): not shipped
            checked += 1
            if not os.path.exists(path):
                broken.append(f"{os.path.relpath(page, doc)} -> {target}")
    assert checked > 5 and not broken, broken


def test_unit_file(installed):
    unit = unit_lines(os.path.join(installed, "usr/lib/systemd/system/anolisnuma.service"))
    for line in ["Type=notify", "NotifyAccess=main", "Before=kubelet.service",
                 "After=containerd.service anolisnuma.socket", "Restart=always", "ExecStart=/usr/bin/anolisnuma -c /etc/anolisnuma/config.toml",
                 "ExecReload=/bin/kill -HUP $MAINPID", "WantedBy=multi-user.target"]:
        assert line in unit, line
    # The kubelet Wants the proxy; nothing makes a proxy restart restart the kubelet.
    assert not [line for line in unit if line.startswith(("RequiredBy=", "BindsTo=", "PartOf="))]
    assert [line for line in unit if line.startswith("Requires=")] == ["Requires=anolisnuma.socket"]


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="no systemd-analyze on this machine")
def test_unit_verifies(installed, tmp_path):
    root = verify_root(installed, str(tmp_path))
    r = analyze_verify(root, "anolisnuma.service")
    assert r.returncode == 0 and "anolisnuma" not in r.stdout + r.stderr, r.stdout + r.stderr
    r = analyze_verify(root, "anolisnuma.socket")
    # verify exits 0 on settings it ignores (a misspelled Type=): any word about our unit fails.
    assert r.returncode == 0 and "anolisnuma" not in r.stdout + r.stderr, r.stdout + r.stderr


KUBEADM_UNIT = """[Unit]
Description=kubelet: The Kubernetes Node Agent
[Service]
ExecStart=/usr/bin/kubelet
Restart=always
[Install]
WantedBy=multi-user.target
"""
KUBEADM_DROPIN = """[Service]
Environment="KUBELET_KUBECONFIG_ARGS=--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf --kubeconfig=/etc/kubernetes/kubelet.conf"
Environment="KUBELET_CONFIG_ARGS=--config=/var/lib/kubelet/config.yaml"
EnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env
EnvironmentFile=-/etc/sysconfig/kubelet
ExecStart=
ExecStart=/usr/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS
"""


def test_kubelet_dropin_sample_wins_on_a_kubeadm_node(installed, tmp_path):
    """Copied where its comment says, the sample is the kubelet's last ExecStart (after
    kubeadm's 10-kubeadm.conf), and on kubeadm's command line our endpoint comes last, so
    it wins over kubeadm-flags.env's flag and the config file whatever /etc/sysconfig/kubelet
    says (unlike the old Environment=KUBELET_EXTRA_ARGS sample)."""
    sample = os.path.join(installed, "usr/share/anolisnuma/kubelet-99-anolisnuma-endpoint.conf")
    lines = unit_lines(sample)
    assert "Wants=anolisnuma.socket anolisnuma.service" in lines
    assert "After=anolisnuma.socket anolisnuma.service" in lines
    assert not [line for line in lines if line.startswith(("Environment", "Requires=", "BindsTo="))]
    execs = [line.split("=", 1)[1] for line in lines if line.startswith("ExecStart=")]
    assert execs[0] == "" and len(execs) == 2
    with open(sample) as f:
        assert "/etc/systemd/system/kubelet.service.d/99-anolisnuma-endpoint.conf" in f.read()
    assert sorted(["10-kubeadm.conf", "99-anolisnuma-endpoint.conf"])[-1] == "99-anolisnuma-endpoint.conf"

    # The effective command line, with kubeadm's environment files.
    env = {"KUBELET_KUBECONFIG_ARGS": "--kubeconfig=/etc/kubernetes/kubelet.conf",
           "KUBELET_CONFIG_ARGS": "--config=/var/lib/kubelet/config.yaml",
           "KUBELET_KUBEADM_ARGS": "--container-runtime-endpoint=unix:///var/run/containerd/containerd.sock --pod-infra-container-image=pause:3.9",
           "KUBELET_EXTRA_ARGS": ""}
    argv = [w for word in execs[1].split() for w in (env[word[1:]].split() if word.startswith("$") else [word])]
    endpoints = [a.split("=", 1)[1] for a in argv if a.startswith("--container-runtime-endpoint=")]
    with open(os.path.join(REPO, "config.toml")) as f:
        listen = re.search(r'^listen = "([^"]*)"', f.read(), re.M).group(1)
    assert endpoints[-1] == f"unix://{listen}"

    if not shutil.which("systemd-analyze"):
        pytest.skip("no systemd-analyze: the drop-in's order and syntax are not verified")
    root = verify_root(installed, str(tmp_path))
    units = os.path.join(root, "usr/lib/systemd/system")
    with open(os.path.join(units, "kubelet.service"), "w") as f:
        f.write(KUBEADM_UNIT)
    os.makedirs(os.path.join(units, "kubelet.service.d"))
    with open(os.path.join(units, "kubelet.service.d/10-kubeadm.conf"), "w") as f:
        f.write(KUBEADM_DROPIN)
    dropins = os.path.join(root, "etc/systemd/system/kubelet.service.d")
    os.makedirs(dropins)
    shutil.copy2(sample, os.path.join(dropins, "99-anolisnuma-endpoint.conf"))
    with open(os.path.join(root, "usr/bin/kubelet"), "w") as f:
        f.write("#!/bin/sh\n")
    os.chmod(os.path.join(root, "usr/bin/kubelet"), 0o755)
    r = analyze_verify(root, "kubelet.service")
    assert r.returncode == 0 and "anolisnuma" not in r.stdout + r.stderr, r.stdout + r.stderr
    # systemd's own order of the drop-ins: ours last.
    r = run(["systemd-analyze", f"--root={root}", "cat-config", "systemd/system/kubelet.service.d"])
    if r.returncode == 0:
        order = [line[2:] for line in r.stdout.splitlines() if line.startswith("# /")]
        assert order[-1].endswith("/99-anolisnuma-endpoint.conf"), order


def test_logrotate_reopens_with_sigusr1(installed, tmp_path):
    path = os.path.join(installed, "etc/logrotate.d/anolisnuma")
    with open(path) as f:
        text = f.read()
    with open(os.path.join(REPO, "config.toml")) as f:
        log = re.search(r'^file = "([^"]*)"', f.read(), re.M).group(1)
    assert re.search(rf"^{re.escape(log)} {{", text, re.M)
    post = re.search(r"postrotate\n(.*?)\n\s*endscript", text, re.S).group(1)
    assert "systemctl kill --signal=SIGUSR1 --kill-who=main anolisnuma.service" in post
    assert "|| true" in post   # a stopped daemon is no rotation error
    if not shutil.which("logrotate"):
        pytest.skip("no logrotate here: the file's syntax is not checked")
    r = run(["logrotate", "-d", "-s", str(tmp_path / "state"), path])
    assert r.returncode == 0 and "error" not in r.stderr.lower(), r.stderr


# ---- the other architecture -----------------------------------------------------------------

@pytest.mark.skipif(not FOREIGN, reason="no foreign architecture")
def test_foreign_arch_rpm(foreign_rpm, native_rpm, workdir):
    """The other architecture's rpm: same files (extension modules named for its arch), its
    ELF objects are all for that machine, same requirements."""
    assert query(foreign_rpm, "--qf", "%{ARCH}") == FOREIGN
    native = set(query(native_rpm, "-l").split())
    foreign = set(query(foreign_rpm, "-l").split())
    assert {f for f in native if "/python3." not in f} <= foreign   # app, launchers, unit, docs
    assert {f.replace(NATIVE, "ARCH") for f in native if f.endswith(".so") and ".libs/" not in f} \
        == {f.replace(FOREIGN, "ARCH") for f in foreign if f.endswith(".so") and ".libs/" not in f}
    assert query(foreign_rpm, "--requires") == query(native_rpm, "--requires")

    root = os.path.join(workdir, f"root-{FOREIGN}")
    rpm_install(foreign_rpm, root, "--ignorearch")
    objects = 0
    for dirpath, _dirs, names in os.walk(os.path.join(root, LIB.lstrip("/"))):
        for n in names:
            p = os.path.join(dirpath, n)
            if os.path.islink(p):
                continue
            with open(p, "rb") as f:
                head = f.read(20)
            if head[:4] == b"\x7fELF":
                objects += 1
                assert struct.unpack("<H", head[18:20])[0] == ARCHES[FOREIGN], p
    assert objects >= 3   # _yaml per Python version, psutil, protobuf's upb
