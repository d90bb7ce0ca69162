"""``Admission``: a pod's QoS level and the files it means, decided when the pod is first seen.

The level comes from ``policies/qos`` (the pod's annotation or label, else the kubelet's
QoS class); the files from the writes decided once for this kernel
(:class:`~anolisnuma.policies.qos.plan.KernelPlan`: the knobs it lacks are left out, and
said), through :func:`~anolisnuma.policies.qos.plan.decide_pod`, whose one fact from the
kernel is whether the pod is offline now (its ``cpu.qos_level`` read, where the plan would
turn it online: an offline pod is kept offline, and that is warned about and told once). The
decision is kept on the pod: the call's note, the log line, the event and explain all say
it without deciding again.

A pod that cannot be placed (a cgroup_parent not of the kubelet's layout, no pod cgroup) is
warned about and told to the decision sink once, then logged at debug: that mark
(:attr:`Admission.warned`) is all that is kept, until the pod goes. Hostile annotation
values never reach a path; they are logged (escaped and cut) and ignored.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

from anolisnuma.decision_events import (
    DecisionEvents, QosApplied, QosLevelRefused, QosSkipped, no_events, pod_ref,
)
from anolisnuma.logsummary import FirstTime
from anolisnuma.policies.qos.config import QosConfig
from anolisnuma.policies.qos.levels import resolve_level
from anolisnuma.policies.qos.plan import KernelPlan, PodWrites, decide_pod, describe_report
from anolisnuma.policies.qos.resctrl import llc_class_for
from anolisnuma.qos.llc import LlcGroups
from anolisnuma.qos.state import ManagedPod, file_targets
from anolisnuma.system.cgroups import (
    CgroupFs, FileGone, InvalidCgroupPath, PodCgroup, ReadFailed, preview, read_int,
)

SOURCE_KEPT = "kept"   # the level is the one the pod was kept at (its markings' level was refused)


class Admission:
    """``Admission(config, plan, cgroups, llc, log=, known=)``: decides; keeps nothing but
    the once-only warnings (the service keeps the pods). ``plan``: the writes decided for
    this kernel; ``known``: the pod the service manages under a UID, if any."""

    def __init__(self, config: QosConfig, plan: KernelPlan, cgroups: CgroupFs, llc: LlcGroups, *,
                 log: Any, known: Callable[[str], Optional[ManagedPod]] = lambda uid: None) -> None:
        self.cfg = config
        self.plan = plan
        self.cgroups = cgroups
        self.llc = llc
        self.log = log
        self.known = known
        # A pod we cannot place is seen again at each of its calls: warned about once.
        self.warned = FirstTime()
        self.decisions: DecisionEvents = no_events

    def decide(self, uid: str, ref: str, labels: Mapping[str, str], annotations: Mapping[str, str],
               cgroup_parent: str, sandbox_id: str = "") -> Optional[ManagedPod]:
        """A pod's level and files; ``None`` when its cgroup cannot be placed."""
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
                if self.warned.first((uid or ref, "cgroup_parent")):
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
        previous = self.known(cgroup.uid)
        offline_now = self.plan.levels[decision.level].online and self._offline_now(cgroup, previous)
        chosen = decide_pod(self.plan, decision.level, offline_now,
                            previous.level if previous is not None and previous.writes is not None
                            and previous.writes.offline else None)
        writes = chosen.writes
        source, why = (decision.source, decision.why) if not chosen.refused else (
            SOURCE_KEPT, f"{decision.why}; {chosen.said()}")
        llc_group = None
        ignored = decision.warnings
        if self.llc.fs is not None:
            cls, warning = llc_class_for(self.cfg.resctrl, chosen.level, annotations)
            if warning:
                ignored += (warning,)
                self.log.warning("ignored pod annotation: " + warning, pod=ref)
            llc_group = self.cfg.resctrl.group_name(cls)
            if llc_group not in self.llc.groups:
                self.log.warning("resctrl group unavailable; pod threads stay where they are",
                                 pod=ref, llc_class=cls)
                llc_group = None
        pod = ManagedPod(uid=cgroup.uid, ref=ref, level=chosen.level, source=source, why=why,
                         cgroup=cgroup, targets=file_targets(self.cgroups, cgroup.rel, writes.pod),
                         container_settings=writes.container, llc_group=llc_group,
                         sandbox_ids={sandbox_id} if sandbox_id else set(),
                         told=QosApplied(pod_ref(ref, uid), chosen.level.value, why, knobs=writes.knob_values(),
                                         lacking=writes.lacking, ignored=ignored),
                         writes=writes, refused=chosen.said())
        report = writes.report(self.cfg.dry_run)
        self.log.info("qos level", pod=ref, qos_level=chosen.level.value, source=source,
                      why=why, cgroup=cgroup.rel, llc_group=llc_group,
                      dry_run=self.cfg.dry_run, knobs_set=report["set"],
                      knobs_unsupported=report["unsupported"], **({"knobs_held": report["held"]} if writes.held else {}))
        if chosen.refused:
            self._refused(uid, ref, chosen)
        return pod

    def _offline_now(self, cgroup: PodCgroup, previous: Optional[ManagedPod]) -> bool:
        """Whether the pod is offline now: kept at an offline level by us, or its cgroup
        holds an offline value of a final knob (set before a restart, or by rubik)."""
        if previous is not None and previous.writes is not None and previous.writes.offline:
            return True
        for knob in self.plan.final_knobs():
            try:
                if read_int(self.cgroups.knob_path(knob, cgroup.rel)) < 0:
                    return True
            except (FileGone, ReadFailed):
                continue   # no cgroup yet, or a file this cgroup lacks: nothing offline there
        return False

    def _refused(self, uid: str, ref: str, chosen: PodWrites) -> None:
        """An online level refused for an offline pod: warned and told once per pod and
        level asked for, then debug."""
        first = self.warned.first((uid or ref, "refused", chosen.wanted))
        (self.log.warning if first else self.log.debug)(
            "qos level refused: an offline pod is not turned online", pod=ref, wanted=chosen.wanted.value,
            qos_level=chosen.level.value, why=chosen.said())
        if first:
            self.decisions(QosLevelRefused(pod_ref(ref, uid), chosen.wanted.value, chosen.level.value,
                                           chosen.refused))

    def describe(self, pod: ManagedPod) -> str:
        """What the pod's level does on this kernel, not only the level: on a kernel without
        the knobs a level changes nothing, and explain must not say more."""
        if pod.writes is None:   # (every admitted pod has its writes)
            return pod.level.value
        return describe_report(pod.level, pod.writes.report(self.cfg.dry_run)) + \
            (f"; {pod.refused}" if pod.refused else "")

    def _skipped(self, uid: str, ref: str, condition: str, why: str, **fields: Any) -> None:
        """A pod the service cannot manage: warned and told the first time, then debug."""
        first = self.warned.first((uid or ref, condition))
        (self.log.warning if first else self.log.debug)("qos skipped: " + why, pod=ref, **fields)
        if first:
            self.decisions(QosSkipped(pod_ref(ref, uid), why + (f": {fields['error']}" if "error" in fields else "")))

    def _once(self, pod: str, condition: str) -> Any:
        """The log method for a per-pod condition: warning the first time, then debug."""
        return self.log.warning if self.warned.first((pod, condition)) else self.log.debug
