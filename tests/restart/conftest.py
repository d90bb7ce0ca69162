"""Restart tests: the daemon under a socket supervisor (systemd's part, see
anolisnuma/testing/socket_supervisor.py), driven by the grpc-go client's load mode.

The tests marked ``containerd`` run on one private real containerd per session and are
skipped, with the reason, when the machine cannot run it (not root, no containerd/runc/ctr,
no static busybox, no cgroup v1, no CRI stubs, no Go toolchain for the grpc-go client).
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import Iterator, Optional

import pytest

from anolisnuma.testing.containerd import PrivateContainerd, cleanup_dead_instances

BASE_PREFIX = "/tmp/anolisnuma-restart-"
RUN_PREFIX = "/run/anolisnuma-restart-"
LAST_LOG = "/tmp/anolisnuma-restart-last-containerd.log"


def containerd_skip_reason() -> Optional[str]:
    if os.geteuid() != 0:
        return "needs root (containerd, cgroups, mounts)"
    for binary in ("containerd", "ctr", "containerd-shim-runc-v2"):
        if shutil.which(binary) is None:
            return f"{binary} not found: run scripts/install-deps.sh"
    if not os.path.exists("/bin/busybox"):
        return "/bin/busybox not found: install busybox-static"
    if not os.path.isdir("/sys/fs/cgroup/cpuset"):
        return "needs the cgroup v1 hierarchies under /sys/fs/cgroup"
    if sys.version_info < (3, 10):
        return "the CRI stubs (cri_api) need Python >= 3.10"
    try:
        import cri_api.v1.api_pb2  # noqa: F401
    except ImportError as e:
        return f"no CRI stubs: {e}"
    return go_skip_reason()


def go_skip_reason() -> Optional[str]:
    from anolisnuma.testing.goclient import _check_grpc_source, find_go

    try:
        find_go()
        _check_grpc_source()
    except RuntimeError as e:
        return str(e)
    return None


@pytest.fixture(scope="session")
def containerd() -> Iterator[PrivateContainerd]:
    reason = containerd_skip_reason()
    if reason:
        pytest.skip(reason)
    cleanup_dead_instances(BASE_PREFIX, RUN_PREFIX)
    pid = os.getpid()
    pc = PrivateContainerd(f"{BASE_PREFIX}{pid}", f"{RUN_PREFIX}{pid}", cni=False)
    try:
        pc.start()
        pc.import_images()
        yield pc
    finally:
        problems = pc.cleanup(save_log=LAST_LOG)
        if problems:
            print(f"\nprivate containerd cleanup problems: {problems}", file=sys.stderr)
