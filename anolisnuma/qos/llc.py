"""``LlcGroups``: the resctrl groups of the LLC/MBA classes, and the threads put in them.

At start the classes of ``[qos.resctrl]`` are planned against what this machine's resctrl
offers (``policies/qos/resctrl``) and their groups made; each pass of the reconciler
re-creates a group that vanished, rewrites drifted schemata and re-sweeps container threads
into their pod's group (threads started later by ``exec`` do not inherit it). A group that
could not be made is left out of :attr:`LlcGroups.ready`, and its pods' threads stay where
they are.
"""

from __future__ import annotations

import errno
from typing import Any, Dict, Optional, Set, Tuple

from anolisnuma.policies.qos.config import ResctrlConfig
from anolisnuma.policies.qos.resctrl import cbm_width, class_schemata, plan_groups
from anolisnuma.qos.applier import ApplyReport
from anolisnuma.qos.state import ManagedContainer, ManagedPod
from anolisnuma.system.cgroups import CgroupFs, FileGone, HostFileError
from anolisnuma.system.resctrl import NoClosidLeft, ResctrlFs, Schemata, render_schemata


class LlcGroups:
    """``LlcGroups(fs, cgroups, dry_run=, log=)``; ``fs`` None when resctrl is off or this
    kernel has neither L3 nor MB allocation (then every method does nothing)."""

    def __init__(self, fs: Optional[ResctrlFs], cgroups: CgroupFs, *, dry_run: bool, log: Any) -> None:
        self.fs = fs
        self.cgroups = cgroups
        self.dry_run = dry_run
        self.log = log
        self.groups: Dict[str, Schemata] = {}     # group name -> schemata wanted
        self.width = 0
        self.ready: Set[str] = set()              # groups that exist

    def setup(self, rc: ResctrlConfig, report: ApplyReport) -> None:
        """Plan the classes' groups on this machine's resctrl, and make them."""
        if self.fs is None:
            return
        try:
            info = self.fs.read_info()
        except HostFileError as e:
            self.log.error("resctrl unusable; LLC/MBA skipped", error=str(e))
            self.fs = None
            return
        for note in info.notes:
            self.log.warning("resctrl: " + note)
        wanted = sorted(set(rc.default.values()) | set(rc.classes))
        names = {c: rc.group_name(c) for c in wanted}
        plan = plan_groups(info, wanted, names)
        for cls, why in plan.skipped.items():
            self.log.error("resctrl class skipped", llc_class=cls, reason=why)
        self.width = cbm_width(info)
        self.groups = {names[c]: class_schemata(info, rc.classes[c]) for c in plan.create}
        self.log.info("resctrl", vendor=info.vendor, num_closids=info.num_closids,
                      l3_ways=info.l3.ways if info.l3 else None,
                      mb_unit=info.mb.unit if info.mb else None, groups=sorted(self.groups))
        self.ensure_groups(report)

    def ensure_groups(self, report: ApplyReport) -> None:
        """Create missing groups and rewrite drifted schemata."""
        if self.fs is None:
            return
        for name, want in self.groups.items():
            path = self.fs.group_dir(name)
            if not self.fs.has_group(name):
                if self.dry_run:
                    self.log.info("dry run: would create resctrl group", group=name, path=path,
                                  schemata=render_schemata(want, self.width).strip())
                    self.ready.discard(name)
                    continue
                try:
                    self.fs.make_group(name)
                    self.log.info("resctrl group created", group=name, path=path)
                except NoClosidLeft as e:
                    self.ready.discard(name)
                    self.log.error("resctrl group not created: no CLOSID left; its pods stay "
                                   "in their current group", group=name, error=str(e))
                    continue
                except HostFileError as e:
                    self.ready.discard(name)
                    report.errors.append(e)
                    self.log.error("resctrl group not created", group=name, error=str(e))
                    continue
            report.checked += 1
            try:
                have = self.fs.read_group_schemata(name)
            except FileGone:
                have = {}
            except HostFileError:
                have = {}
            if any(have.get(res, {}).get(d) != v for res, doms in want.items() for d, v in doms.items()):
                text = render_schemata(want, self.width)
                if self.dry_run:
                    self.log.info("dry run: would write schemata", group=name, schemata=text.strip())
                else:
                    try:
                        self.fs.write_group_schemata(name, text)
                    except HostFileError as e:
                        report.errors.append(e)
                        self.ready.discard(name)
                        self.log.error("resctrl schemata refused", group=name, error=str(e))
                        continue
                    self.log.info("resctrl schemata written", group=name, schemata=text.strip())
                report.written += 1
            self.ready.add(name)

    def sweep_tasks(self, pod: ManagedPod, ctr: ManagedContainer,
                    members_cache: Optional[Dict[str, Set[str]]] = None) -> Tuple[int, bool]:
        """Move the container's threads into the pod's resctrl group. Returns
        ``(threads moved, container cgroup gone)``; errors are logged, never raised."""
        group = pod.llc_group
        if group is None or self.fs is None or group not in self.ready:
            return 0, False
        try:
            tids = self.cgroups.task_ids(ctr.rel)
        except FileGone:
            return 0, True
        except HostFileError as e:
            self.log.warning("cannot list container threads", pod=pod.ref, container=ctr.container_id,
                             error=str(e))
            return 0, False
        if not tids:
            return 0, False
        try:
            if members_cache is not None and group in members_cache:
                members = members_cache[group]
            else:
                members = self.fs.group_tasks(group)
                if members_cache is not None:
                    members_cache[group] = members
        except HostFileError as e:
            self.log.warning("cannot read resctrl group tasks", group=group, error=str(e))
            return 0, False
        missing = [t for t in tids if t not in members]
        if not missing:
            return 0, False
        if self.dry_run:
            self.log.info("dry run: would move threads", pod=pod.ref, container=ctr.container_id,
                          group=group, count=len(missing))
            return len(missing), False
        try:
            refused = self.fs.add_tasks(group, missing)
        except HostFileError as e:
            self.log.error("cannot write resctrl tasks", pod=pod.ref, group=group, error=str(e))
            return 0, False
        real = [(t, err) for t, err in refused if err != errno.ESRCH]
        if real:
            self.log.warning("resctrl refused some threads", pod=pod.ref, group=group,
                             tids=[t for t, _ in real[:10]], errno=real[0][1])
        moved = len(missing) - len(refused)
        members.update(t for t in missing if (t, errno.ESRCH) not in refused)
        self.log.info("threads moved to resctrl group", pod=pod.ref, container=ctr.container_id,
                      group=group, count=moved)
        return moved, False
