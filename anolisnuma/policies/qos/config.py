"""The ``[qos]`` configuration section.

Every key is optional; defaults are the anolisbox values. Every value is checked at start
against the range the kernel accepts (ranges come from the knob table), and unknown keys
are refused, naming the dotted key. Documented key by key in ``docs/qos.md``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, Optional, Set

from anolisnuma.configfile import Table, did_you_mean, shown
from anolisnuma.policies.qos.levels import LEVELS, QosLevel
from anolisnuma.system import knobs
from anolisnuma.system.cgroups import KubeQosClass

LLC_CLASSES = ("low", "high", "all")
_PREFIX_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}")


def _levels(**values: int) -> Dict[QosLevel, int]:
    return {QosLevel(k): v for k, v in values.items()}


@dataclass
class GroupIdentityConfig:
    enabled: bool = True
    values: Dict[QosLevel, int] = field(default_factory=lambda: _levels(LSE=2, LSR=2, LS=1, BE=-1))
    # Write 1 to /proc/sys/kernel/sched_group_identity_enabled where the kernel has it.
    enable_sysctl: bool = True


@dataclass
class OomPriorityConfig:
    enabled: bool = True
    # The root memcg's memory.use_priority_oom: true writes 1, false writes 0.
    enable_global: bool = True
    values: Dict[QosLevel, int] = field(default_factory=lambda: _levels(LSE=5, LSR=10, LS=10, BE=0))


@dataclass
class AsyncReclaimConfig:
    enabled: bool = True
    wmark_ratio: int = 95
    wmark_scale_factor: int = 20
    wmark_min_adj: Dict[QosLevel, int] = field(
        default_factory=lambda: _levels(LSE=-25, LSR=-25, LS=-25, BE=50))


@dataclass
class PreemptionConfig:
    """openEuler's ``cpu.qos_level`` / ``memory.qos_level`` (rubik's "preemption")."""

    enabled: bool = True
    cpu: Dict[QosLevel, int] = field(default_factory=lambda: _levels(LSE=0, LSR=0, LS=0, BE=-1))
    memory: Dict[QosLevel, int] = field(default_factory=lambda: _levels(LSE=0, LSR=0, LS=0, BE=-1))
    # Write 1 to /proc/sys/vm/memcg_qos_enable where it is 0 (host-wide: the OOM killer then
    # honours memory.qos_level). When false and the switch is 0, memory.qos_level is not
    # written and status says why.
    enable_sysctl: bool = True


@dataclass(frozen=True)
class ResctrlClass:
    l3_ways: int        # 0 = every way
    mb_percent: int


@dataclass
class ResctrlConfig:
    enabled: bool = True
    group_prefix: str = "anolisnuma-"
    classes: Dict[str, ResctrlClass] = field(default_factory=lambda: {
        "low": ResctrlClass(4, 20), "high": ResctrlClass(8, 50), "all": ResctrlClass(0, 100)})
    default: Dict[QosLevel, str] = field(default_factory=lambda: {
        QosLevel.LSE: "all", QosLevel.LSR: "all", QosLevel.LS: "all", QosLevel.BE: "low"})

    def group_name(self, cls: str) -> str:
        return f"{self.group_prefix}{cls}"


@dataclass
class QosConfig:
    enabled: bool = True
    dry_run: bool = False
    reconcile_interval_seconds: float = 10.0   # 0 = no periodic reconciler
    manage_qos_class_dirs: bool = True
    kube_class_mapping: Dict[KubeQosClass, QosLevel] = field(default_factory=lambda: {
        KubeQosClass.GUARANTEED: QosLevel.LS, KubeQosClass.BURSTABLE: QosLevel.LS,
        KubeQosClass.BESTEFFORT: QosLevel.BE})
    group_identity: GroupIdentityConfig = field(default_factory=GroupIdentityConfig)
    oom_priority: OomPriorityConfig = field(default_factory=OomPriorityConfig)
    async_reclaim: AsyncReclaimConfig = field(default_factory=AsyncReclaimConfig)
    preemption: PreemptionConfig = field(default_factory=PreemptionConfig)
    resctrl: ResctrlConfig = field(default_factory=ResctrlConfig)

    @classmethod
    def from_table(cls, t: Table) -> "QosConfig":
        """Read ``[qos]``; raises :class:`ConfigError` naming the dotted key."""
        d = cls()
        interval = t.float("reconcile_interval_seconds", d.reconcile_interval_seconds, min=0, max=3600)
        if 0 < interval < 1:
            interval = t.invalid("reconcile_interval_seconds", f"must be 0 (off) or in 1..3600; got {interval}",
                                 d.reconcile_interval_seconds)
        cfg = cls(
            enabled=t.bool("enabled", d.enabled),
            dry_run=t.bool("dry_run", d.dry_run),
            reconcile_interval_seconds=interval,
            manage_qos_class_dirs=t.bool("manage_qos_class_dirs", d.manage_qos_class_dirs),
            kube_class_mapping=_kube_mapping(t.table("kube_class_mapping"), d.kube_class_mapping),
            group_identity=_group_identity(t.table("group_identity")),
            oom_priority=_oom_priority(t.table("oom_priority")),
            async_reclaim=_async_reclaim(t.table("async_reclaim")),
            preemption=_preemption(t.table("preemption")),
            resctrl=_resctrl(t.table("resctrl")),
        )
        t.finish()
        return cfg


def _level_value(t: Table, name: str, default: QosLevel) -> QosLevel:
    raw = t.str(name, default.value)
    level = QosLevel.parse(raw)
    if level is None:
        return t.invalid(name, f"must be one of {', '.join(LEVELS)}; got {shown(raw)}" + did_you_mean(raw, LEVELS),
                         default)
    return level


def _kube_mapping(t: Table, default: Dict[KubeQosClass, QosLevel]) -> Dict[KubeQosClass, QosLevel]:
    out = dict(default)
    for cls in KubeQosClass:
        out[cls] = _level_value(t, cls.value, out[cls])
    t.finish()
    return out


def _per_level(t: Table, default: Dict[QosLevel, int], valid: knobs.ValueRange) -> Dict[QosLevel, int]:
    """A table keyed by level name (``LSE = 2``); absent levels keep their default."""
    out = dict(default)
    seen: Set[QosLevel] = set()
    for key in t.keys():
        level = _level_key(t, key, seen)
        if level is not None:
            out[level] = t.int(key, out[level], min=valid.low, max=valid.high)
    t.finish()
    return out


def _level_key(t: Table, key: str, seen: Set[QosLevel]) -> Optional[QosLevel]:
    """The level ``key`` names, or None when it names none or one named before (noted)."""
    level = QosLevel.parse(key)
    if level is None or key.strip() != key:
        return t.invalid(key, f"unknown QoS level; expected one of {', '.join(LEVELS)}" + did_you_mean(key, LEVELS))
    if level in seen:
        return t.invalid(key, f"level {level.value} given twice")
    seen.add(level)
    return level


def _group_identity(t: Table) -> GroupIdentityConfig:
    d = GroupIdentityConfig()
    cfg = GroupIdentityConfig(
        enabled=t.bool("enabled", d.enabled),
        values=_per_level(t.table("values"), d.values, knobs.CPU_BVT_WARP_NS.valid),
        enable_sysctl=t.bool("enable_sysctl", d.enable_sysctl),
    )
    t.finish()
    return cfg


def _oom_priority(t: Table) -> OomPriorityConfig:
    d = OomPriorityConfig()
    cfg = OomPriorityConfig(
        enabled=t.bool("enabled", d.enabled),
        enable_global=t.bool("enable_global", d.enable_global),
        values=_per_level(t.table("values"), d.values, knobs.MEMORY_PRIORITY.valid),
    )
    t.finish()
    return cfg


def _async_reclaim(t: Table) -> AsyncReclaimConfig:
    d = AsyncReclaimConfig()
    ratio, scale = knobs.MEMORY_WMARK_RATIO.valid, knobs.MEMORY_WMARK_SCALE_FACTOR.valid
    cfg = AsyncReclaimConfig(
        enabled=t.bool("enabled", d.enabled),
        wmark_ratio=t.int("wmark_ratio", d.wmark_ratio, min=ratio.low, max=ratio.high),
        wmark_scale_factor=t.int("wmark_scale_factor", d.wmark_scale_factor, min=scale.low, max=scale.high),
        wmark_min_adj=_per_level(t.table("wmark_min_adj"), d.wmark_min_adj, knobs.MEMORY_WMARK_MIN_ADJ.valid),
    )
    t.finish()
    return cfg


def _preemption(t: Table) -> PreemptionConfig:
    d = PreemptionConfig()
    cfg = PreemptionConfig(
        enabled=t.bool("enabled", d.enabled),
        cpu=_per_level(t.table("cpu"), d.cpu, knobs.CPU_QOS_LEVEL.valid),
        memory=_per_level(t.table("memory"), d.memory, knobs.MEMORY_QOS_LEVEL.valid),
        enable_sysctl=t.bool("enable_sysctl", d.enable_sysctl),
    )
    t.finish()
    return cfg


def _resctrl(t: Table) -> ResctrlConfig:
    d = ResctrlConfig()
    prefix = t.str("group_prefix", d.group_prefix)
    if not _PREFIX_RE.fullmatch(prefix) or prefix.lower() in ("info", "mon_data", "mon_groups"):
        prefix = t.invalid("group_prefix", "must be 1-32 letters, digits, '_' or '-', starting with a letter or "
                                           f"digit; got {shown(prefix)}", d.group_prefix)
    classes = dict(d.classes)
    ct = t.table("classes")
    for key in ct.keys():
        if key not in LLC_CLASSES:
            ct.invalid(key, f"unknown class; expected one of {', '.join(LLC_CLASSES)}" + did_you_mean(key, LLC_CLASSES))
            continue
        classes[key] = _resctrl_class(ct.table(key), classes[key])
    ct.finish()
    default = dict(d.default)
    dt = t.table("default")
    seen: Set[QosLevel] = set()
    for key in dt.keys():
        level = _level_key(dt, key, seen)
        if level is None:
            continue
        value = dt.str(key, default[level])
        if value.lower() not in LLC_CLASSES:
            value = dt.invalid(key, f"must be one of {', '.join(LLC_CLASSES)}; got {shown(value)}", default[level])
        default[level] = value.lower()
    dt.finish()
    cfg = ResctrlConfig(enabled=t.bool("enabled", d.enabled), group_prefix=prefix,
                        classes=classes, default=default)
    t.finish()
    return cfg


def _resctrl_class(t: Table, base: ResctrlClass) -> ResctrlClass:
    cls = ResctrlClass(
        l3_ways=t.int("l3_ways", base.l3_ways, min=0, max=64),
        mb_percent=t.int("mb_percent", base.mb_percent, min=1, max=100),
    )
    t.finish()
    return cls


def default_config(**overrides: object) -> QosConfig:
    """Defaults with top-level fields replaced (a convenience for tests and benchmarks)."""
    cfg = QosConfig()
    for k, v in overrides.items():
        if not hasattr(cfg, k):
            raise AttributeError(k)
        setattr(cfg, k, v)
    return cfg


__all__ = ["QosConfig", "GroupIdentityConfig", "OomPriorityConfig", "AsyncReclaimConfig", "PreemptionConfig",
           "ResctrlConfig", "ResctrlClass", "LLC_CLASSES", "default_config"]
