"""Connecting to containerd's NRI socket so that only root can be at the other end.

Whoever answers on this socket tells the daemon which pods exist and gets its adjustments:
another user there, in containerd's place, could make the daemon place and account for pods
that are not there. Two checks, each on what the connection is made to, not on a name
looked at a moment before:

- **the path.** :func:`anolisnuma.trusted_file.open_trusted` walks it component by
  component (``openat`` with ``O_PATH|O_NOFOLLOW``, ``fstat`` of each): the socket, every
  directory on the way and every link followed must be root's and writable by nobody else
  (a sticky directory aside); a link is followed only when root owns it. The connection is
  then made through ``/proc/self/fd/<the socket's descriptor>``: the kernel connects to the
  very socket that was judged, without looking at any directory again. Connecting by the
  name after checking it (what this did before) leaves a window in between: a link owned by
  another user on the way repointed, or, in a sticky directory, containerd's socket removed
  while it restarts and another user's bound at the name. (Connecting through
  ``/proc/self/fd/<the directory>/<name>`` would still look the name up; the socket's own
  descriptor does not. It also lifts ``sun_path``'s 108-byte limit.)
- **the peer.** The socket's file says who bound it, not who listens on it now: a socket
  file root owns may be listened on by a process running as someone else (bound by root,
  then handed over; or listened on after a ``setuid``). The kernel's ``SO_PEERCRED`` names
  the process that called ``listen`` and its uid then; it must be root (or the daemon's own
  user, who could do all the daemon does anyway).
"""

from __future__ import annotations

import errno
import os
import socket
import stat
from typing import Optional, Tuple

from anolisnuma.system.peercred import peer_credentials
from anolisnuma.trusted_file import open_trusted


class UntrustedPeer(Exception):
    """The process listening on the NRI socket is not root's; the message says who and the fix."""


def connect(path: str, timeout: float) -> socket.socket:
    """A socket connected to the runtime's NRI socket at ``path`` (``timeout`` set on it),
    its peer root. Raises :class:`~anolisnuma.trusted_file.UntrustedFile` (someone else may
    change the socket or something on its way: ``unsafe`` says where and the fix),
    :class:`UntrustedPeer`, or OSError (nothing there, not a socket, nobody listening)."""
    with open_trusted(path) as walked:
        if not stat.S_ISSOCK(walked.st.st_mode):
            raise OSError(errno.ENOTSOCK, "not a socket", path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect(walked.proc_path)
        except BaseException:
            sock.close()
            raise
    cred = peer_credentials(sock)
    if cred is None or cred.uid not in (0, os.geteuid()):
        sock.close()
        who = "an unknown process (the kernel does not say)" if cred is None else \
            f"pid {cred.pid}, running as uid {cred.uid}"
        fix = f"stop process {cred.pid}, " if cred is not None else ""
        raise UntrustedPeer(f"{path} is listened on by {who}, not root: it is not containerd, and could tell "
                            f"anolisnuma of pods that are not there; fix: {fix}remove {path} and restart "
                            f"containerd, which makes its socket again")
    return sock


def identity(path: str) -> Optional[Tuple[int, int, int]]:
    """``(st_dev, st_ino, st_ctime_ns)`` of what is at ``path`` now, following links, or
    None (nothing there, or it cannot be looked at). Only a hint of when to try
    :func:`connect` again (containerd binds a new socket when it starts: another inode, and
    another change time should the inode number be reused): never trusted for anything,
    :func:`connect` checks what it connects to itself."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino, st.st_ctime_ns
