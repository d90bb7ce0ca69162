"""Socket activation (sd_listen_fds(3)): the listening socket handed over by systemd.

With ``anolisnuma.socket`` systemd binds the kubelet's socket and keeps it open across
restarts of the service: while the daemon is down or starting, the kubelet's new
connections wait in the socket's backlog instead of being refused. The service gets it
as descriptor 3 (``SD_LISTEN_FDS_START``) with ``LISTEN_FDS=1`` and ``LISTEN_PID`` set to
its own pid. A ``LISTEN_PID`` of another process means the variables were inherited from
a parent they were meant for: they are ignored. The variables are removed from the
environment either way, so that no child takes them for its own.
"""

from __future__ import annotations

import os
import socket
from typing import List, Optional

SD_LISTEN_FDS_START = 3
_VARIABLES = ("LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES")


class ActivationError(Exception):
    pass


class Inherited:
    """The socket systemd passed, and what else it passed that is not used."""

    def __init__(self, sock: socket.socket, path: str, ignored: List[str]) -> None:
        self.sock = sock
        self.path = path          # the path it is bound to
        self.ignored = ignored    # descriptions of other descriptors passed (closed)


def take_listen_fds() -> Optional[Inherited]:
    """The unix stream socket passed by systemd, or None when none was passed to this
    process. Raises ActivationError when descriptors were passed but none of them is a
    listening unix stream socket bound to a path (a unit that names a TCP port, say)."""
    env = {k: os.environ.pop(k) for k in _VARIABLES if k in os.environ}
    if "LISTEN_FDS" not in env:
        return None
    try:
        pid, count = int(env.get("LISTEN_PID", "")), int(env["LISTEN_FDS"])
    except ValueError:
        raise ActivationError(f"LISTEN_FDS={env['LISTEN_FDS']!r} LISTEN_PID={env.get('LISTEN_PID', '')!r} "
                              f"are not numbers") from None
    if pid != os.getpid() or count <= 0:
        return None   # meant for another process (or nothing passed)
    names = env.get("LISTEN_FDNAMES", "").split(":")
    found: Optional[Inherited] = None
    ignored: List[str] = []
    for i in range(count):
        fd = SD_LISTEN_FDS_START + i
        name = names[i] if i < len(names) else ""
        try:
            sock = socket.socket(fileno=fd)
        except OSError as e:
            ignored.append(f"fd {fd} ({name or 'unnamed'}): {e.strerror}")
            continue
        what = _describe(sock)
        if found is None and what is None:
            os.set_inheritable(fd, False)
            found = Inherited(sock, sock.getsockname(), ignored)
            continue
        ignored.append(f"fd {fd} ({name or 'unnamed'}): {what or 'a second socket'}")
        sock.close()
    if found is None:
        raise ActivationError("systemd passed sockets but none is a listening unix stream socket bound to "
                              "a path: " + "; ".join(ignored))
    return found


def _describe(sock: socket.socket) -> Optional[str]:
    """None for a listening unix stream socket bound to a filesystem path, else what it is."""
    if sock.family != socket.AF_UNIX:
        return f"not a unix socket (family {sock.family!r})"
    if sock.type != socket.SOCK_STREAM:
        return f"not a stream socket (type {sock.type!r})"
    if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        return "not listening"
    path = sock.getsockname()
    if not isinstance(path, str) or not path or path.startswith("\0"):
        return "not bound to a filesystem path"
    return None
