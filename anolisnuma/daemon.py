"""The daemon: listen first, then resync and start the policies; shut down gracefully.

The socket is listening before anything slow happens, because the kubelet calls Version at
its own start and exits if that fails. The start-up resync with containerd runs in the
background and is retried while containerd is down; calls are relayed meanwhile. Every
background loop (the store's writer, each hook's reconcilers and watchers) is a
:class:`~anolisnuma.controller.Controller` registered in :attr:`Daemon.controllers`.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from typing import Any, Dict, List, Optional, Set

import structlog

from anolisnuma import __version__, logsetup
from anolisnuma import reload as reload_plan
from anolisnuma.admin.surface import AdminSurface
from anolisnuma.config import Config
from anolisnuma.configfile import ConfigError
from anolisnuma.controller import Controller, Controllers
from anolisnuma.cri.client import CriClient
from anolisnuma.pipeline.hooks import Hook
from anolisnuma.pipeline.interceptor import HOOK_THREADS, Interceptor
from anolisnuma.reconcile.resync import RuntimeResync, tell_adopted
from anolisnuma.state.store import Store
from anolisnuma.system import sd_notify
from anolisnuma.system.open_files import open_files_soft_limit, raise_open_files_limit
from anolisnuma.transport.connection_cap import connection_cap
from anolisnuma.transport.listener import UnixListener
from anolisnuma.transport.relay import Relay
from anolisnuma.workers import WorkerPool

log = structlog.get_logger("anolisnuma.daemon")

RESYNC_RETRY_SECONDS = 2.0       # the first retry of the start-up resync; backed off from there
RESYNC_RETRY_MAX_SECONDS = 30.0


def read_kubelet_cgroup_settings(files_root: str) -> Dict[str, Any]:
    """The kubelet's cgroup root and driver as its files below ``files_root`` set them, read
    by the reader `anolisnuma-ctl kubelet` uses (imported when called: it is a large module;
    the system layer gets it from here so that it never imports the ctl layer)."""
    from anolisnuma.ctl.kubelet import Root, cgroup_settings, inspect

    return dict(cgroup_settings(inspect(Root(files_root))))


def kubelet_reserved_cpus(files_root: str) -> Any:
    """The CPUs the kubelet reserves (``reservedSystemCPUs`` / ``--reserved-cpus``) as a
    CpuSet, read from its files below ``files_root`` by the same reader as its cgroup
    settings; empty when it names none. One that cannot be read or parsed is logged and
    taken as none: the NodeResourceTopology then counts them as allocatable, as it says."""
    from anolisnuma.ctl.kubelet import Root, inspect, reserved_cpus
    from anolisnuma.policies.numa.cpuset import EMPTY, CpuSet

    try:
        setting = reserved_cpus(inspect(Root(files_root)))
        cpus = CpuSet.parse(setting.value) if setting.value else EMPTY
    except Exception as e:   # an unreadable kubelet setup costs the exactness of allocatable only
        log.warning("cannot read the kubelet's reserved CPUs; the NodeResourceTopology counts none",
                    error=repr(e)[:300])
        return EMPTY
    if cpus:
        log.info("the kubelet's reserved CPUs are left out of the NodeResourceTopology's allocatable",
                 reserved_cpus=str(cpus), origin=setting.origin)
    return cpus


def build_hooks(config: Config) -> List[Hook]:
    """The hooks the configuration enables, in the order they run.

    A hook that cannot be built (its host facts unreadable, say) is left out with an error
    line, so the node keeps a working runtime; unless its failure policy is ``fail``: then
    the operator asked for pods to be refused rather than run without the policy, and the
    daemon does not start (HookUnavailable).
    """
    wanted = []
    layout = None   # the kubelet's cgroup layout, read once for every hook
    if (config.numa is not None and config.numa.enabled) or (config.qos is not None and config.qos.enabled):
        from anolisnuma.system.pod_cgroups import resolve_layout

        layout = resolve_layout(config.cgroups, log, read_kubelet_cgroup_settings)
    if config.numa is not None and config.numa.enabled:
        wanted.append(("numa", lambda: _numa_hook(config, layout)))
    if config.qos is not None and config.qos.enabled:
        wanted.append(("qos", lambda: _qos_hook(config, layout)))
    hooks: List[Hook] = []
    for name, make in wanted:
        try:
            hooks.append(make())
        except Exception as e:
            if config.hooks.settings(name).failure_policy == "fail":
                raise HookUnavailable(f"hook {name} cannot start: {e}") from e
            log.error("hook cannot start; running without it", hook=name, error=repr(e))
    return hooks


def build_cluster_link(config: Config, hooks: List[Hook]) -> Any:
    """The daemon's one link to the API server (``anolisnuma/cluster/link.py``) when
    ``[kubernetes]`` names a kubeconfig, whichever hooks run: the Oenuma rules need the NUMA
    hook's placement service, the events on pods do not. Built before the hooks take calls
    (the rules saved from the CRs apply from the first), and wired to every hook that
    reports its decisions about pods."""
    k = config.kubernetes
    if k is None or not k.enabled:
        return None
    from anolisnuma.cluster.link import cluster_link, link_node_name

    placement = next((h.placement for h in hooks if getattr(h, "placement", None) is not None), None)
    reserved = (kubelet_reserved_cpus(config.cgroups.kubelet_files_root)
                if k.topology and placement is not None else None)
    link = cluster_link(k, placement, config.paths.state_dir, link_node_name(k, config.numa), reserved)
    wire_decision_events(hooks, link)
    return link


def wire_decision_events(hooks: List[Hook], link: Any) -> None:
    """Give every hook that reports its decisions about pods (``use_decision_events``) the
    sink of the API server link, when there is one (events on the pods,
    ``anolisnuma/decision_events.py``); without it the hooks keep their no-op sink."""
    if link is None:
        return
    sink = link.decision_events()
    for h in hooks:
        use = getattr(h, "use_decision_events", None)
        if use is not None:
            use(sink)


class HookUnavailable(Exception):
    pass


def _numa_hook(config: Config, layout: Any = None) -> Hook:
    from anolisnuma.hooks.numa import NumaHook

    return NumaHook(config.numa, config.paths, layout=layout)


def _qos_hook(config: Config, layout: Any = None) -> Hook:
    from anolisnuma.hooks.qos import QosHook

    return QosHook(config.qos, config.paths, layout=layout)


EXIT_START = 1


class Daemon:
    """``hooks=None``: built from the configuration once the socket listens."""

    def __init__(self, config: Config, hooks: Optional[List[Hook]] = None) -> None:
        self.config = config
        self.store = Store(config.paths.state_dir)
        self.hooks: List[Hook] = list(hooks) if hooks is not None else []
        self._build_hooks = hooks is None
        # Hooks and start-up work; all its threads exist from here on (anolisnuma.workers).
        self.executor = WorkerPool(HOOK_THREADS, "hook")
        self.interceptor = Interceptor(hooks, config.hooks, self.store, self.executor,
                                       max_message_bytes=config.server.max_message_bytes)
        self.interceptor.set_debug(config.log.level == "debug")
        # NRI mode: the policies act on containerd's NRI events; the relay defers to it
        self.nri_enabled = config.nri is not None and config.nri.enabled
        self.interceptor.relay_hooks = not self.nri_enabled
        self.nri: Any = None   # the NRI plugin (anolisnuma.nri.plugin.NriPlugin), in NRI mode
        # As containerd does: every connection costs descriptors, and the runtime behind us
        # serves as many as its own limit allows.
        self.open_files = raise_open_files_limit()
        self.relay = Relay(config.runtime.endpoint, self.interceptor,
                           connect_timeout=config.runtime.connect_timeout_seconds,
                           max_message_bytes=config.server.max_message_bytes,
                           budget_per_connection=config.server.buffer_bytes_per_connection,
                           budget_total=config.server.buffer_bytes_total,
                           max_connections=connection_cap(config.server.max_connections, self.open_files.soft),
                           handshake_timeout=config.server.handshake_timeout_seconds)
        self.listener = UnixListener(config.server.listen, config.server.socket_mode, activation=True)
        self.admin = AdminSurface(self)   # admin socket and metrics endpoint (anolisnuma/admin)
        self._stop: Optional[asyncio.Event] = None
        self._reloading: Optional[asyncio.Lock] = None   # made by run()
        self.reload_pool = WorkerPool(1, "reload")   # one reload at a time anyway
        self._reload_tasks: Set[asyncio.Task] = set()   # SIGHUPs' reloads in progress
        self._resync_task: Optional[asyncio.Task] = None
        self.controllers = Controllers()   # every background loop, started and stopped here
        self.cluster: Any = None   # the API server link (anolisnuma.cluster.link.ClusterLink), when on
        self.runtime_resync: Optional[RuntimeResync] = None
        self.resynced = False
        self.ready = False
        self.exit_code = 0
        self.failure = ""   # why the daemon stopped by itself, for the command line

    async def run(self) -> int:
        """Listen first (the kubelet calls Version at its start and gives up if that
        fails), then build the hooks, then tell systemd we are ready. Intercepted calls
        that arrive meanwhile wait for their hooks; every other call is relayed at once."""
        loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._reloading = asyncio.Lock()   # made here: on 3.9 a lock binds to the loop current when made
        # Before the socket answers: a SIGTERM that comes as soon as it does (a restart
        # right after a start) is a graceful stop, not the default handler's sudden death.
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        loop.add_signal_handler(signal.SIGHUP, self._on_sighup)
        loop.add_signal_handler(signal.SIGUSR1, logsetup.reopen)
        sock = self.listener.open()
        # asyncio listens again on the socket it is given, with a backlog of 100 unless told;
        # from 3.13 it would also unlink the path at close, which is the listener's to do
        # (and never for systemd's socket).
        extra = {"cleanup_socket": False} if sys.version_info >= (3, 13) else {}
        server = await loop.create_unix_server(self.relay.protocol, sock=sock, backlog=self.listener.backlog,
                                               **extra)
        log.info("anolisnuma listening", version=__version__, listen=self.listener.path,
                 socket_activation=self.listener.inherited or None,
                 runtime=self.config.runtime.endpoint, config=self.config.source,
                 max_connections=self.relay.max_connections, open_files_limit=self.open_files.soft)
        self._warn_connection_limits()
        if self.nri_enabled:
            log.info("NRI mode: the policies act on containerd's NRI events; this socket relays every call "
                     "unchanged", nri_socket=self.config.nri.socket)
        if self.config.server.socket_mode & 0o007:
            log.warning("server.socket_mode lets every local user in: through this socket they reach "
                        "containerd's root API (0660 keeps it to root and the socket's group)",
                        socket_mode=oct(self.config.server.socket_mode))
        self.store.load()
        self.controllers.add(self.store.writer)
        self.store.start()
        try:
            await self.admin.start()
            if await self._start_hooks():
                self._resync_task = asyncio.ensure_future(self._resync_until_done())
                self.ready = True
                sd_notify.notify("READY=1", f"STATUS=relaying; hooks: {', '.join(h.name for h in self.hooks) or 'none'}")
                await self._stop.wait()
        finally:
            sd_notify.notify("STOPPING=1")
            await self._shutdown(server)
        return self.exit_code

    def _warn_connection_limits(self) -> None:
        limit, configured = self.open_files, self.config.server.max_connections
        if limit.error:
            log.warning("cannot raise the open-files limit; connections are capped by it",
                        soft=limit.soft, hard=limit.hard, error=limit.error, max_connections=self.relay.max_connections)
        if configured > self.relay.max_connections:
            log.warning("server.max_connections is more than the open-files limit carries (two descriptors a "
                        "connection); the lower cap applies", configured=configured,
                        max_connections=self.relay.max_connections, open_files_limit=limit.soft)

    async def _start_hooks(self) -> bool:
        """Build the hooks the configuration enables (unless given); False when one whose
        failure policy is ``fail`` cannot start: the daemon then stops (exit 1)."""
        if self._build_hooks:
            try:
                self.hooks = await asyncio.get_running_loop().run_in_executor(self.executor, build_hooks, self.config)
            except HookUnavailable as e:
                log.error("cannot start: a hook whose failure_policy is fail is unavailable", error=str(e))
                self.interceptor.hooks_failed(str(e))
                self.exit_code = EXIT_START
                self.failure = str(e)
                return False
        self.cluster = await asyncio.get_running_loop().run_in_executor(
            self.executor, build_cluster_link, self.config, self.hooks)
        if self._build_hooks:
            self.interceptor.set_hooks(self.hooks)
        log.info("hooks ready", hooks=[h.name for h in self.hooks])
        return True

    async def reload(self) -> reload_plan.ReloadPlan:
        """Re-read the configuration file and apply what may change live (SIGHUP, the
        admin ``reload``). The file is read and parsed off the event loop, so the relay
        goes on relaying whatever sits at the path, and on a thread of its own (started with
        the daemon: see anolisnuma.workers), not the hooks' pool (hung hooks can fill that one). Reloads run one at a time, in the
        order they came: two reads racing on threads could finish out of order and leave
        the older file applied. An unusable file raises ConfigError, logged once; the
        running configuration stays."""
        async with self._reloading:
            if not self.config.source:
                raise ConfigError("", "the daemon was not started from a file")
            try:
                new = await asyncio.get_running_loop().run_in_executor(self.reload_pool, Config.load,
                                                                       self.config.source)
            except RuntimeError as e:   # the pool shut down: the daemon is stopping
                raise ConfigError("", f"cannot read the configuration now: {e}") from None
            except ConfigError as e:
                log.error("configuration reload refused; the running configuration stays", error=str(e))
                raise
            return self._apply(new)

    def _apply(self, new: Config) -> reload_plan.ReloadPlan:
        """Take from ``new`` what may change live (on the event loop: the relay and the
        interceptor read these between their own steps)."""
        plan = reload_plan.plan(self.config, new)
        cfg = self.config
        if "log.level" in plan.live:
            cfg.log.level = new.log.level
            logsetup.set_level(new.log.level)
            self.interceptor.set_debug(new.log.level == "debug")
        cfg.hooks = new.hooks
        self.interceptor.set_config(new.hooks)
        cfg.server.shutdown_grace_seconds = new.server.shutdown_grace_seconds
        cfg.server.buffer_bytes_per_connection = new.server.buffer_bytes_per_connection
        cfg.server.buffer_bytes_total = new.server.buffer_bytes_total
        self.relay.set_budgets(new.server.buffer_bytes_per_connection, new.server.buffer_bytes_total)
        cfg.server.max_connections = new.server.max_connections
        self.relay.set_max_connections(connection_cap(new.server.max_connections, open_files_soft_limit()))
        cfg.runtime.connect_timeout_seconds = self.relay.connect_timeout = new.runtime.connect_timeout_seconds
        if "runtime.resync_interval_seconds" in plan.live:
            interval = cfg.runtime.resync_interval_seconds = new.runtime.resync_interval_seconds
            resync = self.runtime_resync
            if resync is not None:   # (still starting: it takes the new interval when it starts)
                resync.interval = interval
                if self.resynced:
                    self.interceptor.recent.set_enabled(interval > 0)
                    resync.wake()   # the loop is waiting with the old interval
        log.info("configuration reloaded", config=cfg.source, applied=plan.live or None,
                 needs_restart=plan.restart or None,
                 how_to_restart=reload_plan.restart_hint(plan, self.listener.inherited) or None)
        return plan

    def _on_sighup(self) -> None:
        task = asyncio.ensure_future(self._reload_quietly())
        self._reload_tasks.add(task)   # the loop keeps only a weak reference to a task
        task.add_done_callback(self._reload_tasks.discard)

    async def _reload_quietly(self) -> None:
        try:
            await self.reload()
        except ConfigError:
            pass  # logged: the running configuration stays

    def stop(self) -> None:
        if self._stop is not None:
            self._stop.set()

    async def _resync_until_done(self) -> None:
        """The start-up resync (retried while containerd is down), then each hook's resync,
        start and background loops; then the periodic resync."""
        loop = asyncio.get_running_loop()
        resync = self.runtime_resync = RuntimeResync(
            lambda: self._connect(30.0), self.store, [], self.interceptor.recent,
            self.config.runtime.resync_interval_seconds, opted_out=self.interceptor.opted_out,
            reaper=self.interceptor.reaper)
        while True:
            try:
                pods, containers = await loop.run_in_executor(self.executor, resync.listing)
                break
            except Exception as e:
                delay = min(resync.retry_in or RESYNC_RETRY_SECONDS, RESYNC_RETRY_MAX_SECONDS)
                log.warning("cannot resync with containerd yet; retrying", error=str(e).splitlines()[0][:300],
                            retry_in_seconds=delay, failed_passes=resync.consecutive_failures)
                await asyncio.sleep(delay)
        if self.nri_enabled:   # made first, started last: the re-pinner's client from its first pass
            self._make_nri(resync)
        for hook in self.hooks:
            try:
                await loop.run_in_executor(self.executor, hook.resync, pods, containers, self.interceptor.recent)
                await loop.run_in_executor(self.executor, tell_adopted, hook, resync.adopted)
                await loop.run_in_executor(self.executor, hook.start)
                loops = await loop.run_in_executor(self.executor, hook.controllers, self._connect, self.store)
            except Exception as e:
                log.error("hook could not start; it stays passive", hook=hook.name, error=repr(e))
                continue
            self._repin_through_nri(hook)
            resync.hooks.append(hook)
            for holder in hook.holders():   # told what is gone from now on
                self.interceptor.reaper.add(holder)
            for controller in loops:   # all registered first: a cancelled start-up still stops them
                self.controllers.add(controller)
            for controller in loops:
                await self._start_controller(controller)
        if self.cluster is not None:
            numa = next((h for h in self.hooks if getattr(h, "repinner", None) is not None), None)
            loops = self.cluster.controllers(numa.repinner.wake if numa is not None else lambda: None)
            for controller in loops:
                self.controllers.add(controller)
            for controller in loops:
                await self._start_controller(controller)
        resync.after_pass = self._wake_repinners
        self.controllers.add(resync)
        await self._start_controller(resync)
        if self.nri is not None:
            # registered last, so stopped first: no event reaches the hooks once their loops
            # (numa.json's writer among them) are stopping
            self.controllers.add(self.nri)
            self.nri.start()
            self.nri.wake()
            log.info("background loop started", controller=self.nri.name, socket=self.config.nri.socket)
        # With no periodic resync, nothing would ever turn the windows of what calls named.
        self.interceptor.recent.set_enabled(resync.interval > 0)
        self.resynced = True

    def _make_nri(self, resync: RuntimeResync) -> None:
        """The NRI plugin, registered (started) once the policies are ready: an event that
        came earlier would wait for them past containerd's 2 s. On registering it wakes the
        re-pinner, whose live moves leave through NRI (:meth:`_repin_through_nri`)."""
        from anolisnuma.nri.frontend import NriFrontEnd
        from anolisnuma.nri.plugin import NriPlugin

        self.nri = NriPlugin(self.config.nri, NriFrontEnd(self.interceptor, asyncio.get_running_loop()),
                             on_synchronize=resync.wake, on_registered=self._wake_repinners)

    def _repin_through_nri(self, hook: Hook) -> None:
        """In NRI mode, ``hook``'s re-pinner sends through the plugin (its CRI client the
        plugin's fallback) before its first pass: after a restart, the re-pins of what was
        adopted wait for the registration (``NriPlugin.ready``) rather than go out as CRI
        updates first."""
        repinner = getattr(hook, "repinner", None)
        if self.nri is None or repinner is None:
            return
        self.nri.fallback = repinner.client
        repinner.client = self.nri

    def _wake_repinners(self) -> None:
        for hook in self.hooks:
            repinner = getattr(hook, "repinner", None)
            if repinner is not None:
                repinner.wake()

    def _connect(self, timeout_seconds: Optional[float] = None) -> Any:
        """A new client to containerd for a background loop."""
        rt = self.config.runtime
        if timeout_seconds is None:
            return CriClient(rt.endpoint, rt.max_message_bytes)
        return CriClient(rt.endpoint, rt.max_message_bytes, timeout_seconds=timeout_seconds)

    async def _start_controller(self, controller: Controller) -> None:
        """Start a registered background loop (after its first pass, when it wants one)."""
        if controller.run_at_start:
            await asyncio.get_running_loop().run_in_executor(self.executor, controller.step)
        controller.start()
        log.info("background loop started", controller=controller.name, interval_seconds=controller.interval)

    async def _shutdown(self, server: asyncio.AbstractServer) -> None:
        """Stop accepting at once (under socket activation new connections then wait in
        systemd's backlog for the next process), say goodbye on every kubelet connection
        (GOAWAY: the kubelet's next call opens a new one), let the calls in flight finish
        within ``server.shutdown_grace_seconds``, then their post-hooks and state records,
        and flush the state."""
        grace = self.config.server.shutdown_grace_seconds
        deadline = time.monotonic() + grace
        server.close()
        self.listener.close()   # systemd's socket: our descriptor only
        log.info("shutting down: no new connections taken, GOAWAY sent, waiting for calls in flight",
                 grace_seconds=grace,
                 new_connections="wait in systemd's backlog" if self.listener.inherited else "refused")
        await self.admin.close()
        started = time.monotonic()
        cut = await self.relay.drain(max(0.0, deadline - time.monotonic()))
        drained_ms = round((time.monotonic() - started) * 1000, 1)
        if cut:
            log.warning("shutdown grace over: calls still in flight were cut (the kubelet retries them)",
                        grace_seconds=grace, calls_cut=len(cut), methods=_count(cut))
        # Post-hooks of the calls that finished run within their hook budgets; not cut by the grace.
        after = await self.interceptor.settle(max(deadline - time.monotonic(), self._post_budget()))
        if after:
            log.warning("post-hooks still running at shutdown were left", post_hooks_left=after)
        self.interceptor.aborts.flush()  # the counts of calls cut short, not left unsaid
        if self._resync_task is not None and not self._resync_task.done():
            self._resync_task.cancel()
        self.controllers.stop_all()
        if self.cluster is not None:
            self.cluster.close()   # (its loops stopped, or never started: its clients closed)
        for hook in self.hooks:
            try:
                hook.close()
            except Exception as e:
                log.warning("hook did not close cleanly", hook=hook.name, error=repr(e))
        self.store.close()
        self.executor.shutdown(wait=False)
        self.reload_pool.shutdown(wait=False)
        log.info("anolisnuma stopped", calls_cut=len(cut), drained_in_ms=drained_ms, counters=self.interceptor.counters.snapshot())

    def _post_budget(self) -> float:
        """The longest a post-hook may take (its budget), for the wait at shutdown."""
        return max([self.config.hooks.settings(h.name).budget_seconds for h in self.hooks] or [0.0])


def _count(methods: List[str]) -> Dict[str, int]:
    out: Dict[str, int] = {}
    for m in methods:
        name = m.rsplit("/", 1)[-1] or "(no path)"
        out[name] = out.get(name, 0) + 1
    return out
