"""Every kernel file the QoS policies touch, as one table of data.

Each :class:`Knob` says which kernel family offers it (:data:`FAMILIES`: Alibaba Cloud
Linux / Anolis, openEuler; none for resctrl, which is the hardware's), where the file lives
(cgroup v1 controller and file name, cgroup v2 file name, or a path under ``/proc/sys``),
which values that family's kernels accept, which QoS feature it belongs to, and whether an
offline value is final. Support checks, range validation and the v1/v2 split use this
table and nothing else: a hook never spells a file name itself. Which value each level
writes where is the policy's table (``policies/qos/table.py``), keyed by these rows.

Support is detected once at start (:func:`probe_support`): a cgroup knob is supported when
its file exists in the hierarchy root or in a ``kubepods`` directory (some Anolis files are
not created on the root cgroup; before the kubelet made ``kubepods``, a temporary empty
cgroup is made to look), a sysctl when its file exists under ``/proc/sys``, resctrl
when the filesystem is mounted with the resource's ``info`` directory. Unsupported knobs are
logged once and then skipped; they are never an error.

This module is the catalogue the file adapters (:mod:`~anolisnuma.system.cgroups`,
:mod:`~anolisnuma.system.sysctl`, :mod:`~anolisnuma.system.resctrl`) import; it imports
none of them. The probe asks them through the three small protocols below, which they
satisfy.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Protocol, Tuple


# Kernel families: the vendor interfaces a kernel may offer. A family is "found" when this
# kernel has at least one of its cgroup files (:meth:`KnobSupport.families_found`).
ALINUX = "alinux"
OPENEULER = "openeuler"


@dataclass(frozen=True)
class KernelFamily:
    """A vendor's co-location interface: its name in the table, what to call it, and the
    kernels known to offer it (for status and the docs)."""

    name: str
    title: str
    kernels: str


FAMILIES: Tuple[KernelFamily, ...] = (
    KernelFamily(ALINUX, "Alibaba Cloud Linux / Anolis",
                 "Alibaba Cloud Linux 3 and Anolis 8 kernels (ANCK 4.19, 5.10)"),
    KernelFamily(OPENEULER, "openEuler",
                 "openEuler 22.03 LTS and later kernels (5.10, 6.6)"),
)
FAMILY_BY_NAME: Dict[str, KernelFamily] = {f.name: f for f in FAMILIES}


class KnobKind(str, enum.Enum):
    CGROUP = "cgroup"
    SYSCTL = "sysctl"
    RESCTRL = "resctrl"


@dataclass(frozen=True)
class ValueRange:
    """Inclusive integer range the kernel accepts for a knob."""

    low: int
    high: int

    def check(self, value: int) -> Optional[str]:
        """``None`` when ``value`` is valid, else what is wrong with it."""
        if isinstance(value, bool) or not isinstance(value, int):
            return f"must be an integer, not {type(value).__name__}"
        if not self.low <= value <= self.high:
            return f"must be in {self.low}..{self.high}; got {value}"
        return None

    def __str__(self) -> str:
        return f"{self.low}..{self.high}"


@dataclass(frozen=True)
class Knob:
    """One kernel file.

    ``name`` identifies the knob in logs and in :class:`KnobSupport`; for cgroup knobs it is
    the v1 file name. ``family`` is the kernel family that offers it ("" for resctrl, which
    any kernel may have). ``controller`` is the v1 hierarchy the file lives in, ``v2_name``
    the file name in the unified tree. For sysctls ``sysctl_path`` is relative to
    ``<proc_root>/sys``; for resctrl entries ``resctrl_info`` is the ``info`` sub-directory
    whose presence means support. ``valid`` is the widest range any kernel of the family
    accepts (a kernel may accept less: its refusal is reported, never assumed away).
    ``offline_is_final``: a value below 0 marks the cgroup offline, and it is never brought
    back to 0 or above while the cgroup lives (see :data:`CPU_QOS_LEVEL`).
    """

    name: str
    kind: KnobKind
    feature: str
    valid: Optional[ValueRange] = None
    controller: str = ""
    v2_name: str = ""
    sysctl_path: str = ""
    resctrl_info: str = ""
    doc: str = ""
    family: str = ""
    offline_is_final: bool = False


CPU_BVT_WARP_NS = Knob(
    "cpu.bvt_warp_ns", KnobKind.CGROUP, "group_identity", ValueRange(-1, 2),
    controller="cpu", v2_name="cpu.bvt_warp_ns",
    doc="group identity: 2/1 high class, 0 normal, -1 underclass (Anolis kernels)", family=ALINUX)
MEMORY_PRIORITY = Knob(
    "memory.priority", KnobKind.CGROUP, "oom_priority", ValueRange(0, 12),
    controller="memory", v2_name="memory.priority",
    doc="OOM priority among siblings; higher survives longer", family=ALINUX)
MEMORY_USE_PRIORITY_OOM = Knob(
    "memory.use_priority_oom", KnobKind.CGROUP, "oom_priority", ValueRange(0, 1),
    controller="memory", v2_name="memory.use_priority_oom",
    doc="1 = pick OOM victims by memory.priority (on the root memcg: for global OOM)", family=ALINUX)
MEMORY_WMARK_RATIO = Knob(
    "memory.wmark_ratio", KnobKind.CGROUP, "async_reclaim", ValueRange(0, 100),
    controller="memory", v2_name="memory.wmark_ratio",
    doc="async reclaim starts at this percentage of the memory limit; 0 = off", family=ALINUX)
MEMORY_WMARK_SCALE_FACTOR = Knob(
    "memory.wmark_scale_factor", KnobKind.CGROUP, "async_reclaim", ValueRange(1, 1000),
    controller="memory", v2_name="memory.wmark_scale_factor",
    doc="distance between the high and low watermarks, in 1/10000 of the limit", family=ALINUX)
MEMORY_WMARK_MIN_ADJ = Knob(
    "memory.wmark_min_adj", KnobKind.CGROUP, "async_reclaim", ValueRange(-25, 50),
    controller="memory", v2_name="memory.wmark_min_adj",
    doc="global min watermark adjustment: negative protects, positive throttles", family=ALINUX)

SCHED_GROUP_IDENTITY_ENABLED = Knob(
    "kernel.sched_group_identity_enabled", KnobKind.SYSCTL, "group_identity", ValueRange(0, 1),
    sysctl_path="kernel/sched_group_identity_enabled",
    doc="newer Alinux kernels apply cpu.bvt_warp_ns only while this is 1", family=ALINUX)
SCHED_CORE = Knob(
    "kernel.sched_core", KnobKind.SYSCTL, "group_identity", ValueRange(0, 1),
    sysctl_path="kernel/sched_core",
    doc="core scheduling; read only: while it is 1 the kernel conflicts with bvt -1", family=ALINUX)

# openEuler's co-location interface (the kernel's CONFIG_QOS_SCHED and memcg QoS; rubik's
# "preemption" service writes it). Both files take 0 (online) and -1 (offline) on every
# openEuler kernel that has them; kernels with multi-level scheduling
# (CONFIG_QOS_SCHED_MULTILEVEL) take cpu.qos_level -2..2, and some take memory.qos_level
# -1024..1023. An offline cgroup's cpu.qos_level cannot be set back to 0 (the kernel refuses
# it); rubik refuses the same for the whole pod, memory.qos_level included, so that the two
# never disagree: both rows are marked final.
CPU_QOS_LEVEL = Knob(
    "cpu.qos_level", KnobKind.CGROUP, "preemption", ValueRange(-2, 2),
    controller="cpu", v2_name="cpu.qos_level", family=OPENEULER, offline_is_final=True,
    doc="online (>= 0) tasks preempt offline (< 0) ones on every CPU (openEuler kernels)")
MEMORY_QOS_LEVEL = Knob(
    "memory.qos_level", KnobKind.CGROUP, "preemption", ValueRange(-1024, 1023),
    controller="memory", v2_name="memory.qos_level", family=OPENEULER, offline_is_final=True,
    doc="under OOM the lowest level's memcgs are killed first; only while vm.memcg_qos_enable >= 1")
VM_MEMCG_QOS_ENABLE = Knob(
    "vm.memcg_qos_enable", KnobKind.SYSCTL, "preemption", ValueRange(0, 2),
    sysctl_path="vm/memcg_qos_enable", family=OPENEULER,
    doc="host-wide: 1 (or 2) makes the OOM killer honour memory.qos_level")

RESCTRL_L3 = Knob(
    "resctrl.L3", KnobKind.RESCTRL, "resctrl", resctrl_info="L3",
    doc="L3 cache allocation (Intel CAT, AMD L3 QoS, ARM MPAM cache portions)")
RESCTRL_MB = Knob(
    "resctrl.MB", KnobKind.RESCTRL, "resctrl", resctrl_info="MB",
    doc="memory bandwidth allocation (Intel MBA, AMD MBA, ARM MPAM bandwidth)")

ALINUX_CGROUP_KNOBS: Tuple[Knob, ...] = (
    CPU_BVT_WARP_NS, MEMORY_PRIORITY, MEMORY_USE_PRIORITY_OOM,
    MEMORY_WMARK_RATIO, MEMORY_WMARK_SCALE_FACTOR, MEMORY_WMARK_MIN_ADJ,
)
OPENEULER_CGROUP_KNOBS: Tuple[Knob, ...] = (CPU_QOS_LEVEL, MEMORY_QOS_LEVEL)
# (The Alibaba family's files, under the name they had before there were two families:
# what fake Alibaba trees are made of and what their tests count.)
CGROUP_KNOBS: Tuple[Knob, ...] = ALINUX_CGROUP_KNOBS
ALL_CGROUP_KNOBS: Tuple[Knob, ...] = ALINUX_CGROUP_KNOBS + OPENEULER_CGROUP_KNOBS
SYSCTL_KNOBS: Tuple[Knob, ...] = (SCHED_GROUP_IDENTITY_ENABLED, SCHED_CORE, VM_MEMCG_QOS_ENABLE)
RESCTRL_KNOBS: Tuple[Knob, ...] = (RESCTRL_L3, RESCTRL_MB)
ALL_KNOBS: Tuple[Knob, ...] = ALL_CGROUP_KNOBS + SYSCTL_KNOBS + RESCTRL_KNOBS
BY_NAME: Dict[str, Knob] = {k.name: k for k in ALL_KNOBS}

# The cgroup files a fake kernel creates, with the values a fresh cgroup shows.
ANOLIS_CGROUP_DEFAULTS: Dict[str, int] = {
    CPU_BVT_WARP_NS.name: 0,
    MEMORY_PRIORITY.name: 0,
    MEMORY_USE_PRIORITY_OOM.name: 0,
    MEMORY_WMARK_RATIO.name: 0,
    MEMORY_WMARK_SCALE_FACTOR.name: 50,
    MEMORY_WMARK_MIN_ADJ.name: 0,
}
OPENEULER_CGROUP_DEFAULTS: Dict[str, int] = {CPU_QOS_LEVEL.name: 0, MEMORY_QOS_LEVEL.name: 0}


@dataclass
class KnobSupport:
    """Result of the start-up probe: which knobs this kernel has, and why not the others."""

    supported: Dict[str, Knob]
    unsupported: Dict[str, str]   # knob name -> reason

    def has(self, knob: Knob) -> bool:
        return knob.name in self.supported

    @classmethod
    def everything(cls) -> "KnobSupport":
        """All knobs supported (for tests of pure code)."""
        return cls({k.name: k for k in ALL_KNOBS}, {})

    @classmethod
    def only(cls, knobs: Iterable[Knob]) -> "KnobSupport":
        present = {k.name: k for k in knobs}
        return cls(present, {k.name: "not present" for k in ALL_KNOBS if k.name not in present})

    def report_lines(self) -> List[Tuple[str, str]]:
        """``(knob name, reason)`` for each unsupported knob, in table order."""
        return [(k.name, self.unsupported[k.name]) for k in ALL_KNOBS if k.name in self.unsupported]

    def families_found(self) -> Tuple[str, ...]:
        """The kernel families this kernel offers (at least one of their cgroup files), in
        table order; ``()`` on a kernel with neither (a mainline one)."""
        return tuple(f.name for f in FAMILIES
                     if any(k.family == f.name and self.has(k) for k in ALL_CGROUP_KNOBS))

    def concerns(self, knob: Knob) -> bool:
        """Whether ``knob`` matters on this kernel: it belongs to no family (resctrl), to a
        family found, or no family was found at all (then every knob is worth naming). A
        family this kernel does not have is one line in status, not a line per file."""
        found = self.families_found()
        return not knob.family or not found or knob.family in found

    def lacking_lines(self) -> List[Tuple[str, str]]:
        """:meth:`report_lines`, without the files of a family this kernel does not have."""
        return [(name, why) for name, why in self.report_lines() if self.concerns(BY_NAME[name])]


class CgroupProbe(Protocol):
    """What the probe asks of the cgroup hierarchy (:class:`~anolisnuma.system.cgroups.CgroupFs`)."""

    def knob_missing_reason(self, knob: Knob, probe_cgroup: bool = True) -> Optional[str]: ...


class SysctlProbe(Protocol):
    """What the probe asks of ``/proc/sys`` (:class:`~anolisnuma.system.sysctl.Sysctls`)."""

    def missing_reason(self, knob: Knob) -> Optional[str]: ...


class ResctrlProbe(Protocol):
    """What the probe asks of resctrl (:class:`~anolisnuma.system.resctrl.ResctrlFs`)."""

    def missing_reason(self, info_name: str) -> Optional[str]: ...


def probe_support(cgroups: CgroupProbe, sysctls: SysctlProbe,
                  resctrl: Optional[ResctrlProbe] = None, probe_cgroup: bool = True) -> KnobSupport:
    """Look once at the kernel and sort every knob into supported / unsupported.

    ``probe_cgroup`` lets the cgroup check make (and remove) a temporary empty cgroup when
    no ``kubepods`` directory exists yet (see :meth:`CgroupFs.knob_missing_reason`); a dry
    run passes ``False``. Never raises: a knob whose check fails for any reason is
    unsupported with that reason.
    """
    supported: Dict[str, Knob] = {}
    unsupported: Dict[str, str] = {}
    for knob in ALL_KNOBS:
        try:
            if knob.kind is KnobKind.CGROUP:
                reason = cgroups.knob_missing_reason(knob, probe_cgroup)
            elif knob.kind is KnobKind.SYSCTL:
                reason = sysctls.missing_reason(knob)
            else:
                reason = ("resctrl not configured" if resctrl is None
                          else resctrl.missing_reason(knob.resctrl_info))
        except OSError as e:  # pragma: no cover - a probe that cannot even stat
            reason = f"probe failed: {e.strerror or e}"
        if reason is None:
            supported[knob.name] = knob
        else:
            unsupported[knob.name] = reason
    return KnobSupport(supported, unsupported)
