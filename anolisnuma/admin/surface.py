"""What the daemon serves besides the CRI socket: the admin socket and the metrics endpoint.

Started once the CRI socket listens, stopped first at shutdown. Neither may cost the node
its runtime: when one cannot start (its socket is taken, its port is in use) that is one
error line and the daemon goes on relaying without it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Dict, Optional

import structlog

from anolisnuma.admin.commands import AdminCommands
from anolisnuma.admin.server import AdminServer
from anolisnuma.config import is_loopback
from anolisnuma.transport.listener import ListenerError

if TYPE_CHECKING:  # pragma: no cover
    from anolisnuma.admin.metrics_http import MetricsServer
    from anolisnuma.admin.daemon_view import DaemonView

log = structlog.get_logger("anolisnuma.admin")


class AdminSurface:
    def __init__(self, daemon: "DaemonView") -> None:
        self.daemon = daemon
        self.started = time.monotonic()
        self.commands: Optional[AdminCommands] = None
        self.server: Optional[AdminServer] = None
        self.metrics: Optional["MetricsServer"] = None

    async def start(self) -> None:
        cfg = self.daemon.config
        if cfg.admin.socket:
            self.commands = AdminCommands(self.daemon, self.started, self.describe)
            server = AdminServer(cfg.admin.socket, self.commands.dispatch)
            try:
                await server.start()
            except (ListenerError, OSError) as e:
                log.error("admin socket unavailable; running without it (anolisnuma-ctl cannot reach "
                          "this daemon)", socket=cfg.admin.socket, error=str(e))
            else:
                self.server = server
                log.info("admin socket listening", socket=cfg.admin.socket)
        if cfg.metrics.listen:
            await self._start_metrics()

    async def _start_metrics(self) -> None:
        cfg = self.daemon.config.metrics
        host, port = cfg.address
        try:
            from anolisnuma.admin.metrics import DaemonCollector
            from anolisnuma.admin.metrics_http import MetricsServer

            self.metrics = await MetricsServer(host, port, DaemonCollector(self.daemon, self.started)).start()
        except (OSError, ImportError) as e:
            log.error("metrics endpoint unavailable; running without it", listen=cfg.listen, error=str(e))
            self.metrics = None
            return
        log.info("metrics endpoint listening", url=self.metrics.url)
        if not is_loopback(host):
            log.warning("metrics are served beyond this node (metrics.allow_remote)", listen=cfg.listen)

    def describe(self) -> Dict[str, Any]:
        """The surfaces themselves, for ``status``."""
        return {"admin_socket": self.server.path if self.server is not None else None,
                "metrics_url": self.metrics.url if self.metrics is not None else None}

    async def close(self) -> None:
        if self.server is not None:
            await self.server.close()
            self.server = None
        if self.metrics is not None:
            metrics, self.metrics = self.metrics, None
            await metrics.stop()
        if self.commands is not None:
            self.commands.close()
            self.commands = None
