"""``Admission``: a pod's QoS level and the files it means, decided when the pod is first seen.

The level comes from ``policies/qos`` (the pod's annotation or label, else the kubelet's
QoS class); the files from the level's plan on this kernel (the knobs it lacks are left
out, and said). A pod that cannot be placed (a cgroup_parent not of the kubelet's layout,
no pod cgroup) is warned about and told to the decision sink once, then logged at debug:
that mark (:attr:`Admission.warned`) is all that is kept, until the pod goes. Hostile
annotation values never reach a path; they are logged (escaped and cut) and ignored.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

from anolisnuma.decision_events import DecisionEvents, QosApplied, QosSkipped, no_events, pod_ref
from anolisnuma.logsummary import FirstTime
from anolisnuma.policies.qos.config import QosConfig
from anolisnuma.policies.qos.levels import QosLevel, resolve_level
from anolisnuma.policies.qos.plan import LevelPlan, describe_knob_report, level_knob_report, plan_level
from anolisnuma.policies.qos.resctrl import llc_class_for
from anolisnuma.qos.llc import LlcGroups
from anolisnuma.qos.state import ManagedPod, file_targets
from anolisnuma.system.cgroups import CgroupFs, InvalidCgroupPath, PodCgroup, preview
from anolisnuma.system.knobs import KnobSupport


class Admission:
    """``Admission(config, support, cgroups, llc, log=)``: decides; keeps nothing but the
    once-only warnings (the service keeps the pods)."""

    def __init__(self, config: QosConfig, support: KnobSupport, cgroups: CgroupFs, llc: LlcGroups, *,
                 log: Any) -> None:
        self.cfg = config
        self.support = support
        self.cgroups = cgroups
        self.llc = llc
        self.log = log
        # A pod we cannot place is seen again at each of its calls: warned about once.
        self.warned = FirstTime()
        self.decisions: DecisionEvents = no_events
        self.plans: Dict[QosLevel, LevelPlan] = {}
        self.lacking: Dict[QosLevel, Tuple[str, ...]] = {}   # knobs a level would write that this kernel lacks
        if config.enabled:
            self.plans = {lv: plan_level(config, lv, support) for lv in QosLevel}
            self.lacking = {lv: _lacking(plan_level(config, lv, KnobSupport.everything()), self.plans[lv])
                            for lv in QosLevel}

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
        plan = self.plans[decision.level]
        llc_group = None
        ignored = decision.warnings
        if self.llc.fs is not None:
            cls, warning = llc_class_for(self.cfg.resctrl, decision.level, annotations)
            if warning:
                ignored += (warning,)
                self.log.warning("ignored pod annotation: " + warning, pod=ref)
            llc_group = self.cfg.resctrl.group_name(cls)
            if llc_group not in self.llc.groups:
                self.log.warning("resctrl group unavailable; pod threads stay where they are",
                                 pod=ref, llc_class=cls)
                llc_group = None
        pod = ManagedPod(uid=cgroup.uid, ref=ref, level=decision.level, source=decision.source, why=decision.why,
                         cgroup=cgroup, targets=file_targets(self.cgroups, cgroup.rel, plan.pod),
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
        return pod

    def describe(self, pod: ManagedPod) -> str:
        """What the pod's level does on this kernel, not only the level: on a kernel without
        the knobs a level changes nothing, and explain must not say more."""
        return describe_knob_report(pod.level, level_knob_report(self.cfg, pod.level, self.support, pod.targets))

    def _skipped(self, uid: str, ref: str, condition: str, why: str, **fields: Any) -> None:
        """A pod the service cannot manage: warned and told the first time, then debug."""
        first = self.warned.first((uid or ref, condition))
        (self.log.warning if first else self.log.debug)("qos skipped: " + why, pod=ref, **fields)
        if first:
            self.decisions(QosSkipped(pod_ref(ref, uid), why + (f": {fields['error']}" if "error" in fields else "")))

    def _once(self, pod: str, condition: str) -> Any:
        """The log method for a per-pod condition: warning the first time, then debug."""
        return self.log.warning if self.warned.first((pod, condition)) else self.log.debug


def _knob_values(plan: LevelPlan) -> Tuple[Tuple[str, int], ...]:
    """The level's knobs as ``(name, value)``, pod and container files alike, once each."""
    return tuple(dict.fromkeys((s.knob.name, s.value) for s in plan.pod + plan.container))


def _lacking(wanted: LevelPlan, planned: LevelPlan) -> Tuple[str, ...]:
    have = {s.knob.name for s in planned.pod + planned.container}
    return tuple(dict.fromkeys(s.knob.name for s in wanted.pod + wanted.container if s.knob.name not in have))
