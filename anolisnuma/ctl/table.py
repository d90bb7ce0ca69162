"""Plain-text tables with aligned columns (no dependency, no colours, no terminal width).

Cells hold what pod authors wrote (names, annotations, hook errors that quote them): every
cell is made safe for a terminal by :func:`printable`, so a value cannot move the cursor,
retitle the window or erase and forge the lines an operator reads.
"""

from __future__ import annotations

import unicodedata
from typing import Any, List, Sequence, Tuple

EMPTY = "-"
# Control characters (C0, DEL, C1), format characters (bidi overrides, zero-width marks),
# line/paragraph separators, and lone surrogates (JSON can carry them; a terminal cannot
# print them): nothing a person should see as a character of its own.
_HIDDEN = frozenset(("Cc", "Cf", "Zl", "Zp", "Cs"))


def printable(text: str, keep: str = "") -> str:
    """``text`` with every control, format and separator character shown as its escape
    (``\\x1b``, ``\\u202e``); characters in ``keep`` (e.g. ``"\\n"``) stay as they are."""
    if text.isprintable() and not keep:   # the common case, in C
        return text
    return "".join(c if c in keep or unicodedata.category(c) not in _HIDDEN else _escape(c) for c in text)


def _escape(c: str) -> str:
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def cell(value: Any) -> str:
    if value is None or value == "" or value == []:
        return EMPTY
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ",".join(cell(v) for v in value)
    return printable(" ".join(str(value).split()))   # one line per row, whatever the value holds


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """``headers`` and ``rows`` as columns padded to their widest cell; the last column is
    not padded (no trailing blanks)."""
    text = [[str(h) for h in headers]] + [[cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in text) for i in range(len(headers))]
    lines = []
    for r in text:
        padded = [v.ljust(w) for v, w in zip(r[:-1], widths[:-1])] + [r[-1]]
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines)


def fields(pairs: Sequence[Tuple[str, Any]]) -> str:
    """``name: value`` lines with the values aligned."""
    width = max((len(k) for k, _ in pairs), default=0)
    return "\n".join(f"{(k + ':').ljust(width + 1)}  {cell(v)}".rstrip() for k, v in pairs)


def lines(*blocks: str) -> str:
    """Blocks separated by one empty line (empty blocks left out)."""
    return "\n\n".join(b for b in blocks if b)


__all__: List[str] = ["cell", "fields", "lines", "printable", "table"]
