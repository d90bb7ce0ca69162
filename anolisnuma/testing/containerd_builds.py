"""Which containerd the tests run: Debian's 1.6 and the 1.7 and 2.2 builds of ``../shared``.

Debian ships containerd 1.6.20; many Kubernetes nodes run 1.7, most newer ones 2.x. The
tests start any of them as their private instance
(:class:`~anolisnuma.testing.containerd.PrivateContainerd`), so that what the proxy promises
(every call passes as if it were not there) and what NRI mode does are checked on each.

- ``1.6``: ``containerd``, ``ctr`` and ``containerd-shim-runc-v2`` on ``PATH`` (Debian's
  package, installed by ``scripts/install-deps.sh``); no NRI;
- ``1.7``: the same three of containerd v1.7.34 in ``$ANOLISNUMA_CONTAINERD17_DIR``, else
  ``<repo>/../shared/containerd-1.7`` (CI's layout), else ``/work/shared/containerd-1.7``;
  NRI v0.8.0, off unless its configuration turns it on;
- ``2.2``: the same three of containerd v2.2.7 in ``$ANOLISNUMA_CONTAINERD22_DIR``, else
  ``<repo>/../shared/containerd-2.2``, else ``/work/shared/containerd-2.2``; NRI v0.11.0, on
  by default.

containerd finds its shim on ``PATH``, so a build of a directory runs with that directory
first on it (Debian's 1.6 shim is not the one 1.7 or 2.x were built with). The directories
are the test machine's owner's (root): whoever can write them chooses the binaries every
containerd test runs as root, as with any binary on ``PATH``.

``$ANOLISNUMA_CONTAINERDS`` (e.g. ``1.6`` or ``1.6,1.7,2.2``) narrows which the tests run; by
default every build this machine has.

Every containerd test runs on 1.6 and 2.2 (``EVERY_TEST_BUILDS``), the two ends. 1.7 runs
the conformance gate and the test modules that name it in their ``CONTAINERD_BUILDS``
(:func:`runs_on`): NRI mode's (its NRI v0.8.0 is neither end's), the CRI surface and the
restarts and kill -9 (where it differs from both ends), within CI's time budget.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BINARIES = ("containerd", "ctr", "containerd-shim-runc-v2")
ENV_BUILDS = "ANOLISNUMA_CONTAINERDS"
ENV_17_DIR = "ANOLISNUMA_CONTAINERD17_DIR"
ENV_22_DIR = "ANOLISNUMA_CONTAINERD22_DIR"


@dataclass(frozen=True)
class ContainerdBuild:
    """One containerd to test against: a name the tests carry (``1.6``, ``1.7``, ``2.2``: its
    release) and where its binaries are (``bin_dir`` None: found on ``PATH``)."""

    name: str
    bin_dir: Optional[str] = None

    def binary(self, name: str) -> str:
        if self.bin_dir is not None:
            return os.path.join(self.bin_dir, name)
        return shutil.which(name) or name

    @property
    def containerd(self) -> str:
        return self.binary("containerd")

    @property
    def ctr(self) -> str:
        return self.binary("ctr")

    @property
    def release(self) -> Tuple[int, int]:
        """(major, minor) of the name: ``1.7`` -> (1, 7)."""
        major, minor = self.name.split(".")[:2]
        return int(major), int(minor)

    @property
    def major(self) -> int:
        return self.release[0]

    @property
    def has_nri(self) -> bool:
        """NRI came with containerd 1.7."""
        return self.release >= (1, 7)

    @property
    def streams_container_events(self) -> bool:
        """The CRI's GetContainerEvents (the kubelet's evented PLEG) came with 1.7; 1.6
        answers UNIMPLEMENTED."""
        return self.release >= (1, 7)

    @property
    def container_events_to_every_stream(self) -> bool:
        """2.x tells each container event on every GetContainerEvents stream; 1.7 reads all
        streams off one channel, so each event goes to one of them only (seen on 1.7.34: two
        streams on its own socket, four containers, each event told on one). A second
        subscriber there (a test's stream beside the kubelet's) takes events from the first."""
        return self.release >= (2, 0)

    @property
    def serves_cri_v1alpha2(self) -> bool:
        """2.0 dropped the CRI's v1alpha2 API."""
        return self.release < (2, 0)

    @property
    def nri_by_default(self) -> bool:
        """1.7 ships NRI disabled (its ``DefaultConfig`` says ``Disable: true``); 2.x enabled."""
        return self.release >= (2, 0)

    def missing(self) -> Optional[str]:
        """Why this build cannot run here; None when it can."""
        for name in BINARIES:
            path = self.binary(name)
            if not (os.path.isabs(path) and os.access(path, os.X_OK)):
                where = self.bin_dir or "PATH"
                return f"containerd {self.name}: {name} not found in {where}"
        return None

    def path_env(self, path: str) -> str:
        """``PATH`` for the instance: this build's directory first, so that containerd
        runs its own shim."""
        return f"{self.bin_dir}:{path}" if self.bin_dir else path

    def version(self) -> str:
        """``containerd --version``'s version word (``1.6.20~ds1``, ``v2.2.7``)."""
        try:
            out = subprocess.run([self.containerd, "--version"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            return "?"
        words = out.split()
        return words[2] if len(words) > 2 else out.strip() or "?"


DEBIAN = ContainerdBuild("1.6")


def shared_dir(name: str, env: str) -> str:
    """``$env``, else ``<repo>/../shared/<name>`` (CI's layout), else ``/work/shared/<name>``."""
    given = os.environ.get(env)
    if given:
        return given
    beside = os.path.normpath(os.path.join(REPO_ROOT, "..", "shared", name))
    return beside if os.path.isdir(beside) else os.path.join("/work/shared", name)


def containerd_17() -> ContainerdBuild:
    return ContainerdBuild("1.7", shared_dir("containerd-1.7", ENV_17_DIR))


def containerd_22() -> ContainerdBuild:
    return ContainerdBuild("2.2", shared_dir("containerd-2.2", ENV_22_DIR))


def known_builds() -> List[ContainerdBuild]:
    return [DEBIAN, containerd_17(), containerd_22()]


def build_named(name: str) -> ContainerdBuild:
    for b in known_builds():
        if b.name == name:
            return b
    raise ValueError(f"no containerd build named {name!r} (known: {', '.join(b.name for b in known_builds())})")


# The builds every containerd test runs on; the others run where a module names them.
EVERY_TEST_BUILDS = ("1.6", "2.2")


def runs_on(build: str, wanted: Optional[Sequence[str]]) -> bool:
    """Whether a test of a module whose ``CONTAINERD_BUILDS`` is ``wanted`` (None: the
    module sets none) runs on ``build``."""
    return build in (EVERY_TEST_BUILDS if wanted is None else wanted)


def deselect_other_builds(config: Any, items: List[Any], here: str, param: str) -> None:
    """For a directory's ``pytest_collection_modifyitems``: leave out the items under
    ``here`` whose build (the ``param`` fixture's parameter) their module does not run on
    (:func:`runs_on`), reported to pytest as deselected."""
    kept, dropped = [], []
    for item in items:
        build = getattr(getattr(item, "callspec", None), "params", {}).get(param)
        if build is None or not str(item.path).startswith(here + os.sep):
            kept.append(item)
            continue
        (kept if runs_on(build, getattr(item.module, "CONTAINERD_BUILDS", None)) else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def builds_for_tests() -> List[ContainerdBuild]:
    """The builds the tests run on: ``$ANOLISNUMA_CONTAINERDS`` when set, else every known
    build present on this machine. A build named there and missing here raises
    RuntimeError (CI names them all: a machine without one must fail, not skip it)."""
    wanted = os.environ.get(ENV_BUILDS, "").strip()
    if not wanted:
        return [b for b in known_builds() if b.missing() is None]
    builds = [build_named(n.strip()) for n in wanted.split(",") if n.strip()]
    for b in builds:
        if b.missing():
            raise RuntimeError(f"{ENV_BUILDS}={wanted}: {b.missing()}")
    return builds
