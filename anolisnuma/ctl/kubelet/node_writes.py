"""How the switch changes the node's files: each replaced atomically (written beside it,
fsynced, renamed over it, the directory fsynced; mode and owner kept), missing directories
created and reported (so ``disable`` can remove them), and one ``anolisnuma-ctl kubelet``
changing a root at a time.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import tempfile
import time
from typing import Iterator, List, Optional

from anolisnuma.ctl.kubelet.node_root import Root
from anolisnuma.ctl.kubelet.outcome import CtlError


def atomic_write(host_path: str, data: bytes, mode: Optional[int] = None) -> None:
    """Replace a file atomically, keeping the mode and owner of the file it replaces."""
    directory = os.path.dirname(host_path)
    try:
        old: Optional[os.stat_result] = os.stat(host_path)
    except FileNotFoundError:
        old = None
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(host_path) + ".", suffix=".anolisnuma-tmp",
                               dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if old is not None:
                os.fchmod(f.fileno(), stat.S_IMODE(old.st_mode) if mode is None else mode)
                with contextlib.suppress(PermissionError):
                    os.fchown(f.fileno(), old.st_uid, old.st_gid)
            else:
                os.fchmod(f.fileno(), 0o644 if mode is None else mode)
            os.fsync(f.fileno())
        os.replace(tmp, host_path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(directory)


def fsync_dir(directory: str) -> None:
    with contextlib.suppress(OSError):
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def makedirs(root: Root, path: str, mode: int = 0o755) -> List[str]:
    """Create a node directory (``mode``) and its missing parents (0755); the node paths created."""
    missing: List[str] = []
    p = path.rstrip("/")
    while p and not os.path.isdir(root.host(p)):
        missing.append(p)
        p = os.path.dirname(p)
    created: List[str] = []
    for p in reversed(missing):
        os.mkdir(root.host(p), mode if p == path.rstrip("/") else 0o755)
        created.append(p)
    return created


@contextlib.contextmanager
def locked(root: Root, wait: float = 10.0) -> Iterator[None]:
    """One ``anolisnuma-ctl kubelet`` changing a root at a time (flock on the root itself)."""
    fd = os.open(root.root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise CtlError("another anolisnuma-ctl kubelet is changing this node; try again")
                time.sleep(0.1)
        yield
    finally:
        os.close(fd)
