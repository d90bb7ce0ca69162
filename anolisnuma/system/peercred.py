"""Who is at the other end of a connected unix socket, as the kernel says (``SO_PEERCRED``).

A file's mode and owner say who could have bound a socket; only the kernel says who is
listening on it (or who connected to it) now: the pid, uid and gid of the process that
called ``connect`` or ``listen``, as they were then. The admin socket refuses a client that
is not root; the NRI plugin refuses a runtime that is not.

Standard library only.
"""

from __future__ import annotations

import socket
import struct
from typing import Any, NamedTuple, Optional

_UCRED = struct.Struct("3i")   # struct ucred: pid, uid, gid


class PeerCred(NamedTuple):
    pid: int
    uid: int
    gid: int


def peer_credentials(sock: Any) -> Optional[PeerCred]:
    """The (pid, uid, gid) of the peer of ``sock`` (a connected socket, or asyncio's
    wrapper of one); None where the kernel does not say (no ``SO_PEERCRED`` on this
    platform, not a unix socket, the socket closed). Never raises."""
    option = getattr(socket, "SO_PEERCRED", None)
    if sock is None or option is None:
        return None
    try:
        return PeerCred(*_UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, option, _UCRED.size)))
    except (OSError, struct.error):
        return None
