"""Plain-text tables with aligned columns (no dependency, no colours, no terminal width)."""

from __future__ import annotations

from typing import Any, List, Sequence, Tuple

EMPTY = "-"


def cell(value: Any) -> str:
    if value is None or value == "" or value == []:
        return EMPTY
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ",".join(cell(v) for v in value)
    return " ".join(str(value).split())   # one line per row, whatever the value holds


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


__all__: List[str] = ["cell", "fields", "lines", "table"]
