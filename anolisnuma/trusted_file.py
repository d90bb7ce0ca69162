"""Whether only root may change a path, and reading a file only root may change.

The daemon runs as root and acts on what it reads: its configuration, its state, the
kubeconfig and the credentials it names, the placement-rule files. Whoever may write one of
them, or a directory above it, may swap it for a file of their choosing (another kubeconfig
sending the node's token elsewhere, a ``tokenFile`` naming ``/etc/shadow``, a rule moving
every pod). So each must be changeable by root (or the daemon's own user) alone: owned by
it, writable by no group but root's and by nobody else, by the mode bits and by any POSIX
ACL entry (:mod:`anolisnuma.posix_acl`); a directory above may be writable by all only with
the sticky bit (``/tmp``), where nobody may rename what is not theirs.

:func:`open_trusted` and :func:`read_trusted_file` judge a path without a window between
the check and the use (:mod:`anolisnuma.system.pathwalk`): each component is opened from
the descriptor of the directory before it and judged on what was opened, and a symbolic
link on the way is followed only when root (or the daemon's user) owns it. Its directory
was judged first, so nobody else may replace it, and a link's target cannot be changed:
root's links are followed as kubeadm and the kubelet make them (to rotated certificates),
another user's, who could point it elsewhere at any moment, are refused. A stat of the path
then an open of it would give a user who owns a link or may write a directory on the way
the moment in between. :func:`read_trusted_file` reads what the walk led to as
:mod:`anolisnuma.fileread` reads the configuration (a regular file only, never a device
opened, without blocking, bounded) and says who else may read it, so that a caller holding
a secret can warn. Nothing here logs, and no message carries a byte of the file.

:func:`unsafe_along` looks at a path by name, on the path as written and as it resolves:
for the directories the daemon creates its own files in (the preflight, the listener),
which it makes and opens itself.

Standard library only (the preflight uses it before logging is set up).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import Callable, Iterator, List, Optional, Tuple

from anolisnuma import posix_acl
from anolisnuma.fileread import RefusedFile, check_regular, read_opened
from anolisnuma.system.pathwalk import Walked, walk

SWAP = "whoever may write there may swap what the daemon reads as root"


@dataclass(frozen=True)
class Unsafe:
    """Someone but root may change ``at`` (``path`` itself or a directory above it)."""

    path: str
    at: str
    above: bool
    what: str     # "writable by every user (mode 0777)", "owned by uid 1000, not root", ...
    fix: str      # the command, without the path: "chmod go-w"

    @property
    def where(self) -> str:
        return f"{self.at} (above {self.path})" if self.above else self.at

    def describe(self, consequence: str = SWAP) -> str:
        return f"{self.where} is {self.what}: {consequence}; fix: {self.fix} {self.at}"


class UntrustedFile(RefusedFile):
    """A file someone but root may change (``unsafe`` says who and how to fix it)."""

    def __init__(self, unsafe: Unsafe) -> None:
        super().__init__(unsafe.path, "not safe to trust: " + unsafe.describe())
        self.unsafe = unsafe


def chain(path: str) -> Iterator[Tuple[str, bool]]:
    """``(path, False)``, then ``(directory, True)`` for each directory above it, up to
    ``/``: on the path as written and on the path it resolves to."""
    seen = set()
    for start in (os.path.abspath(path), os.path.realpath(path)):
        at, above = start, False
        while at not in seen:
            seen.add(at)
            yield at, above
            at, above = os.path.dirname(at), True


def who_may_change(path: str, above: bool, creates: bool = False) -> Optional[Tuple[str, str]]:
    """(what is wrong, the command that fixes it), or None when only root or the daemon's
    user may change ``path``. ``creates``: the daemon makes files in this directory, so a
    default ACL granting someone write there is wrong too (the socket it binds would
    inherit it). Raises OSError when it cannot be looked at."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None   # made later, in a directory checked here
    return _unsafe_stat(path, st, above, creates)


def _unsafe_stat(path: str, st: os.stat_result, above: bool, creates: bool = False,
                 acl: Optional[Callable[[str], List[posix_acl.AclEntry]]] = None) -> Optional[Tuple[str, str]]:
    """``acl(which)``: the entries of ``path``'s ACL ``which``; read by ``path`` by default."""
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid not in (0, os.geteuid()):
        return f"owned by uid {st.st_uid}, not root", "chown root"
    if above and mode & stat.S_ISVTX:
        return None
    if mode & stat.S_IWOTH or (mode & stat.S_IWGRP and st.st_gid != 0):
        who = "every user" if mode & stat.S_IWOTH else f"group {st.st_gid}"
        return f"writable by {who} (mode {mode:04o})", "chmod go-w"
    read_acl = acl or (lambda which: posix_acl.read_acl(path, which))
    writers = _grants(read_acl(posix_acl.ACCESS), posix_acl.WRITE)
    if writers:
        return f"writable by {', '.join(writers)} through a POSIX ACL", f"setfacl -x {_acl_spec(writers)}"
    if creates and stat.S_ISDIR(st.st_mode):
        writers = _grants(read_acl(posix_acl.DEFAULT), posix_acl.WRITE)
        if writers:
            return (f"given a default POSIX ACL that makes what the daemon creates there writable by "
                    f"{', '.join(writers)}", f"setfacl -d -x {_acl_spec(writers)}")
    return None


def unsafe_along(path: str, creates: bool = False) -> Optional[Unsafe]:
    """The first place along ``path`` (itself, then each directory above it) that someone
    but root may change, or None. Raises OSError when one cannot be looked at."""
    for at, above in chain(path):
        problem = who_may_change(at, above, creates=creates and not above)
        if problem is not None:
            return Unsafe(path, at, above, *problem)
    return None


def readers(st: os.stat_result, fd: int) -> Optional[str]:
    """Who but root and the owner may read the file open at ``fd`` (``st``: its fstat):
    ``"every user (mode 0644)"``, ``"group 50 (mode 0640)"``, ``"uid 1000 through a POSIX
    ACL"``, or None."""
    mode = stat.S_IMODE(st.st_mode)
    if mode & stat.S_IROTH:
        return f"every user (mode {mode:04o})"
    if mode & stat.S_IRGRP and st.st_gid != 0:
        return f"group {st.st_gid} (mode {mode:04o})"
    named = _grants(posix_acl.read_acl_fd(fd, posix_acl.ACCESS), posix_acl.READ)
    return f"{', '.join(named)} through a POSIX ACL" if named else None


@dataclass(frozen=True)
class TrustedFile:
    data: bytes
    readers: Optional[str]    # who else may read it (see :func:`readers`), for a secret's warning


def open_trusted(path: str) -> Walked:
    """What ``path`` names, walked to when only root may change it: every directory on the
    way (as walked, links resolved), every symbolic link followed, and the object itself
    (see the module's docstring). The caller closes what it gets (a context manager), and
    uses it rather than the path: :attr:`Walked.proc_path` to connect, the descriptor to
    read. Raises :class:`UntrustedFile` naming the first component someone else may change,
    or OSError (FileNotFoundError naming the component that is not there)."""
    return walk(path, _judge(os.path.abspath(path)))


def read_trusted_file(path: str, limit: int) -> TrustedFile:
    """The content of ``path`` when only root may change it (:func:`open_trusted`), a
    regular file of at most ``limit`` bytes. Raises :class:`UntrustedFile`, RefusedFile
    (not a regular file, too large) or OSError (FileNotFoundError when absent)."""
    with open_trusted(path) as walked:
        check_regular(path, walked.st, limit)   # before it is opened: a device is never opened
        # Reopened through /proc/self/fd, not by its name: the very file judged, without
        # looking at any directory again. Without blocking: nothing but a regular file gets
        # here, but this must stay so whatever is added above.
        fd = os.open(walked.proc_path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
        try:
            data = read_opened(path, fd, limit)
            return TrustedFile(data, readers(os.fstat(fd), fd))
        finally:
            os.close(fd)


def read_trusted_or(path: str, limit: int, fail: Callable[[str], Exception]) -> TrustedFile:
    """:func:`read_trusted_file`, every refusal raised as ``fail(message)``, the message
    starting with the path (``/etc/x is not a regular file (a FIFO)``, ``/etc/x: No such
    file or directory``)."""
    try:
        return read_trusted_file(path, limit)
    except RefusedFile as e:
        raise fail(str(e)) from None
    except OSError as e:
        raise fail(f"{path}: {e.strerror}") from None


def _judge(path: str) -> Callable[[str, os.stat_result, int, bool], None]:
    """The walk's check for :func:`open_trusted` of ``path``."""
    def judge(at: str, st: os.stat_result, fd: int, above: bool) -> None:
        if stat.S_ISLNK(st.st_mode):
            # Its directory was judged before it: nobody but root may replace it, or (sticky)
            # nobody but its owner; its target is fixed at its making. So its owner is all.
            problem = None if st.st_uid in (0, os.geteuid()) else (
                f"a symbolic link owned by uid {st.st_uid}, not root", "chown -h root")
        else:
            problem = _unsafe_stat(at, st, above, acl=lambda which: posix_acl.read_acl_fd(fd, which))
        if problem is not None:
            raise UntrustedFile(Unsafe(path, at, above and at != path, *problem))
    return judge


def _grants(entries: List[posix_acl.AclEntry], perm: int) -> List[str]:
    return posix_acl.named_grants(entries, perm, trusted_uids={0, os.geteuid()})


def _acl_spec(who: List[str]) -> str:
    return ",".join(("u:" if w.startswith("uid ") else "g:") + w.split(" ", 1)[1] for w in who)
