"""The QoS hook: group identity, OOM priority, async reclaim and LLC/MBA for every pod.

=====================  =====  =========================================================
call                   stage  what happens
=====================  =====  =========================================================
RunPodSandbox          pre    resolve the pod's level, write the pod cgroup's knobs (the
                              kubelet made the cgroup already, so ``fail`` can refuse)
RunPodSandbox          post   remember the sandbox ID; retry the knobs if the cgroup was
                              not there in pre
CreateContainer        post   remember the container; write its knobs if its cgroup exists
StartContainer         pre    write the container's knobs if still missing
StartContainer         post   write them if still missing; move its threads to the pod's
                              resctrl group
StopPodSandbox         post   forget the sandbox (the pod with its last one)
=====================  =====  =========================================================

What is removed (through the proxy or behind its back) is forgotten when the daemon's
:class:`~anolisnuma.state.gone.Reaper` says so: the hook is a
:class:`~anolisnuma.state.gone.PodStateHolder`, and so also forgets a pod whose
RunPodSandbox failed for good (admitted in pre, it never got a sandbox).

containerd creates a container's cgroup when the container's task is created, which is
during StartContainer, so the container knobs usually land in StartContainer post; the
earlier attempts cost one failed ``open`` each and cover runtimes that create it sooner.
A container that ended before its post-hook ran (stopped right after it started, or done
at once) has no cgroup left: that is said at info, nothing is wrong.

Errors: a refused write (read-only file, EINVAL, ...) is collected while the other knobs
are still written, then raised as :class:`QosApplyError` -- the pipeline logs it and goes
on (``ignore``) or refuses the call (``fail``, pre stage only). A pod or container whose
cgroup vanished meanwhile is skipped quietly. Hostile annotation values never reach a
path; they are logged (escaped and cut) and ignored.
"""

from __future__ import annotations

import threading
from typing import Any, Container, Dict, List, Mapping, Optional, Tuple

import structlog

from anolisnuma.config import PathsConfig
from anolisnuma.controller import Controller
from anolisnuma.decision_events import DecisionEvents, QosApplied, QosSkipped, no_events, pod_ref
from anolisnuma.logsummary import FirstTime
from anolisnuma.pipeline.hooks import (
    CREATE_CONTAINER, RUN_POD_SANDBOX, START_CONTAINER, STOP_POD_SANDBOX, Call, Hook, HookRefused,
)
from anolisnuma.policies.qos.config import QosConfig
from anolisnuma.policies.qos.levels import QosLevel, resolve_level
from anolisnuma.policies.qos.plan import (
    LevelPlan, describe_knob_report, level_knob_report, plan_globals, plan_level, plan_qos_class_dirs,
)
from anolisnuma.policies.qos.resctrl import cbm_width, class_schemata, llc_class_for, plan_groups
from anolisnuma.qos.applier import ApplyReport, QosApplier
from anolisnuma.qos.state import ManagedContainer, ManagedPod, QosState
from anolisnuma.reconcile.qos import QosReconciler, ReconcileCounts
from anolisnuma.state.gone import PodGone, PodKeys, PodStateHolder
from anolisnuma.state.records import ContainerRecord, PodRecord
from anolisnuma.system import knobs
from anolisnuma.system.cgroups import (
    CgroupFs, HostFileError, InvalidCgroupPath, KubeletCgroupLayout, PodCgroup, preview,
)
from anolisnuma.system.knobs import KnobSupport, probe_support
from anolisnuma.system.resctrl import ResctrlFs
from anolisnuma.system.sysctl import Sysctls


class QosApplyError(HookRefused):
    """Some knob writes were refused; ``errors`` holds each (the others were written)."""

    def __init__(self, ref: str, errors: List[HostFileError]) -> None:
        detail = "; ".join(str(e) for e in errors[:3])
        more = f" (+{len(errors) - 3} more)" if len(errors) > 3 else ""
        super().__init__(f"qos: {len(errors)} knob write(s) refused for {ref}: {detail}{more}", "INTERNAL")
        self.errors = errors


def _str_map(m: Any) -> Dict[str, str]:
    try:
        return dict(m) if m is not None else {}
    except Exception:
        return {}


class QosHook(Hook, PodStateHolder):
    """``QosHook(config, paths)``; optional ``log`` (a structlog logger)."""

    name = "qos"
    methods = frozenset({RUN_POD_SANDBOX, CREATE_CONTAINER, START_CONTAINER, STOP_POD_SANDBOX})

    def __init__(self, config: QosConfig, paths: PathsConfig, *, log: Any = None,
                 layout: Optional[KubeletCgroupLayout] = None) -> None:
        self.cfg = config
        self.paths = paths
        self.log = log if log is not None else structlog.get_logger("anolisnuma.qos")
        self.cgroups = CgroupFs(paths.cgroup_root, layout)
        self.sysctls = Sysctls(paths.proc_root)
        self.resctrl_fs = ResctrlFs(paths.resctrl_root, paths.proc_root)
        self.state = QosState()
        # A pod we cannot place is seen again at each of its calls: warned about once.
        self._warned = FirstTime()
        self.support: KnobSupport = KnobSupport({}, {})
        self.plans: Dict[QosLevel, LevelPlan] = {}
        self.lacking: Dict[QosLevel, Tuple[str, ...]] = {}   # knobs a level would write that this kernel lacks
        self.decisions: DecisionEvents = no_events
        self._prepare_lock = threading.Lock()
        # A resync's "did a call name this pod?" and its admission of the pod happen under
        # this lock, and so does a call forgetting a pod: a Stop/Remove never lands between
        # the two (the pipeline names the call's IDs before any hook runs).
        self._admission = threading.Lock()
        self._prepared = False
        if config.enabled:
            self.support = probe_support(self.cgroups, self.sysctls, self.resctrl_fs,
                                         probe_cgroup=not config.dry_run)
            for name, reason in self.support.report_lines():
                self.log.info(f"unsupported knob {name}: {reason}", knob=name, reason=reason)
            self.plans = {lv: plan_level(config, lv, self.support) for lv in QosLevel}
            self.lacking = {lv: _lacking(plan_level(config, lv, KnobSupport.everything()), self.plans[lv])
                            for lv in QosLevel}
        self.applier = QosApplier(self.cgroups, self.sysctls,
                                  self.resctrl_fs if self._resctrl_wanted() else None,
                                  dry_run=config.dry_run, log=self.log)
        self.applier.sched_core_supported = self.support.has(knobs.SCHED_CORE)
        self.reconciler = QosReconciler(self.state, self.applier, config.reconcile_interval_seconds,
                                        log=self.log)
        self.log.info("qos hook ready", enabled=config.enabled, dry_run=config.dry_run,
                      cgroup_version=self.cgroups.version, cgroup_root=self.cgroups.root,
                      kubelet_cgroups=self.cgroups.layout.describe(),
                      supported=sorted(self.support.supported))

    def wants_pre(self, method: str) -> bool:
        return method in (RUN_POD_SANDBOX, START_CONTAINER)

    def _resctrl_wanted(self) -> bool:
        return bool(self.cfg.enabled and self.cfg.resctrl.enabled and
                    (self.support.has(knobs.RESCTRL_L3) or self.support.has(knobs.RESCTRL_MB)))

    def use_decision_events(self, sink: DecisionEvents) -> None:
        """Report each pod's level (applied, or skipped and why) to ``sink`` (the daemon
        wires it)."""
        self.decisions = self.applier.decisions = sink

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self.prepare()

    def controllers(self, connect: Any, store: Any = None) -> List[Controller]:
        """The reconciler, when enabled with an interval."""
        return [self.reconciler] if self.cfg.enabled and self.reconciler.interval > 0 else []

    def close(self) -> None:
        self.reconciler.stop()

    def holders(self) -> List[PodStateHolder]:
        return [self] if self.cfg.enabled else []

    # ------------------------------------------------------------------ PodStateHolder
    def held(self) -> PodKeys:
        uids, sandboxes, containers = self.state.keys()
        return PodKeys.of(uids + [str(o) for o in self._warned.owners()], sandboxes, containers)

    def forget(self, gone: PodGone) -> None:
        with self._admission:
            for cid in gone.container_ids:
                self.state.forget_container(cid)
            dropped = [self.state.forget_sandbox(sid) for sid in gone.sandbox_ids]
            dropped += [self.state.forget_uid(uid) for uid in gone.uids]
        for pod in dropped:
            if pod is not None:
                self.log.info("pod forgotten", pod=pod.ref, reason=gone.reason)
        for uid in gone.uids:
            self._warned.forget(uid)

    def structures(self) -> Dict[str, int]:
        return {"pods": len(self.state), "containers": self.state.container_count(),
                "warned_once": len(self._warned)}

    def prepare(self) -> None:
        """Global set-up, once: sysctl and root switch, QoS-class directories, resctrl
        groups. Called by :meth:`start`, or by the first hook call if nobody did."""
        if self._prepared:
            return
        with self._prepare_lock:
            if self._prepared or not self.cfg.enabled:
                self._prepared = True
                return
            a = self.applier
            a.refresh_sched_core()
            if a.sched_core_on:
                self.log.warning("kernel.sched_core is 1: group identity -1 will not be written "
                                 "while it stays on (core scheduling conflicts with it)")
            g = plan_globals(self.cfg, self.support)
            a.root_settings, a.sysctl_settings = g.root_cgroup, g.sysctls
            a.qos_dir_settings = plan_qos_class_dirs(self.cfg, self.support)
            report = ApplyReport()
            a.ensure_globals(report)
            if a.resctrl is not None:
                self._setup_resctrl(report)
            self._prepared = True

    def _setup_resctrl(self, report: ApplyReport) -> None:
        a = self.applier
        try:
            info = self.resctrl_fs.read_info()
        except HostFileError as e:
            self.log.error("resctrl unusable; LLC/MBA skipped", error=str(e))
            a.resctrl = None
            return
        for note in info.notes:
            self.log.warning("resctrl: " + note)
        rc = self.cfg.resctrl
        wanted = sorted(set(rc.default.values()) | set(rc.classes))
        names = {c: rc.group_name(c) for c in wanted}
        plan = plan_groups(info, wanted, names)
        for cls, why in plan.skipped.items():
            self.log.error("resctrl class skipped", llc_class=cls, reason=why)
        a.resctrl_width = cbm_width(info)
        a.resctrl_groups = {names[c]: class_schemata(info, rc.classes[c]) for c in plan.create}
        self.log.info("resctrl", vendor=info.vendor, num_closids=info.num_closids,
                      l3_ways=info.l3.ways if info.l3 else None,
                      mb_unit=info.mb.unit if info.mb else None, groups=sorted(a.resctrl_groups))
        a.ensure_resctrl_groups(report)

    def run_once(self) -> ReconcileCounts:
        """One reconciler pass now (tests, benchmarks)."""
        self.prepare()
        return self.reconciler.step()

    # ------------------------------------------------------------------ admission
    def _admit(self, uid: str, ref: str, labels: Mapping[str, str], annotations: Mapping[str, str],
               cgroup_parent: str, sandbox_id: str = "") -> Optional[ManagedPod]:
        """Decide a pod's level and files; ``None`` when its cgroup cannot be placed."""
        cgroup: Optional[PodCgroup] = None
        if cgroup_parent:
            try:
                cgroup = self.cgroups.layout.parse(cgroup_parent)
            except InvalidCgroupPath as e:
                # Every pod of a node whose kubelet uses another layout is refused alike:
                # the layout is reported once, with the fix; each pod at debug, and told (an
                # event on the pod) once: that mark is all that is kept, until the pod goes.
                first, fix = self.cgroups.layout.unknown(cgroup_parent)
                (self.log.warning if first else self.log.debug)(
                    "qos skipped: cgroup_parent not recognized", pod=ref, error=str(e), fix=fix)
                if self._warned.first((uid or ref, "cgroup_parent")):
                    self.decisions(QosSkipped(pod_ref(ref, uid), f"cgroup_parent not recognized: {e}"))
                return None
        elif uid:
            cgroup = self.cgroups.locate_pod(uid)
        if cgroup is None:
            self._skipped(uid, ref, "no cgroup", "no pod cgroup known", uid=preview(uid))
            return None
        decision = resolve_level(annotations, labels, cgroup.kube_class, self.cfg.kube_class_mapping)
        for w in decision.warnings:
            self._once(uid or ref, w)("ignored pod annotation/label: " + w, pod=ref)
        plan = self.plans[decision.level]
        llc_group = None
        ignored = decision.warnings
        if self.applier.resctrl is not None:
            cls, warning = llc_class_for(self.cfg.resctrl, decision.level, annotations)
            if warning:
                ignored += (warning,)
                self.log.warning("ignored pod annotation: " + warning, pod=ref)
            llc_group = self.cfg.resctrl.group_name(cls)
            if llc_group not in self.applier.resctrl_groups:
                self.log.warning("resctrl group unavailable; pod threads stay where they are",
                                 pod=ref, llc_class=cls)
                llc_group = None
        pod = ManagedPod(uid=cgroup.uid, ref=ref, level=decision.level, source=decision.source, why=decision.why,
                         cgroup=cgroup, targets=self.applier.pod_targets(cgroup, plan.pod),
                         container_settings=plan.container, llc_group=llc_group,
                         sandbox_ids={sandbox_id} if sandbox_id else set(),
                         told=QosApplied(pod_ref(ref, uid), decision.level.value, decision.why,
                                         knobs=_knob_values(plan), lacking=self.lacking.get(decision.level, ()),
                                         ignored=ignored))
        knob_report = level_knob_report(self.cfg, decision.level, self.support, pod.targets)
        self.log.info("qos level", pod=ref, qos_level=decision.level.value, source=decision.source,
                      why=decision.why, cgroup=cgroup.rel, llc_group=llc_group,
                      dry_run=self.cfg.dry_run, knobs_set=knob_report["set"],
                      knobs_unsupported=knob_report["unsupported"])
        self.applier.log_sched_core_skips(pod.targets, ref)
        self.state.put(pod)
        return self.state.by_uid(pod.uid)

    def _skipped(self, uid: str, ref: str, condition: str, why: str, **fields: Any) -> None:
        """A pod the hook cannot manage: warned and told the first time, then debug."""
        first = self._warned.first((uid or ref, condition))
        (self.log.warning if first else self.log.debug)("qos skipped: " + why, pod=ref, **fields)
        if first:
            self.decisions(QosSkipped(pod_ref(ref, uid), why + (f": {fields['error']}" if "error" in fields else "")))

    def _once(self, pod: str, condition: str) -> Any:
        """The log method for a per-pod condition: warning the first time, then debug."""
        return self.log.warning if self._warned.first((pod, condition)) else self.log.debug

    def _admit_config(self, config: Any, sandbox_id: str = "") -> Optional[ManagedPod]:
        """Admit from a ``PodSandboxConfig`` message."""
        md = config.metadata
        return self._admit(md.uid, f"{md.namespace}/{md.name}", _str_map(config.labels),
                           _str_map(config.annotations), config.linux.cgroup_parent, sandbox_id)

    def _admit_record(self, rec: PodRecord) -> Optional[ManagedPod]:
        return self._admit(rec.uid, rec.ref, rec.labels, rec.annotations, rec.cgroup_parent,
                           rec.sandbox_id)

    def _add_container(self, pod: ManagedPod, container_id: str) -> Optional[ManagedContainer]:
        try:
            rel = pod.cgroup.container_rel(container_id)
        except InvalidCgroupPath as e:
            self.log.warning("qos skipped for container", pod=pod.ref, error=str(e))
            return None
        ctr = ManagedContainer(container_id, rel, self.applier.container_targets(rel, pod.container_settings))
        self.state.add_container(pod, ctr)
        return ctr

    @staticmethod
    def _raise_errors(ref: str, *reports: ApplyReport) -> None:
        errors = [e for r in reports for e in r.errors]
        if errors:
            raise QosApplyError(ref, errors)

    # ------------------------------------------------------------------ dispatch
    def pre(self, call: Call) -> None:
        if not self.cfg.enabled:
            return
        self.prepare()
        if call.method == RUN_POD_SANDBOX:
            self._pre_run_pod(call)
        elif call.method == START_CONTAINER:
            self._pre_start(call)

    def post(self, call: Call) -> None:
        if not self.cfg.enabled:
            return
        self.prepare()
        m = call.method
        if m == RUN_POD_SANDBOX:
            self._post_run_pod(call)
        elif m == CREATE_CONTAINER:
            self._post_create(call)
        elif m == START_CONTAINER:
            self._post_start(call)
        elif m == STOP_POD_SANDBOX:
            with self._admission:
                pod = self.state.forget_sandbox(call.request.pod_sandbox_id)
            if pod is not None:
                self.log.info("pod forgotten", pod=pod.ref, method=m)

    # ------------------------------------------------------------------ pods
    def _pre_run_pod(self, call: Call) -> None:
        pod = self._admit_config(call.request.config)
        if pod is None:
            return
        # The decision says what the level does on this kernel, not only the level: on a
        # kernel without the knobs a level changes nothing, and explain must not say more.
        call.notes["qos"] = describe_knob_report(
            pod.level, level_knob_report(self.cfg, pod.level, self.support, pod.targets))
        report = self.applier.apply_pod(pod, compare=False)
        if pod.llc_group:
            call.notes["qos"] += f"; resctrl group {pod.llc_group}"
        if report.gone:
            call.notes["qos"] += " (pod cgroup not there yet: retried after RunPodSandbox)"
            self.log.info("pod cgroup not there yet; retried after RunPodSandbox", pod=pod.ref,
                          path=pod.cgroup.rel)
        self._raise_errors(pod.ref, report)

    def _post_run_pod(self, call: Call) -> None:
        config = call.request.config
        sandbox_id = call.reply.pod_sandbox_id
        pod = self.state.by_uid(_uid_of(config, self.cgroups.layout))
        if pod is None:
            pod = self._admit_config(config, sandbox_id)
            if pod is None:
                return
        self.state.bind_sandbox(pod.uid, sandbox_id)
        if not pod.applied:
            report = self.applier.apply_pod(pod, compare=False)
            if report.gone:
                self.log.warning("pod cgroup not found; pod knobs not written", pod=pod.ref,
                                 path=pod.cgroup.rel)
            self._raise_errors(pod.ref, report)

    # ------------------------------------------------------------------ containers
    def _pod_for_create(self, call: Call, reports: List[ApplyReport]) -> Optional[ManagedPod]:
        sandbox_id = call.request.pod_sandbox_id
        pod = self.state.by_sandbox(sandbox_id)
        if pod is not None:
            return pod
        if call.pod is not None:
            pod = self._admit_record(call.pod)
        elif call.request.HasField("sandbox_config"):
            pod = self._admit_config(call.request.sandbox_config, sandbox_id)
        if pod is not None:
            self.state.bind_sandbox(pod.uid, sandbox_id)
            reports.append(self.applier.apply_pod(pod, compare=False))   # a pod we had not seen yet
        return pod

    def _post_create(self, call: Call) -> None:
        container_id = getattr(call.reply, "container_id", "") or \
            (call.container.container_id if call.container is not None else "")
        reports: List[ApplyReport] = []
        pod = self._pod_for_create(call, reports)
        if pod is None:
            return
        ctr = self._add_container(pod, container_id)
        if ctr is not None:
            reports.append(self.applier.apply_container(pod, ctr, compare=False))
        self._raise_errors(pod.ref, *reports)

    def _find_container(self, call: Call, reports: List[ApplyReport]
                        ) -> Tuple[Optional[ManagedPod], Optional[ManagedContainer]]:
        cid = call.request.container_id
        pod, ctr = self.state.by_container(cid)
        if ctr is not None:
            return pod, ctr
        # Created before we saw it (proxy restarted between Create and Start).
        rec: Optional[ContainerRecord] = call.container
        if rec is None or rec.container_id != cid:
            return None, None
        pod = self.state.by_sandbox(rec.sandbox_id)
        if pod is None and call.pod is not None:
            pod = self._admit_record(call.pod)
            if pod is not None:
                self.state.bind_sandbox(pod.uid, rec.sandbox_id)
                reports.append(self.applier.apply_pod(pod, compare=False))
        if pod is None:
            return None, None
        return pod, self._add_container(pod, cid)

    def _pre_start(self, call: Call) -> None:
        reports: List[ApplyReport] = []
        pod, ctr = self._find_container(call, reports)
        if pod is not None and ctr is not None and not ctr.applied:
            reports.append(self.applier.apply_container(pod, ctr, compare=False))
        if pod is not None:
            self._raise_errors(pod.ref, *reports)

    def _post_start(self, call: Call) -> None:
        reports: List[ApplyReport] = []
        pod, ctr = self._find_container(call, reports)
        if pod is None or ctr is None:
            return
        if not ctr.applied:
            report = self.applier.apply_container(pod, ctr, compare=False)
            reports.append(report)
            if report.gone:
                self._cgroup_gone_after_start(pod, ctr)
        self.applier.sweep_tasks(pod, ctr)
        self._raise_errors(pod.ref, *reports)

    def _cgroup_gone_after_start(self, pod: ManagedPod, ctr: ManagedContainer) -> None:
        """A started container without a cgroup: under a pod cgroup that is there, the
        container ended already (runc removes its cgroup when it stops: a StopContainer
        right after StartContainer, or a command that is done at once); nothing is wrong.
        Without the pod's cgroup either, the pod went too, or the cgroups are not where
        they are looked for: warned."""
        if self.cgroups.exists(pod.cgroup.rel) or self.cgroups.exists(pod.cgroup.rel, "memory"):
            self.log.info("container cgroup not there after start, under its pod's cgroup: the container "
                          "stopped or exited at once (nothing to apply), or its cgroup comes later (the "
                          "reconciler applies it then)",
                          pod=pod.ref, container=ctr.container_id, path=ctr.rel)
        else:
            self.log.warning("container cgroup not found after start; knobs not written",
                             pod=pod.ref, container=ctr.container_id, path=ctr.rel)

    # ------------------------------------------------------------------ resync
    def resync(self, pods: List[PodRecord], containers: List[ContainerRecord],
               fresh: Container[str] = frozenset()) -> None:
        """Adopt everything containerd runs now, apply it, drop what is gone; leave alone
        what calls newer than the listing named (``fresh``)."""
        if not self.cfg.enabled:
            return
        self.prepare()
        live_sandboxes = {p.sandbox_id for p in pods}
        for managed, _ in self.state.snapshot():
            if managed.uid in fresh:
                continue
            for sid in list(managed.sandbox_ids):
                if sid not in live_sandboxes and sid not in fresh:
                    self.state.forget_sandbox(sid)
        for rec in pods:
            with self._admission:
                if rec.sandbox_id in fresh or rec.uid in fresh:
                    continue
                pod = self.state.by_sandbox(rec.sandbox_id) or self._admit_record(rec)
                if pod is None:
                    continue
                self.state.bind_sandbox(pod.uid, rec.sandbox_id)
            self._log_errors(pod.ref, self.applier.apply_pod(pod, compare=True))
        for crec in containers:
            with self._admission:
                pod = self.state.by_sandbox(crec.sandbox_id)
                if pod is None or crec.container_id in fresh or pod.uid in fresh:
                    continue
                _, ctr = self.state.by_container(crec.container_id)
                if ctr is None:
                    ctr = self._add_container(pod, crec.container_id)
                if ctr is None:
                    continue
            self._log_errors(pod.ref, self.applier.apply_container(pod, ctr, compare=True))
            self.applier.sweep_tasks(pod, ctr)
        self.log.info("qos resync done", pods=len(self.state))

    def _log_errors(self, ref: str, report: ApplyReport) -> None:
        if report.errors:
            self.log.error("qos knobs refused", pod=ref, errors=[str(e) for e in report.errors[:5]])


def _knob_values(plan: LevelPlan) -> Tuple[Tuple[str, int], ...]:
    """The level's knobs as ``(name, value)``, pod and container files alike, once each."""
    return tuple(dict.fromkeys((s.knob.name, s.value) for s in plan.pod + plan.container))


def _lacking(wanted: LevelPlan, planned: LevelPlan) -> Tuple[str, ...]:
    have = {s.knob.name for s in planned.pod + planned.container}
    return tuple(dict.fromkeys(s.knob.name for s in wanted.pod + wanted.container if s.knob.name not in have))


def _uid_of(config: Any, layout: KubeletCgroupLayout) -> str:
    """The pod UID as the cgroup path spells it (validated later by path rules)."""
    uid = config.metadata.uid
    try:
        return layout.parse(config.linux.cgroup_parent).uid
    except InvalidCgroupPath:
        return uid


__all__ = ["QosHook", "QosApplyError"]
