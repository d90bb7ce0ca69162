"""The node's file system below ``--root``: paths are the node's (``/etc/...``), read below
the root with symlinks resolved inside it as in a chroot, optionally with planned contents
overlaid (how an edit is checked before it is made), and which of its files belong to a
package (never edited in place).
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Dict, List, Optional

# Files a package update (or, for /run, a reboot) would overwrite: never edited in place.
PACKAGED_PREFIXES = ("/usr/", "/lib/", "/run/")


class Root:
    """The node's file system below ``root``, optionally with planned contents overlaid.

    Paths given to it are the node's (absolute, ``/etc/...``); symlinks are resolved
    inside the root, as in a chroot. ``overlay`` maps resolved host paths to the bytes a
    file would have (``None``: would not exist): how an edit is checked before it is made.
    """

    def __init__(self, root: str = "/", overlay: Optional[Dict[str, Optional[bytes]]] = None) -> None:
        self.root = os.path.abspath(root)
        self.overlay: Dict[str, Optional[bytes]] = dict(overlay or {})

    def with_overlay(self, overlay: Dict[str, Optional[bytes]]) -> "Root":
        merged = dict(self.overlay)
        merged.update(overlay)
        return Root(self.root, merged)

    def host(self, path: str) -> str:
        """The path on this machine of the node's ``path``, symlinks resolved inside the root."""
        parts = [p for p in path.split("/") if p]
        resolved: List[str] = []
        hops = 0
        while parts:
            name = parts.pop(0)
            if name == ".":
                continue
            if name == "..":
                if resolved:
                    resolved.pop()
                continue
            candidate = os.path.join(self.root, *resolved, name)
            if os.path.islink(candidate):
                hops += 1
                if hops > 40:
                    raise OSError(errno.ELOOP, "too many levels of symbolic links", path)
                target = os.readlink(candidate)
                if target.startswith("/"):
                    resolved = []
                parts = [p for p in target.split("/") if p] + parts
                continue
            resolved.append(name)
        return os.path.join(self.root, *resolved)

    def read(self, path: str) -> Optional[bytes]:
        """The bytes of a regular file, or None when it is missing (or not a file)."""
        host = self.host(path)
        if host in self.overlay:
            return self.overlay[host]
        try:
            with open(host, "rb") as f:
                if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    return None
                return f.read()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None

    def read_text(self, path: str) -> Optional[str]:
        data = self.read(path)
        return None if data is None else data.decode("utf-8", "surrogateescape")

    def listdir(self, path: str) -> List[str]:
        host = self.host(path)
        try:
            names = set(os.listdir(host))
        except (FileNotFoundError, NotADirectoryError):
            names = set()
        for h, data in self.overlay.items():
            if os.path.dirname(h) == host:
                if data is None:
                    names.discard(os.path.basename(h))
                else:
                    names.add(os.path.basename(h))
        return sorted(names)

    def is_masked(self, path: str) -> bool:
        """A unit symlinked to /dev/null."""
        host = os.path.join(self.root, path.lstrip("/"))
        return os.path.islink(host) and os.readlink(host) == "/dev/null"


def is_packaged(path: str) -> bool:
    return path.startswith(PACKAGED_PREFIXES)
