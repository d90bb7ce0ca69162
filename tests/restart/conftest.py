"""Restart tests: the daemon under a socket supervisor (systemd's part, see
anolisnuma/testing/socket_supervisor.py), driven by the grpc-go client's load mode.

The tests marked ``containerd`` run on one private real containerd per session and build
(Debian's 1.6, 1.7 and 2.2: ``anolisnuma/testing/containerd_builds.py``; test ids ``[1.6]``,
``[1.7]``, ``[2.2]``); a module runs on 1.7 when its ``CONTAINERD_BUILDS`` names it, as both
here do: what a kill -9 leaves differs on each build (2.x an orphaned ``runc init``, 1.7 a
task it will not remove), and the whole directory costs ~25 s on 1.7. They are skipped, with the reason, when the machine cannot run it (not root, no
containerd/runc/ctr, no static busybox, no cgroup v1, no CRI stubs, no Go toolchain for the
grpc-go client).
"""

from __future__ import annotations

import os
import sys
from typing import Iterator, Optional

import pytest

from anolisnuma.testing.containerd import PrivateContainerd, cleanup_dead_instances
from anolisnuma.testing.containerd_builds import build_named, builds_for_tests, deselect_other_builds

BASE_PREFIX = "/tmp/anolisnuma-restart-"
RUN_PREFIX = "/run/anolisnuma-restart-"
LAST_LOG = "/tmp/anolisnuma-restart-last-containerd.log"


def containerd_skip_reason() -> Optional[str]:
    if os.geteuid() != 0:
        return "needs root (containerd, cgroups, mounts)"
    if not BUILDS:
        return "no containerd found: run scripts/install-deps.sh"
    for build in BUILDS:
        if build.missing():
            return build.missing()
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


BUILDS = builds_for_tests()
HERE = os.path.dirname(os.path.abspath(__file__))


def pytest_collection_modifyitems(config, items):  # type: ignore[no-untyped-def]
    deselect_other_builds(config, items, HERE, "containerd")


@pytest.fixture(scope="session", params=[b.name for b in BUILDS] or ["1.6"])
def containerd(request) -> Iterator[PrivateContainerd]:  # type: ignore[no-untyped-def]
    reason = containerd_skip_reason()
    if reason:
        pytest.skip(reason)
    cleanup_dead_instances(BASE_PREFIX, RUN_PREFIX)
    build = build_named(request.param)
    where = f"{os.getpid()}-{build.name.replace('.', '')}"
    pc = PrivateContainerd(f"{BASE_PREFIX}{where}", f"{RUN_PREFIX}{where}", cni=False, build=build)
    try:
        pc.start()
        pc.import_images()
        yield pc
    finally:
        problems = pc.cleanup(save_log=LAST_LOG.replace(".log", f"-{build.name}.log"))
        if problems:
            print(f"\nprivate containerd cleanup problems: {problems}", file=sys.stderr)
