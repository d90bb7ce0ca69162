"""Atomic JSON state files.

A state file is written to a temporary file in the same directory, fsynced, renamed over
the old one, and the directory is fsynced: after a crash or ``kill -9`` the file is either
the old or the new version, never a torn one.

Reading one back trusts nothing about what is at the path: it must be a regular file, not
a symbolic link (the daemon only ever renames its own files there), of at most
:data:`STATE_MAX_BYTES`, whose JSON is an object of the expected format version and whose
records decode. Anything else (torn, hand-edited, a FIFO or a directory put there) is moved
aside (``<name>.corrupt-<time>``) with one error line saying what is wrong, and the caller
starts empty: the start-up resync rebuilds everything from containerd. The daemon must
start whatever it finds, or the kubelet has no runtime.

One exception: a file of a NEWER format version than this build reads was written by a
newer anolisnuma (a downgrade, or an upgrade rolled back). It is not corrupt, and moving it
aside would lose what the newer version knows: :class:`StateFormatTooNew` is raised, the
file stays as it is, and the caller does without it (the daemon keeps that state in
memory, a hook that owns it stays off) until the operator reinstalls the newer version or
moves the file away.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from typing import Any, Callable, Dict, Optional, TypeVar

import structlog

from anolisnuma.fileread import MIB, RefusedFile, read_regular_file

log = structlog.get_logger("anolisnuma.state")

T = TypeVar("T")

# Far above what a full node needs: Kubernetes caps a pod's annotations at 256 KiB, and
# store.json with 250 pods carrying that much is 64 MiB; numa.json is smaller still.
STATE_MAX_BYTES = 256 * MIB


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


class StateFormatTooNew(Exception):
    """A state file of a newer format version than this build reads; left untouched."""

    def __init__(self, path: str, found: int, known: int) -> None:
        super().__init__(f"{path} has state format version {found}, newer than the version {known} this "
                         f"anolisnuma reads: a newer anolisnuma wrote it. It is left untouched; reinstall "
                         f"the newer anolisnuma, or move the file away to start this state afresh "
                         f"(rebuilt from containerd)")
        self.path = path
        self.found = found
        self.known = known


def load_json_state(path: str, version: int, decode: Callable[[Dict[str, Any]], T],
                    max_bytes: int = STATE_MAX_BYTES) -> Optional[T]:
    """``decode(content)`` of the JSON object in ``path`` whose ``"version"`` is ``version``;
    ``decode`` raises ValueError or TypeError saying what is wrong. None when there is no
    file, or when it was unusable (larger than ``max_bytes`` too): then it is moved aside
    with one error line. Raises StateFormatTooNew, touching nothing, when its version is
    newer than ``version``."""
    try:
        data = json.loads(read_regular_file(path, max_bytes, follow_symlinks=False))
        found = data.get("version") if isinstance(data, dict) else None
        exact = type(found) is int   # (not a bool: True == 1)
        if exact and found > version:
            raise StateFormatTooNew(path, found, version)
        if not exact or found != version:
            raise ValueError(f"not a format version {version} state file (version {found!r})")
        return decode(data)
    except FileNotFoundError:
        return None
    except (OSError, RefusedFile, ValueError, TypeError, RecursionError) as e:  # RecursionError: [[[[...
        _move_aside(path, e)
        return None


def _move_aside(path: str, error: Exception) -> None:
    aside = stem = f"{path}.corrupt-{int(time.time())}"
    n = 0
    while os.path.lexists(aside):   # two in one second: replacing the first would lose it
        n += 1
        aside = f"{stem}.{n}"
    try:
        os.replace(path, aside)
    except OSError:
        aside = "(could not move it aside)"
    log.error("state file is corrupt; moved aside, rebuilding from containerd",
              path=path, moved_to=aside, error=str(error))
