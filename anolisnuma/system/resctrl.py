"""The resctrl filesystem (Intel RDT, AMD PQoS, ARM MPAM with the upstream interface).

This adapter reads what the hardware offers (:meth:`ResctrlFs.read_info`), creates control
groups, writes their ``schemata`` and moves threads into their ``tasks``. It decides nothing:
which group gets which mask is computed in :mod:`anolisnuma.policies.qos.resctrl`.

Facts read, and how the MB unit is chosen (explicitly, never guessed silently):

- ``info/L3/{cbm_mask,min_cbm_bits,shareable_bits,num_closids}`` (or ``info/L3CODE`` and
  ``info/L3DATA`` when code/data prioritization is on: both lines get the same mask);
- ``info/MB/{bandwidth_gran,min_bandwidth,num_closids,delay_linear}``;
- the cache/domain IDs from the root group's ``schemata`` lines (``L3:0=7ff;1=7ff``);
- the CPU vendor from ``<proc_root>/cpuinfo`` (``vendor_id``; ``CPU implementer`` = ARM).
  Intel and ARM take MB as a percentage; AMD (and Hygon) as an absolute value in 1/8 GB/s
  where the root's value (2048 on current parts) means unlimited. Without a known vendor the
  unit is inferred from the root's MB values (all <= 100: percent; otherwise AMD units) and
  the reason is recorded. Intel's ``mba_MBps`` mount mode (root values in MB/s) is reported
  as unsupported.

Group files on a fake tree: the kernel creates ``schemata`` and ``tasks`` when a group is
made with ``mkdir``; a fake tree is a plain directory and cannot. The adapter therefore
opens those two files of *its own groups* with ``O_CREAT``: on the real filesystem they
always exist, so this changes nothing there, and fake trees need no special code.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

from anolisnuma.system.cgroups import (
    FileGone, HostFileError, ReadFailed, WriteRefused, append_lines, read_text,
)
from anolisnuma.system.sysctl import cpu_vendor

GROUP_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_NOT_GROUPS = {"info", "mon_data", "mon_groups"}

MB_PERCENT = "percent"
MB_AMD_UNITS = "amd_units"
AMD_MB_UNLIMITED = 2048

# schemata: {resource: {domain id: value}}; values as ints (L3 masks parsed from hex).
Schemata = Dict[str, Dict[int, int]]


class NoClosidLeft(HostFileError):
    """mkdir of a control group failed with ENOSPC: every CLOSID is in use."""


@dataclass(frozen=True)
class CacheInfo:
    resources: Tuple[str, ...]      # ("L3",) or ("L3CODE", "L3DATA")
    cbm_mask: int
    min_cbm_bits: int
    shareable_bits: int
    num_closids: int
    domain_ids: Tuple[int, ...]

    @property
    def ways(self) -> int:
        return bin(self.cbm_mask).count("1")


@dataclass(frozen=True)
class BandwidthInfo:
    bandwidth_gran: int
    min_bandwidth: int
    num_closids: int
    domain_ids: Tuple[int, ...]
    unit: str                        # MB_PERCENT or MB_AMD_UNITS
    max_value: int                   # 100, or the AMD "unlimited" value


@dataclass
class ResctrlInfo:
    vendor: Optional[str]
    l3: Optional[CacheInfo]
    mb: Optional[BandwidthInfo]
    groups: Tuple[str, ...]          # control groups that exist now (root excluded)
    notes: List[str] = field(default_factory=list)   # why L3 or MB is not usable

    @property
    def num_closids(self) -> int:
        """CLOSIDs usable by groups that need every present resource (root included)."""
        counts = [r.num_closids for r in (self.l3, self.mb) if r is not None]
        return min(counts) if counts else 0


def parse_schemata(text: str) -> Schemata:
    """``{"L3": {0: 0x7ff, 1: 0x7ff}, "MB": {0: 100}}`` from a schemata file. Lines of other
    resources are kept with integer values when they parse, and skipped when they do not."""
    out: Schemata = {}
    for line in text.splitlines():
        name, sep, rest = line.strip().partition(":")
        if not sep or not name:
            continue
        hexa = name.startswith("L2") or name.startswith("L3")
        domains: Dict[int, int] = {}
        try:
            for part in rest.split(";"):
                if not part.strip():
                    continue
                dom, _, val = part.partition("=")
                domains[int(dom.strip())] = int(val.strip(), 16 if hexa else 10)
        except ValueError:
            continue
        out[name] = domains
    return out


def render_schemata(schemata: Schemata, cbm_width: int = 0) -> str:
    """The text to write for ``schemata`` (one line per resource, kernel-style hex masks)."""
    lines = []
    for name, domains in schemata.items():
        hexa = name.startswith("L2") or name.startswith("L3")
        parts = []
        for dom, val in domains.items():
            parts.append(f"{dom}={val:0{cbm_width}x}" if hexa else f"{dom}={val}")
        lines.append(f"{name}:{';'.join(parts)}")
    return "\n".join(lines) + "\n"


class ResctrlFs:
    def __init__(self, root: str, proc_root: str = "/proc") -> None:
        self.root = os.path.abspath(root)
        self.proc_root = proc_root

    # ---------------------------------------------------------------- facts
    def mounted(self) -> bool:
        return os.path.isfile(os.path.join(self.root, "schemata")) and \
            os.path.isdir(os.path.join(self.root, "info"))

    def missing_reason(self, info_name: str) -> Optional[str]:
        """``None`` if resource ``info_name`` ("L3" or "MB") is offered, else why not."""
        if not self.mounted():
            return f"resctrl not mounted at {self.root}"
        names = (info_name, "L3CODE") if info_name == "L3" else (info_name,)
        for n in names:
            if os.path.isdir(os.path.join(self.root, "info", n)):
                return None
        return f"{os.path.join(self.root, 'info', info_name)} does not exist"

    def read_info(self) -> ResctrlInfo:
        """Everything the schemata math needs. Raises :class:`ReadFailed` when resctrl is
        not mounted; a resource whose files are unreadable is left out with a note."""
        if not self.mounted():
            raise ReadFailed(self.root, "resctrl is not mounted")
        notes: List[str] = []
        root_schemata = parse_schemata(read_text(os.path.join(self.root, "schemata")))
        vendor = cpu_vendor(self.proc_root)
        l3 = self._cache_info(root_schemata, notes)
        mb = self._bandwidth_info(root_schemata, vendor, notes)
        return ResctrlInfo(vendor, l3, mb, tuple(self.list_groups()), notes)

    def _cache_info(self, root: Schemata, notes: List[str]) -> Optional[CacheInfo]:
        info = os.path.join(self.root, "info")
        if os.path.isdir(os.path.join(info, "L3")):
            resources: Tuple[str, ...] = ("L3",)
        elif os.path.isdir(os.path.join(info, "L3CODE")):
            resources = ("L3CODE", "L3DATA")
        else:
            return None
        d = os.path.join(info, resources[0])
        try:
            cbm_mask = int(read_text(os.path.join(d, "cbm_mask")).strip(), 16)
            min_bits = _read_int(os.path.join(d, "min_cbm_bits"), 1)
            shareable = int(_read_opt(os.path.join(d, "shareable_bits"), "0").strip() or "0", 16)
            closids = _read_int(os.path.join(d, "num_closids"), 0)
        except (HostFileError, ValueError) as e:
            notes.append(f"L3 skipped: cannot read {d}: {e}")
            return None
        ids = tuple(root.get(resources[0], {}))
        if cbm_mask == 0 or not ids:
            notes.append(f"L3 skipped: cbm_mask {cbm_mask:x} or no {resources[0]} line in the root schemata")
            return None
        return CacheInfo(resources, cbm_mask, max(1, min_bits), shareable, closids, ids)

    def _bandwidth_info(self, root: Schemata, vendor: Optional[str],
                        notes: List[str]) -> Optional[BandwidthInfo]:
        d = os.path.join(self.root, "info", "MB")
        if not os.path.isdir(d):
            return None
        try:
            gran = _read_int(os.path.join(d, "bandwidth_gran"), 1)
            min_bw = _read_int(os.path.join(d, "min_bandwidth"), 0)
            closids = _read_int(os.path.join(d, "num_closids"), 0)
        except (HostFileError, ValueError) as e:
            notes.append(f"MB skipped: cannot read {d}: {e}")
            return None
        values = root.get("MB", {})
        if not values:
            notes.append("MB skipped: no MB line in the root schemata")
            return None
        top = max(values.values())
        if vendor == "amd":
            unit, max_value = MB_AMD_UNITS, max(top, AMD_MB_UNLIMITED)
        elif vendor in ("intel", "arm"):
            if top > 100:
                notes.append(f"MB skipped: root MB value {top} is not a percentage "
                             f"(mba_MBps mount option?); not supported")
                return None
            unit, max_value = MB_PERCENT, 100
        elif top <= 100:
            unit, max_value = MB_PERCENT, 100
            notes.append("CPU vendor unknown: MB taken as percentages (root values <= 100)")
        else:
            unit, max_value = MB_AMD_UNITS, top
            notes.append(f"CPU vendor unknown: MB taken as AMD absolute units (root value {top})")
        return BandwidthInfo(max(1, gran), min_bw, closids, tuple(values), unit, max_value)

    def list_groups(self) -> List[str]:
        try:
            names = os.listdir(self.root)
        except OSError:
            return []
        return sorted(n for n in names if n not in _NOT_GROUPS
                      and os.path.isdir(os.path.join(self.root, n)))

    # ---------------------------------------------------------------- groups
    def group_dir(self, name: str) -> str:
        if not GROUP_NAME_RE.fullmatch(name) or name in _NOT_GROUPS:
            raise ValueError(f"not a resctrl group name: {name!r}")
        return os.path.join(self.root, name)

    def has_group(self, name: str) -> bool:
        return os.path.isdir(self.group_dir(name))

    def make_group(self, name: str) -> bool:
        """Create group ``name``; ``True`` if it was created, ``False`` if it existed.
        Raises :class:`NoClosidLeft` (ENOSPC) or :class:`WriteRefused`."""
        path = self.group_dir(name)
        try:
            os.mkdir(path)
            return True
        except FileExistsError:
            return False
        except OSError as e:
            if e.errno == errno.ENOSPC:
                raise NoClosidLeft(path, "no CLOSID left", e.errno) from None
            raise WriteRefused(path, f"mkdir refused: {e.strerror}", e.errno) from None

    def read_group_schemata(self, name: str) -> Schemata:
        return parse_schemata(read_text(os.path.join(self.group_dir(name), "schemata")))

    def write_group_schemata(self, name: str, text: str) -> None:
        """Write ``text`` (several lines at once). Raises :class:`WriteRefused` with the
        kernel's ``info/last_cmd_status`` explanation, or :class:`FileGone`."""
        path = os.path.join(self.group_dir(name), "schemata")
        if not os.path.isdir(os.path.dirname(path)):
            raise FileGone(path, "group does not exist")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            try:
                os.write(fd, text.encode("ascii"))
            finally:
                os.close(fd)
        except OSError as e:
            status = _read_opt(os.path.join(self.root, "info", "last_cmd_status"), "").strip()
            detail = f"; kernel says: {status}" if status and status != "ok" else ""
            raise WriteRefused(path, f"schemata refused: {e.strerror}{detail}", e.errno) from None

    def group_tasks(self, name: str) -> Set[str]:
        path = os.path.join(self.group_dir(name), "tasks")
        try:
            return set(read_text(path).split())
        except FileGone:
            if os.path.isdir(os.path.dirname(path)):
                return set()  # fake tree before the first write
            raise

    def add_tasks(self, name: str, tids: List[str]) -> List[Tuple[str, int]]:
        """Move threads ``tids`` into group ``name``, one write each. Returns the
        ``(tid, errno)`` pairs refused (ESRCH: the thread exited meanwhile)."""
        path = os.path.join(self.group_dir(name), "tasks")
        if not os.path.exists(path) and os.path.isdir(os.path.dirname(path)):
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
        return append_lines(path, [t for t in tids if t.isdigit()])


def _read_opt(path: str, default: str) -> str:
    try:
        return read_text(path)
    except FileGone:
        return default


def _read_int(path: str, default: int) -> int:
    text = _read_opt(path, "").strip()
    return int(text) if text else default
