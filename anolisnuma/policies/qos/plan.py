"""Knob values per QoS level: what to write to a pod's cgroup, its containers' cgroups, the
kubelet's QoS-class directories and the global switches.

Pure: the kernel facts (which knobs exist, whether core scheduling is on) are inputs.

Where each knob goes:

=========================  ======  ==========  ==================================  ======
knob                       pod     container   QoS-class dirs                      global
=========================  ======  ==========  ==================================  ======
cpu.bvt_warp_ns            level   level       guaranteed (kubepods) 0,            --
                                               burstable LS, besteffort BE
memory.priority            level   --          burstable LS, besteffort BE         --
memory.use_priority_oom    1       --          --                                  root memcg: enable_global
memory.wmark_ratio         ratio   ratio       --                                  --
memory.wmark_scale_factor  scale   scale       --                                  --
memory.wmark_min_adj       level   level       --                                  --
sched_group_identity_en.   --      --          --                                  1
=========================  ======  ==========  ==================================  ======

``memory.priority`` is compared among siblings, and a pod's siblings are other pods (or,
under ``kubepods``, the burstable/besteffort directories): setting it on containers would
only rank a pod's containers against each other, so it is not done.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Tuple

from anolisnuma.policies.qos.config import QosConfig
from anolisnuma.policies.qos.levels import QosLevel
from anolisnuma.system import knobs
from anolisnuma.system.cgroups import KubeQosClass
from anolisnuma.system.knobs import Knob, KnobSupport


@dataclass(frozen=True)
class KnobSetting:
    knob: Knob
    value: int


@dataclass(frozen=True)
class LevelPlan:
    """What a pod of one level gets (pod cgroup, each container cgroup)."""

    level: QosLevel
    pod: Tuple[KnobSetting, ...]
    container: Tuple[KnobSetting, ...]


def sched_core_conflict(knob: Knob, value: int, sched_core_on: bool) -> Optional[str]:
    """Why ``value`` must not be written to ``knob`` now, or ``None``.

    Core scheduling and group identity -1 (underclass) are mutually exclusive in the Anolis
    kernel; while ``kernel.sched_core`` is 1 the -1 is refused (left for the operator to
    resolve) instead of silently turning core scheduling off as koordinator does.
    """
    if knob is knobs.CPU_BVT_WARP_NS and value == -1 and sched_core_on:
        return (f"{knob.name}=-1 not set: kernel.sched_core is 1 and core scheduling "
                f"conflicts with group identity -1")
    return None


def plan_level(cfg: QosConfig, level: QosLevel, support: KnobSupport) -> LevelPlan:
    """The settings for a pod of ``level``, restricted to supported and enabled knobs."""
    has = support.has
    pod: List[KnobSetting] = []
    ctr: List[KnobSetting] = []
    gi = cfg.group_identity
    if gi.enabled and has(knobs.CPU_BVT_WARP_NS):
        s = KnobSetting(knobs.CPU_BVT_WARP_NS, gi.values[level])
        pod.append(s)
        ctr.append(s)
    op = cfg.oom_priority
    if op.enabled:
        if has(knobs.MEMORY_PRIORITY):
            pod.append(KnobSetting(knobs.MEMORY_PRIORITY, op.values[level]))
        if has(knobs.MEMORY_USE_PRIORITY_OOM):
            pod.append(KnobSetting(knobs.MEMORY_USE_PRIORITY_OOM, 1))
    ar = cfg.async_reclaim
    if ar.enabled:
        for knob, value in ((knobs.MEMORY_WMARK_RATIO, ar.wmark_ratio),
                            (knobs.MEMORY_WMARK_SCALE_FACTOR, ar.wmark_scale_factor),
                            (knobs.MEMORY_WMARK_MIN_ADJ, ar.wmark_min_adj[level])):
            if has(knob):
                s = KnobSetting(knob, value)
                pod.append(s)
                ctr.append(s)
    return LevelPlan(level, tuple(pod), tuple(ctr))


def plan_qos_class_dirs(cfg: QosConfig, support: KnobSupport) -> Dict[KubeQosClass, Tuple[KnobSetting, ...]]:
    """Settings for the kubelet's QoS-class directories: the guaranteed level (``kubepods``
    itself) gets group identity 0, burstable the LS values, besteffort the BE values."""
    out: Dict[KubeQosClass, List[KnobSetting]] = {c: [] for c in KubeQosClass}
    if not cfg.enabled or not cfg.manage_qos_class_dirs:
        return {c: () for c in KubeQosClass}
    has = support.has
    gi = cfg.group_identity
    if gi.enabled and has(knobs.CPU_BVT_WARP_NS):
        out[KubeQosClass.GUARANTEED].append(KnobSetting(knobs.CPU_BVT_WARP_NS, 0))
        out[KubeQosClass.BURSTABLE].append(KnobSetting(knobs.CPU_BVT_WARP_NS, gi.values[QosLevel.LS]))
        out[KubeQosClass.BESTEFFORT].append(KnobSetting(knobs.CPU_BVT_WARP_NS, gi.values[QosLevel.BE]))
    op = cfg.oom_priority
    if op.enabled and has(knobs.MEMORY_PRIORITY):
        out[KubeQosClass.BURSTABLE].append(KnobSetting(knobs.MEMORY_PRIORITY, op.values[QosLevel.LS]))
        out[KubeQosClass.BESTEFFORT].append(KnobSetting(knobs.MEMORY_PRIORITY, op.values[QosLevel.BE]))
    return {c: tuple(v) for c, v in out.items()}


@dataclass(frozen=True)
class GlobalPlan:
    root_cgroup: Tuple[KnobSetting, ...]
    sysctls: Tuple[KnobSetting, ...]


def plan_globals(cfg: QosConfig, support: KnobSupport) -> GlobalPlan:
    """The root memcg's priority-OOM switch and the group identity sysctl."""
    root: List[KnobSetting] = []
    sysctls: List[KnobSetting] = []
    if not cfg.enabled:
        return GlobalPlan((), ())
    if cfg.oom_priority.enabled and support.has(knobs.MEMORY_USE_PRIORITY_OOM):
        root.append(KnobSetting(knobs.MEMORY_USE_PRIORITY_OOM, 1 if cfg.oom_priority.enable_global else 0))
    gi = cfg.group_identity
    if gi.enabled and gi.enable_sysctl and support.has(knobs.SCHED_GROUP_IDENTITY_ENABLED):
        sysctls.append(KnobSetting(knobs.SCHED_GROUP_IDENTITY_ENABLED, 1))
    return GlobalPlan(tuple(root), tuple(sysctls))


def level_knob_report(cfg: QosConfig, level: QosLevel, support: KnobSupport, pod_targets: Iterable[object] = (),
                      container_targets: Iterable[object] = ()) -> Dict[str, object]:
    """What a QoS level means on this kernel, for ``explain`` and the decision log: the
    knobs kept at a value (``set``: ``name=value`` per knob, from the pod's and its
    containers' targets: objects with ``knob`` and ``value``), the knobs the level would
    set that this kernel lacks (``unsupported``), and ``dry_run``. A level whose ``set``
    is empty changed nothing on this node."""
    written: Dict[str, str] = {}
    for t in list(pod_targets) + list(container_targets):
        written.setdefault(t.knob.name, f"{t.knob.name}={t.value}")   # type: ignore[attr-defined]
    wanted = plan_level(cfg, level, KnobSupport.everything())
    missing = sorted({s.knob.name for s in wanted.pod + wanted.container if not support.has(s.knob)})
    return {"set": [written[k] for k in sorted(written)], "unsupported": missing, "dry_run": cfg.dry_run}


def describe_knob_report(level: QosLevel, report: Dict[str, object]) -> str:
    """One line: the level and what it set here, or that it set nothing and why."""
    done = list(report.get("set") or [])   # type: ignore[call-overload]
    missing = list(report.get("unsupported") or [])   # type: ignore[call-overload]
    if done:
        text = f"{level.value}: {'would set' if report.get('dry_run') else 'set'} {', '.join(done)}"
        return text + (f"; not on this kernel: {', '.join(missing)}" if missing else "")
    if missing:
        return f"{level.value}: nothing written (not on this kernel: {', '.join(missing)})"
    return f"{level.value}: nothing written (every knob of this level is turned off in [qos])"
