"""Atomic JSON state files.

A state file is written to a temporary file in the same directory, fsynced, renamed over
the old one, and the directory is fsynced: after a crash or ``kill -9`` the file is either
the old or the new version, never a torn one. A file that does not parse is moved aside
(``<name>.corrupt-<time>``) with a log line, and the caller rebuilds from containerd.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from typing import Any, Optional

import structlog

log = structlog.get_logger("anolisnuma.state")


def atomic_write_json(path: str, data: Any) -> None:
    """Replace ``path`` with ``data`` as JSON, atomically and durably."""
    # json.dumps uses the C encoder; json.dump to a file object does not (4x slower).
    atomic_write_bytes(path, json.dumps(data, separators=(",", ":"), sort_keys=True).encode("utf-8"))


def atomic_write_bytes(path: str, data: bytes, mode: int = 0o600) -> None:
    """Replace ``path`` with ``data``: temp file in the same directory, fsync, rename,
    fsync of the directory."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def load_json_state(path: str) -> Optional[Any]:
    """The parsed content of ``path``; None when it is absent or was corrupt (moved aside)."""
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        aside = f"{path}.corrupt-{int(time.time())}"
        try:
            os.replace(path, aside)
        except OSError:
            aside = "(could not move it aside)"
        log.error("state file is corrupt; moved aside, rebuilding from containerd",
                  path=path, moved_to=aside, error=str(e))
        return None
