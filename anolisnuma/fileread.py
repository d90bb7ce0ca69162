"""Reading a file by a path whose content the daemon does not control.

The configuration (at start and on every reload) and the state files (at start) are read
by root from paths that may hold anything: a FIFO, whose ``open`` blocks until someone
writes into it; a symbolic link to ``/dev/zero``, whose ``read`` never ends; a file of
gigabytes. Any of them must cost one clear error, never a frozen event loop nor the
node's memory. So the path is looked at before it is opened (a device is never opened:
opening some has effects), opened without blocking (``O_NONBLOCK``: a FIFO swapped in
meanwhile opens at once), checked again on the descriptor (what was opened, not what the
path names a moment later), and read up to its cap plus one byte (a file that grows while
it is read, or says it is empty as ``/proc`` files do, cannot get past the cap).

Nothing here logs or imports beyond the standard library: the configuration's reader
(:mod:`anolisnuma.configfile`) uses it before logging is set up.
"""

from __future__ import annotations

import errno
import os
import stat

MIB = 1 << 20

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link"))


class RefusedFile(Exception):
    """What is at ``path`` is not read: ``problem`` says why ("not a regular file (a FIFO)",
    "larger than 1 MiB", ...)."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path} is {problem}")
        self.path = path
        self.problem = problem


def read_regular_file(path: str, limit: int, follow_symlinks: bool = True) -> bytes:
    """The content of the regular file at ``path``, at most ``limit`` bytes.

    Raises :class:`RefusedFile` when it is not a regular file (with ``follow_symlinks``
    false, also when it is a symbolic link) or holds more than ``limit`` bytes; OSError
    when it cannot be opened or read (FileNotFoundError when there is nothing there).
    """
    check_regular(path, os.stat(path) if follow_symlinks else os.lstat(path), limit)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    try:
        fd = os.open(path, flags if follow_symlinks else flags | os.O_NOFOLLOW)
    except OSError as e:
        if e.errno == errno.ELOOP and not follow_symlinks:   # became a link since the lstat
            raise RefusedFile(path, "a symbolic link") from None
        raise
    try:
        return read_opened(path, fd, limit)
    finally:
        os.close(fd)


def read_opened(path: str, fd: int, limit: int) -> bytes:
    """The content of the regular file open at ``fd`` (``path`` names it in messages), at
    most ``limit`` bytes, checked on the descriptor first. Raises :class:`RefusedFile` or
    OSError, as :func:`read_regular_file`."""
    check_regular(path, os.fstat(fd), limit)
    data = _read_at_most(fd, limit + 1)
    if len(data) > limit:
        raise RefusedFile(path, f"larger than {_size(limit)}")
    return data


def check_regular(path: str, st: os.stat_result, limit: int) -> None:
    """:class:`RefusedFile` unless ``st`` is a regular file of at most ``limit`` bytes."""
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in _KINDS if test(st.st_mode)), "something else")
        raise RefusedFile(path, f"not a regular file ({kind})")
    if st.st_size > limit:
        raise RefusedFile(path, f"larger than {_size(limit)} ({st.st_size} bytes)")


def _read_at_most(fd: int, count: int) -> bytes:
    chunks = []
    while count > 0:
        chunk = os.read(fd, min(count, MIB))
        if not chunk:
            break
        chunks.append(chunk)
        count -= len(chunk)
    return b"".join(chunks)


def _size(n: int) -> str:
    return f"{n // MIB} MiB" if n % MIB == 0 else f"{n} bytes"
