"""systemd's side of the kubelet's command line: the ``[Service]`` settings of its unit and
drop-ins, words split as systemd splits ``ExecStart=`` and ``Environment=``, and the values
a flag takes on the resulting command line.

Every setting and word keeps where it was written (path and byte span, :class:`Origin`): the
planner edits exactly that span and nothing else.
"""

from __future__ import annotations

import re
from typing import List, NamedTuple, Optional, Sequence, Tuple

from anolisnuma.ctl.kubelet.text import text_lines

NAME = r"[A-Za-z_][A-Za-z0-9_]*"
VAR_WORD = re.compile(r"\$(" + NAME + r")")
VAR_REF = re.compile(r"\$\$|\$\{(" + NAME + r")\}")


class Setting(NamedTuple):
    """One ``[Service]`` assignment of a unit file and its raw span in that file."""

    key: str
    value: str
    path: str
    start: int
    end: int


class Origin(NamedTuple):
    """Where a word of the kubelet's command line was written: the span to edit."""

    kind: str            # "ExecStart" | "Environment" | "EnvironmentFile"
    path: str
    var: Optional[str]
    start: int
    end: int

    def describe(self) -> str:
        if self.kind == "ExecStart":
            return f"ExecStart= in {self.path}"
        if self.kind == "Environment":
            return f"{self.var} (Environment=) in {self.path}"
        return f"{self.var} in {self.path}"


class Word(NamedTuple):
    text: str
    origin: Origin


def parse_unit(text: str, path: str) -> List[Setting]:
    """The ``[Service]`` settings of a unit file or drop-in, as systemd reads them.

    Comment lines start with ``#`` or ``;``; a line ending in a backslash continues on the
    next one (the backslash becomes a space; comment lines in between are skipped).
    """
    lines = list(text_lines(text))
    out: List[Setting] = []
    section = ""
    i = 0
    while i < len(lines):
        start, line, end = lines[i]
        i += 1
        stripped = line.strip()
        if not stripped or stripped[0] in "#;":
            continue
        if stripped.startswith("[") and "]" in stripped:
            section = stripped[1:stripped.index("]")]
            continue
        body = line.rstrip()
        while body.endswith("\\") and i < len(lines):
            body = body[:-1] + " "
            while i < len(lines):
                _, nxt, end = lines[i]
                i += 1
                if nxt.strip()[:1] in ("#", ";"):
                    continue
                body += nxt.rstrip()
                break
        if section != "Service" or "=" not in body:
            continue
        key, value = body.split("=", 1)
        out.append(Setting(key.strip(), value.strip(), path, start, end))
    return out


def split_words(s: str) -> List[str]:
    """Split a command line or ``Environment=`` value the way systemd does (quotes, escapes)."""
    words: List[str] = []
    cur: List[str] = []
    in_word = False
    i = 0
    n = len(s)
    while i < n:
        c = s[i]
        if c in " \t\r\n":
            if in_word:
                words.append("".join(cur))
                cur = []
                in_word = False
            i += 1
            continue
        in_word = True
        if c == "\\" and i + 1 < n:
            cur.append(s[i + 1])
            i += 2
            continue
        if c in "'\"":
            i += 1
            while i < n and s[i] != c:
                if c == '"' and s[i] == "\\" and i + 1 < n:
                    cur.append(s[i + 1])
                    i += 2
                    continue
                cur.append(s[i])
                i += 1
            i += 1
            continue
        cur.append(c)
        i += 1
    if in_word:
        words.append("".join(cur))
    return words


def flag_values(words: Sequence[Word], name: str) -> List[Tuple[str, Origin]]:
    """Every value given to ``name`` (``--name=v`` or ``--name v``), in command-line order."""
    out: List[Tuple[str, Origin]] = []
    i = 1  # words[0] is the program
    while i < len(words):
        text = words[i].text
        if text == "--":
            break
        if text == name and i + 1 < len(words):
            out.append((words[i + 1].text, words[i].origin))
            i += 2
            continue
        if text.startswith(name + "="):
            out.append((text[len(name) + 1:], words[i].origin))
        i += 1
    return out
