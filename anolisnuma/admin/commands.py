"""The admin socket's commands: ``status``, ``pods``, ``numa``, ``explain``, ``reload``.

The views (:mod:`anolisnuma.admin.views`) run on a small executor of the admin's own: the
daemon's executor runs the hooks, and when hooks hang and fill it is exactly when an
operator asks ``status``. ``reload`` is the daemon's own, as SIGHUP's: the file read on a
thread, the new values applied on the event loop, one reload at a time.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List

from anolisnuma.admin import views
from anolisnuma.admin.server import CommandError
from anolisnuma.configfile import ConfigError
from anolisnuma.workers import WorkerPool

if TYPE_CHECKING:  # pragma: no cover
    from anolisnuma.admin.daemon_view import DaemonView

# containerd must answer Version within this for `status` to call it reachable.
PROBE_TIMEOUT = 2.0


class AdminCommands:
    """``await dispatch(command, args)``; ``surfaces()`` adds what the admin surface itself
    serves (socket path, metrics address) to ``status``."""

    def __init__(self, daemon: "DaemonView", started: float, surfaces: Callable[[], Dict[str, Any]]) -> None:
        self.daemon = daemon
        self.started = started
        self.surfaces = surfaces
        self.executor = WorkerPool(2, "admin")
        self._handlers = {"status": self.status, "pods": self.pods, "numa": self.numa,
                          "explain": self.explain, "reload": self.reload}

    @property
    def names(self) -> List[str]:
        return sorted(self._handlers)

    async def dispatch(self, command: str, args: Dict[str, Any]) -> Any:
        handler = self._handlers.get(command)
        if handler is None:
            raise CommandError(f"unknown command {command!r} (commands: {', '.join(self.names)})")
        return await handler(args)

    def close(self) -> None:
        self.executor.shutdown(wait=False)

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    # ---------------------------------------------------------------- commands
    async def status(self, args: Dict[str, Any]) -> Any:
        uptime = time.monotonic() - self.started
        probe = asyncio.ensure_future(self._run(probe_containerd, self.daemon.config.runtime.endpoint,
                                                self.daemon.config.runtime.max_message_bytes))
        result = await self._run(views.status, self.daemon, uptime, self.surfaces())
        result["containerd"] = await probe
        result.update(views.health(result))
        return result

    async def pods(self, args: Dict[str, Any]) -> Any:
        return await self._run(views.pods, self.daemon)

    async def numa(self, args: Dict[str, Any]) -> Any:
        return await self._run(views.numa, self.daemon)

    async def explain(self, args: Dict[str, Any]) -> Any:
        query = args.get("pod")
        if not isinstance(query, str) or not query.strip():
            raise CommandError("explain needs a pod: namespace/name, a pod UID or a sandbox ID")
        try:
            return await self._run(views.explain, self.daemon, query)
        except views.NotFound as e:
            raise CommandError(str(e)) from None

    async def reload(self, args: Dict[str, Any]) -> Any:
        try:
            plan = await self.daemon.reload()
        except ConfigError as e:
            raise CommandError(f"reload refused, the running configuration stays: {e}") from None
        return {"config": self.daemon.config.source, "applied": plan.live, "needs_restart": plan.restart}


def probe_containerd(endpoint: str, max_message_bytes: int) -> Dict[str, Any]:
    """Whether containerd answers ``Version`` within :data:`PROBE_TIMEOUT` (a new channel
    each time: a kept one would still be backing off after containerd came back)."""
    from anolisnuma.cri.client import CriClient

    started = time.perf_counter()
    client = CriClient(endpoint, max_message_bytes, timeout_seconds=PROBE_TIMEOUT)
    try:
        reply = client.version()
    except Exception as e:
        code = getattr(e, "code", None)
        details = getattr(e, "details", None)
        why = (f"{code().name}: {details()}" if callable(code) and callable(details) else repr(e))
        return {"endpoint": endpoint, "reachable": False, "error": why.splitlines()[0][:300] if why else repr(e)}
    finally:
        client.close()
    return {"endpoint": endpoint, "reachable": True, "runtime": f"{reply.runtime_name} {reply.runtime_version}",
            "api_version": reply.runtime_api_version,
            "latency_ms": round((time.perf_counter() - started) * 1000, 1)}
