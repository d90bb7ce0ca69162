"""``QosApplier``: the decided values written to the kernel's files.

Read, compare, write only when different; dry run; one log line per write with pod, knob,
path and value. The pod's decision is told to the decision sink once its knobs are first
applied. Used by the QoS service at admission and by the reconciler's passes; the resctrl
groups are :mod:`~anolisnuma.qos.llc`'s.

It decides nothing: what to write was decided with the targets. Two rules are checked at
write time because the kernel's state behind them can change while the daemon runs: a
value core scheduling forbids is not written while ``kernel.sched_core`` is 1, and a file
whose offline value is final and that reads offline is not turned online (someone else set
it, the kernel would refuse): both are skipped, the second warned about once.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Tuple

import structlog

from anolisnuma.decision_events import DecisionEvents, QosApplied, no_events
from anolisnuma.policies.qos.plan import KnobSetting, sched_core_conflict
from anolisnuma.qos.state import FileTarget, ManagedContainer, ManagedPod, file_targets
from anolisnuma.system import knobs
from anolisnuma.system.cgroups import (
    CgroupFs, FileGone, HostFileError, KnobFileMissing, KubeQosClass, ReadFailed, directory_of_exists, read_int,
    write_text,
)
from anolisnuma.system.sysctl import Sysctls

_LOG = "anolisnuma.qos"


class Outcome(enum.Enum):
    UNCHANGED = "unchanged"
    WRITTEN = "written"
    WOULD_WRITE = "would_write"     # dry run
    SKIPPED = "skipped"             # a rule forbids the value now (sched_core)
    MISSING = "missing"             # directory there, file not (kernel lacks it here)
    GONE = "gone"                   # directory gone (pod or container removed)


@dataclass
class ApplyReport:
    checked: int = 0
    written: int = 0
    gone: bool = False
    errors: List[HostFileError] = field(default_factory=list)


class QosApplier:
    """Applies decided values to the kernel. Decides nothing, except refusing group identity
    -1 while core scheduling is on (the rule lives in the policy; this checks it at write
    time because ``kernel.sched_core`` can change while the daemon runs)."""

    def __init__(self, cgroups: CgroupFs, sysctls: Sysctls, *, dry_run: bool = False, log: Any = None) -> None:
        self.cgroups = cgroups
        self.sysctls = sysctls
        self.dry_run = dry_run
        self.log = log if log is not None else structlog.get_logger(_LOG)
        self.sched_core_supported = False
        self.sched_core_on = False
        # Desired global state, set by the service at start.
        self.root_settings: Tuple[KnobSetting, ...] = ()
        self.sysctl_settings: Tuple[KnobSetting, ...] = ()
        self.qos_dir_settings: Dict[KubeQosClass, Tuple[KnobSetting, ...]] = {}
        self._qos_dir_targets: Dict[Any, List[FileTarget]] = {}
        self._root_targets: Optional[List[FileTarget]] = None
        self.decisions: DecisionEvents = no_events   # told each pod's level (the service wires it)

    # ------------------------------------------------------------------ one file
    def ensure(self, t: FileTarget, ref: str, report: ApplyReport, compare: bool = True) -> Outcome:
        """Bring one file to its value. Errors other than a vanished directory or a missing
        file are appended to ``report.errors``.

        ``compare`` reads the file first and writes only when it differs (the reconciler);
        without it the value is written straight away (a new cgroup at creation time, where
        the read would only add a syscall). A dry run always compares.
        """
        if t.sched_core_held and self.sched_core_on:
            return Outcome.SKIPPED
        old: Optional[int] = None
        if compare or self.dry_run:
            report.checked += 1
            try:
                old = read_int(t.path)
            except FileGone as e:
                return self._absent(t, ref, e)
            except ReadFailed:
                old = None
            if old == t.value:
                return Outcome.UNCHANGED
            if t.knob.offline_is_final and old is not None and old < 0 <= t.value:
                return self._kept_offline(t, ref, old)
        if self.dry_run:
            self.log.info("dry run: would write", pod=ref, knob=t.knob.name, path=t.path,
                          value=t.value, old=old)
            report.written += 1
            return Outcome.WOULD_WRITE
        try:
            try:
                write_text(t.path, str(t.value))
            except (FileGone, KnobFileMissing):
                # Looked at once: a directory that appears after this look is one that was
                # not there when written (gone, or not made yet: the next call or pass
                # writes it), never a file this kernel lacks.
                if not directory_of_exists(t.path):
                    return Outcome.GONE
                # The directory is there now: it may have appeared (with its files) just
                # after the write failed. Once more before the file is called missing.
                write_text(t.path, str(t.value))
        except (FileGone, KnobFileMissing) as e:
            return self._absent(t, ref, e)
        except HostFileError as e:
            self.log.error("knob write refused", pod=ref, knob=t.knob.name, path=t.path,
                           value=t.value, error=str(e))
            report.errors.append(e)
            return Outcome.SKIPPED
        if compare:
            self.log.info("knob written", pod=ref, knob=t.knob.name, path=t.path, value=t.value, old=old)
        else:
            self.log.info("knob written", pod=ref, knob=t.knob.name, path=t.path, value=t.value)
        report.written += 1
        return Outcome.WRITTEN

    def _absent(self, t: FileTarget, ref: str, e: HostFileError) -> Outcome:
        if directory_of_exists(t.path):
            if not t.missing_logged:
                t.missing_logged = True
                self.log.warning("knob file missing in this cgroup; skipped", pod=ref,
                                 knob=t.knob.name, path=t.path)
            return Outcome.MISSING
        return Outcome.GONE

    def _kept_offline(self, t: FileTarget, ref: str, old: int) -> Outcome:
        if not t.final_logged:
            t.final_logged = True
            self.log.warning("offline cgroup not turned online: the kernel does not allow it while it lives",
                             pod=ref, knob=t.knob.name, path=t.path, value=t.value, old=old)
        return Outcome.SKIPPED

    def ensure_all(self, targets: Iterable[FileTarget], ref: str, report: ApplyReport,
                   compare: bool = True) -> None:
        """Apply every target; stops early (``report.gone``) when the directory vanished."""
        for t in targets:
            if self.ensure(t, ref, report, compare) is Outcome.GONE:
                report.gone = True
                return

    def log_sched_core_skips(self, targets: Iterable[FileTarget], ref: str) -> None:
        for t in targets:
            if t.sched_core_held and self.sched_core_on:
                why = sched_core_conflict(t.knob, t.value, True)
                self.log.warning("knob not set", pod=ref, knob=t.knob.name, path=t.path, reason=why)

    # ------------------------------------------------------------------ pods
    def apply_pod(self, pod: ManagedPod, compare: bool = True) -> ApplyReport:
        report = ApplyReport()
        first = not pod.applied
        if pod.targets:
            self.ensure_all(pod.targets, pod.ref, report, compare)
        elif not self.cgroups.exists(pod.cgroup.rel) and not self.cgroups.exists(pod.cgroup.rel, "memory"):
            report.gone = True
        if not report.gone:
            pod.applied = True
            # Told once: at creation, or when a pass first finds the values not there yet
            # (a pod whose values a restart finds in place was told before the restart).
            if first and pod.told is not None and (not compare or report.written or report.errors):
                told, pod.told = pod.told, None
                self._tell(pod, told, report)
        return report

    def tell(self, pod: ManagedPod) -> None:
        """Tell the pod's decision now unless it was told: a pod adopted at a resync whose
        values were found in place (or that has none to write on this kernel)."""
        told, pod.told = pod.told, None
        if told is not None:
            self._tell(pod, told, ApplyReport())

    def _tell(self, pod: ManagedPod, told: QosApplied, report: ApplyReport) -> None:
        missing = tuple(t.knob.name for t in pod.targets if t.missing_logged)
        self.decisions(dataclasses.replace(
            told, knobs=tuple(k for k in told.knobs if k[0] not in missing), lacking=told.lacking + missing,
            refused=tuple(str(e)[:200] for e in report.errors[:3])))

    def apply_container(self, pod: ManagedPod, ctr: ManagedContainer, compare: bool = True) -> ApplyReport:
        report = ApplyReport()
        if ctr.targets:
            self.ensure_all(ctr.targets, pod.ref, report, compare)
        elif not self.cgroups.exists(ctr.rel):
            report.gone = True
        if not report.gone:
            ctr.applied = True
        return report

    # ------------------------------------------------------------------ globals
    def refresh_sched_core(self) -> None:
        if not self.sched_core_supported:
            return
        try:
            value = self.sysctls.read(knobs.SCHED_CORE)
        except HostFileError:
            return
        on = bool(value)
        if on != self.sched_core_on:
            self.sched_core_on = on
            self.log.warning("kernel.sched_core changed", value=int(on),
                             effect=("group identity -1 is not written while it is 1" if on
                                     else "group identity -1 is written again"))

    def ensure_globals(self, report: ApplyReport) -> None:
        """Root memcg switch, sysctls and the kubelet's QoS-class directories."""
        if self._root_targets is None:
            self._root_targets = file_targets(self.cgroups, "", self.root_settings)
        self.ensure_all(self._root_targets, "<root cgroup>", report)
        for s in self.sysctl_settings:
            self.ensure(FileTarget(s.knob, self.sysctls.path(s.knob), s.value), "<sysctl>", report)
        if not self.qos_dir_settings:
            return
        for driver in self.cgroups.drivers_present():
            targets = self._qos_dir_targets.get(driver)
            if targets is None:
                targets = []
                for cls, settings in self.qos_dir_settings.items():
                    rel = self.cgroups.layout.qos_class_dirs[driver][cls]
                    targets += file_targets(self.cgroups, rel, settings)
                self._qos_dir_targets[driver] = targets
            for t in targets:
                self.ensure(t, f"<{driver.value} QoS-class dirs>", report)
