"""Run the proxy for tests: in-process on a background thread, or as a real subprocess.

- :func:`make_config` / :func:`config_dict` build a configuration whose every path lives
  under a temporary directory (socket, log file, state dir, fake host roots) and whose
  runtime endpoint is a backend socket (a :class:`~anolisnuma.testing.fake_cri.FakeCri`
  or a private containerd); the QoS and NUMA policies are disabled unless asked for.
- :class:`InProcessProxy` runs :class:`~anolisnuma.daemon.Daemon` with its own asyncio
  loop on a thread, with test hooks, and exposes the daemon (store, interceptor, counters).
- :class:`SubprocessProxy` writes a TOML file and runs ``python -m anolisnuma -c FILE``,
  for signals, exit codes and start-up errors.

    fake = FakeCri(str(tmp_path / "cri.sock")).start()
    with InProcessProxy(make_config(tmp_path, fake.socket_path), hooks=[MyHook()]) as proxy:
        channel = grpc.insecure_channel(proxy.address)
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional

from anolisnuma.config import (AdminConfig, Config, HookSettings, HooksConfig, LogConfig, MetricsConfig,
                               PathsConfig, RuntimeConfig, ServerConfig)
from anolisnuma.testing.waiting import wait_until

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# --------------------------------------------------------------------------- configuration

def _paths(base: str) -> Dict[str, str]:
    return {
        "cgroup_root": os.path.join(base, "host", "sys", "fs", "cgroup"),
        "resctrl_root": os.path.join(base, "host", "sys", "fs", "resctrl"),
        "sys_root": os.path.join(base, "host", "sys"),
        "proc_root": os.path.join(base, "host", "proc"),
        "state_dir": os.path.join(base, "state"),
        "kubelet_cpu_manager_state": os.path.join(base, "host", "kubelet", "cpu_manager_state"),
    }


def policy_sections_available() -> Dict[str, bool]:
    """Which policy config modules (``[qos]``, ``[numa]``) exist in this tree."""
    return {
        name: importlib.util.find_spec(f"anolisnuma.policies.{name}.config") is not None
        for name in ("qos", "numa")
    }


def config_dict(base: str, backend: str, *, listen: Optional[str] = None, level: str = "info",
                grace: float = 5.0, extra: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """A TOML-ready configuration: everything under ``base``, runtime at ``backend``.

    ``[qos]``/``[numa]`` get ``enabled = false`` when their parser modules exist; there is
    no admin socket (``{"admin": {"socket": PATH}}`` in ``extra`` makes one). ``extra``
    is merged one level deep (``{"server": {"socket_mode": "0600"}}``)."""
    base = str(base)
    data: Dict[str, Any] = {
        "server": {"listen": listen or os.path.join(base, "run", "anolisnuma.sock"),
                   "shutdown_grace_seconds": grace},
        "runtime": {"endpoint": str(backend), "connect_timeout_seconds": 1.0},
        "log": {"file": os.path.join(base, "log", "anolisnuma.log"), "level": level, "stderr": True},
        "paths": _paths(base),
        "admin": {"socket": ""},
    }
    for name, present in policy_sections_available().items():
        if present:
            data[name] = {"enabled": False}
    for section, values in (extra or {}).items():
        if isinstance(values, dict):
            data.setdefault(section, {}).update(values)
        else:
            data[section] = values
    return data


def make_config(base: str, backend: str, *, listen: Optional[str] = None, level: str = "info",
                grace: float = 5.0, socket_mode: int = 0o660, hooks: Optional[Dict[str, HookSettings]] = None,
                default_hook: Optional[HookSettings] = None, connect_timeout: float = 1.0,
                admin_socket: str = "", metrics_listen: str = "") -> Config:
    """A :class:`Config` built directly (no TOML, no policy sections: QoS/NUMA off; no admin
    socket nor metrics endpoint unless given)."""
    base = str(base)
    hooks_cfg = HooksConfig(default=default_hook or HookSettings(), per_hook=dict(hooks or {}))
    return Config(
        server=ServerConfig(listen=listen or os.path.join(base, "run", "anolisnuma.sock"),
                            socket_mode=socket_mode, shutdown_grace_seconds=grace),
        runtime=RuntimeConfig(endpoint=str(backend), connect_timeout_seconds=connect_timeout),
        log=LogConfig(file=os.path.join(base, "log", "anolisnuma.log"), level=level, stderr=False),
        paths=PathsConfig(**_paths(base)),
        hooks=hooks_cfg,
        admin=AdminConfig(socket=admin_socket),
        metrics=MetricsConfig(listen=metrics_listen),
        source=None,
    )


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):  # inside a list: an array of tables, e.g. [[numa.pin]]
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def to_toml(data: Dict[str, Any], prefix: str = "") -> str:
    """A minimal TOML writer for nested dicts of scalars, lists and lists of tables (enough for configs)."""
    lines: List[str] = []
    tables = []
    for k, v in data.items():
        if isinstance(v, dict):
            tables.append((k, v))
        else:
            lines.append(f"{k} = {_toml_value(v)}")
    out = "\n".join(lines) + ("\n" if lines else "")
    for k, v in tables:
        name = f"{prefix}.{k}" if prefix else k
        out += f"\n[{name}]\n" + to_toml(v, name)
    return out


def write_config(path: str, data: Dict[str, Any]) -> str:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        f.write(to_toml(data))
    return path


# --------------------------------------------------------------------------- helpers

def socket_accepts(path: str) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(0.5)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def wait_for_socket(path: str, timeout: float = 5.0, alive: Any = None) -> None:
    """Wait until ``path`` accepts connections; ``alive()`` returning False aborts early."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path) and socket_accepts(path):
            return
        if alive is not None and not alive():
            raise RuntimeError(f"the proxy died before listening on {path}")
        time.sleep(0.01)
    raise TimeoutError(f"nothing accepted connections on {path} within {timeout}s")


def read_log(path: str) -> List[Dict[str, Any]]:
    """The JSON lines of a log file (lines that are not JSON are skipped)."""
    out = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
    except FileNotFoundError:
        pass
    return out


class _ThreadLoop(asyncio.SelectorEventLoop):
    """An event loop usable off the main thread: signal handlers are not installed
    (``signal.set_wakeup_fd`` only works on the main thread); tests call ``stop()``."""

    def add_signal_handler(self, sig: int, callback: Any, *args: Any) -> None:  # type: ignore[override]
        pass

    def remove_signal_handler(self, sig: int) -> bool:  # type: ignore[override]
        return False


# --------------------------------------------------------------------------- in-process

class InProcessProxy:
    """The daemon on a background thread with its own event loop."""

    def __init__(self, config: Config, hooks: Optional[List[Any]] = None, configure_logging: bool = True) -> None:
        from anolisnuma.daemon import Daemon

        self.config = config
        # hooks=None: the daemon builds them from the configuration, as it does in production
        self.daemon = Daemon(config, hooks=None if hooks is None else list(hooks))
        self.configure_logging = configure_logging
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        self.thread: Optional[threading.Thread] = None
        self.exit_code: Optional[int] = None
        self.error: Optional[BaseException] = None
        self._started = threading.Event()

    @classmethod
    def for_backend(cls, backend_socket: str, workdir: str, hooks: Optional[List[Any]] = None,
                    grace: float = 5.0, level: str = "info") -> "InProcessProxy":
        """A proxy with every path under ``workdir`` in front of ``backend_socket``."""
        return cls(make_config(workdir, backend_socket, grace=grace, level=level), hooks=hooks)

    @property
    def socket_path(self) -> str:
        return self.config.server.listen

    socket = socket_path

    def wait_resynced(self, timeout: float = 30.0) -> None:
        """Wait until the daemon's start-up resync with the backend is done."""
        wait_until(lambda: self.daemon.resynced, "the daemon's start-up resync", timeout)

    @property
    def address(self) -> str:
        return "unix://" + self.config.server.listen

    @property
    def log_file(self) -> str:
        return self.config.log.file

    @property
    def store(self) -> Any:
        return self.daemon.store

    @property
    def interceptor(self) -> Any:
        return self.daemon.interceptor

    def log_lines(self) -> List[Dict[str, Any]]:
        """The log file's lines, including every line logged before this call (a writer
        thread writes them: wait for it)."""
        from anolisnuma import logsetup

        logsetup.flush()
        for h in logging.getLogger().handlers:
            h.flush()
        return read_log(self.config.log.file)

    def start(self, timeout: float = 5.0) -> "InProcessProxy":
        if self.configure_logging:
            from anolisnuma import logsetup

            logsetup.configure(self.config.log.level, self.config.log.file, stderr=False)
        self.thread = threading.Thread(target=self._run, name="anolisnuma-proxy", daemon=True)
        self.thread.start()
        self._started.wait(timeout)
        try:
            wait_for_socket(self.socket_path, timeout, alive=lambda: self.thread.is_alive())
        except Exception:
            if self.error is not None:
                raise self.error
            raise
        return self

    def _run(self) -> None:
        loop = _ThreadLoop()
        asyncio.set_event_loop(loop)
        self.loop = loop
        self._started.set()
        try:
            self.exit_code = loop.run_until_complete(self.daemon.run())
        except BaseException as e:  # reported by start()/stop()
            self.error = e
        finally:
            try:  # what asyncio.run does: cancel what is left (e.g. upstream connects in progress)
                left = [t for t in asyncio.all_tasks(loop) if not t.done()]
                for t in left:
                    t.cancel()
                if left:
                    loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()

    def call_in_loop(self, fn: Any, *args: Any) -> None:
        assert self.loop is not None
        self.loop.call_soon_threadsafe(fn, *args)

    def stop(self, timeout: float = 15.0) -> Optional[int]:
        """Stop like SIGTERM does (graceful drain) and join; returns the exit code."""
        if self.thread is None:
            return self.exit_code
        if self.loop is not None and self.thread.is_alive():
            try:
                self.loop.call_soon_threadsafe(self.daemon.stop)
            except RuntimeError:  # loop already closed
                pass
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise TimeoutError("the in-process proxy did not stop")
        self.thread = None
        if self.configure_logging:
            from anolisnuma import logsetup

            logsetup.shutdown()  # writes out what is queued, stops the writer thread
            root = logging.getLogger()
            for h in list(root.handlers):
                root.removeHandler(h)
                h.close()
            root.addHandler(logging.NullHandler())
        if self.error is not None:
            raise self.error
        return self.exit_code

    def __enter__(self) -> "InProcessProxy":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --------------------------------------------------------------------------- subprocess

class SubprocessProxy:
    """``python -m anolisnuma -c FILE`` as a child process."""

    def __init__(self, config: Any, base: str, python: Optional[str] = None,
                 env: Optional[Dict[str, str]] = None, name: str = "proxy") -> None:
        base = str(base)
        if isinstance(config, dict):
            self.config_path = write_config(os.path.join(base, f"{name}.toml"), config)
            self.data: Optional[Dict[str, Any]] = config
        else:
            self.config_path = str(config)
            self.data = None
        self.python = python or sys.executable
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = REPO_ROOT + os.pathsep + self.env.get("PYTHONPATH", "")
        self.env.update(env or {})
        self.stderr_path = os.path.join(base, f"{name}.stderr")
        self.stdout_path = os.path.join(base, f"{name}.stdout")
        self.proc: Optional[subprocess.Popen] = None

    @property
    def socket_path(self) -> str:
        assert self.data is not None, "socket path unknown for a config given as a file"
        return self.data["server"]["listen"]

    @property
    def address(self) -> str:
        return "unix://" + self.socket_path

    @property
    def stderr(self) -> str:
        try:
            with open(self.stderr_path, errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def start(self, wait: bool = True, timeout: float = 10.0, args: Optional[List[str]] = None) -> "SubprocessProxy":
        cmd = [self.python, "-m", "anolisnuma", "-c", self.config_path] + list(args or [])
        with open(self.stderr_path, "wb") as err, open(self.stdout_path, "wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                         env=self.env, cwd=REPO_ROOT)
        if wait:
            try:
                wait_for_socket(self.socket_path, timeout, alive=lambda: self.proc.poll() is None)
            except Exception as e:
                raise RuntimeError(f"{e}; exit code {self.proc.poll()}; stderr:\n{self.stderr}") from e
        return self

    def signal(self, sig: int = signal.SIGTERM) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 15.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def stop(self, timeout: float = 15.0) -> Optional[int]:
        """SIGTERM, wait, SIGKILL as a last resort; returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode

    def __enter__(self) -> "SubprocessProxy":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run_cli(args: List[str], timeout: float = 30.0, python: Optional[str] = None) -> subprocess.CompletedProcess:
    """``python -m anolisnuma ARGS`` to completion (for --version / --check-config)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([python or sys.executable, "-m", "anolisnuma"] + list(args), capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=REPO_ROOT)


__all__ = ["InProcessProxy", "SubprocessProxy", "config_dict", "make_config", "read_log", "run_cli",
           "socket_accepts", "to_toml", "wait_for_socket", "write_config", "policy_sections_available"]
