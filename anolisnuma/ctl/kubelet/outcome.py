"""What a ``kubelet`` command hands back to the command line: an :class:`Outcome` (exit
code, the lines for the operator, the files it changed) or a :class:`CtlError` (one line,
non-zero exit), and the program name those lines are prefixed with.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

PROG = "anolisnuma-ctl kubelet"
EXIT_OK = 0
EXIT_FAIL = 1


class CtlError(Exception):
    """A condition reported to the operator as one line; the command exits non-zero."""


@dataclass
class Outcome:
    code: int
    lines: List[str]
    changed: List[str] = field(default_factory=list)
    unit_changed: bool = False
