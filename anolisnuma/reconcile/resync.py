"""The one resync with containerd: the store (the pod/container cache every hook's calls are
resolved from) and every hook agree with what containerd runs.

:class:`RuntimeResync` makes a pass at start (retried by the daemon until containerd
answers) and then every ``[runtime] resync_interval_seconds``: it lists containerd once,
drops from the store the pods and containers containerd no longer has, reads back those it
never saw (created while the proxy was down, or before it was installed, from containerd's
verbose status), has the daemon's :class:`~anolisnuma.state.gone.Reaper` tell every
holder of pod state what the store no longer knows (a removal whose call was lost, a pod
whose RunPodSandbox failed and was not retried), and hands the same listing to every hook
(``Hook.resync``), which make their state follow what runs now (stopped sandboxes hold
nothing) and adopt what is new; the pods new to the store are then named to each hook
(``Hook.pods_adopted``), which tells its decisions about them as at their creation. Whatever the kubelet's calls named since the window before
the listing (:class:`~anolisnuma.pipeline.recent.RecentCalls`) is left alone by all of
them: those calls are newer than the listing.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Container, Dict, List, Optional, Sequence, Tuple

import structlog

from anolisnuma.controller import Controller
from anolisnuma.state.gone import Reaper
from anolisnuma.state.records import ContainerRecord, ContainerResources, PodRecord
from anolisnuma.state.store import Store
from cri_proto import api_pb2

log = structlog.get_logger("anolisnuma.resync")


def resync_store(client: Any, store: Store, fresh: Container[str] = frozenset(), quiet: bool = False
                 ) -> Tuple[List[PodRecord], List[ContainerRecord], Dict[str, int]]:
    """Reconcile ``store`` with containerd through ``client`` (a CriClient); returns the
    pods and containers that run now (ready sandboxes; their created or running containers)
    and what changed. The store keeps every one containerd has, in any state, because the
    kubelet's later calls (RemovePodSandbox of a stopped pod) are resolved from it. IDs in
    ``fresh`` are neither dropped nor read back. ``quiet``: a pass that changed nothing is
    logged at debug. Raises CallError (UNAVAILABLE) when containerd is down."""
    known_pods = {p.sandbox_id for p in store.pods()}
    known_containers = {c.container_id for c in store.containers()}
    sandboxes = client.list_pod_sandboxes()
    containers = client.list_containers()

    live_pods = {s.id for s in sandboxes}
    live_containers = {c.id for c in containers}
    # (records added after ``known_*`` were taken are newer than the listing: never dropped)
    dropped_pods = [sid for sid in known_pods - live_pods
                    if sid not in fresh and store.remove_pod(sid) is not None]
    dropped_containers = [cid for cid in known_containers - live_containers
                          if cid not in fresh and store.remove_container(cid) is not None]

    adopted_pods = 0
    for s in sandboxes:
        if store.pod(s.id) is None and s.id not in fresh and s.metadata.uid not in fresh:
            store.put_pod(_pod_from_containerd(client, s))
            adopted_pods += 1
    adopted_containers = 0
    for c in containers:
        if store.container(c.id) is None and c.id not in fresh and store.pod(c.pod_sandbox_id) is not None:
            store.put_container(_container_from_containerd(client, c))
            adopted_containers += 1
    changes = {"dropped_pods": len(dropped_pods), "dropped_containers": len(dropped_containers),
               "adopted_pods": adopted_pods, "adopted_containers": adopted_containers}
    (log.debug if quiet and not any(changes.values()) else log.info)(
        "store reconciled with containerd", pods=len(live_pods), containers=len(live_containers), **changes)
    # Stopped sandboxes and exited containers hold nothing: StopPodSandbox released them.
    ready = {s.id for s in sandboxes if s.state == api_pb2.SANDBOX_READY}
    running = {c.id for c in containers
               if c.state in (api_pb2.CONTAINER_CREATED, api_pb2.CONTAINER_RUNNING) and c.pod_sandbox_id in ready}
    pods = [p for p in store.pods() if p.sandbox_id in ready]
    ctrs = [c for c in store.containers() if c.container_id in running]
    return pods, ctrs, changes


class RetryBackoff:
    """Delays between retries of a failing pass: ``first`` seconds, doubled after each
    failure up to ``cap``; :meth:`reset` after a success. A containerd that stays down is
    asked (and logged about) less and less often, one that comes back is seen within
    ``cap``."""

    def __init__(self, first: float = 2.0, cap: float = 30.0) -> None:
        self.first = first
        self.cap = max(cap, first)
        self.failures = 0

    def next(self) -> float:
        """The delay before the next retry, counting one more failure."""
        delay = min(self.first * (2 ** min(self.failures, 30)), self.cap)
        self.failures += 1
        return delay

    def reset(self) -> None:
        self.failures = 0


class RuntimeResync(Controller):
    """``RuntimeResync(connect, store, hooks, recent, interval_seconds, opted_out=None,
    reaper=None)``: ``connect()`` opens a client to containerd (one per pass, closed after
    it: no channel is held for the minute between passes); ``recent`` is the pipeline's
    :class:`~anolisnuma.pipeline.recent.RecentCalls`; ``opted_out(pod)`` tells the pods no
    hook may touch (``[hooks] skip_keys``): the hooks never see them; ``reaper`` is told
    to reap after each store pass."""

    name = "runtime-resync"

    def __init__(self, connect: Callable[[], Any], store: Store, hooks: Sequence[Any], recent: Any,
                 interval_seconds: float, opted_out: Optional[Callable[[PodRecord], bool]] = None,
                 reaper: Optional[Reaper] = None) -> None:
        super().__init__()
        self.connect = connect
        self.opted_out = opted_out or (lambda pod: False)
        self.store = store
        self.hooks = list(hooks)
        self.recent = recent
        self.interval = interval_seconds
        self.reaper = reaper
        self.hook_errors = 0
        self.changes: Dict[str, int] = {}
        self._listed = False
        # While containerd cannot be listed: when that began, how often it failed since,
        # and the backed-off delay until the next try (the interval again once it answers).
        self.failing_since: Optional[float] = None
        self.consecutive_failures = 0
        self.last_failure = ""
        self.backoff = RetryBackoff()
        self._retry_in: Optional[float] = None
        self.not_ready: frozenset = frozenset()
        self.adopted: List[PodRecord] = []   # the last listing's pods new to the store
        # called after each pass that the hooks saw (the daemon wakes its re-pinners: what
        # the pass adopted unpinned is pinned now, not at the re-pinner's next interval)
        self.after_pass: Optional[Callable[[], None]] = None

    def listing(self) -> Tuple[List[PodRecord], List[ContainerRecord]]:
        """The store's pass and the reaping after it (the daemon's start-up runs the hooks
        itself)."""
        self.recent.new_window()
        known = {p.sandbox_id for p in self.store.pods()}
        try:
            client = self.connect()
            try:
                pods, containers, changes = resync_store(client, self.store, self.recent, quiet=self._listed)
            finally:
                client.close()
        except BaseException as e:
            self.recent.listing_failed()
            if self.failing_since is None:
                self.failing_since = time.time()
            self.consecutive_failures += 1
            self.last_failure = " ".join(str(e).split())[:300] or repr(e)
            self._retry_in = self.backoff.next()
            raise
        # Sandboxes the store keeps that containerd does not run (stopped, not removed yet):
        # what ``anolisnuma-ctl pods`` shows as stopped. Those calls named since are newer.
        ready = {p.sandbox_id for p in pods}
        self.not_ready = frozenset(p.sandbox_id for p in self.store.pods()
                                   if p.sandbox_id not in ready and p.sandbox_id not in self.recent
                                   and p.uid not in self.recent)
        if self.failing_since is not None:
            log.info("containerd listed again", failed_passes=self.consecutive_failures,
                     failing_seconds=round(time.time() - self.failing_since, 1))
        self.failing_since, self.consecutive_failures, self._retry_in = None, 0, None
        self.backoff.reset()
        self._listed = True
        if self.reaper is not None:
            gone = self.reaper.reap(self.recent)
            self._count("forgotten_pods", len(gone.uids))
        skipped = {p.sandbox_id for p in pods if self.opted_out(p)}
        if skipped:
            pods = [p for p in pods if p.sandbox_id not in skipped]
            containers = [c for c in containers if c.sandbox_id not in skipped]
        for k, v in changes.items():
            self._count(k, v)
        # read back from containerd, not from a call or an event: told by the hooks as at creation
        self.adopted = [p for p in pods if p.sandbox_id not in known and p.sandbox_id not in self.recent
                        and p.uid not in self.recent]
        return pods, containers

    def _count(self, what: str, n: int) -> None:
        self.changes[what] = self.changes.get(what, 0) + n

    def run_once(self) -> Tuple[int, int]:
        pods, containers = self.listing()
        for hook in self.hooks:
            try:
                hook.resync(pods, containers, self.recent)
                tell_adopted(hook, self.adopted)
            except Exception as e:   # one hook's failure must not keep the others stale
                self.hook_errors += 1
                log.error("hook resync failed", hook=hook.name, error=repr(e))
        if self.after_pass is not None:
            self.after_pass()
        return len(pods), len(containers)

    @property
    def retry_in(self) -> Optional[float]:
        """The backed-off delay before retrying a failed listing (``None``: the last one
        worked)."""
        return self._retry_in

    def wait_seconds(self) -> float:
        """A failed pass is retried after the backed-off delay (no longer than the
        interval); else the interval."""
        if self._retry_in is not None and self.interval > 0:
            return min(self._retry_in, self.interval)
        return self.interval

    def counts(self) -> Dict[str, int]:
        return {**self.changes, "hook_errors": self.hook_errors, "consecutive_failures": self.consecutive_failures}

    def health(self) -> Optional[str]:
        """Why the store and the policies may be behind containerd now (``None``: they
        are not): the listing has failed since some time."""
        if self.failing_since is None:
            return None
        retry = f", next try in {self._retry_in:g}s" if self._retry_in is not None else ""
        return (f"cannot list containerd: {self.consecutive_failures} failed "
                f"{'pass' if self.consecutive_failures == 1 else 'passes'} in a row for "
                f"{time.time() - self.failing_since:.0f}s ({self.last_failure}){retry}")


def tell_adopted(hook: Any, pods: List[PodRecord]) -> None:
    """``hook.pods_adopted(pods)`` when there are any and the hook takes them."""
    told = getattr(hook, "pods_adopted", None)
    if pods and told is not None:
        told(pods)


def _pod_from_containerd(client: Any, sandbox: Any) -> PodRecord:
    cgroup_parent = ""
    try:
        _, info = client.pod_sandbox_status(sandbox.id, verbose=True)
        cgroup_parent = _dig(info, "config", "linux", "cgroup_parent") or ""
    except Exception as e:  # the pod may vanish between list and status
        log.warning("cannot read pod status", pod_sandbox_id=sandbox.id, error=str(e))
    md = sandbox.metadata
    return PodRecord(sandbox_id=sandbox.id, uid=md.uid, name=md.name, namespace=md.namespace,
                     cgroup_parent=cgroup_parent, labels=dict(sandbox.labels),
                     annotations=dict(sandbox.annotations), runtime_handler=sandbox.runtime_handler)


def _container_from_containerd(client: Any, container: Any) -> ContainerRecord:
    resources = ContainerResources()
    try:
        _, info = client.container_status(container.id, verbose=True)
        resources = _resources_from_spec(_dig(info, "runtimeSpec", "linux", "resources") or {})
    except Exception as e:
        log.warning("cannot read container status", container_id=container.id, error=str(e))
    return ContainerRecord(container_id=container.id, sandbox_id=container.pod_sandbox_id,
                           name=container.metadata.name, labels=dict(container.labels),
                           annotations=dict(container.annotations), resources=resources)


def _resources_from_spec(res: Dict[str, Any]) -> ContainerResources:
    """ContainerResources from an OCI runtime spec's ``linux.resources``."""
    cpu = res.get("cpu") or {}
    memory = res.get("memory") or {}
    return ContainerResources(
        cpu_period=int(cpu.get("period") or 0), cpu_quota=int(cpu.get("quota") or 0),
        cpu_shares=int(cpu.get("shares") or 0), memory_limit_in_bytes=int(memory.get("limit") or 0),
        cpuset_cpus=str(cpu.get("cpus") or ""), cpuset_mems=str(cpu.get("mems") or ""))


def _dig(data: Any, *keys: str) -> Any:
    for k in keys:
        if not isinstance(data, dict):
            return None
        data = data.get(k)
    return data
