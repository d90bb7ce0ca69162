"""The daemon: listen first, then resync and start the policies; shut down gracefully.

The socket is listening before anything slow happens, because the kubelet calls Version at
its own start and exits if that fails. The start-up resync with containerd runs in the
background and is retried while containerd is down; calls are relayed meanwhile.
"""

from __future__ import annotations

import asyncio
import signal
from concurrent.futures import ThreadPoolExecutor
from typing import List, Optional

import structlog

from anolisnuma import __version__
from anolisnuma.config import Config
from anolisnuma.cri.client import CriClient
from anolisnuma.pipeline.hooks import Hook
from anolisnuma.pipeline.interceptor import Interceptor
from anolisnuma.reconcile.numa import CpusetRepinner
from anolisnuma.reconcile.startup import resync_store
from anolisnuma.state.store import Store
from anolisnuma.transport.listener import UnixListener
from anolisnuma.transport.relay import Relay

log = structlog.get_logger("anolisnuma.daemon")

RESYNC_RETRY_SECONDS = 2.0


def build_hooks(config: Config) -> List[Hook]:
    """The hooks the configuration enables, in the order they run.

    A hook that cannot be built (its host facts unreadable, say) is left out with an error
    line, so the node keeps a working runtime; unless its failure policy is ``fail``: then
    the operator asked for pods to be refused rather than run without the policy, and the
    daemon does not start (HookUnavailable).
    """
    wanted = []
    if config.numa is not None and config.numa.enabled:
        wanted.append(("numa", lambda: _numa_hook(config)))
    if config.qos is not None and config.qos.enabled:
        wanted.append(("qos", lambda: _qos_hook(config)))
    hooks: List[Hook] = []
    for name, make in wanted:
        try:
            hooks.append(make())
        except Exception as e:
            if config.hooks.settings(name).failure_policy == "fail":
                raise HookUnavailable(f"hook {name} cannot start: {e}") from e
            log.error("hook cannot start; running without it", hook=name, error=repr(e))
    return hooks


class HookUnavailable(Exception):
    pass


def _numa_hook(config: Config) -> Hook:
    from anolisnuma.hooks.numa import NumaHook

    return NumaHook(config.numa, config.paths)


def _qos_hook(config: Config) -> Hook:
    from anolisnuma.hooks.qos import QosHook

    return QosHook(config.qos, config.paths)


class Daemon:
    def __init__(self, config: Config, hooks: Optional[List[Hook]] = None) -> None:
        self.config = config
        self.store = Store(config.paths.state_dir)
        self.hooks = build_hooks(config) if hooks is None else hooks
        self.executor = ThreadPoolExecutor(max_workers=8, thread_name_prefix="hook")
        self.interceptor = Interceptor(self.hooks, config.hooks, self.store, self.executor,
                                       max_message_bytes=config.server.max_message_bytes)
        self.interceptor.set_debug(config.log.level == "debug")
        self.relay = Relay(config.runtime.endpoint, self.interceptor,
                           connect_timeout=config.runtime.connect_timeout_seconds,
                           max_message_bytes=config.server.max_message_bytes,
                           budget_per_connection=config.server.buffer_bytes_per_connection,
                           budget_total=config.server.buffer_bytes_total)
        self.listener = UnixListener(config.server.listen, config.server.socket_mode)
        self._stop: Optional[asyncio.Event] = None
        self._resync_task: Optional[asyncio.Task] = None
        self._background: List[object] = []
        self.resynced = False

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        sock = self.listener.open()
        # asyncio listens again on the socket it is given, with a backlog of 100 unless told.
        server = await loop.create_unix_server(self.relay.protocol, sock=sock, backlog=self.listener.backlog)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        log.info("anolisnuma listening", version=__version__, listen=self.config.server.listen,
                 runtime=self.config.runtime.endpoint, hooks=[h.name for h in self.hooks],
                 config=self.config.source)
        self.store.load()
        self.store.start()
        self._resync_task = asyncio.ensure_future(self._resync_until_done())
        try:
            await self._stop.wait()
        finally:
            await self._shutdown(server)
        return 0

    def stop(self) -> None:
        if self._stop is not None:
            self._stop.set()

    async def _resync_until_done(self) -> None:
        loop = asyncio.get_running_loop()
        client = CriClient(self.config.runtime.endpoint, self.config.runtime.max_message_bytes,
                           timeout_seconds=30.0)
        try:
            while True:
                try:
                    pods, containers = await loop.run_in_executor(self.executor, resync_store, client, self.store)
                    break
                except Exception as e:
                    log.warning("cannot resync with containerd yet; retrying", error=str(e).splitlines()[0][:300],
                                retry_in_seconds=RESYNC_RETRY_SECONDS)
                    await asyncio.sleep(RESYNC_RETRY_SECONDS)
            for hook in self.hooks:
                try:
                    await loop.run_in_executor(self.executor, hook.resync, pods, containers)
                    await loop.run_in_executor(self.executor, hook.start)
                except Exception as e:
                    log.error("hook could not start; it stays passive", hook=hook.name, error=repr(e))
                    continue
                if hasattr(hook, "pending_updates"):
                    repinner = CpusetRepinner(hook, CriClient(self.config.runtime.endpoint,
                                                              self.config.runtime.max_message_bytes))
                    await loop.run_in_executor(self.executor, repinner.run_once)
                    repinner.start()
                    self._background.append(repinner)
            self.resynced = True
        finally:
            client.close()

    async def _shutdown(self, server: asyncio.AbstractServer) -> None:
        grace = self.config.server.shutdown_grace_seconds
        log.info("shutting down: no new connections, waiting for calls in flight", grace_seconds=grace)
        server.close()
        self.listener.close()
        left = await self.relay.drain(grace)
        self.interceptor.aborts.flush()  # the counts of calls cut short, not left unsaid
        if self._resync_task is not None and not self._resync_task.done():
            self._resync_task.cancel()
        for task in self._background:
            task.close()
        for hook in self.hooks:
            try:
                hook.close()
            except Exception as e:
                log.warning("hook did not close cleanly", hook=hook.name, error=repr(e))
        self.store.close()
        self.executor.shutdown(wait=False)
        log.info("anolisnuma stopped", connections_with_calls_cut=left,
                 counters=self.interceptor.counters.snapshot())
