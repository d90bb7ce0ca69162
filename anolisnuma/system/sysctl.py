"""``/proc/sys`` knobs from the knob table, and ``/proc/cpuinfo`` facts.

Only knobs declared in :mod:`anolisnuma.system.knobs` can be read or written: the path is
``<proc_root>/sys/<knob.sysctl_path>``, never built from anything else.
"""

from __future__ import annotations

import os
from typing import Optional

from anolisnuma.system.cgroups import FileGone, ReadFailed, read_int, read_text, write_text
from anolisnuma.system.knobs import Knob, KnobKind


class Sysctls:
    def __init__(self, proc_root: str) -> None:
        self.proc_root = os.path.abspath(proc_root)

    def path(self, knob: Knob) -> str:
        if knob.kind is not KnobKind.SYSCTL:
            raise ValueError(f"{knob.name} is not a sysctl")
        return os.path.join(self.proc_root, "sys", knob.sysctl_path)

    def missing_reason(self, knob: Knob) -> Optional[str]:
        p = self.path(knob)
        return None if os.path.exists(p) else f"{p} does not exist"

    def read(self, knob: Knob) -> Optional[int]:
        """The current value, or ``None`` when this kernel lacks the knob.
        Raises :class:`ReadFailed` for a file that exists but cannot be read."""
        try:
            return read_int(self.path(knob))
        except FileGone:
            return None

    def write(self, knob: Knob, value: int) -> None:
        """Raises :class:`~anolisnuma.system.cgroups.WriteRefused` (or ``FileGone``)."""
        write_text(self.path(knob), str(value))


# Vendor names as /proc/cpuinfo spells them. Hygon implements AMD's resctrl interface.
_VENDORS = {"GenuineIntel": "intel", "AuthenticAMD": "amd", "HygonGenuine": "amd"}


def cpu_vendor(proc_root: str) -> Optional[str]:
    """``"intel"``, ``"amd"`` or ``"arm"`` from ``<proc_root>/cpuinfo``; ``None`` when the
    file is absent or names none of them. Only the first processor's block is read."""
    try:
        text = read_text(os.path.join(os.path.abspath(proc_root), "cpuinfo"))
    except (FileGone, ReadFailed):
        return None
    for line in text.split("\n\n", 1)[0].splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "vendor_id":
            return _VENDORS.get(value)
        if key == "CPU implementer":
            return "arm"
    return None
