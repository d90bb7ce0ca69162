"""A document's walk-through as steps a test runs as written (pure: parsing and matching).

A fenced block of a Markdown file is a step when the line before it is an HTML comment
``<!-- walkthrough: ROLE -->``; ``ROLE`` says where it runs (``admin``: a shell with kubectl
for the cluster; ``node``: a root shell on the node; ``node-config``: keys for the node's
configuration file). Its language says what it is:

- ``sh``: a script, run whole (``bash -e -o pipefail``);
- ``console``: commands after ``$ ``, each followed by the output it prints (a command goes
  on over lines ending in ``\\``, and over a here-document's lines up to its end marker);
  ``#`` lines between commands are comments;
- ``toml``: configuration keys.

Blocks without the comment (examples, excerpts) are not steps. :func:`output_matches` says
whether a command printed what the document shows: the same non-empty lines, in order,
with runs of blanks as one and what differs from run to run read past: durations (``3s``,
``5m02s``, ``120ms``, ``1.6 ms``) as any duration, clock times (``16:31:13``) as any time,
``pid N`` as any pid, hexadecimal IDs of 12 digits or more (containerd's) as any ID, and
what a caller's ``volatile`` patterns find (a running daemon's counters, say) as anything;
:func:`as_shown` whether a command did what the document shows: shown with its output, it
printed it, whatever its exit status (``kubectl auth can-i`` answers ``no`` with 1); shown
without, it succeeded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import List, Pattern, Sequence

MARK = re.compile(r"^<!--\s*walkthrough:\s*([a-z-]+)\s*-->\s*$")
FENCE = re.compile(r"^```(\w*)\s*$")
HEREDOC = re.compile(r"<<-?\s*'?\"?(\w+)'?\"?")
DURATION = re.compile(r"\b(?:\d+(?:\.\d+)?(?:ms|us|s|m|h|d))+\b|\b\d+(?:\.\d+)? (?:ms|us|s)\b")
CLOCK = re.compile(r"\b\d\d:\d\d:\d\d\b")
PID = re.compile(r"\bpid \d+\b")
HEX_ID = re.compile(r"\b[0-9a-f]{12,64}\b")
ROLES = ("admin", "node", "node-config")
KINDS = ("sh", "console", "toml")


@dataclass
class Command:
    text: str                                   # what is typed (without the prompt)
    expected: List[str] = field(default_factory=list)   # the output the document shows


@dataclass
class Step:
    role: str
    kind: str
    text: str
    line: int                                   # the line of its first in the document

    def commands(self) -> List[Command]:
        """A console block's commands (see the module docstring)."""
        if self.kind != "console":
            raise ValueError(f"line {self.line}: a {self.kind} block has no commands")
        return console_commands(self.text)


def steps(markdown: str) -> List[Step]:
    """The walk-through's steps, in the document's order. ValueError for a marked block of
    an unknown role or kind, or a mark that is not followed by a block."""
    lines = markdown.splitlines()
    out: List[Step] = []
    i = 0
    while i < len(lines):
        mark = MARK.match(lines[i])
        i += 1
        if mark is None:
            continue
        role = mark.group(1)
        fence = FENCE.match(lines[i]) if i < len(lines) else None
        if role not in ROLES or fence is None or fence.group(1) not in KINDS:
            raise ValueError(f"line {i}: a walk-through mark must be followed by a {'/'.join(KINDS)} block "
                             f"of a role among {', '.join(ROLES)}")
        start = i + 1
        end = start
        while end < len(lines) and not lines[end].startswith("```"):
            end += 1
        out.append(Step(role, fence.group(1), "\n".join(lines[start:end]) + "\n", start + 1))
        i = end + 1
    return out


def console_commands(text: str) -> List[Command]:
    out: List[Command] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.startswith("$ "):
            if out and not line.startswith("#"):
                out[-1].expected.append(line)
            elif not out and line.strip() and not line.startswith("#"):
                raise ValueError(f"output before any command: {line!r}")
            continue
        typed = [line[2:]]
        while typed[-1].endswith("\\") and i < len(lines):
            typed.append(lines[i])
            i += 1
        ends = HEREDOC.findall("\n".join(typed))
        for marker in ends:
            while i < len(lines):
                typed.append(lines[i])
                i += 1
                if lines[i - 1] == marker:
                    break
        out.append(Command("\n".join(typed)))
    return out


def normalized(line: str, volatile: Sequence[Pattern[str]] = ()) -> str:
    """``line`` with what differs from run to run replaced (see the module docstring); what
    ``volatile`` finds (in the line with its blanks made single spaces) too."""
    line = " ".join(line.split())
    for pattern in volatile:
        line = pattern.sub("<varies>", line)
    line = DURATION.sub("<duration>", line)
    line = CLOCK.sub("<time>", line)
    line = PID.sub("pid <pid>", line)
    return HEX_ID.sub("<id>", line)


def output_matches(expected: List[str], output: str, volatile: Sequence[Pattern[str]] = ()) -> bool:
    """The output shows what the document does (see the module docstring); a command shown
    without output may print anything."""
    want = [normalized(x, volatile) for x in expected if x.strip()]
    if not want:
        return True
    return want == [normalized(x, volatile) for x in output.splitlines() if x.strip()]


def as_shown(command: Command, returncode: int, stdout: str) -> bool:
    """See the module docstring."""
    if any(line.strip() for line in command.expected):
        return output_matches(command.expected, stdout)
    return returncode == 0


__all__ = ["Command", "Step", "as_shown", "console_commands", "output_matches", "steps"]
