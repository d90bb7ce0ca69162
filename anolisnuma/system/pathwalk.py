"""Walking a path one component at a time, judging each on the descriptor the walk goes on from.

Checking a path (``os.stat`` of it and of each directory above it) and then opening it
looks twice: in between, whoever may write in a directory on the way may swap a component
for a symbolic link to somewhere else, and the open goes there. So here each component is
opened relative to the descriptor of the directory before it (``openat``), with
``O_PATH | O_NOFOLLOW`` (no side effect, whatever it is; a link is opened itself, not
followed), and the caller's ``check`` judges it by ``fstat`` of that descriptor: what was
judged is what the walk goes on from, and what the caller gets. A symbolic link is followed
by the walk itself, its target read from the link's own descriptor (``readlinkat`` with an
empty name), after ``check`` has judged the link: a link the caller refuses is never
followed. ``..`` is taken as the kernel takes it (the parent of the directory reached, which
a link may have made another than the name's), and judged too.

What remains of the name is used once more, by the caller, to open the last component for
reading (``openat`` on :attr:`Walked.parent`, to compare with :attr:`Walked.st`) or to
connect to it (through ``/proc/self/fd``, :attr:`Walked.proc_path`).

Standard library only (the preflight's checks use it before logging is set up).
"""

from __future__ import annotations

import errno
import os
import stat
from collections import deque
from typing import Callable, Deque, List, Tuple

# as the kernel's limit on the links one lookup follows (ELOOP beyond)
MAX_LINKS = 40

_PATH = os.O_PATH | os.O_CLOEXEC

# check(at, st, fd, above): ``at`` is the path walked to the component (links resolved),
# ``st`` its fstat, ``fd`` its O_PATH descriptor (valid during the call only), ``above``
# true for a directory on the way or a symbolic link followed, false for the last
# component. It raises to refuse; the walk closes its descriptors and lets it through.
Check = Callable[[str, os.stat_result, int, bool], None]


class Walked:
    """Where a path led: :attr:`fd`, an ``O_PATH`` descriptor of what the path names (links
    followed), :attr:`st` its ``fstat``, :attr:`at` the path walked to it; :attr:`parent`
    and :attr:`name`: its directory's descriptor and its name there. A context manager:
    the descriptors are closed at its end (or by :meth:`close`)."""

    def __init__(self, path: str, at: str, fd: int, st: os.stat_result, parent: int, name: str) -> None:
        self.path, self.at, self.fd, self.st, self.parent, self.name = path, at, fd, st, parent, name

    @property
    def proc_path(self) -> str:
        """A name of the very object walked to, for calls that take a name (``connect``):
        the kernel resolves it to the descriptor's object without looking at any directory."""
        return f"/proc/self/fd/{self.fd}"

    def close(self) -> None:
        for fd in (self.fd, self.parent):
            if fd >= 0:
                os.close(fd)
        self.fd = self.parent = -1

    def __enter__(self) -> "Walked":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def walk(path: str, check: Check) -> Walked:
    """Walk ``path`` (relative: from the working directory) from ``/``, calling ``check``
    on ``/``, on every directory and symbolic link on the way and on the last component.
    Returns a :class:`Walked` (the caller closes it). Raises what ``check`` raises, or
    OSError naming the component (FileNotFoundError, NotADirectoryError; ELOOP after
    :data:`MAX_LINKS` links)."""
    path = os.fspath(path)
    todo: Deque[str] = deque(_parts(path if os.path.isabs(path) else os.path.join(os.getcwd(), path)))
    dirfd, at = _root(check)
    links = 0
    try:
        while True:
            name = todo.popleft() if todo else "."
            here = os.path.dirname(at) if name == ".." else at if name == "." else os.path.join(at, name)
            fd = _open(name, dirfd, here)
            try:
                st = os.fstat(fd)
                if stat.S_ISLNK(st.st_mode):
                    check(here, st, fd, True)   # the link itself: judged before it is followed
                    links += 1
                    if links > MAX_LINKS:
                        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
                    target = os.readlink("", dir_fd=fd)   # (from the link opened, not from its name)
                    if target.startswith("/"):
                        os.close(dirfd)
                        dirfd = -1
                        dirfd, at = _root(check)
                    todo.extendleft(reversed(_parts(target) or ["."]))
                    continue
                if todo:
                    if not stat.S_ISDIR(st.st_mode):
                        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), here)
                    check(here, st, fd, True)
                    os.close(dirfd)
                    dirfd, fd, at = fd, -1, here
                    continue
                check(here, st, fd, False)
                walked = Walked(path, here, fd, st, dirfd, name)
                fd = dirfd = -1
                return walked
            finally:
                if fd >= 0:
                    os.close(fd)
    finally:
        if dirfd >= 0:
            os.close(dirfd)


def _open(name: str, dirfd: int, here: str) -> int:
    """An O_PATH descriptor of ``name`` in ``dirfd``, the link itself if it is one; an
    OSError names ``here``, the path walked to it."""
    flags = _PATH | (os.O_DIRECTORY if name in (".", "..") else os.O_NOFOLLOW)
    try:
        return os.open(name, flags, dir_fd=dirfd)
    except OSError as e:
        raise type(e)(e.errno, e.strerror, here) from None


def _root(check: Check) -> Tuple[int, str]:
    fd = os.open("/", _PATH | os.O_DIRECTORY)
    try:
        check("/", os.fstat(fd), fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, "/"


def _parts(path: str) -> List[str]:
    return [p for p in path.split("/") if p and p != "."]
