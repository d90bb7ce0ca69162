"""Cgroup paths and files: the path rules for kubelet pods and containers, both cgroup
drivers, cgroup v1 and v2, and small, fast file reads and writes with typed errors.

Pod cgroup path rules (the kubelet's root, both drivers, validated IDs) are in
:mod:`anolisnuma.system.pod_cgroups`; a :class:`CgroupFs` carries the node's
:class:`~anolisnuma.system.pod_cgroups.KubeletCgroupLayout` so every user of the hierarchy
follows the same one. The names below are re-exported for the callers that import them here.

cgroup v1 has one hierarchy per controller: ``<root>/<controller>/<dir>``; cgroup v2 one
unified tree: ``<root>/<dir>``, detected by ``<root>/cgroup.controllers``.
"""

from __future__ import annotations

import errno
import os
from typing import Dict, List, Optional, Tuple

from anolisnuma.system.knobs import Knob
from anolisnuma.system.pod_cgroups import (  # noqa: F401 (re-exported)
    CONTAINER_ID_RE, DEFAULT_LAYOUT, POD_UID_RE, Driver, InvalidCgroupPath, KubeletCgroupLayout,
    KubeQosClass, PodCgroup, check_container_id, preview,
)

# Cap on what we read from one cgroup file: enough for every value file we read and for
# the task lists of any container; longer files are read in further chunks.
_READ_CHUNK = 65536


# The default layout's QoS-class directories (root "/"), per driver: the guaranteed level
# is ``kubepods`` itself.
QOS_CLASS_DIRS: Dict[Driver, Dict[KubeQosClass, str]] = DEFAULT_LAYOUT.qos_class_dirs


# ------------------------------------------------------------------------------- errors

class HostFileError(Exception):
    """A host file could not be read or written; ``path`` names it."""

    def __init__(self, path: str, message: str, err: Optional[int] = None) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.errno = err


class FileGone(HostFileError):
    """The file's directory does not exist (the pod or container was removed)."""


class KnobFileMissing(HostFileError):
    """The directory exists but the file does not (the kernel lacks the knob there)."""


class WriteRefused(HostFileError):
    """The kernel refused the write (EACCES, EPERM, EINVAL, EROFS, EBUSY, ...)."""


class ReadFailed(HostFileError):
    """The file exists but could not be read or did not hold what was expected."""


# ------------------------------------------------------------------------ file helpers

def read_text(path: str) -> str:
    """The whole content of a small kernel file.

    Raises :class:`FileGone` when the file or its directory is absent, :class:`ReadFailed`
    for any other error.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise FileGone(path, "does not exist", e.errno) from None
        raise ReadFailed(path, f"cannot open: {e.strerror}", e.errno) from None
    try:
        chunks = []
        while True:
            chunk = os.read(fd, _READ_CHUNK)
            if not chunk:
                break
            chunks.append(chunk)
            if len(chunk) < 4096 and len(chunks) == 1:
                # A short first answer is the whole file (value files are a few bytes);
                # skip the extra read. Longer ones (task lists) are read to EOF.
                break
    except OSError as e:
        if e.errno == errno.ENODEV:  # cgroup removed while open
            raise FileGone(path, "removed while reading", e.errno) from None
        raise ReadFailed(path, f"cannot read: {e.strerror}", e.errno) from None
    finally:
        os.close(fd)
    return b"".join(chunks).decode("ascii", "replace")


def directory_of_exists(path: str) -> bool:
    """Whether the directory holding the kernel file ``path`` exists: a file missing from
    an existing cgroup is a knob this kernel lacks; a missing cgroup is one that is gone."""
    return os.path.isdir(os.path.dirname(path))


def read_int(path: str) -> int:
    """The integer a knob file holds; raises like :func:`read_text`, or
    :class:`ReadFailed` if the content is not one integer."""
    text = read_text(path)
    try:
        return int(text.strip())
    except ValueError:
        raise ReadFailed(path, f"does not hold an integer: {text[:40]!r}") from None


def write_text(path: str, value: str) -> None:
    """Write ``value`` to an existing kernel file (never creates it).

    Raises :class:`FileGone` when the directory is absent, :class:`KnobFileMissing` when only
    the file is, :class:`WriteRefused` when the kernel refuses the value or the file.
    """
    data = value.encode("ascii")
    try:
        # O_TRUNC is what a shell's ">" does: kernel files ignore it, regular files (fake
        # trees) need it so a shorter value does not leave the tail of a longer one.
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
    except OSError as e:
        raise _write_error(path, e) from None
    try:
        os.write(fd, data)
    except OSError as e:
        raise _write_error(path, e) from None
    finally:
        os.close(fd)


def append_lines(path: str, values: List[str]) -> List[Tuple[str, int]]:
    """Write each of ``values`` to ``path`` with its own ``write()`` (what ``tasks`` files
    need: one ID per write). Returns ``(value, errno)`` for the values the kernel refused
    (e.g. ESRCH for a thread that exited); raises like :func:`write_text` when the file
    cannot be opened at all."""
    failed: List[Tuple[str, int]] = []
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    except OSError as e:
        raise _write_error(path, e) from None
    try:
        for v in values:
            try:
                os.write(fd, (v + "\n").encode("ascii"))
            except OSError as e:
                failed.append((v, e.errno or 0))
    finally:
        os.close(fd)
    return failed


def _write_error(path: str, e: OSError) -> HostFileError:
    if e.errno == errno.ENOENT:
        if os.path.isdir(os.path.dirname(path)):
            return KnobFileMissing(path, "file does not exist", e.errno)
        return FileGone(path, "directory does not exist", e.errno)
    if e.errno == errno.ENODEV:
        return FileGone(path, "cgroup removed", e.errno)
    return WriteRefused(path, f"write refused: {e.strerror} (errno {e.errno})", e.errno)


# --------------------------------------------------------------------------- path rules

def parse_cgroup_parent(cgroup_parent: str) -> PodCgroup:
    """:meth:`KubeletCgroupLayout.parse` of the default layout (kubelet root ``/``, either
    driver); code that has a :class:`CgroupFs` uses ``fs.layout.parse``."""
    return DEFAULT_LAYOUT.parse(cgroup_parent)


def pod_cgroup_for(driver: Driver, kube_class: KubeQosClass, uid: str) -> PodCgroup:
    """:meth:`KubeletCgroupLayout.pod_cgroup_for` of the default layout."""
    return DEFAULT_LAYOUT.pod_cgroup_for(driver, kube_class, uid)


# ----------------------------------------------------------------------- the hierarchy

class CgroupFs:
    """A cgroup mount (v1: the directory holding one mount per controller; v2: the unified
    mount). All paths it hands out are under ``root``."""

    def __init__(self, root: str, layout: Optional[KubeletCgroupLayout] = None) -> None:
        self.root = os.path.abspath(root)
        # (a layout of its own: what it reports once is reported per daemon, not per process)
        self.layout = layout if layout is not None else KubeletCgroupLayout()
        self.version = 2 if os.path.exists(os.path.join(self.root, "cgroup.controllers")) else 1

    def dir(self, controller: str, rel: str) -> str:
        """Absolute directory of ``rel`` in ``controller``'s hierarchy (``rel`` "" = root)."""
        base = self.root if self.version == 2 else os.path.join(self.root, controller)
        return os.path.join(base, rel) if rel else base

    def knob_path(self, knob: Knob, rel: str) -> str:
        if self.version == 2:
            return os.path.join(self.dir("", rel), knob.v2_name)
        return os.path.join(self.dir(knob.controller, rel), knob.name)

    def exists(self, rel: str, controller: str = "cpu") -> bool:
        return os.path.isdir(self.dir(controller, rel))

    def knob_missing_reason(self, knob: Knob, probe_cgroup: bool = True) -> Optional[str]:
        """``None`` when ``knob``'s file exists at the hierarchy root or in a ``kubepods``
        directory of either driver; else why it counts as unsupported.

        Some Anolis files exist only on non-root cgroups. When no ``kubepods`` directory
        exists yet (the daemon starts before the kubelet), and ``probe_cgroup`` allows it, a
        temporary empty cgroup ``anolisnuma-probe-<pid>`` is made to look, and removed.
        """
        base = self.dir(knob.controller, "")
        if not os.path.isdir(base):
            return (f"controller {knob.controller} not mounted at {base}" if self.version == 1
                    else f"no cgroup v2 tree at {base}")
        candidates = [""] + [r for r in self.layout.kubepods_dirs().values()
                             if os.path.isdir(self.dir(knob.controller, r))]
        for rel in candidates:
            if os.path.exists(self.knob_path(knob, rel)):
                return None
        if len(candidates) == 1 and probe_cgroup:
            present = self._probe_listing(knob.controller)
            if present is not None:
                name = knob.v2_name if self.version == 2 else knob.name
                return None if name in present else f"{knob.name} not in a new cgroup under {base}"
        return f"{self.knob_path(knob, '')} does not exist"

    def _probe_listing(self, controller: str) -> Optional[frozenset]:
        cache = self.__dict__.setdefault("_probe_cache", {})
        key = controller if self.version == 1 else ""
        if key not in cache:
            path = self.dir(controller, f"anolisnuma-probe-{os.getpid()}")
            try:
                os.mkdir(path)
            except OSError:
                cache[key] = None
            else:
                try:
                    cache[key] = frozenset(os.listdir(path))
                finally:
                    try:
                        os.rmdir(path)
                    except OSError:
                        pass
        return cache[key]

    def drivers_present(self) -> List[Driver]:
        """The cgroup drivers whose ``kubepods`` directory (under the kubelet's root) exists now."""
        return [d for d, rel in self.layout.kubepods_dirs().items() if self.exists(rel)]

    def locate_pod(self, uid: str) -> Optional[PodCgroup]:
        """Find the pod cgroup of ``uid`` among the places the kubelet may have made it
        (its layout's drivers and QoS classes; for pods recorded without a
        ``cgroup_parent``). ``None`` if it is nowhere or ``uid`` is malformed."""
        try:
            candidates = self.layout.candidates(uid)
        except InvalidCgroupPath:
            return None
        for pc in candidates:
            if self.exists(pc.rel) or self.exists(pc.rel, "memory"):
                return pc
        return None

    def task_ids_path(self, rel: str) -> str:
        """The file that lists every thread of the cgroup ``rel``."""
        if self.version == 2:
            return os.path.join(self.dir("", rel), "cgroup.threads")
        return os.path.join(self.dir("cpu", rel), "tasks")

    def task_ids(self, rel: str) -> List[str]:
        """Thread IDs in the cgroup ``rel`` as decimal strings (v1 ``tasks``; v2
        ``cgroup.threads``, or ``cgroup.procs`` where threads are not listed).
        Raises :class:`FileGone` if the cgroup is absent."""
        path = self.task_ids_path(rel)
        try:
            text = read_text(path)
        except FileGone:
            if self.version == 2 and os.path.isdir(self.dir("", rel)):
                text = read_text(os.path.join(self.dir("", rel), "cgroup.procs"))
            else:
                raise
        return text.split()


# ---------------------------------------------------------------------------- memory migration
MEMORY_MIGRATE = "cpuset.memory_migrate"


def enable_memory_migrate(fs: CgroupFs, pod_uid: str, container_ids: List[str]) -> List[str]:
    """cgroup v1: write ``1`` to ``cpuset.memory_migrate`` in the cpuset cgroup of each of
    the pod's containers, so that the kernel moves their pages when ``cpuset.mems`` changes
    next (the v1 default is 0: pages stay where they are). Paths are built from the
    validated pod UID and container IDs under ``fs.root`` only. Returns the problems (one
    line each); a container whose cgroup cannot be written is skipped.

    cgroup v2 has no such file: since Linux 5.15 every v2 cpuset migrates memory when its
    ``cpuset.mems`` changes; before 5.15 v2 never did. Nothing to write: returns ``[]``.
    """
    if fs.version == 2:
        return []
    try:
        pc = fs.locate_pod(pod_uid)
    except InvalidCgroupPath as e:
        return [str(e)]
    if pc is None:
        return [f"no cgroup found for pod {preview(pod_uid)} under {fs.root}"]
    problems: List[str] = []
    for cid in container_ids:
        try:
            path = os.path.join(fs.dir("cpuset", pc.container_rel(cid)), MEMORY_MIGRATE)
        except InvalidCgroupPath as e:
            problems.append(str(e))
            continue
        try:
            write_text(path, "1")
        except HostFileError as e:
            problems.append(str(e))
    return problems
