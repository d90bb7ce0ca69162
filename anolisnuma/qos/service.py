"""``QosService``: the managed pods, their admission and the writes that keep them at their level.

The QoS half's one owner of what the kernel is kept at for each pod, as
:class:`~anolisnuma.placement.service.PlacementService` is NUMA's. Every change goes
through a few entry points:

- :meth:`QosService.sandbox_starting` / :meth:`~QosService.sandbox_started` /
  :meth:`~QosService.sandbox_stopped` / :meth:`~QosService.container_created` /
  :meth:`~QosService.container_starting` / :meth:`~QosService.container_started`: the
  kubelet's calls, as the QoS hook reads them; each answers an :class:`Applied`;
- :meth:`~QosService.resync`: what containerd runs now (at start, then every
  ``[runtime] resync_interval_seconds``);
- :meth:`~QosService.forget`: what the daemon's :class:`~anolisnuma.state.gone.Reaper`
  found gone (the service is a :class:`~anolisnuma.state.gone.PodStateHolder`, and so also
  forgets a pod whose RunPodSandbox failed for good: admitted in pre, it never got a
  sandbox);
- :meth:`~QosService.reapply_globals`, :meth:`~QosService.reapply_pod`,
  :meth:`~QosService.reapply_container`, :meth:`~QosService.sweep`: the reconciler's pass
  (:class:`~anolisnuma.reconcile.qos.QosReconciler`, which the QoS hook builds over the
  service, as the NUMA hook builds its loops over the placement service).

At start the kernel is probed once (``system/knobs.py``: which families' files exist, what
the host switches hold) and the writes for this kernel decided once from the rows of every
family (:func:`~anolisnuma.policies.qos.plan.plan_kernel`: :attr:`QosService.plan`). Then a
call goes one way down: :class:`~anolisnuma.qos.admission.Admission` picks the pod's writes
from that plan (``policies/qos``), :class:`~anolisnuma.qos.applier.QosApplier` writes them;
resctrl groups are kept by :class:`~anolisnuma.qos.llc.LlcGroups` (host files through
``system/``), pods in :class:`~anolisnuma.qos.state.QosState`. The global set-up (sysctls,
root switch, the kubelet's QoS-class directories, resctrl groups) runs once, at
:meth:`QosService.prepare`.

A refused write (read-only file, EINVAL, ...) is collected while the other knobs are still
written; a pod or container whose cgroup vanished meanwhile is skipped quietly.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Container, Dict, List, Optional, Set, Tuple

import structlog

from anolisnuma.config import PathsConfig
from anolisnuma.decision_events import DecisionEvents, no_events
from anolisnuma.policies.qos.config import QosConfig
from anolisnuma.policies.qos.plan import KernelFacts, KernelPlan, plan_kernel
from anolisnuma.policies.qos.table import rows
from anolisnuma.qos.admission import Admission
from anolisnuma.qos.applier import ApplyReport, QosApplier
from anolisnuma.qos.llc import LlcGroups
from anolisnuma.qos.state import ManagedContainer, ManagedPod, QosState, file_targets
from anolisnuma.state.gone import PodGone, PodKeys, PodStateHolder
from anolisnuma.state.records import ContainerRecord, PodRecord
from anolisnuma.system import knobs
from anolisnuma.system.cgroups import CgroupFs, HostFileError, InvalidCgroupPath, KubeletCgroupLayout
from anolisnuma.system.knobs import KnobSupport, probe_support
from anolisnuma.system.resctrl import ResctrlFs
from anolisnuma.system.sysctl import Sysctls


@dataclass
class Applied:
    """What a kubelet call did: its pod (None: not one the service manages), the writes the
    kernel refused (the others were done), and what to say in the call's decision ("" when
    nothing)."""

    pod: Optional[ManagedPod] = None
    errors: List[HostFileError] = field(default_factory=list)
    note: str = ""

    def add(self, report: ApplyReport) -> ApplyReport:
        self.errors += report.errors
        return report


class QosService(PodStateHolder):
    """``QosService(config, paths, log=None, layout=None)``; ``layout`` is the kubelet's
    cgroup layout (None: root ``/``, either driver)."""

    name = "qos"

    def __init__(self, config: QosConfig, paths: PathsConfig, *, log: Any = None,
                 layout: Optional[KubeletCgroupLayout] = None) -> None:
        self.cfg = config
        self.log = log if log is not None else structlog.get_logger("anolisnuma.qos")
        self.cgroups = CgroupFs(paths.cgroup_root, layout)
        self.sysctls = Sysctls(paths.proc_root)
        self.resctrl_fs = ResctrlFs(paths.resctrl_root, paths.proc_root)
        self.state = QosState()
        self.support: KnobSupport = KnobSupport({}, {})
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
        self.plan: KernelPlan = plan_kernel(rows(config), KernelFacts(self.support, self._host_values()))
        if config.enabled:
            self._log_kernel()
        self.applier = QosApplier(self.cgroups, self.sysctls, dry_run=config.dry_run, log=self.log)
        self.applier.sched_core_supported = self.support.has(knobs.SCHED_CORE)
        self.llc = LlcGroups(self.resctrl_fs if self._resctrl_wanted() else None, self.cgroups,
                             dry_run=config.dry_run, log=self.log)
        self.admission = Admission(config, self.plan, self.cgroups, self.llc, log=self.log, known=self.state.by_uid)

    def _host_values(self) -> Dict[str, int]:
        """What the host switches this kernel has hold now (a fact of the plan)."""
        out: Dict[str, int] = {}
        for knob in knobs.SYSCTL_KNOBS:
            if self.support.has(knob):
                try:
                    value = self.sysctls.read(knob)
                except HostFileError:
                    continue
                if value is not None:
                    out[knob.name] = value
        return out

    def _log_kernel(self) -> None:
        """Once at start: the families found, the files of those families this kernel lacks
        (one line each), and the files it has that would not act here."""
        found = self.plan.families
        self.log.info("qos kernel family", families=list(found) or ["none"],
                      not_found=[f.name for f in knobs.FAMILIES if f.name not in found])
        for name, reason in self.support.lacking_lines():
            self.log.info(f"unsupported knob {name}: {reason}", knob=name, reason=reason)
        for name, why in self.plan.held:
            self.log.warning(f"knob not written: {why}", knob=name, reason=why)

    def _resctrl_wanted(self) -> bool:
        return bool(self.cfg.enabled and self.cfg.resctrl.enabled and
                    (self.support.has(knobs.RESCTRL_L3) or self.support.has(knobs.RESCTRL_MB)))

    def use_decision_events(self, sink: DecisionEvents) -> None:
        """Report each pod's level (applied, or skipped and why) to ``sink``."""
        self.decisions = self.admission.decisions = self.applier.decisions = sink

    # ------------------------------------------------------------------ lifecycle
    def prepare(self) -> None:
        """Global set-up, once: sysctl and root switch, QoS-class directories, resctrl
        groups. Called when the hook starts, or by the first call if nobody did."""
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
            a.root_settings, a.sysctl_settings = self.plan.root, self.plan.host
            a.qos_dir_settings = {c: s for c, s in self.plan.qos_class.items() if s}
            report = ApplyReport()
            a.ensure_globals(report)
            self.llc.setup(self.cfg.resctrl, report)
            self._prepared = True

    # ------------------------------------------------------------------ admission
    def admit(self, uid: str, ref: str, labels: Dict[str, str], annotations: Dict[str, str],
              cgroup_parent: str, sandbox_id: str = "") -> Optional[ManagedPod]:
        """Decide a pod's level and files and keep it; ``None`` when its cgroup cannot be
        placed."""
        pod = self.admission.decide(uid, ref, labels, annotations, cgroup_parent, sandbox_id)
        if pod is None:
            return None
        self.applier.log_sched_core_skips(pod.targets, ref)
        self.state.put(pod)
        return self.state.by_uid(pod.uid)

    def admit_record(self, rec: PodRecord) -> Optional[ManagedPod]:
        return self.admit(rec.uid, rec.ref, rec.labels, rec.annotations, rec.cgroup_parent, rec.sandbox_id)

    def _add_container(self, pod: ManagedPod, container_id: str) -> Optional[ManagedContainer]:
        try:
            rel = pod.cgroup.container_rel(container_id)
        except InvalidCgroupPath as e:
            self.log.warning("qos skipped for container", pod=pod.ref, error=str(e))
            return None
        ctr = ManagedContainer(container_id, rel, file_targets(self.cgroups, rel, pod.container_settings))
        self.state.add_container(pod, ctr)
        return ctr

    def _uid_of(self, rec: PodRecord) -> str:
        """The pod UID as the cgroup path spells it (validated later by path rules)."""
        try:
            return self.cgroups.layout.parse(rec.cgroup_parent).uid
        except InvalidCgroupPath:
            return rec.uid

    # ------------------------------------------------------------------ pods
    def sandbox_starting(self, rec: PodRecord) -> Applied:
        """Before RunPodSandbox: the kubelet made the pod cgroup already, so its knobs are
        written now (and a refused write can still refuse the call)."""
        out = Applied(pod=self.admit_record(rec))
        pod = out.pod
        if pod is None:
            return out
        out.note = self.admission.describe(pod)
        report = out.add(self.applier.apply_pod(pod, compare=False))
        if pod.llc_group:
            out.note += f"; resctrl group {pod.llc_group}"
        if report.gone:
            out.note += " (pod cgroup not there yet: retried after RunPodSandbox)"
            self.log.info("pod cgroup not there yet; retried after RunPodSandbox", pod=pod.ref,
                          path=pod.cgroup.rel)
        return out

    def sandbox_started(self, rec: PodRecord) -> Applied:
        """After RunPodSandbox (``rec.sandbox_id`` the new sandbox): remember it; the knobs
        again if the cgroup was not there before."""
        pod = self.state.by_uid(self._uid_of(rec))
        if pod is None:
            pod = self.admit_record(rec)
            if pod is None:
                return Applied()
        out = Applied(pod=pod)
        self.state.bind_sandbox(pod.uid, rec.sandbox_id)
        if not pod.applied:
            report = out.add(self.applier.apply_pod(pod, compare=False))
            if report.gone:
                self.log.warning("pod cgroup not found; pod knobs not written", pod=pod.ref,
                                 path=pod.cgroup.rel)
        return out

    def sandbox_stopped(self, sandbox_id: str) -> Optional[ManagedPod]:
        """Forget the sandbox; the pod (returned) with its last one."""
        with self._admission:
            return self.state.forget_sandbox(sandbox_id)

    # ------------------------------------------------------------------ containers
    def container_created(self, sandbox_id: str, container_id: str, rec: Optional[PodRecord]) -> Applied:
        """After CreateContainer: remember the container; its knobs if its cgroup exists.
        ``rec`` is the pod as the call knows it, for a pod not seen yet."""
        out = Applied(pod=self.state.by_sandbox(sandbox_id))
        if out.pod is None and rec is not None:
            out.pod = self.admit_record(rec)
            if out.pod is not None:
                self.state.bind_sandbox(out.pod.uid, sandbox_id)
                out.add(self.applier.apply_pod(out.pod, compare=False))   # a pod we had not seen yet
        if out.pod is None:
            return out
        ctr = self._add_container(out.pod, container_id)
        if ctr is not None:
            out.add(self.applier.apply_container(out.pod, ctr, compare=False))
        return out

    def _find_container(self, container_id: str, rec: Optional[ContainerRecord], pod_rec: Optional[PodRecord],
                        out: Applied) -> Tuple[Optional[ManagedPod], Optional[ManagedContainer]]:
        pod, ctr = self.state.by_container(container_id)
        if ctr is not None:
            return pod, ctr
        # Created before we saw it (proxy restarted between Create and Start).
        if rec is None or rec.container_id != container_id:
            return None, None
        pod = self.state.by_sandbox(rec.sandbox_id)
        if pod is None and pod_rec is not None:
            pod = self.admit_record(pod_rec)
            if pod is not None:
                self.state.bind_sandbox(pod.uid, rec.sandbox_id)
                out.add(self.applier.apply_pod(pod, compare=False))
        if pod is None:
            return None, None
        return pod, self._add_container(pod, container_id)

    def container_starting(self, container_id: str, rec: Optional[ContainerRecord],
                           pod_rec: Optional[PodRecord]) -> Applied:
        """Before StartContainer: the container's knobs if still missing."""
        out = Applied()
        out.pod, ctr = self._find_container(container_id, rec, pod_rec, out)
        if out.pod is not None and ctr is not None and not ctr.applied:
            out.add(self.applier.apply_container(out.pod, ctr, compare=False))
        return out

    def container_started(self, container_id: str, rec: Optional[ContainerRecord],
                          pod_rec: Optional[PodRecord]) -> Applied:
        """After StartContainer: the knobs if still missing (containerd makes the cgroup
        during StartContainer, so they usually land here); its threads into the pod's
        resctrl group."""
        out = Applied()
        pod, ctr = self._find_container(container_id, rec, pod_rec, out)
        if pod is None or ctr is None:
            return Applied()
        out.pod = pod
        if not ctr.applied:
            report = out.add(self.applier.apply_container(pod, ctr, compare=False))
            if report.gone:
                self._cgroup_gone_after_start(pod, ctr)
        self.llc.sweep_tasks(pod, ctr)
        return out

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
                pod = self.state.by_sandbox(rec.sandbox_id) or self.admit_record(rec)
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
            self.llc.sweep_tasks(pod, ctr)
        self.log.info("qos resync done", pods=len(self.state))

    def tell_adopted(self, pods: List[PodRecord]) -> None:
        """Tell the decision about each of ``pods`` (adopted by a resync) that is not told
        yet: a resync that finds a pod's values in place tells nothing (a pod the daemon
        knew was told before), so a pod new to the daemon is told here (on a kernel with no
        knob of its level, nothing is ever written)."""
        for rec in pods:
            with self._admission:
                pod = self.state.by_sandbox(rec.sandbox_id)
                if pod is not None:
                    self.applier.tell(pod)

    def _log_errors(self, ref: str, report: ApplyReport) -> None:
        if report.errors:
            self.log.error("qos knobs refused", pod=ref, errors=[str(e) for e in report.errors[:5]])

    # ------------------------------------------------------------------ PodStateHolder
    def held(self) -> PodKeys:
        uids, sandboxes, containers = self.state.keys()
        return PodKeys.of(uids + [str(o) for o in self.admission.warned.owners()], sandboxes, containers)

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
            self.admission.warned.forget(uid)

    def structures(self) -> Dict[str, int]:
        return {"pods": len(self.state), "containers": self.state.container_count(),
                "warned_once": len(self.admission.warned)}

    # ------------------------------------------------------------------ the reconciler's pass
    def snapshot(self) -> List[Tuple[ManagedPod, List[ManagedContainer]]]:
        return self.state.snapshot()

    def reapply_globals(self) -> ApplyReport:
        """The sched_core switch re-read; root switch, sysctls, QoS-class directories and
        resctrl groups put back where they drifted."""
        self.applier.refresh_sched_core()
        report = ApplyReport()
        self.applier.ensure_globals(report)
        self.llc.ensure_groups(report)
        return report

    def reapply_pod(self, pod: ManagedPod) -> ApplyReport:
        return self.applier.apply_pod(pod)

    def reapply_container(self, pod: ManagedPod, ctr: ManagedContainer) -> ApplyReport:
        return self.applier.apply_container(pod, ctr)

    def sweep(self, pod: ManagedPod, ctr: ManagedContainer, members: Dict[str, Set[str]]) -> int:
        """The container's threads into its pod's resctrl group; how many moved."""
        return self.llc.sweep_tasks(pod, ctr, members)[0]

    def forget_pod(self, pod: ManagedPod) -> None:
        self.state.forget_pod(pod)

    def forget_container(self, container_id: str) -> None:
        self.state.forget_container(container_id)
