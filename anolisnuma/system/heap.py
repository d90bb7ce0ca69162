"""Giving the kernel back the heap memory a burst left free.

The relay's buffers are many ``bytes`` of up to a frame each, allocated by glibc's malloc
from the heap. After a burst (a flood of held requests, a storm of large creates) they are
free again but scattered, so glibc keeps the pages and the daemon's RSS stays at its peak
(the unit also raises glibc's trim threshold, for the speed of large replies).
``malloc_trim`` returns every free page, wherever it is in the heap.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Callable, Optional


def _find_malloc_trim() -> Optional[Callable[[int], int]]:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_malloc_trim = _find_malloc_trim()


def trim_heap() -> bool:
    """Return free heap pages to the kernel; False where the C library cannot."""
    if _malloc_trim is None:
        return False
    _malloc_trim(0)
    return True
