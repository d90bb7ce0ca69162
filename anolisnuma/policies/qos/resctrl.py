"""resctrl math: which class a pod gets, each class's ``schemata``, which groups fit.

Pure functions over the facts :class:`~anolisnuma.system.resctrl.ResctrlInfo` holds.

- **L3 mask**: ``n`` ways counted from the lowest way of ``cbm_mask`` (0 = every way),
  raised to ``min_cbm_bits`` and capped at the number of ways; always contiguous. The
  same mask for every cache id (and for both ``L3CODE`` and ``L3DATA`` under CDP).
- **MB**: percentages (Intel, ARM MPAM) are rounded *up* to ``bandwidth_gran`` (what the
  kernel does anyway, made explicit) and raised to ``min_bandwidth``. AMD takes absolute
  units: 100 % is the "unlimited" value (2048 on current parts) and p % is that fraction of
  it, rounded up, at least 1.
- **CLOSIDs**: the root group holds CLOSID 0; every other group (ours from a previous run
  excepted, they already hold theirs) takes one. Classes that do not fit are skipped with
  a reason, in the order low, high, all: a class whose group is missing leaves its pods
  where they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from anolisnuma.policies.qos.config import LLC_CLASSES, ResctrlClass, ResctrlConfig
from anolisnuma.policies.qos.levels import ANNOTATION_LLC_LIMIT, QosLevel, normalize_choice
from anolisnuma.system.cgroups import preview
from anolisnuma.system.resctrl import (
    MB_AMD_UNITS, BandwidthInfo, CacheInfo, ResctrlInfo, Schemata,
)


def llc_class_for(cfg: ResctrlConfig, level: QosLevel,
                  annotations: Mapping[str, str]) -> Tuple[str, Optional[str]]:
    """The class for a pod (annotation ``anolisbox.sh/llc_limit`` first, else the level's
    default) and a warning when the annotation was there but not a class."""
    value = annotations.get(ANNOTATION_LLC_LIMIT)
    if value is None:
        return cfg.default[level], None
    cls = normalize_choice(value, LLC_CLASSES)
    if cls is None:
        return cfg.default[level], (f"annotation {ANNOTATION_LLC_LIMIT} has unknown value "
                                    f"{preview(value)}; expected one of {', '.join(LLC_CLASSES)}")
    return cls, None


def l3_mask(cache: CacheInfo, ways: int) -> int:
    total = cache.ways
    n = total if ways <= 0 else min(max(ways, cache.min_cbm_bits), total)
    low = (cache.cbm_mask & -cache.cbm_mask).bit_length() - 1
    return ((1 << n) - 1) << low


def mb_value(mb: BandwidthInfo, percent: int) -> int:
    percent = min(max(percent, 1), 100)
    if mb.unit == MB_AMD_UNITS:
        if percent >= 100:
            return mb.max_value
        return max(1, -(-mb.max_value * percent // 100))
    gran = mb.bandwidth_gran
    value = -(-percent // gran) * gran
    return min(max(value, mb.min_bandwidth, 1), 100)


def class_schemata(info: ResctrlInfo, cls: ResctrlClass) -> Schemata:
    """The ``schemata`` for one class: an L3 line per cache resource and an MB line, for
    what the hardware offers."""
    out: Schemata = {}
    if info.l3 is not None:
        mask = l3_mask(info.l3, cls.l3_ways)
        for res in info.l3.resources:
            out[res] = {dom: mask for dom in info.l3.domain_ids}
    if info.mb is not None:
        value = mb_value(info.mb, cls.mb_percent)
        out["MB"] = {dom: value for dom in info.mb.domain_ids}
    return out


def cbm_width(info: ResctrlInfo) -> int:
    """Hex digits the kernel prints for a mask (for log-friendly rendering)."""
    return (info.l3.cbm_mask.bit_length() + 3) // 4 if info.l3 is not None else 0


def schemata_drift(want: Schemata, have: Schemata) -> List[str]:
    """The resources whose values differ (a domain missing counts as different)."""
    return [res for res, doms in want.items()
            if any(have.get(res, {}).get(d) != v for d, v in doms.items())]


@dataclass(frozen=True)
class GroupPlan:
    create: Tuple[str, ...]             # classes whose groups exist or will be made
    skipped: Dict[str, str]             # class -> reason


def plan_groups(info: ResctrlInfo, wanted: Sequence[str], group_names: Mapping[str, str]) -> GroupPlan:
    """Which of the ``wanted`` classes get a group, given ``num_closids`` and the groups
    that exist already (``group_names``: class -> group directory name)."""
    ours = set(group_names.values())
    foreign = [g for g in info.groups if g not in ours]
    free = info.num_closids - 1 - len(foreign)
    create: List[str] = []
    skipped: Dict[str, str] = {}
    order = [c for c in LLC_CLASSES if c in wanted] + [c for c in wanted if c not in LLC_CLASSES]
    if info.l3 is None and info.mb is None:
        return GroupPlan((), {c: "neither L3 nor MB allocation is usable" for c in order})
    for cls in order:
        if group_names[cls] in info.groups:
            create.append(cls)
        elif free > 0:
            create.append(cls)
            free -= 1
        else:
            skipped[cls] = (f"no CLOSID left (num_closids={info.num_closids}, root + "
                            f"{len(foreign)} other group(s) + {len(create)} of ours)")
    return GroupPlan(tuple(create), skipped)
