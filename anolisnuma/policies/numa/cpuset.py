"""``CpuSet``: an immutable set of CPU (or NUMA node) numbers in the kernel's list format.

The kernel prints CPU and node masks as lists of ranges (``0-3,8,10-11``); cgroup
``cpuset.cpus``/``cpuset.mems``, ``/sys/devices/system/node/node*/cpulist`` and the kubelet's
``cpu_manager_state`` all use it. A set is stored as one Python integer used as a bit mask,
so union, intersection and difference are single integer operations: cheap enough for the
hot path of every CreateContainer and UpdateContainerResources call.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Iterable, Iterator, List, Optional, Tuple

# Far above any real NR_CPUS (8192 on the largest x86 and arm64 configurations); it bounds
# the integer a hostile or garbled string can make us build.
MAX_CPU = 65535

_ITEM = re.compile(r"^([0-9]+)(?:-([0-9]+)(?::([0-9]+)/([0-9]+))?)?$")


class CpuSetError(ValueError):
    """A string is not a valid CPU list."""


class CpuSet:
    """An immutable set of non-negative integers with the kernel's list syntax.

    ``CpuSet.parse("0-3,8")`` reads the list format (an empty or blank string is the
    empty set); ``str()`` prints it back in canonical form. Sets compare equal by content,
    are hashable, iterate in ascending order, and support ``| & - ^``, ``in``, ``len``.
    """

    __slots__ = ("_mask", "_text")

    def __init__(self, cpus: Iterable[int] = ()) -> None:
        mask = 0
        for cpu in cpus:
            if isinstance(cpu, bool) or not isinstance(cpu, int) or not 0 <= cpu <= MAX_CPU:
                raise CpuSetError(f"not a CPU number: {cpu!r}")
            mask |= 1 << cpu
        self._mask = mask
        self._text: Optional[str] = None

    # ------------------------------------------------------------------ construction
    @classmethod
    def parse(cls, text: str) -> "CpuSet":
        """The set written as ``text`` in the kernel list format.

        Accepts ``N``, ``A-B`` and the kernel's grouped ranges ``A-B:U/G`` (the first U of
        every G numbers from A to B), comma separated, with surrounding whitespace and
        newlines. Raises :class:`CpuSetError` on anything else (empty items, reversed
        ranges, numbers above ``MAX_CPU``, stray characters).
        """
        if not isinstance(text, str):
            raise CpuSetError(f"a CPU list must be a string, not {type(text).__name__}")
        return cls.from_mask(_parse_mask(text))

    @classmethod
    def from_mask(cls, mask: int) -> "CpuSet":
        """The set whose members are the bits set in ``mask``."""
        if mask < 0:
            raise CpuSetError("a CPU mask cannot be negative")
        obj = cls.__new__(cls)
        obj._mask = mask
        obj._text = None
        return obj

    @classmethod
    def range(cls, first: int, last: int) -> "CpuSet":
        """``first..last`` inclusive (empty when ``last < first``)."""
        if first < 0 or last > MAX_CPU:
            raise CpuSetError(f"range {first}-{last} out of bounds")
        if last < first:
            return EMPTY
        return cls.from_mask(((1 << (last - first + 1)) - 1) << first)

    # ------------------------------------------------------------------ queries
    @property
    def mask(self) -> int:
        return self._mask

    def __len__(self) -> int:
        return bin(self._mask).count("1")

    def __bool__(self) -> bool:
        return self._mask != 0

    def __contains__(self, cpu: object) -> bool:
        return isinstance(cpu, int) and cpu >= 0 and bool(self._mask >> cpu & 1)

    def __iter__(self) -> Iterator[int]:
        m = self._mask
        while m:
            low = m & -m
            yield low.bit_length() - 1
            m ^= low

    def to_list(self) -> List[int]:
        return list(self)

    def min(self) -> int:
        """The smallest member; ValueError when empty."""
        if not self._mask:
            raise ValueError("min() of an empty CpuSet")
        return (self._mask & -self._mask).bit_length() - 1

    def max(self) -> int:
        """The largest member; ValueError when empty."""
        if not self._mask:
            raise ValueError("max() of an empty CpuSet")
        return self._mask.bit_length() - 1

    def issubset(self, other: "CpuSet") -> bool:
        return self._mask & ~other._mask == 0

    def issuperset(self, other: "CpuSet") -> bool:
        return other._mask & ~self._mask == 0

    def isdisjoint(self, other: "CpuSet") -> bool:
        return self._mask & other._mask == 0

    def ranges(self) -> List[Tuple[int, int]]:
        """Maximal runs as inclusive ``(first, last)`` pairs, ascending."""
        out = []
        m = self._mask
        while m:
            start = (m & -m).bit_length() - 1
            shifted = m >> start
            run = (shifted ^ (shifted + 1)).bit_length() - 1   # trailing ones
            out.append((start, start + run - 1))
            m &= ~(((1 << run) - 1) << start)
        return out

    # ------------------------------------------------------------------ arithmetic
    def __or__(self, other: "CpuSet") -> "CpuSet":
        if not isinstance(other, CpuSet):
            return NotImplemented
        return CpuSet.from_mask(self._mask | other._mask)

    def __and__(self, other: "CpuSet") -> "CpuSet":
        if not isinstance(other, CpuSet):
            return NotImplemented
        return CpuSet.from_mask(self._mask & other._mask)

    def __sub__(self, other: "CpuSet") -> "CpuSet":
        if not isinstance(other, CpuSet):
            return NotImplemented
        return CpuSet.from_mask(self._mask & ~other._mask)

    def __xor__(self, other: "CpuSet") -> "CpuSet":
        if not isinstance(other, CpuSet):
            return NotImplemented
        return CpuSet.from_mask(self._mask ^ other._mask)

    union = __or__
    intersection = __and__
    difference = __sub__

    # ------------------------------------------------------------------ identity
    def __eq__(self, other: object) -> bool:
        return isinstance(other, CpuSet) and self._mask == other._mask

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return hash(("CpuSet", self._mask))

    def __str__(self) -> str:
        text = self._text
        if text is None:
            text = ",".join(str(a) if a == b else f"{a}-{b}" for a, b in self.ranges())
            self._text = text
        return text

    def __repr__(self) -> str:
        return f"CpuSet({str(self)!r})"

    def __reduce__(self):  # pickling / copy
        return (CpuSet.from_mask, (self._mask,))


EMPTY = CpuSet()


def union_all(sets: Iterable[CpuSet]) -> CpuSet:
    """The union of any number of sets."""
    mask = 0
    for s in sets:
        mask |= s.mask
    return CpuSet.from_mask(mask)


# Numbers are at most this many digits: MAX_CPU has 5, and a longer one is refused before
# int() reads it (int() of a long digit string costs time quadratic in its length, and
# raises its own ValueError past sys.get_int_max_str_digits()).
_MAX_DIGITS = 10

# Only short lists are cached: a node's cpulist or the kubelet's defaultCpuSet are a few
# dozen characters, and a cache of 4096 entries must not hold 4096 hostile megabytes.
_CACHED_MAX_CHARS = 256


def _parse_mask(text: str) -> int:
    if len(text) <= _CACHED_MAX_CHARS:
        return _parse_mask_cached(text)
    return _parse_mask_uncached(text)


@lru_cache(maxsize=4096)
def _parse_mask_cached(text: str) -> int:
    # Cached: the same few strings (a node's cpulist, the kubelet's defaultCpuSet) are
    # parsed over and over on the hot path.
    return _parse_mask_uncached(text)


def _parse_mask_uncached(text: str) -> int:
    body = text.strip()
    if not body:
        return 0
    mask = 0
    for raw in body.split(","):
        mask |= _item_mask(raw.strip(), text)
    return mask


def _item_mask(item: str, text: str) -> int:
    """The bits of one item (``N``, ``A-B`` or ``A-B:U/G``). Its cost is bounded by
    ``MAX_CPU`` bits whatever its numbers say: every number is checked before it is used
    to size anything."""
    m = _ITEM.match(item)
    if m is None:
        raise CpuSetError(f"invalid CPU list {_quoted(text)}: bad item {_quoted(item)}")
    if any(g is not None and len(g) > _MAX_DIGITS for g in m.groups()):
        raise CpuSetError(f"invalid CPU list {_quoted(text)}: a number in {_quoted(item)} is above {MAX_CPU}")
    first = int(m.group(1))
    last = int(m.group(2)) if m.group(2) is not None else first
    if last < first:
        raise CpuSetError(f"invalid CPU list {_quoted(text)}: range {_quoted(item)} is reversed")
    if last > MAX_CPU:
        raise CpuSetError(f"invalid CPU list {_quoted(text)}: {last} is above {MAX_CPU}")
    width = last - first + 1
    if m.group(3) is None:
        return ((1 << width) - 1) << first
    used, group = int(m.group(3)), int(m.group(4))
    # (the kernel's bitmap_parselist refuses the same: no group, or more used than a group has)
    if group == 0 or used == 0 or used > group:
        raise CpuSetError(f"invalid CPU list {_quoted(text)}: bad group {_quoted(item)}")
    return _grouped(width, min(used, width), min(group, width)) << first


def _grouped(width: int, used: int, group: int) -> int:
    """``width`` bits in which the first ``used`` of every ``group`` are set. The pattern
    doubles until it covers the width: a few shifts of at most ``width`` bits each, so the
    cost is linear in the CPUs the range spans (it was one shift per group before: a
    quadratic loop for ``0-65535:1/1``)."""
    pattern, span = (1 << used) - 1, group
    while span < width:
        pattern |= pattern << span
        span *= 2
    return pattern & ((1 << width) - 1)


def _quoted(text: str, limit: int = 64) -> str:
    """``text`` for an error message, cut: the message of a hostile megabyte is short."""
    text = text.strip()
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"... ({len(text)} characters)"
