"""End-to-end fixtures: one private real containerd per test session.

Every test module in this directory is skipped, with the reason, when the machine cannot run
it: not root, no ``containerd``/``runc``/``ctr`` binary, no static busybox, or the CRI stubs
(``cri_api``, Python >= 3.10) are missing.

Fixtures:
  ``containerd``      session, once per containerd build (``[1.6]``: Debian's, ``[1.7]`` and
                      ``[2.2]``: the v1.7.34 and v2.2.7 of ../shared;
                      anolisnuma/testing/containerd_builds.py): a started ``PrivateContainerd``
                      (CNI bridge on, test images imported, NRI on a private socket where the
                      build has NRI) under /tmp/anolisnuma-e2e-<pid>-<build> and
                      /run/anolisnuma-e2e-<pid>-<build>; everything it created is removed at
                      session end, even after failures.
                      A module that checks the proxy rather than the runtime (floods, large
                      messages, soaks) sets ``CONTAINERD_BUILDS = ("1.6",)`` and runs on that
                      build only; a module without one runs on 1.6 and 2.2. 1.7 runs where a
                      module names it: NRI mode's (test_nri_e2e, test_nri_cluster_e2e: its NRI
                      v0.8.0 is neither end's), the CRI surface and pod lifecycles through the
                      proxy and a containerd restart under it (test_proxy_e2e: v1alpha2 as
                      1.6, GetContainerEvents as 2.2 but each event to one stream only) and
                      the harness itself (test_containerd_direct). Every other module passed
                      on 1.7 too (2026-12-05, 49 tests, ~95 s); they stay on the two ends
                      for CI's 25-minute budget, where the conformance gate on 1.7 already
                      takes ~3 minutes.
  ``kubelet_direct``  function: a ``KubeletLike`` on containerd's own socket; the pods and
                      containers it created are removed after the test.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from typing import Iterator, Optional

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:  # so test modules can `from cri_client import ...`
    sys.path.insert(0, HERE)

from anolisnuma.testing.containerd import PrivateContainerd, cleanup_dead_instances  # noqa: E402
from anolisnuma.testing.containerd_builds import build_named, builds_for_tests, deselect_other_builds  # noqa: E402

BASE_PREFIX = "/tmp/anolisnuma-e2e-"
RUN_PREFIX = "/run/anolisnuma-e2e-"
# containerd.log of the last session is copied here (the base dir itself is removed).
LAST_LOG = "/tmp/anolisnuma-e2e-last-containerd.log"


BUILDS = builds_for_tests()


def _skip_reason() -> Optional[str]:
    if os.geteuid() != 0:
        return "end-to-end tests need root (containerd, cgroups, mounts)"
    if not BUILDS:
        return "no containerd found: run scripts/install-deps.sh"
    for build in BUILDS:
        if build.missing():
            return f"{build.missing()} (ANOLISNUMA_CONTAINERDS picks the builds to run)"
    if shutil.which("runc", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") is None:
        return "runc not found: run scripts/install-deps.sh"
    if not os.path.exists("/bin/busybox"):
        return "/bin/busybox not found: install busybox-static"
    if not os.path.isdir("/sys/fs/cgroup/cpu"):
        return "needs the cgroup v1 hierarchies under /sys/fs/cgroup"
    from cri_client import CRI_IMPORT_ERROR
    if CRI_IMPORT_ERROR:
        return CRI_IMPORT_ERROR
    return None


SKIP_REASON = _skip_reason()


class _SkippedModule(pytest.Module):
    def collect(self):  # type: ignore[override]
        pytest.skip(SKIP_REASON or "", allow_module_level=True)


def pytest_pycollect_makemodule(module_path, parent):  # type: ignore[no-untyped-def]
    """Skip each test module here (instead of failing its import) when the machine lacks
    what the end-to-end tests need."""
    if SKIP_REASON is not None:
        return _SkippedModule.from_parent(parent, path=module_path)
    return None


def pytest_configure(config):  # type: ignore[no-untyped-def]
    config.addinivalue_line(
        "markers", "containerd: needs the private real containerd started by the test harness")


def pytest_collection_modifyitems(config, items):  # type: ignore[no-untyped-def]
    """Mark every test of this directory ``containerd`` (``-m "not containerd"`` skips them),
    and leave out the runs on builds a module does not take (``CONTAINERD_BUILDS``)."""
    for item in items:
        if str(item.path).startswith(HERE + os.sep):
            item.add_marker(pytest.mark.containerd)
    deselect_other_builds(config, items, HERE, "containerd")


@pytest.fixture(scope="session", params=[b.name for b in BUILDS] or ["1.6"])
def containerd(request) -> Iterator[PrivateContainerd]:  # type: ignore[no-untyped-def]
    """A running private containerd of one build (CNI on, images imported).
    ``.cold_start_s`` holds the seconds it took from nothing to images imported."""
    cleanup_dead_instances(BASE_PREFIX, RUN_PREFIX)  # leftovers of crashed sessions
    build = build_named(request.param)
    where = f"{os.getpid()}-{build.name.replace('.', '')}"
    # NRI on (private socket) where the build has it: 1.7 ships it off, NRI mode's tests need it
    pc = PrivateContainerd(f"{BASE_PREFIX}{where}", f"{RUN_PREFIX}{where}", cni=True, build=build,
                           nri=build.has_nri or None)
    try:
        t0 = time.monotonic()
        pc.start()
        pc.import_images()
        pc.cold_start_s = time.monotonic() - t0  # type: ignore[attr-defined]
        yield pc
    finally:
        problems = pc.cleanup(save_log=LAST_LOG.replace(".log", f"-{build.name}.log"))
        if problems:
            print(f"\nprivate containerd cleanup problems: {problems}", file=sys.stderr)


def _kubelet_on(socket_path: str, containerd: PrivateContainerd, what: str):  # type: ignore[no-untyped-def]
    """A KubeletLike on ``socket_path``; what it created is removed afterwards."""
    from cri_client import KubeletLike

    kl = KubeletLike(socket_path, harness=containerd)
    try:
        yield kl
    finally:
        errors = kl.cleanup()
        kl.close()
        if errors:
            print(f"\n{what} cleanup errors: {errors}", file=sys.stderr)


@pytest.fixture
def kubelet_direct(containerd: PrivateContainerd):  # type: ignore[no-untyped-def]
    """A KubeletLike on containerd's own socket."""
    yield from _kubelet_on(containerd.socket, containerd, "kubelet_direct")


@pytest.fixture
def proxy(containerd: PrivateContainerd, tmp_path):  # type: ignore[no-untyped-def]
    """anolisnuma (no policy hooks) running in this process in front of the private
    containerd; ``.socket`` is where to connect, ``.daemon`` the Daemon object."""
    from anolisnuma.testing.proxy import InProcessProxy

    with InProcessProxy.for_backend(containerd.socket, str(tmp_path)) as p:
        yield p


@pytest.fixture
def kubelet(proxy, containerd: PrivateContainerd):  # type: ignore[no-untyped-def]
    """A KubeletLike talking to containerd through the proxy."""
    yield from _kubelet_on(proxy.socket, containerd, "kubelet")
