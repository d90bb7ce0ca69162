"""A configuration snippet applied to a TOML file the way a person edits it (pure: text in,
text out).

The documents show configuration as snippets (``[kubernetes]`` then ``kubeconfig = "..."``)
that mean *set these keys in the shipped config.toml*. Appending a snippet to the file
declares its table a second time, which TOML refuses (``Cannot declare ('kubernetes',)
twice``), so a test that merged the keys into a dict could not see a snippet a person
could not apply. :func:`edit` does what the person does:

- a key the section has (``kubeconfig = ""``) gets its line replaced by the snippet's line;
- a key the section has commented out (``# nodes = [2, 3]``) is uncommented as the snippet has it;
- a key the section lacks is added after the section's last key;
- a table the file has commented out (``# [[numa.pin]]``) is uncommented; one it lacks is
  added at the end; an array of tables (``[[numa.pin]]``) gets one element per snippet block;
- the result is parsed (a table declared twice fails) and must hold every value of the
  snippet, or :class:`ConfigEditError` says which.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the Python 3.9/3.10 nodes
    import tomli as tomllib

HEADER = re.compile(r"^\s*(#\s*)?(\[\[?)\s*([A-Za-z0-9_.-]+)\s*(\]\]?)\s*(#.*)?$")
KEY = re.compile(r"^\s*(#\s*)?([A-Za-z0-9_-]+)\s*=")


class ConfigEditError(ValueError):
    """The snippet cannot be applied as a person would (its text, the file's, or the result)."""


@dataclass
class Block:
    """One table of the snippet: its name, whether an array element, its key lines."""
    name: str
    array: bool
    keys: List[Tuple[str, List[str]]] = field(default_factory=list)   # (key, its lines)


def edit(config: str, snippet: str) -> str:
    """``config`` (a TOML file's text) with ``snippet``'s keys set as described in the
    module docstring. ConfigEditError when the snippet is not TOML, uses a form this does
    not edit (dotted keys), or the result is not TOML or lacks a value of the snippet."""
    try:
        wanted = tomllib.loads(snippet)
    except tomllib.TOMLDecodeError as e:
        raise ConfigEditError(f"the snippet is not TOML: {e}") from None
    lines = config.splitlines()
    for block in _blocks(snippet):
        lines = _apply(lines, block)
    out = "\n".join(lines) + "\n"
    try:
        got = tomllib.loads(out)
    except tomllib.TOMLDecodeError as e:
        raise ConfigEditError(f"the edited file is not TOML: {e}") from None
    missing = _differences(wanted, got)
    if missing:
        raise ConfigEditError("the edited file does not hold " + ", ".join(missing))
    return out


def _blocks(snippet: str) -> List[Block]:
    blocks = [Block("", False)]
    lines = snippet.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        header = HEADER.match(line)
        if header is not None and header.group(1) is None:
            blocks.append(Block(header.group(3), header.group(2) == "[["))
            continue
        key = KEY.match(line)
        if key is None or key.group(1) is not None:
            raise ConfigEditError(f"not a key this edits (dotted keys are not): {line!r}")
        taken = [line]
        while not _complete(taken) and i < len(lines):   # a value over several lines
            taken.append(lines[i])
            i += 1
        blocks[-1].keys.append((key.group(2), taken))
    return [b for b in blocks if b.keys or b.name]


def _complete(key_lines: List[str]) -> bool:
    try:
        tomllib.loads("\n".join(key_lines))
        return True
    except tomllib.TOMLDecodeError:
        return False


def _headers(lines: List[str], name: str, array: bool, commented: bool) -> List[int]:
    out = []
    for n, line in enumerate(lines):
        m = HEADER.match(line)
        if m and m.group(3) == name and (m.group(2) == "[[") == array and (m.group(1) is not None) == commented:
            out.append(n)
    return out


def _section_end(lines: List[str], start: int) -> int:
    """The line after the last line of the section whose header is at ``start`` (the next
    live header; a commented header is a comment inside the section)."""
    n = start + 1
    while n < len(lines):
        m = HEADER.match(lines[n])
        if m and m.group(1) is None:
            break
        n += 1
    return n


def _apply(lines: List[str], block: Block) -> List[str]:
    lines = list(lines)
    if block.name == "":
        start, end = -1, _section_end(lines, -1)
    else:
        live = _headers(lines, block.name, block.array, commented=False)
        if len(live) > 1 and not block.array:
            raise ConfigEditError(f"the file declares [{block.name}] {len(live)} times")
        dormant = _headers(lines, block.name, block.array, commented=True)
        if live and not block.array:
            start = live[0]
        elif dormant and not live:
            start = dormant[0]
            lines[start] = _uncomment(lines[start])
        elif block.array and live:
            # one more element, after the last one
            last_end = _content_end(lines, live[-1], _section_end(lines, live[-1]))
            lines[last_end:last_end] = ["", f"[[{block.name}]]"]
            start = last_end + 1
        else:
            lines += ["", f"[[{block.name}]]" if block.array else f"[{block.name}]"]
            start = len(lines) - 1
        end = _section_end(lines, start)
    for key, key_lines in block.keys:
        lines, end = _set_key(lines, start, end, key, key_lines)
    return lines


def _set_key(lines: List[str], start: int, end: int, key: str, key_lines: List[str]) -> Tuple[List[str], int]:
    """Lines with ``key`` set in the section ``[start, end)``; the section's new end."""
    found: Optional[Tuple[int, int]] = None
    for live in (True, False):
        for n in range(start + 1, end):
            if not live and HEADER.match(lines[n]):
                break   # a commented table's keys are its own, not this section's
            m = KEY.match(lines[n])
            if m and m.group(2) == key and (m.group(1) is None) == live:
                stop = n + 1
                if live:
                    while not _complete(lines[n:stop]) and stop < end:
                        stop += 1
                found = (n, stop)
                break
        if found:
            break
    if found is None:
        at = _content_end(lines, start, end)
        found = (at, at)
    a, b = found
    return lines[:a] + key_lines + lines[b:], end - (b - a) + len(key_lines)


def _content_end(lines: List[str], start: int, end: int) -> int:
    """The line after the section's last key (its header's next line if it has none)."""
    at = start + 1
    for n in range(start + 1, end):
        m = KEY.match(lines[n])
        if m and m.group(1) is None:
            at = n + 1
            while not _complete(lines[n:at]) and at < end:
                at += 1
    return at


def _uncomment(line: str) -> str:
    return re.sub(r"^(\s*)#\s?", r"\1", line, count=1)


def _differences(wanted: Dict[str, Any], got: Dict[str, Any], path: str = "") -> List[str]:
    out = []
    for k, v in wanted.items():
        where = f"{path}.{k}" if path else k
        if isinstance(v, dict) and isinstance(got.get(k), dict):
            out += _differences(v, got[k], where)
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            have = got.get(k) if isinstance(got.get(k), list) else []
            out += [f"{where} = {x!r}" for x in v if x not in have]
        elif got.get(k, object()) != v:
            out.append(f"{where} = {v!r}")
    return out


__all__ = ["ConfigEditError", "edit"]
