"""The process's open-files limit (``RLIMIT_NOFILE``), raised to what it is allowed.

Every relayed connection costs the daemon two descriptors (the kubelet's side and
containerd's). systemd starts services with a soft limit of 1024 and a hard limit far above
it (524288 on current systemd; the unit asks for more), and containerd, like every Go
program since Go 1.19, raises its soft limit to the hard one as it starts. The daemon does
the same, so that it can serve as many connections as the runtime behind it.
"""

from __future__ import annotations

import resource
from typing import NamedTuple, Optional


class OpenFilesLimit(NamedTuple):
    before: int            # the soft limit the daemon was started with
    soft: int              # the soft limit now
    hard: int
    error: Optional[str]   # why it could not be raised (it stays as it was)

    @property
    def raised(self) -> bool:
        return self.soft > self.before


def _finite(value: int) -> int:
    # RLIM_INFINITY is a valid hard limit; the kernel's own ceiling (fs.nr_open) then applies.
    return value if value != resource.RLIM_INFINITY else _nr_open()


def _nr_open() -> int:
    try:
        with open("/proc/sys/fs/nr_open") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return 1 << 20   # the kernel's default fs.nr_open


def raise_open_files_limit() -> OpenFilesLimit:
    """Set the soft ``RLIMIT_NOFILE`` to the hard limit; the limits before and after.

    Never raises: a limit that cannot be changed (a seccomp profile, a container's
    restrictions) is kept, and the error is returned for the caller to report."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = _finite(hard)
    if soft != resource.RLIM_INFINITY and soft >= want:
        return OpenFilesLimit(soft, soft, want, None)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (OSError, ValueError) as e:
        return OpenFilesLimit(_finite(soft), _finite(soft), want, str(e))
    return OpenFilesLimit(_finite(soft), want, want, None)


def open_files_soft_limit() -> int:
    """The soft ``RLIMIT_NOFILE`` now (finite)."""
    return _finite(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
