"""What ``/proc/<pid>`` tells the traffic observer, under the configured ``proc_root``
(``/proc`` on a host), from integer PIDs only: a namespace's TCP open counters
(``net/snmp``), the socket inodes a process holds (``fd/*``) and the pod it is in
(``cgroup``, through the kubelet cgroup layout's path rules).
"""

from __future__ import annotations

import errno
import os
from typing import Dict, Iterable, List, Optional

from anolisnuma.system.pod_cgroups import DEFAULT_LAYOUT, KubeletCgroupLayout

_CGROUP_FILE_CAP = 1 << 16


def process_exists(proc_root: str, pid: int) -> bool:
    return os.path.exists(os.path.join(proc_root, str(pid)))


def list_pids(proc_root: str) -> List[int]:
    return [int(name) for name in os.listdir(proc_root) if name.isdigit()]


def _read_bytes(path: str, cap: int = _CGROUP_FILE_CAP) -> bytes:
    """A small proc file made by one ``show`` call (``single_open``: ``cgroup``,
    ``net/snmp``), which one large enough read returns whole; up to ``cap`` bytes."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.read(fd, cap)
        if len(data) >= cap // 2:              # not expected: read on, to EOF or cap
            chunks = [data]
            size = len(data)
            while size < cap:
                chunk = os.read(fd, cap - size)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            data = b"".join(chunks)
    finally:
        os.close(fd)
    return data


def _read_small(path: str, cap: int = _CGROUP_FILE_CAP) -> str:
    return _read_bytes(path, cap).decode("ascii", "replace")


def tcp_opens(proc_root: str, pid: int) -> int:
    """``ActiveOpens + PassiveOpens`` of ``pid``'s network namespace (``net/snmp``): it
    changes whenever a TCP connection is made there, so while it stands still the
    namespace has no socket that was not there before. Raises OSError if unreadable."""
    path = os.path.join(proc_root, str(int(pid)), "net/snmp")
    data = _read_bytes(path)
    head = data.find(b"Tcp: ")
    body = data.find(b"Tcp: ", head + 5) if head >= 0 else -1
    if body >= 0:
        names = data[head:data.find(b"\n", head)].split()
        end = data.find(b"\n", body)
        values = data[body:end if end >= 0 else len(data)].split()
        try:
            return (int(values[names.index(b"ActiveOpens")])
                    + int(values[names.index(b"PassiveOpens")]))
        except (ValueError, IndexError):
            pass
    raise OSError(errno.EBADMSG, f"no TCP open counters in {path}")


def socket_inodes(proc_root: str, pid: int) -> List[int]:
    """Inodes of the sockets ``pid`` holds open (``fd/*`` links ``socket:[N]``). Empty if
    the process is gone; descriptors closed while reading are skipped."""
    base = os.path.join(proc_root, str(int(pid)), "fd")
    try:
        names = os.listdir(base)
    except OSError:
        return []
    out = []
    for name in names:
        try:
            target = os.readlink(os.path.join(base, name))
        except OSError:
            continue
        if target.startswith("socket:[") and target.endswith("]"):
            try:
                out.append(int(target[8:-1]))
            except ValueError:
                continue
    return out


def pod_uid_from_cgroup_path(path: str, layout: Optional[KubeletCgroupLayout] = None) -> Optional[str]:
    """The pod UID in a cgroup path as ``/proc/<pid>/cgroup`` shows it, for the kubelet's
    cgroup layout (``layout``; default: root ``/``, either driver), wherever the pod part
    sits (a node running in a container puts a prefix before it). ``None`` when the path is
    not inside a pod cgroup. The UID is validated by the layout's path rules."""
    return (layout or DEFAULT_LAYOUT).pod_uid_from_cgroup_path(path)


def pod_uid_of(proc_root: str, pid: int, layout: Optional[KubeletCgroupLayout] = None) -> Optional[str]:
    """The UID of the pod whose cgroup ``pid`` is in (first hierarchy that names one), or
    ``None``. Raises OSError if the process is gone."""
    text = _read_small(os.path.join(proc_root, str(int(pid)), "cgroup"))
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        uid = pod_uid_from_cgroup_path(path, layout)
        if uid is not None:
            return uid
    return None


def inode_owners(proc_root: str, pids: Iterable[int]) -> Dict[int, int]:
    """socket inode -> PID, for the sockets ``pids`` hold (a socket shared by several of
    them goes to the first)."""
    owners: Dict[int, int] = {}
    for pid in pids:
        for inode in socket_inodes(proc_root, pid):
            owners.setdefault(inode, pid)
    return owners
