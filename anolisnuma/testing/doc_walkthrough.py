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
without, it succeeded. :func:`cut_sample_differs` says where a sample that leaves lines out
(a line ``…`` of its own where it does) differs from what the command printed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import List, Optional, Pattern, Sequence

MARK = re.compile(r"^<!--\s*walkthrough:\s*([a-z-]+)\s*-->\s*$")
FENCE = re.compile(r"^```(\w*)\s*$")
HEREDOC = re.compile(r"<<-?\s*'?\"?(\w+)'?\"?")
DURATION = re.compile(r"\b(?:\d+(?:\.\d+)?(?:ms|us|s|m|h|d))+\b|\b\d+(?:\.\d+)? (?:ms|us|s)\b")
CLOCK = re.compile(r"\b\d\d:\d\d:\d\d\b")
PID = re.compile(r"\bpid \d+\b")
HEX_ID = re.compile(r"\b[0-9a-f]{12,64}\b")
CUT = "…"
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


def cut_sample_differs(shown: str, printed: str, volatile: Sequence[Pattern[str]] = ()) -> Optional[str]:
    """None when ``printed`` is what ``shown`` shows, compared as :func:`output_matches`
    does but for the lines a line ``…`` leaves out (any number, none too): each part between
    cuts is a run of ``printed``'s lines, in order; the first part starts it and the last ends
    it unless a cut stands there. Else the first line of ``shown`` not where it shows it and
    the printed lines from where it was looked for."""
    parts: List[List[str]] = [[]]
    for line in shown.splitlines():
        if line.strip() == CUT:
            parts.append([])
        elif line.strip():
            parts[-1].append(normalized(line, volatile))
    lines = [normalized(x, volatile) for x in printed.splitlines() if x.strip()]
    at = 0
    for i, part in enumerate(parts):
        if i == 0:
            starts: Sequence[int] = [0]
        elif i == len(parts) - 1:
            starts = [len(lines) - len(part)]
        else:
            starts = range(at, len(lines) - len(part) + 1)
        found = next((s for s in starts if s >= at and lines[s:s + len(part)] == part), None)
        if found is None:
            # where the part's first line is, else where it had to be
            begin = next((s for s in starts if s >= at and lines[s:s + 1] == part[:1]), max([at, *starts[:1]]))
            missing = next(x for j, x in enumerate(part) if lines[begin + j:begin + j + 1] != [x])
            return f"{missing!r} is not where the sample shows it; printed from there:\n" + "\n".join(lines[begin:])
        at = found + len(part)
    if len(parts) == 1 and at != len(lines):
        return "printed more than the sample shows:\n" + "\n".join(lines[at:])
    return None


def as_shown(command: Command, returncode: int, stdout: str) -> bool:
    """See the module docstring."""
    if any(line.strip() for line in command.expected):
        return output_matches(command.expected, stdout)
    return returncode == 0


__all__ = ["Command", "Step", "as_shown", "console_commands", "cut_sample_differs", "output_matches", "steps"]
