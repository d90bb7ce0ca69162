"""The daemon's state as plain data (what ``anolisnuma-ctl`` shows, as JSON).

Each function reads the daemon and returns dicts and lists of strings and numbers; none
writes anything. They run on the admin socket's worker thread: the stores they read are
thread-safe (the NUMA ledger through its hook's lock), and what the event loop owns is only
read as single integers.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Tuple

from anolisnuma import __version__
from anolisnuma.state.records import ContainerRecord, PodRecord
from anolisnuma.system.open_files import open_files_soft_limit
from anolisnuma.workers import WorkerPool, census

if TYPE_CHECKING:  # pragma: no cover
    from anolisnuma.admin.daemon_view import DaemonView
    from anolisnuma.hooks.qos import QosHook
    from anolisnuma.placement.service import PlacementService

# The pod markings that decide a policy, shown by `explain` (no other annotation is shown),
# besides the opt-out keys of [hooks] skip_keys.
POLICY_KEYS = ("anolisbox.sh/qoslevel", "koordinator.sh/qosClass", "volcano.sh/preemptable",
               "anolisbox.sh/llc_limit", "numa.anolisnuma.io/skip")
_HEX_ID = re.compile(r"^[0-9a-f]{6,64}$")


class NotFound(LookupError):
    pass


# ---------------------------------------------------------------- the hooks, by what they are

def qos_hook(daemon: "DaemonView") -> Optional["QosHook"]:
    from anolisnuma.hooks.qos import QosHook

    return next((h for h in daemon.hooks if isinstance(h, QosHook)), None)


def placement(daemon: "DaemonView") -> Optional["PlacementService"]:
    """The NUMA placement service, when the NUMA hook runs."""
    from anolisnuma.hooks.numa import NumaHook

    return next((h.placement for h in daemon.hooks if isinstance(h, NumaHook) and h.placement is not None), None)


def cluster(daemon: "DaemonView") -> Optional[Dict[str, Any]]:
    """The API server link (connection, CRs, rules in force) when ``[kubernetes]`` is on."""
    link = daemon.cluster
    return link.status() if link is not None else None


def front_end(daemon: "DaemonView") -> Dict[str, Any]:
    """Where the policies take their pods from: the kubelet's calls through the relay, or
    containerd's NRI events (the relay then passes every call unchanged)."""
    cfg = daemon.config.nri
    if cfg is None or not cfg.enabled:
        return {"mode": "proxy"}
    plugin = daemon.nri
    if plugin is None:   # registered once the policies are up
        return {"mode": "nri", "socket": cfg.socket, "plugin": f"{cfg.plugin_index}-{cfg.plugin_name}",
                "connected": False}
    return {"mode": "nri", **plugin.describe()}


# ---------------------------------------------------------------- status

def status(daemon: "DaemonView", uptime_seconds: float, surfaces: Dict[str, Any]) -> Dict[str, Any]:
    """Everything ``anolisnuma-ctl status`` shows except containerd's answer."""
    cfg = daemon.config
    counters = daemon.interceptor.counters.snapshot()
    # In NRI mode the hooks run on NRI's events only, each within the budget cut to fit
    # containerd's request timeout (NriFrontEnd.fit_to, at registration): that one is in force.
    nri_budget = daemon.interceptor.nri_hook_budget if daemon.nri is not None else 0.0
    hooks = []
    for h in daemon.hooks:
        settings = cfg.hooks.settings(h.name)
        budget = settings.budget_seconds
        hooks.append({
            "name": h.name, "failure_policy": settings.failure_policy, "budget_seconds": budget,
            "effective_budget_seconds": round(min(budget, nri_budget), 3) if nri_budget > 0 else budget,
            **{f"{stage}_{outcome}": counters.get(f"hook_{h.name}_{stage}_{outcome}", 0)
               for stage in ("pre", "post") for outcome in ("ok", "failed")}})
    qos = qos_hook(daemon)
    knobs = _kernel_knobs(qos) if qos is not None else None
    resync = daemon.runtime_resync
    relay = daemon.relay
    return {
        "version": __version__,
        "pid": os.getpid(),
        "uptime_seconds": round(uptime_seconds, 1),
        "ready": daemon.ready,
        "resynced": daemon.resynced,
        "resync_problem": resync.health() if resync is not None else None,
        "config": cfg.source,
        "listen": cfg.server.listen,
        "runtime_endpoint": cfg.runtime.endpoint,
        "hooks": hooks,
        "hooks_configured": [n for n, on in (("numa", cfg.numa is not None and cfg.numa.enabled),
                                             ("qos", cfg.qos is not None and cfg.qos.enabled)) if on],
        "calls_waiting_for_hooks": daemon.interceptor.calls_waiting_for_hooks,
        "pipeline": {k: v for k, v in sorted(counters.items()) if not k.startswith("hook_")},
        "knobs": knobs,
        "relay": {
            "connections": len(relay.splices),
            "max_connections": relay.max_connections,
            "idle_connections": relay.cap.idle_count(),
            "connections_being_shed": relay.cap.shedding,
            "open_files_limit": open_files_soft_limit(),
            "buffer_bytes": relay.budget.used,
            "buffer_peak_bytes": relay.budget.peak,
            "buffer_limit_bytes": relay.budget.limit,
            "buffer_per_connection_limit_bytes": relay.budget_per_connection,
            "counters": dict(sorted(relay.counters.snapshot().items())),
        },
        "reconcilers": reconcilers(daemon),
        "controllers": daemon.controllers.status(),
        "journal_pods": len(daemon.interceptor.journal),
        "cluster": cluster(daemon),
        "front_end": front_end(daemon),
        "threads": census(_pools(daemon)),
        "structures": structures(daemon),
        **surfaces,
    }


def _kernel_knobs(qos: "QosHook") -> Dict[str, Any]:
    """What the QoS hook found on this kernel and will write: the families found (each with
    its files here), the files it has, those it lacks (of the families found: a family this
    kernel does not have is one entry, not a line per file), and the writes decided at
    start for each level and place."""
    from anolisnuma.system.knobs import ALL_KNOBS, FAMILIES

    support, plan = qos.support, qos.service.plan
    summary = plan.summary()
    return {"supported": sorted(support.supported),
            "unsupported": dict(sorted(support.lacking_lines())),
            "family": "+".join(plan.families) or "none",
            "families": [{"name": f.name, "title": f.title, "kernels": f.kernels, "found": f.name in plan.families,
                          "files": [k.name for k in ALL_KNOBS if k.family == f.name and support.has(k)]}
                         for f in FAMILIES],
            "writes": {k: v for k, v in summary.items() if k not in ("families", "held")},
            "held": summary["held"],
            "cgroup_version": qos.cgroups.version, "dry_run": qos.cfg.dry_run,
            "kubelet_cgroups": qos.cgroups.layout.as_dict()}


def health(result: Dict[str, Any]) -> Dict[str, Any]:
    """``state`` (``starting``, ``ready`` or ``degraded``) and ``degraded_because`` (one line
    per reason) for a :func:`status` result that carries containerd's answer: degraded
    while containerd does not answer, while the resync with it fails, while a configured
    hook is not running, while NRI mode is not registered with containerd; ``warnings``
    for what is worth a look but does not degrade (pods whose cgroup is not in the kubelet
    layout)."""
    reasons: List[str] = []
    c = result.get("containerd") or {}
    if not c.get("reachable", True):
        reasons.append(f"containerd does not answer at {c.get('endpoint')}: {c.get('error')} "
                       "(the kubelet's calls fail with UNAVAILABLE until it is back)")
    if result.get("resync_problem"):
        reasons.append(result["resync_problem"])
    elif result.get("ready") and not result.get("resynced"):
        reasons.append("the start-up resync with containerd has not finished: the policies are not started yet")
    running = {h["name"] for h in result.get("hooks") or []}
    for name in result.get("hooks_configured") or []:
        if result.get("ready") and name not in running:
            reasons.append(f"hook {name} is configured but not running (see the log)")
    fe = result.get("front_end") or {}
    if fe.get("mode") == "nri" and result.get("resynced") and not fe.get("connected"):
        reasons.append(f"not registered with containerd's NRI at {fe.get('socket')}: pods are created without the "
                       f"policies until it is (the resync on registering adopts them)")
    warnings: List[str] = []
    layout = (result.get("knobs") or {}).get("kubelet_cgroups") or {}
    if layout.get("unknown_cgroup_parents"):   # (a pod outside kubepods may be meant to be)
        warnings.append(f"QoS left pods alone {layout['unknown_cgroup_parents']} time(s): their cgroup_parent is not "
                        f"in the kubelet layout (root {layout.get('root')}; last {layout.get('last_unknown')}): "
                        f"if the kubelet runs with another --cgroup-root, set [cgroups] kubelet_cgroup_root")
    state = "starting" if not result.get("ready") else ("degraded" if reasons else "ready")
    return {"state": state, "degraded_because": reasons, "warnings": warnings}


def _pools(daemon: "DaemonView") -> List[WorkerPool]:
    pools = [daemon.executor, daemon.reload_pool]
    commands, metrics = daemon.admin.commands, daemon.admin.metrics
    if commands is not None:
        pools.append(commands.executor)
    if metrics is not None:
        pools.append(metrics.executor)
    return [p for p in pools if isinstance(p, WorkerPool)]


def structures(daemon: "DaemonView") -> Dict[str, Dict[str, int]]:
    """The size of everything the daemon keeps per pod, sandbox, container or call, by
    holder: the store, what calls named lately, and every holder the daemon's Reaper tells
    what is gone. Each is 0 on a node with no pods, once a resync found them gone."""
    store = daemon.store
    return {"store": {"pods": len(store.pods()), "containers": len(store.containers())},
            "recent_calls": {"ids": len(daemon.interceptor.recent)},
            **daemon.interceptor.reaper.structures()}


def reconcilers(daemon: "DaemonView") -> Dict[str, Any]:
    """The loops that put drifted values back, as the operator knows them (``qos``,
    ``numa_repin``)."""
    out: Dict[str, Any] = {}
    qos = daemon.controllers.get("qos-reconcile")
    if qos is not None:
        st = qos.status()
        out["qos"] = {"running": st["running"], "interval_seconds": st["interval_seconds"], "runs": st["runs"],
                      "rewritten": st["rewritten"], "tasks_moved": st["tasks_moved"], "forgotten": st["forgotten"],
                      "errors": st["write_errors"] + st["errors"], "checked": st["checked"]}
    repin = daemon.controllers.get("numa-repin")
    if repin is not None:
        st = repin.status()
        out["numa_repin"] = {"runs": st["runs"], "applied": st["applied"], "failed": st["failed"] + st["errors"]}
    return out


# ---------------------------------------------------------------- pods

def pods(daemon: "DaemonView") -> List[Dict[str, Any]]:
    """Every pod the daemon knows (its store), with its QoS level and NUMA placement."""
    records = daemon.store.pods()
    by_sandbox = _containers_by_sandbox(daemon.store.containers())
    facts = _PolicyFacts(daemon)
    rows = []
    for rec in sorted(records, key=lambda p: (p.namespace, p.name, p.sandbox_id)):
        rows.append({
            "namespace": rec.namespace, "name": rec.name, "uid": rec.uid, "sandbox_id": rec.sandbox_id,
            "containers": sorted(c.name for c in by_sandbox.get(rec.sandbox_id, [])),
            "state": facts.sandbox_state(rec),
            "opted_out": facts.opted_out(rec),
            "qos": facts.qos(rec),
            "numa": facts.numa(rec),
        })
    return rows


def _containers_by_sandbox(containers: Iterable[ContainerRecord]) -> Dict[str, List[ContainerRecord]]:
    out: Dict[str, List[ContainerRecord]] = {}
    for c in containers:
        out.setdefault(c.sandbox_id, []).append(c)
    return out


class _PolicyFacts:
    """What the policies decided for a pod, read once per request from the hooks."""

    def __init__(self, daemon: "DaemonView") -> None:
        self.skip_keys = tuple(daemon.config.hooks.skip_keys)
        self.qos_hook = qos_hook(daemon)
        self.placement = placement(daemon)
        self.allocations = {a.pod_uid: a for a in self.placement.allocations()} if self.placement else {}
        self.kubelet = self.placement.kubelet_state if self.placement else None
        self.pool = self.placement.shared_pool if self.placement else None
        resync = daemon.runtime_resync
        self.not_ready = resync.not_ready if resync is not None else frozenset()
        self.journal = daemon.interceptor.journal
        self.sandboxes_of: Dict[str, int] = {}
        for p in daemon.store.pods():
            self.sandboxes_of[p.uid] = self.sandboxes_of.get(p.uid, 0) + 1

    def sandbox_state(self, rec: PodRecord) -> str:
        """``stopped`` when the last resync saw the sandbox not ready, or the pod's last
        sandbox call through the proxy stopped it (its only sandbox); else ``ready``."""
        if rec.sandbox_id in self.not_ready:
            return "stopped"
        if self.sandboxes_of.get(rec.uid, 0) == 1:
            for call in reversed(self.journal.calls(rec.uid)):
                if call.get("status") != "OK":
                    continue
                if call.get("method") == "StopPodSandbox":
                    return "stopped"
                if call.get("method") == "RunPodSandbox":
                    break
        return "ready"

    def opted_out(self, rec: PodRecord) -> Optional[str]:
        """The key that opts the pod out of every hook, if one does."""
        for key in self.skip_keys:
            for source in (rec.annotations, rec.labels):
                if source.get(key, "").strip().lower() in ("true", "1", "yes"):
                    return key
        return None

    def qos(self, rec: PodRecord) -> Dict[str, Any]:
        hook = self.qos_hook
        if hook is None:
            return {"level": None, "why": "QoS hook not running"}
        key = self.opted_out(rec)
        if key is not None:
            return {"level": None, "why": f"opted out ({key})"}
        managed = hook.state.by_sandbox(rec.sandbox_id) or hook.state.by_uid(rec.uid)
        if managed is None:
            if self.sandbox_state(rec) == "stopped":
                return {"level": None, "why": "sandbox stopped: its cgroup (and what was set there) is gone"}
            return {"level": None, **_qos_skip_reason(rec, hook)}
        return {"level": managed.level.value, "source": managed.source, "why": managed.why,
                "llc_group": managed.llc_group, "cgroup": managed.cgroup.rel,
                "containers": len(managed.containers), "knobs": _knobs_of(managed, hook),
                **({"refused": managed.refused} if managed.refused else {})}

    def numa(self, rec: PodRecord) -> Dict[str, Any]:
        service = self.placement
        if service is None:
            return {"placed": False, "why": "NUMA placement off"}
        out: Dict[str, Any] = {"placed": False}
        exclusive = {}
        if self.kubelet is not None and self.kubelet.is_static:
            exclusive = {name: str(cpus) for name, cpus in self.kubelet.entries.get(rec.uid, {}).items()}
        if exclusive:
            out["kubelet_exclusive"] = exclusive
        key = self.opted_out(rec)
        alloc = self.allocations.get(rec.uid)
        if alloc is not None and alloc.sandbox_id in ("", rec.sandbox_id):
            sel = service.select(rec)
            moves = service.move_history.of(rec.uid)
            if alloc.source == "rule":
                why = f"rule {sel.rule.source}" if sel.rule is not None else "rule (no longer listed)"
            elif alloc.source == "adopted":
                why = "adopted at start-up from its cpuset"
            elif alloc.source == "balance":
                why = f"balance ({sel.why})" if sel.managed else "balance"
            else:   # put there by a live move (affinity, re-spread, ...)
                why = alloc.source if moves else f"{alloc.source} (moved live before the daemon's last start)"
            if moves:
                why += "; " + describe_move(moves[-1])
            out.update(placed=True, nodes=list(alloc.nodes), cpus=str(alloc.cpus(self.pool)),
                       mems=str(alloc.mems) or None, source=alloc.source, why=why, moves=moves)
            if exclusive:
                out["why"] += "; kubelet-exclusive: " + ", ".join(sorted(exclusive))
            return out
        if key is not None:
            out["why"] = f"opted out ({key})"
        elif self.sandbox_state(rec) == "stopped":
            out["why"] = "sandbox stopped: its CPUs were released"
        elif exclusive:
            out["why"] = "kubelet-exclusive CPUs (static CPU manager); left alone"
        else:
            sel = service.select(rec)
            out["why"] = f"managed ({sel.why}); not placed" if sel.managed else f"unmanaged ({sel.why})"
        return out


def describe_move(move: Dict[str, Any]) -> str:
    """One line for a live move of :class:`~anolisnuma.placement.move_history.MoveHistory`."""
    def nodes(ns: List[int]) -> str:
        return ("node " if len(ns) == 1 else "nodes ") + ",".join(str(n) for n in ns)

    text = f"moved live from {nodes(move['from_nodes'])} to {nodes(move['to_nodes'])} by {move['source']}"
    if move.get("reason"):
        text += f" ({move['reason']})"
    if move.get("outcome") != "applied":
        text += f", {move.get('outcome')}" + (f": {move['error']}" if move.get("error") else "")
    return text


def _knobs_of(managed: Any, hook: "QosHook") -> Dict[str, Any]:
    """What the pod's level means on this kernel, as decided when it was admitted: the knob
    files kept at a value (pod and container cgroups), the knobs the level has that this
    kernel lacks, those it has that would not act here (not written, and why), and the
    kernel families found."""
    report: Dict[str, Any] = managed.writes.report(hook.cfg.dry_run) if managed.writes is not None else {}
    return {**report, "family": "+".join(hook.service.plan.families) or "none"}


def _qos_skip_reason(rec: PodRecord, hook: "QosHook") -> Dict[str, str]:
    """Why the QoS hook manages no such pod (what its log said the first time)."""
    from anolisnuma.system.cgroups import InvalidCgroupPath, preview

    if rec.cgroup_parent:
        layout = hook.cgroups.layout
        try:
            layout.parse(rec.cgroup_parent)
        except InvalidCgroupPath:
            return {"why": "skipped: cgroup_parent not recognized",
                    "detail": f"cgroup_parent {preview(rec.cgroup_parent)}", "fix": layout.hint(rec.cgroup_parent)}
        return {"why": "not managed (see the log for the pod)"}
    return {"why": "skipped: no pod cgroup known"}


# ---------------------------------------------------------------- numa

def numa(daemon: "DaemonView") -> Dict[str, Any]:
    """Per NUMA node: CPUs, those in the kubelet's shared pool and exclusive ones, what our
    placements use, and the pods placed there."""
    service = placement(daemon)
    if service is None:
        return {"enabled": False}
    allocations = service.allocations()
    loads = service.ledger.loads()
    kubelet = service.kubelet_state
    pool = service.shared_pool
    exclusive_cpus = kubelet.exclusive_cpus
    refs = {p.uid: p.ref for p in daemon.store.pods()}
    nodes = []
    for node in service.topology.nodes:
        load = loads.get(node.id)
        used = load.millicpu if load is not None else 0
        shared = node.cpus & pool
        nodes.append({
            "node": node.id, "cpus": str(node.cpus), "cpus_total": len(node.cpus),
            "shared_cpus": str(shared), "kubelet_exclusive_cpus": str(node.cpus & exclusive_cpus),
            "used_cpus": used / 1000, "free_cpus": max(len(shared) * 1000 - used, 0) / 1000,
            "memory_bytes": node.memory_bytes, "placed_memory_bytes": load.memory_bytes if load is not None else 0,
            "pods": sorted(a.ref for a in allocations if node.id in a.nodes),
        })
    exclusive = [{"pod_uid": uid, "pod": refs.get(uid), "container": name, "cpus": str(cpus)}
                 for uid, containers in sorted(kubelet.entries.items()) for name, cpus in sorted(containers.items())
                 ] if kubelet.is_static else []
    return {"enabled": True, "kubelet_policy": kubelet.policy, "shared_pool": str(pool),
            "kubelet_exclusive_cpus": str(exclusive_cpus), "kubelet_exclusive": exclusive,
            "allocations": len(allocations), "pending_updates": len(service.pending_updates()),
            "rule_files_skipped": service.rule_files_skipped, "nodes": nodes}


# ---------------------------------------------------------------- explain

def find_pods(daemon: "DaemonView", query: str) -> List[PodRecord]:
    """The pods ``query`` names: ``namespace/name``, a pod UID, or a sandbox ID (or the
    first 6+ hex digits of one). NotFound when none does."""
    query = query.strip()
    records = daemon.store.pods()
    if "/" in query:
        ns, _, name = query.partition("/")
        found = [p for p in records if p.namespace == ns and p.name == name]
    else:
        found = [p for p in records if p.uid == query]
        if not found and _HEX_ID.match(query):
            found = [p for p in records if p.sandbox_id.startswith(query)]
    if not found:
        raise NotFound(f"no pod {query!r} is known to anolisnuma (give namespace/name, a pod UID or a sandbox ID)")
    return sorted(found, key=lambda p: p.sandbox_id)


def explain(daemon: "DaemonView", query: str) -> List[Dict[str, Any]]:
    """Every decision taken for the pods ``query`` names (one entry per pod UID): the
    markings behind them, the QoS level and NUMA placement now, and the journal of the
    pod's intercepted calls with each hook's decision."""
    found = find_pods(daemon, query)
    facts = _PolicyFacts(daemon)
    by_sandbox = _containers_by_sandbox(daemon.store.containers())
    service = placement(daemon)
    out = []
    for uid, recs in _group_by_uid(found):
        # the sandbox that runs containers speaks for the pod (an old one may linger until removed)
        rec = ([r for r in recs if by_sandbox.get(r.sandbox_id)] or recs)[-1]
        containers = [c for r in recs for c in by_sandbox.get(r.sandbox_id, [])]
        markings = {}
        for key in POLICY_KEYS + facts.skip_keys:
            for kind, src in (("annotation", rec.annotations), ("label", rec.labels)):
                if key in src:
                    markings[f"{kind} {key}"] = src[key]
        entry: Dict[str, Any] = {
            "pod": {"namespace": rec.namespace, "name": rec.name, "uid": uid,
                    "sandbox_ids": [r.sandbox_id for r in recs], "cgroup_parent": rec.cgroup_parent,
                    "state": facts.sandbox_state(rec),
                    "containers": [{"name": c.name, "id": c.container_id, "cpuset_cpus": c.resources.cpuset_cpus,
                                    "cpuset_mems": c.resources.cpuset_mems} for c in containers]},
            "markings": markings,
            "opted_out": facts.opted_out(rec),
            "qos": facts.qos(rec),
            "numa": facts.numa(rec),
            "calls": daemon.interceptor.journal.calls(uid),
        }
        if service is not None:
            sel = service.select(rec)
            entry["numa"]["selection"] = sel.why
            if sel.rule is not None:
                entry["numa"]["rule"] = sel.rule.describe()
        out.append(entry)
    return out


def _group_by_uid(records: List[PodRecord]) -> List[Tuple[str, List[PodRecord]]]:
    groups: Dict[str, List[PodRecord]] = {}
    for r in records:
        groups.setdefault(r.uid, []).append(r)
    return sorted(groups.items())

