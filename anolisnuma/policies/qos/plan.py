"""The writes for this kernel, decided once; each pod's, decided when it is first seen.

:func:`plan_kernel` takes the rows of every family (:mod:`~anolisnuma.policies.qos.table`)
and what the start-up probe found (:class:`KernelFacts`: which files exist, what the host
switches hold) and decides, once, what a pod of each level gets on this kernel
(:class:`LevelWrites`: its pod and container files, the knobs this kernel lacks, those it
has that would not act), what the kubelet's class directories, the root cgroup and the
host get, and which families were found (:class:`KernelPlan`). A kernel with both
families' files gets each file it has; one with neither gets nothing, and says so.

:func:`decide_pod` then picks a pod's writes: its level's, unless that would turn an
offline pod online (:class:`PodWrites`): an offline cgroup stays offline while it lives
(the openEuler kernel refuses ``cpu.qos_level`` -1 -> 0, and rubik refuses the whole
change), so the change is refused as a whole, with its reason, and the pod keeps an
offline level: nothing is half-applied.

Pure: the kernel facts are inputs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from anolisnuma.policies.qos.levels import QosLevel
from anolisnuma.policies.qos.table import Row, Where
from anolisnuma.system import knobs
from anolisnuma.system.knobs import Knob, KnobSupport
from anolisnuma.system.pod_cgroups import KubeQosClass

# The levels an offline pod is kept at when its change to an online one is refused, in the
# order they are tried (the level it had first, when known).
_KEEP_ORDER = (QosLevel.BE, QosLevel.LS, QosLevel.LSR, QosLevel.LSE)


@dataclass(frozen=True)
class KnobSetting:
    knob: Knob
    value: int


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


@dataclass(frozen=True)
class KernelFacts:
    """What the start-up probe found: which knobs this kernel has, and the host switches'
    values now (sysctl name -> value; absent or unreadable: missing)."""

    support: KnobSupport
    host: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class LevelWrites:
    """What a pod of one level gets on this kernel: its pod cgroup's and each container
    cgroup's files, the knobs of the level this kernel lacks, and those it has that would
    not act here (``held``: knob, why), which are not written."""

    level: QosLevel
    pod: Tuple[KnobSetting, ...]
    container: Tuple[KnobSetting, ...]
    lacking: Tuple[str, ...] = ()
    held: Tuple[Tuple[str, str], ...] = ()

    @property
    def offline(self) -> bool:
        """A pod of this level is offline: a final knob (``cpu.qos_level``) below 0."""
        return any(s.knob.offline_is_final and s.value < 0 for s in self.pod)

    @property
    def online(self) -> bool:
        """A pod of this level is online: a final knob at 0 or above."""
        return any(s.knob.offline_is_final and s.value >= 0 for s in self.pod)

    def knob_values(self) -> Tuple[Tuple[str, int], ...]:
        """``(name, value)`` of pod and container files alike, once each."""
        return tuple(dict.fromkeys((s.knob.name, s.value) for s in self.pod + self.container))

    def report(self, dry_run: bool) -> Dict[str, object]:
        """For explain and the decision log: ``set`` (``name=value`` per knob kept at a
        value), ``unsupported`` (this kernel lacks them), ``held`` (knob: why not written)
        and ``dry_run``. A level whose ``set`` is empty changed nothing on this node."""
        return {"set": sorted(f"{n}={v}" for n, v in dict(self.knob_values()).items()),
                "unsupported": list(self.lacking), "held": dict(self.held), "dry_run": dry_run}


def describe_report(level: QosLevel, report: Mapping[str, object]) -> str:
    """One line: the level and what it set here, or that it set nothing and why."""
    done = list(report.get("set") or [])   # type: ignore[call-overload]
    missing = list(report.get("unsupported") or [])   # type: ignore[call-overload]
    held = dict(report.get("held") or {})   # type: ignore[call-overload]
    notes = ([f"not on this kernel: {', '.join(missing)}"] if missing else []) + \
        ([f"not written: {'; '.join(f'{k} ({why})' for k, why in held.items())}"] if held else [])
    if done:
        return f"{level.value}: {'would set' if report.get('dry_run') else 'set'} {', '.join(done)}" + \
            "".join(f"; {n}" for n in notes)
    if notes:
        return f"{level.value}: nothing written ({'; '.join(notes)})"
    return f"{level.value}: nothing written (every knob of this level is turned off in [qos])"


@dataclass(frozen=True)
class KernelPlan:
    """Everything this kernel gets, decided once at start (see the module docstring)."""

    families: Tuple[str, ...]
    levels: Mapping[QosLevel, LevelWrites]
    qos_class: Mapping[KubeQosClass, Tuple[KnobSetting, ...]]
    root: Tuple[KnobSetting, ...]
    host: Tuple[KnobSetting, ...]
    held: Tuple[Tuple[str, str], ...] = ()

    def final_knobs(self) -> Tuple[Knob, ...]:
        """The knobs whose offline value is final, as some level writes them on pods: the
        files read to know whether a pod is offline now."""
        seen = {s.knob.name: s.knob for lw in self.levels.values() for s in lw.pod if s.knob.offline_is_final}
        return tuple(seen.values())

    def summary(self) -> Dict[str, object]:
        """For status: the families found and every write, by where it goes."""
        def names(settings: Sequence[KnobSetting]) -> List[str]:
            return [f"{s.knob.name}={s.value}" for s in settings]
        return {
            "families": list(self.families),
            "levels": {lv.value: {"pod": names(w.pod), "container": names(w.container)}
                       for lv, w in self.levels.items()},
            "qos_class_dirs": {cls.value: names(s) for cls, s in self.qos_class.items() if s},
            "root_cgroup": names(self.root),
            "host": names(self.host),
            "held": dict(self.held),
        }


def _held_why(row: Row, rows: Sequence[Row], facts: KernelFacts) -> Optional[str]:
    """Why a row this kernel has would not act here (its host switch off and not turned
    on by a host row), or None."""
    if row.needs is None:
        return None
    switch, least = row.needs
    now = facts.host.get(switch.name)
    if now is not None and now >= least:
        return None
    if not facts.support.has(switch):
        return f"{switch.name} does not exist: {row.knob.name} would not act"
    turned = [r.value(None) for r in rows if r.knob is switch and r.where is Where.HOST]
    if any(v is not None and v >= least for v in turned):
        return None
    return (f"{switch.name} is {now if now is not None else 'unreadable'} and not written here "
            f"([qos.{row.knob.feature}] enable_sysctl = false): {row.knob.name} would not act")


def plan_kernel(rows: Sequence[Row], facts: KernelFacts) -> KernelPlan:
    """The writes for this kernel, every level and place: see the module docstring."""
    support = facts.support
    held: Dict[str, str] = {}
    usable: List[Row] = []
    lacking: Dict[str, None] = {}
    for row in rows:
        if not support.has(row.knob):
            if row.where in (Where.POD, Where.CONTAINER) and support.concerns(row.knob):
                lacking[row.knob.name] = None
            continue
        why = _held_why(row, rows, facts)
        if why is not None:
            held[row.knob.name] = why
            continue
        usable.append(row)

    def at(where: Where, key: object) -> Tuple[KnobSetting, ...]:
        return tuple(KnobSetting(r.knob, v) for r in usable if r.where is where
                     for v in (r.value(key),) if v is not None)

    missing = tuple(sorted(lacking))
    levels = {lv: LevelWrites(lv, at(Where.POD, lv), at(Where.CONTAINER, lv), missing,
                              tuple(sorted(held.items()))) for lv in QosLevel}
    return KernelPlan(support.families_found(), levels, {c: at(Where.QOS_CLASS, c) for c in KubeQosClass},
                      at(Where.ROOT, None), at(Where.HOST, None), tuple(sorted(held.items())))


def family_plans(rows: Sequence[Row]) -> Dict[str, KernelPlan]:
    """What a kernel of each family would get from ``rows`` (family name -> its plan): a
    kernel with every file of that family and none of the others', its host switches as
    the rows set them. What a pod's level means on a node of another kernel than this one
    (the demo shows it beside what this kernel lets it write)."""
    return {f.name: plan_kernel(rows, KernelFacts(knobs.KnobSupport.only(k for k in knobs.ALL_KNOBS
                                                                          if k.family == f.name)))
            for f in knobs.FAMILIES}


@dataclass(frozen=True)
class PodWrites:
    """One pod's decision: the level it is kept at, its writes, the level its markings
    asked for, and why that one was refused ("" when it was not)."""

    level: QosLevel
    writes: LevelWrites
    wanted: QosLevel
    refused: str = ""

    def said(self) -> str:
        """The refusal in one phrase ("" when nothing was refused)."""
        if not self.refused:
            return ""
        if self.level is not self.wanted:
            return f"{self.wanted.value} refused, kept at {self.level.value}: {self.refused}"
        return f"{self.wanted.value}'s online values refused, the pod stays offline: {self.refused}"


def decide_pod(plan: KernelPlan, wanted: QosLevel, offline_now: bool,
               previous: Optional[QosLevel] = None) -> PodWrites:
    """The writes for a pod whose markings ask for ``wanted``. ``offline_now``: its cgroup
    holds an offline value already (read from the kernel, or the level it was kept at);
    ``previous``: that level, when known. An online level for an offline pod is refused
    as a whole: the pod keeps ``previous`` (or the first offline level), and when no level
    is offline in this configuration, the wanted level's writes without the final knobs."""
    writes = plan.levels[wanted]
    if not (offline_now and writes.online):
        return PodWrites(wanted, writes, wanted)
    why = ("the pod is offline, and an offline pod is never turned online while it runs (the kernel refuses "
           "cpu.qos_level -1 -> 0; rubik refuses it too): recreate the pod to run it online")
    order = ((previous,) if previous is not None else ()) + _KEEP_ORDER
    keep = next((lv for lv in order if plan.levels[lv].offline), None)
    if keep is None:
        def kept(settings: Tuple[KnobSetting, ...]) -> Tuple[KnobSetting, ...]:
            return tuple(s for s in settings if not s.knob.offline_is_final)
        return PodWrites(wanted, dataclasses.replace(writes, pod=kept(writes.pod), container=kept(writes.container)),
                         wanted, why)
    return PodWrites(keep, plan.levels[keep], wanted, why)


__all__ = ["KnobSetting", "sched_core_conflict", "KernelFacts", "LevelWrites", "KernelPlan", "PodWrites",
           "plan_kernel", "decide_pod", "describe_report", "family_plans"]
