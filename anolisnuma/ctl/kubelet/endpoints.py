"""Whether two CRI endpoints name the same unix socket (``unix://`` or a bare path,
``/var/run`` being ``/run``): how the switch tells that the kubelet already points at
anolisnuma, or still at the runtime anolisnuma forwards to.
"""

from __future__ import annotations

import os
from typing import Optional


def socket_of(endpoint: str) -> Optional[str]:
    """The unix socket path of an endpoint, normalised (``/var/run`` is ``/run``)."""
    e = endpoint.strip()
    if e.startswith("unix://"):
        e = e[len("unix://"):]
    elif "://" in e:
        return None
    if not e.startswith("/"):
        return None
    e = os.path.normpath(e)
    if e == "/var/run" or e.startswith("/var/run/"):
        e = e[len("/var"):]
    return e


def same_socket(endpoint: str, socket_path: str) -> bool:
    a, b = socket_of(endpoint), socket_of(socket_path)
    return a is not None and a == b
