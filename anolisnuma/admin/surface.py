"""What the daemon serves besides the CRI socket: the admin socket and the metrics endpoint.

Started once the CRI socket listens, stopped first at shutdown. Neither may cost the node
its runtime: when one cannot start (its socket is taken, its port is in use) the daemon
goes on relaying without it. That is said where each reader looks: one error line in the
log, one plain line on stderr at start (a person starting a second daemon by hand reads
the terminal, not the log file), and in ``status`` (``surfaces``), which is all a daemon
whose metrics endpoint failed can still be asked.
"""

from __future__ import annotations

import errno
import sys
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
        # What start() was asked to serve and why it could not (None: served, or off).
        self.admin_path = ""
        self.admin_error: Optional[str] = None
        self.metrics_listen = ""
        self.metrics_error: Optional[str] = None

    async def start(self) -> None:
        cfg = self.daemon.config
        if cfg.admin.socket:
            self.admin_path = cfg.admin.socket
            self.commands = AdminCommands(self.daemon, self.started, self.describe)
            server = AdminServer(cfg.admin.socket, self.commands.dispatch)
            try:
                await server.start()
            except (ListenerError, OSError) as e:
                self.admin_error = str(e)
                log.error("admin socket unavailable; running without it (anolisnuma-ctl cannot reach "
                          "this daemon)", socket=cfg.admin.socket, error=str(e))
                tell_operator(admin_socket_unavailable(cfg.admin.socket, e))
            else:
                self.server = server
                log.info("admin socket listening", socket=cfg.admin.socket)
        if cfg.metrics.listen:
            await self._start_metrics()

    async def _start_metrics(self) -> None:
        cfg = self.daemon.config.metrics
        self.metrics_listen = cfg.listen
        host, port = cfg.address
        try:
            from anolisnuma.admin.metrics import DaemonCollector
            from anolisnuma.admin.metrics_http import MetricsServer

            self.metrics = await MetricsServer(host, port, DaemonCollector(self.daemon, self.started)).start()
        except (OSError, ImportError) as e:
            self.metrics_error = str(e)
            log.error("metrics endpoint unavailable; running without it", listen=cfg.listen, error=str(e))
            tell_operator(metrics_unavailable(cfg.listen, e))
            self.metrics = None
            return
        log.info("metrics endpoint listening", url=self.metrics.url)
        if not is_loopback(host):
            log.warning("metrics are served beyond this node (metrics.allow_remote)", listen=cfg.listen)

    def describe(self) -> Dict[str, Any]:
        """The surfaces themselves, for ``status``: where each is served (``admin_socket``,
        ``metrics_url``: None when not served), and under ``surfaces`` what was asked
        for each and why it is not served (``error``: None when it is, or when it is off)."""
        return {"admin_socket": self.server.path if self.server is not None else None,
                "metrics_url": self.metrics.url if self.metrics is not None else None,
                "surfaces": {"admin_socket": {"path": self.admin_path, "error": self.admin_error},
                             "metrics": {"listen": self.metrics_listen, "error": self.metrics_error}}}

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


def admin_socket_unavailable(path: str, error: BaseException) -> str:
    """The line a person reads when the admin socket cannot be served."""
    line = (f"anolisnuma: no admin socket: {error}. This daemon serves the kubelet without it, "
            f"and anolisnuma-ctl cannot reach this daemon")
    if getattr(error, "taken", False):
        # the worst of it: `anolisnuma-ctl` answers, from the other daemon
        line += (f": at {path} it reaches the other one. Stop that one, or give this daemon a socket "
                 f"of its own ([admin] socket)")
    return line + "."


def metrics_unavailable(listen: str, error: BaseException) -> str:
    """The line a person reads when the metrics endpoint cannot be served."""
    why = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
    line = f"anolisnuma: no metrics endpoint: cannot serve {listen}: {why}. This daemon serves the kubelet without it"
    if isinstance(error, OSError) and error.errno == errno.EADDRINUSE:
        line += ("; another process (another anolisnuma?) has that port: stop it, or give this daemon a port "
                 "of its own ([metrics] listen)")
    return line + "; `anolisnuma-ctl status` says so."


def tell_operator(line: str) -> None:
    """One line on stderr, whatever the log's destination: it says what a person starting
    the daemon must know now. A closed stderr costs nothing but the line."""
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
