"""What each QoS level writes where, on every kernel family: the knob rows, as data.

A :class:`Row` is one knob of the file table (``system/knobs.py``: its family, file,
accepted values and how it is detected) at one place (:class:`Where`), with the value for
each key of that place: a QoS level for pod and container cgroups, a Kubernetes QoS class
for the kubelet's class directories, one value for the root cgroup and for a host-wide
sysctl. A key left out is left alone. ``needs`` names a host switch the row acts only
under (``memory.qos_level`` does nothing while ``vm.memcg_qos_enable`` is 0).

:func:`rows` turns the ``[qos]`` configuration into the rows of every family, the feature
switches applied; which of them this kernel gets is decided once, in
:func:`~anolisnuma.policies.qos.plan.plan_kernel`, from what the start-up probe found.
Adding a family is a function below, its files in the knob table and a fake tree of it:
the decision, the writes, status and explain take it as they take these.

=========================  =========================  ====================================
family / knob              pod, container cgroups     elsewhere
=========================  =========================  ====================================
alinux cpu.bvt_warp_ns     level (both)               class dirs: guaranteed 0, burstable
                                                      LS, besteffort BE
alinux memory.priority     level (pod only)           class dirs: burstable LS, besteffort BE
alinux memory.use_prio...  1 (pod only)               root memcg: enable_global
alinux memory.wmark_*      ratio, scale, level (both) --
alinux sched_group_id...   --                         host: 1 (enable_sysctl)
openeuler cpu.qos_level    level (both)               --
openeuler memory.qos_level level (both)               --  (needs vm.memcg_qos_enable >= 1)
openeuler memcg_qos_enable --                         host: 1 (enable_sysctl)
=========================  =========================  ====================================

``memory.priority`` is compared among siblings, and a pod's siblings are other pods (or,
under ``kubepods``, the burstable/besteffort directories): setting it on containers would
only rank a pod's containers against each other, so it is not done. openEuler's files are
not written on the class directories: a child of an offline cgroup cannot be online, so a
besteffort directory made offline would keep every pod under it offline, whatever its level.

Pure: no I/O.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

from anolisnuma.policies.qos.config import QosConfig
from anolisnuma.policies.qos.levels import QosLevel
from anolisnuma.system import knobs
from anolisnuma.system.knobs import Knob
from anolisnuma.system.pod_cgroups import KubeQosClass


class Where(str, enum.Enum):
    POD = "pod"
    CONTAINER = "container"
    QOS_CLASS = "qos_class"     # the kubelet's kubepods / burstable / besteffort directories
    ROOT = "root"               # the root cgroup
    HOST = "host"               # a sysctl: host-wide


@dataclass(frozen=True)
class Row:
    """One knob at one place, with its value per key (see the module docstring)."""

    knob: Knob
    where: Where
    values: Mapping[Any, int]
    needs: Optional[Tuple[Knob, int]] = None   # (host switch, least value) for the row to act

    def value(self, key: Any) -> Optional[int]:
        return self.values.get(key)


def _one(value: int) -> Dict[Any, int]:
    return {None: value}


def _classes(values: Mapping[QosLevel, int], guaranteed: Optional[int] = None) -> Dict[Any, int]:
    """Class-directory values from level values: burstable takes LS's, besteffort BE's."""
    out: Dict[Any, int] = {KubeQosClass.BURSTABLE: values[QosLevel.LS],
                           KubeQosClass.BESTEFFORT: values[QosLevel.BE]}
    if guaranteed is not None:
        out[KubeQosClass.GUARANTEED] = guaranteed
    return out


def _same(value: int) -> Dict[Any, int]:
    return {lv: value for lv in QosLevel}


def alinux_rows(cfg: QosConfig) -> Tuple[Row, ...]:
    """Alibaba Cloud Linux / Anolis: group identity, OOM priority, async reclaim."""
    out = []
    gi, op, ar = cfg.group_identity, cfg.oom_priority, cfg.async_reclaim
    if gi.enabled:
        out += [Row(knobs.CPU_BVT_WARP_NS, Where.POD, gi.values), Row(knobs.CPU_BVT_WARP_NS, Where.CONTAINER, gi.values)]
    if op.enabled:
        out += [Row(knobs.MEMORY_PRIORITY, Where.POD, op.values),
                Row(knobs.MEMORY_USE_PRIORITY_OOM, Where.POD, _same(1))]
    if ar.enabled:
        for knob, values in ((knobs.MEMORY_WMARK_RATIO, _same(ar.wmark_ratio)),
                             (knobs.MEMORY_WMARK_SCALE_FACTOR, _same(ar.wmark_scale_factor)),
                             (knobs.MEMORY_WMARK_MIN_ADJ, ar.wmark_min_adj)):
            out += [Row(knob, Where.POD, values), Row(knob, Where.CONTAINER, values)]
    if cfg.manage_qos_class_dirs:
        if gi.enabled:
            out.append(Row(knobs.CPU_BVT_WARP_NS, Where.QOS_CLASS, _classes(gi.values, guaranteed=0)))
        if op.enabled:
            out.append(Row(knobs.MEMORY_PRIORITY, Where.QOS_CLASS, _classes(op.values)))
    if op.enabled:
        out.append(Row(knobs.MEMORY_USE_PRIORITY_OOM, Where.ROOT, _one(1 if op.enable_global else 0)))
    if gi.enabled and gi.enable_sysctl:
        out.append(Row(knobs.SCHED_GROUP_IDENTITY_ENABLED, Where.HOST, _one(1)))
    return tuple(out)


def openeuler_rows(cfg: QosConfig) -> Tuple[Row, ...]:
    """openEuler: cpu.qos_level and memory.qos_level on pods and containers (what rubik's
    preemption service writes), the memcg QoS switch host-wide when allowed."""
    pe = cfg.preemption
    if not pe.enabled:
        return ()
    memcg_on = (knobs.VM_MEMCG_QOS_ENABLE, 1)
    out = [Row(knobs.CPU_QOS_LEVEL, Where.POD, pe.cpu), Row(knobs.CPU_QOS_LEVEL, Where.CONTAINER, pe.cpu),
           Row(knobs.MEMORY_QOS_LEVEL, Where.POD, pe.memory, needs=memcg_on),
           Row(knobs.MEMORY_QOS_LEVEL, Where.CONTAINER, pe.memory, needs=memcg_on)]
    if pe.enable_sysctl:
        out.append(Row(knobs.VM_MEMCG_QOS_ENABLE, Where.HOST, _one(1)))
    return tuple(out)


# Every family's rows, in the order they are written. A new family is one more entry.
FAMILY_ROWS = (alinux_rows, openeuler_rows)


def rows(cfg: QosConfig) -> Tuple[Row, ...]:
    """Every row the configuration turns on, of every family (none when QoS is off)."""
    if not cfg.enabled:
        return ()
    return tuple(r for family in FAMILY_ROWS for r in family(cfg))


__all__ = ["Where", "Row", "rows", "alinux_rows", "openeuler_rows", "FAMILY_ROWS"]
