"""Run the daemon on a background thread of the test process.

For functional tests that want to look inside (the store, the counters) while calls pass;
tests of signals and exit codes run ``python -m anolisnuma`` as a subprocess instead.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from typing import Any, List, Optional

from anolisnuma import logsetup
from anolisnuma.config import Config, LogConfig, PathsConfig, RuntimeConfig, ServerConfig
from anolisnuma.daemon import Daemon


def wait_for_socket(path: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listens on {path} after {timeout}s")
            time.sleep(0.01)
        finally:
            s.close()


class InProcessProxy:
    def __init__(self, config: Config, hooks: Optional[List[Any]] = None) -> None:
        self.config = config
        self.daemon = Daemon(config, hooks=hooks)
        self.socket = config.server.listen
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self.exit_code: Optional[int] = None
        self.error: Optional[BaseException] = None

    @classmethod
    def for_backend(cls, backend_socket: str, workdir: str, hooks: Optional[List[Any]] = None,
                    **overrides: Any) -> "InProcessProxy":
        """A proxy config under ``workdir`` (socket, log file, state) in front of ``backend_socket``."""
        config = Config(
            server=ServerConfig(listen=os.path.join(workdir, "anolisnuma.sock"),
                                shutdown_grace_seconds=overrides.pop("grace", 5.0)),
            runtime=RuntimeConfig(endpoint=backend_socket),
            log=LogConfig(file=os.path.join(workdir, "anolisnuma.log"), level=overrides.pop("level", "info"),
                          stderr=False),
            paths=PathsConfig(state_dir=os.path.join(workdir, "state")),
        )
        for key, value in overrides.items():
            setattr(config, key, value)
        return cls(config, hooks=hooks if hooks is not None else [])

    def start(self, timeout: float = 10.0) -> "InProcessProxy":
        logsetup.configure(self.config.log.level, self.config.log.file, self.config.log.stderr)
        self._thread = threading.Thread(target=self._run, name="anolisnuma-proxy", daemon=True)
        self._thread.start()
        wait_for_socket(self.socket, timeout)
        return self

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        try:
            # Signal handlers can only be installed on the main thread: stop() is the SIGTERM path.
            self._loop.add_signal_handler = lambda *a, **k: None  # type: ignore[assignment]
            self.exit_code = self._loop.run_until_complete(self.daemon.run())
        except BaseException as e:
            self.error = e
        finally:
            self._loop.close()

    def stop(self, timeout: float = 30.0) -> Optional[int]:
        """The SIGTERM path: stop accepting, drain calls in flight, exit."""
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self.daemon.stop)
            self._thread.join(timeout)
        if self.error is not None:
            raise self.error
        return self.exit_code

    def wait_resynced(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.daemon.resynced:
            if time.monotonic() > deadline:
                raise TimeoutError("the daemon did not finish its start-up resync")
            time.sleep(0.01)

    def log_lines(self) -> List[dict]:
        import json

        with open(self.config.log.file) as f:
            return [json.loads(line) for line in f if line.strip()]

    def __enter__(self) -> "InProcessProxy":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
