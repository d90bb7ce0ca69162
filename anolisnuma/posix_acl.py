"""POSIX ACLs as the kernel keeps them: who, beyond what the mode bits say, may write or read.

``stat`` shows the owner, the owning group and everybody else; ``setfacl -m u:alice:rw``
adds a named user (or group) that ``stat`` does not show, kept in the extended attribute
``system.posix_acl_access`` (and, on a directory, ``system.posix_acl_default``: the ACL
every file made there starts with). A check of the mode bits alone therefore passes a
directory that a named user may write. The attribute is read as the kernel stores it
(``include/uapi/linux/posix_acl_xattr.h``): a 4-byte version (2), then 8-byte entries of
tag, permissions and id, little-endian. A named entry's effective permissions are those
the mask entry also grants.

Standard library only, like :mod:`anolisnuma.fileread`: the preflight uses it before
logging is set up.
"""

from __future__ import annotations

import errno
import os
import struct
from dataclasses import dataclass
from typing import Iterable, List

ACCESS = "system.posix_acl_access"
DEFAULT = "system.posix_acl_default"

_VERSION = 2
USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
READ, WRITE, EXECUTE = 4, 2, 1
_HEADER = struct.Struct("<I")
_ENTRY = struct.Struct("<HHI")
# what a file system without ACLs (or without extended attributes) answers
_NONE = {errno.ENODATA, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOENT}


@dataclass(frozen=True)
class AclEntry:
    tag: int
    perm: int
    id: int


def parse(data: bytes) -> List[AclEntry]:
    """The entries of an ACL attribute; [] for one of another version (the kernel writes 2)."""
    if len(data) < _HEADER.size or _HEADER.unpack_from(data)[0] != _VERSION:
        return []
    count = (len(data) - _HEADER.size) // _ENTRY.size
    return [AclEntry(*_ENTRY.unpack_from(data, _HEADER.size + i * _ENTRY.size)) for i in range(count)]


def read_acl(path: str, which: str = ACCESS) -> List[AclEntry]:
    """The entries of ``path``'s ACL (``which``: :data:`ACCESS` or :data:`DEFAULT`); [] when
    it has none or its file system keeps none. Raises OSError when it cannot be read."""
    try:
        data = os.getxattr(path, which)
    except OSError as e:
        if e.errno in _NONE:
            return []
        raise
    return parse(data)


def read_acl_fd(fd: int, which: str = ACCESS) -> List[AclEntry]:
    """The entries of the ACL of what descriptor ``fd`` is open on (an ``O_PATH`` one too,
    which ``fgetxattr`` refuses: read through ``/proc/self/fd``); [] when it has none.
    Raises OSError when it cannot be read, /proc not mounted included: an ACL that
    cannot be looked at is not taken for none."""
    try:
        data = os.getxattr(f"/proc/self/fd/{fd}", which)
    except OSError as e:
        if e.errno in _NONE and e.errno != errno.ENOENT:
            return []
        if e.errno == errno.ENOENT and not os.path.isdir("/proc/self/fd"):
            raise OSError(e.errno, "/proc is not mounted: POSIX ACLs cannot be read") from None
        raise
    return parse(data)


def named_grants(entries: Iterable[AclEntry], perm: int, trusted_uids: Iterable[int] = (0,),
                 trusted_gids: Iterable[int] = (0,)) -> List[str]:
    """The named users and groups (``"uid 1000"``, ``"gid 50"``) that ``entries`` grant
    ``perm`` (through the mask), but for ``trusted_uids`` and ``trusted_gids``."""
    entries = list(entries)
    mask = next((e.perm for e in entries if e.tag == MASK), READ | WRITE | EXECUTE)
    uids, gids = set(trusted_uids), set(trusted_gids)
    out = []
    for e in entries:
        if not e.perm & mask & perm:
            continue
        if e.tag == USER and e.id not in uids:
            out.append(f"uid {e.id}")
        elif e.tag == GROUP and e.id not in gids:
            out.append(f"gid {e.id}")
    return out
