"""What the admin surface reads of a running daemon: the one thing admin/ knows of it.

The admin socket's commands, its views and the metrics collector are handed the daemon
itself, but see it only as a :class:`DaemonView`: the parts listed here, read and never
replaced, and ``reload()``. :class:`anolisnuma.daemon.Daemon` satisfies the protocol by
its shape; it is never imported from admin/, so the admin modules can be read and tested
without the daemon (a test passes any object of this shape), and the daemon imports the
admin surface without a circle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, List, Optional, Protocol, runtime_checkable

if TYPE_CHECKING:  # pragma: no cover - imports for type checkers only
    from anolisnuma.cluster.link import ClusterLink
    from anolisnuma.config import Config
    from anolisnuma.controller import Controllers
    from anolisnuma.pipeline.hooks import Hook
    from anolisnuma.pipeline.interceptor import Interceptor
    from anolisnuma.reconcile.resync import RuntimeResync
    from anolisnuma.reload import ReloadPlan
    from anolisnuma.state.store import Store
    from anolisnuma.transport.relay import Relay
    from anolisnuma.workers import WorkerPool


@runtime_checkable
class DaemonView(Protocol):
    """The running daemon as the admin surface sees it."""

    @property
    def config(self) -> "Config": ...   # the configuration in force (replaced by a reload)

    @property
    def store(self) -> "Store": ...

    @property
    def hooks(self) -> List["Hook"]: ...

    @property
    def interceptor(self) -> "Interceptor": ...

    @property
    def relay(self) -> "Relay": ...

    @property
    def controllers(self) -> "Controllers": ...

    @property
    def runtime_resync(self) -> Optional["RuntimeResync"]: ...

    @property
    def ready(self) -> bool: ...   # the socket listens and the hooks are up

    @property
    def resynced(self) -> bool: ...   # the start-up resync with containerd finished

    @property
    def cluster(self) -> Optional["ClusterLink"]: ...   # the API server link, when [kubernetes] is on

    @property
    def nri(self) -> Any: ...   # the NRI plugin (anolisnuma.nri.plugin.NriPlugin) in NRI mode, once made

    # The daemon's worker pools, and its admin surface, whose pools are counted with them.
    @property
    def executor(self) -> "WorkerPool": ...

    @property
    def reload_pool(self) -> "WorkerPool": ...

    @property
    def admin(self) -> Any: ...   # the AdminSurface (not named: it imports this module)

    async def reload(self) -> "ReloadPlan":
        """Re-read the configuration file and apply what may change live (ConfigError when
        the file is unusable; the running configuration then stays)."""
        ...
