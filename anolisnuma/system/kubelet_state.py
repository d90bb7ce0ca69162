"""Read the kubelet's CPU manager checkpoint (``cpu_manager_state``), again only when it
changed (the placement watcher polls it).

The file is JSON written by the kubelet (atomically, by rename)::

    {"policyName": "static", "defaultCpuSet": "0,23-31,34-127",
     "entries": {"<pod uid>": {"<container name>": "1-20"}}, "checksum": 736622555}

``entries`` are the CPUs the static policy gave exclusively to containers; ``defaultCpuSet``
is the shared pool every other container runs in. With the ``none`` policy the file holds
only ``policyName`` and an empty ``defaultCpuSet``; on a node without a CPU manager the file
may not exist. This module reads the strings; the CPU lists are interpreted by
:mod:`anolisnuma.policies.numa.cpu_manager`.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple, Union

import structlog

from anolisnuma.fileread import RefusedFile, read_regular_file

log = structlog.get_logger("anolisnuma.numa")

_MAX_FILE = 16 << 20


class KubeletStateError(ValueError):
    """The file exists but is not a CPU manager checkpoint."""


@dataclass(frozen=True)
class RawCpuManagerState:
    policy_name: str = "none"
    default_cpuset: str = ""
    entries: Dict[str, Dict[str, str]] = field(default_factory=dict)
    present: bool = False      # False: the file does not exist


ABSENT = RawCpuManagerState()


def parse_cpu_manager_state(text: Union[str, bytes]) -> RawCpuManagerState:
    """The checkpoint in ``text`` (bytes: UTF-8); raises :class:`KubeletStateError` when it
    is not one."""
    try:
        data = json.loads(text)
    except ValueError as e:   # (UnicodeDecodeError too)
        raise KubeletStateError(f"not JSON: {e}") from e
    except RecursionError:    # arrays or objects nested past the decoder's recursion
        raise KubeletStateError("not JSON: nested too deeply") from None
    if not isinstance(data, dict):
        raise KubeletStateError("not a JSON object")
    policy = data.get("policyName", "")
    if not isinstance(policy, str) or not policy:
        raise KubeletStateError("policyName missing or not a string")
    default = data.get("defaultCpuSet", "")
    if default is None:
        default = ""
    if not isinstance(default, str):
        raise KubeletStateError("defaultCpuSet is not a string")
    raw_entries = data.get("entries")
    if raw_entries is None:
        raw_entries = {}
    if not isinstance(raw_entries, dict):
        raise KubeletStateError("entries is not an object")
    entries: Dict[str, Dict[str, str]] = {}
    for uid, containers in raw_entries.items():
        if not isinstance(containers, dict):
            raise KubeletStateError(f"entries[{uid!r}] is not an object")
        for name, cpus in containers.items():
            if not isinstance(cpus, str):
                raise KubeletStateError(f"entries[{uid!r}][{name!r}] is not a string")
        entries[str(uid)] = {str(k): v for k, v in containers.items()}
    return RawCpuManagerState(policy_name=policy, default_cpuset=default, entries=entries, present=True)


def read_cpu_manager_state(path: str) -> RawCpuManagerState:
    """The checkpoint at ``path``; :data:`ABSENT` when there is no file. Raises
    :class:`KubeletStateError` (unparseable, not a regular file, over 16 MiB) or OSError
    (unreadable)."""
    try:
        # (bytes: not the locale's encoding, which may be ASCII; and read as it grows, not
        # into a buffer of the whole cap made for every read of a file of a few hundred bytes)
        data = read_regular_file(path, _MAX_FILE)
    except FileNotFoundError:
        return ABSENT
    except RefusedFile as e:
        raise KubeletStateError(str(e)) from None
    return parse_cpu_manager_state(data)


Signature = Optional[Tuple[int, int, int]]


def file_signature(path: str) -> Signature:
    """(inode, size, mtime_ns) of ``path``, None when absent: changes whenever the file does
    (the kubelet replaces it by rename, which changes the inode)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class CpuManagerStateFile:
    """The checkpoint at ``path``, re-read only when the file changed.

    :meth:`refresh` costs one ``stat`` when nothing changed, so it can be called on the hot
    path right before a decision. A file that cannot be parsed (e.g. a kubelet mid-upgrade)
    keeps the last good state and is logged once per version of the file.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._sig: Signature = (-1, -1, -1)   # never read yet
        self._state = ABSENT
        self._bad_sig: Signature = None

    @property
    def state(self) -> RawCpuManagerState:
        return self._state

    def refresh(self) -> Optional[RawCpuManagerState]:
        """Re-read when the file changed; the new state if it changed, else None."""
        sig = file_signature(self.path)
        if sig == self._sig:
            return None
        with self._lock:
            if sig == self._sig:
                return None
            if sig is None:
                new = ABSENT
            else:
                try:
                    new = read_cpu_manager_state(self.path)
                except (KubeletStateError, OSError) as e:
                    if sig != self._bad_sig:
                        log.warning("kubelet cpu_manager_state unreadable; keeping the last good one",
                                    path=self.path, error=str(e))
                        self._bad_sig = sig
                    return None
            self._sig = sig
            changed = new != self._state
            self._state = new
            return new if changed else None
