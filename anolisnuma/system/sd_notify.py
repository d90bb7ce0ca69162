"""Telling systemd how the daemon is doing (``Type=notify`` units), per sd_notify(3).

The unit waits for ``READY=1`` before it counts as started, so ``Before=kubelet.service``
means the kubelet starts only once our socket answers. Outside systemd (no
``NOTIFY_SOCKET``) every call does nothing.
"""

from __future__ import annotations

import os
import socket


def notify(*fields: str) -> bool:
    """Send ``fields`` (e.g. ``"READY=1"``, ``"STATUS=..."``) to systemd; False when not
    run by systemd or when the notification could not be sent."""
    address = os.environ.get("NOTIFY_SOCKET", "")
    if not address or address[0] not in "/@":
        return False
    if address[0] == "@":  # abstract namespace
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(address)
            s.sendall("\n".join(fields).encode())
        return True
    except OSError:
        return False
