"""Name patterns written by whoever may create an Oenuma, matched without a regular expression.

Two wildcards: ``*`` (any run of characters, the empty one too) and ``?`` (one character);
every other character stands for itself. The whole name must match, case-sensitively.

Why not ``fnmatch``: it turns a pattern into a regular expression, and both the turning
(``fnmatch.translate``, quadratic in ``[``: 6,000 of them cost 1.26 s of CPU, holding the
interpreter lock against the relay) and the matching of some expressions (backtracking)
cost what the pattern's author chooses. A pattern from the API server must cost the daemon
an amount bounded by its length and the name's, whoever wrote it.

How: the pattern is cut at ``*`` into segments. The first must start the name and the last
must end it (both checked in place, no search); each middle one is looked for, leftmost,
after the one before. Taking the leftmost place never loses a match (whatever a later
place could leave for the segments after it, the leftmost leaves more), so nothing is
ever tried twice: no backtracking. A middle segment without ``?`` is looked for with
``str.find``. One with ``?`` is looked for bit-parallel, never by trying each place in
turn: the places of each character in the name are bits of one integer (made once per
name), and the places where the segment can start are those bits, shifted by each
literal character's offset in the segment, ANDed together; the leftmost is the lowest bit
set. So a match costs one pass over the name and one integer operation per character of
the pattern: linear, whatever the pattern.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

WILDCARDS = "*?"

# A segment: its length, its literal pieces as (offset, text), and whether it has a `?`.
_Segment = Tuple[int, Tuple[Tuple[int, str], ...], bool]


def is_pattern(text: str) -> bool:
    """Whether ``text`` has a wildcard (else it names exactly one name)."""
    return "*" in text or "?" in text


def wildcard_count(text: str) -> int:
    return text.count("*") + text.count("?")


class Glob:
    """``Glob(pattern).matches(name)``."""

    __slots__ = ("pattern", "literal", "_segments", "_min_length")

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self.literal: Optional[str] = None if is_pattern(pattern) else pattern
        parts = pattern.split("*")
        self._segments: List[_Segment] = [_segment(p) for p in parts]
        self._min_length = sum(seg[0] for seg in self._segments)

    def matches(self, name: str) -> bool:
        if self.literal is not None:
            return name == self.literal
        segments = self._segments
        if len(name) < self._min_length:
            return False
        if len(segments) == 1:   # no `*`: the one segment is the whole name
            return len(name) == segments[0][0] and _at(name, 0, segments[0])
        first, last = segments[0], segments[-1]
        if not _at(name, 0, first):
            return False
        end = len(name) - last[0]
        if not _at(name, end, last):
            return False
        pos = first[0]
        for seg in segments[1:-1]:
            found = _find(name, pos, end, seg)
            if found < 0:
                return False
            pos = found + seg[0]
        return True

    def __repr__(self) -> str:
        return f"Glob({self.pattern!r})"


def _segment(text: str) -> _Segment:
    pieces = []
    offset = 0
    for piece in text.split("?"):
        if piece:
            pieces.append((offset, piece))
        offset += len(piece) + 1
    return len(text), tuple(pieces), "?" in text


def _at(name: str, pos: int, seg: _Segment) -> bool:
    """Whether ``seg`` matches ``name`` at ``pos`` (its length fits: checked by the caller)."""
    return all(name.startswith(piece, pos + offset) for offset, piece in seg[1])


def _find(name: str, pos: int, end: int, seg: _Segment) -> int:
    """The leftmost place ``p >= pos`` where ``seg`` matches and ends by ``end``; -1 when none."""
    length, pieces, wild = seg
    if end - pos < length:
        return -1
    if not pieces:   # only `?`s: any place with room
        return pos
    if not wild:   # one literal piece
        return name.find(pieces[0][1], pos, end)
    places = _places(name)
    starts = ((1 << (end - length + 1)) - 1) >> pos << pos   # pos <= p <= end - length
    for offset, piece in pieces:
        for i, c in enumerate(piece, offset):
            starts &= places.get(c, 0) >> i
        if not starts:
            return -1
    return (starts & -starts).bit_length() - 1


_last: Tuple[str, Dict[str, int]] = ("", {})


def _places(name: str) -> Dict[str, int]:
    """Per character of ``name``, the bits of its places. The last name's are kept: the
    patterns of one lookup are matched against one name (a tuple swapped whole: threads may
    share it)."""
    global _last
    last = _last
    if last[0] == name and name:
        return last[1]
    places: Dict[str, int] = {}
    for i, c in enumerate(name):
        places[c] = places.get(c, 0) | 1 << i
    _last = (name, places)
    return places
