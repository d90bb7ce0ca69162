"""Where the kubelet puts pod cgroups: the one module that knows the layout.

The kubelet makes a pod's cgroup under its cgroup root (``--cgroup-root`` /
``cgroupRoot``, ``/`` unless set), in a directory per Kubernetes QoS class, and names it in
the ``cgroup_parent`` it sends with RunPodSandbox. With a root ``/custom`` (``/`` has no
prefix):

============  ===================================================  ==========================================
driver        pod cgroup (``cgroup_parent``)                       container cgroup
============  ===================================================  ==========================================
cgroupfs      ``/custom/kubepods/burstable/pod<uid>``              ``<pod dir>/<container id>``
              ``/custom/kubepods/besteffort/pod<uid>``
              ``/custom/kubepods/pod<uid>`` (guaranteed)
systemd       ``custom-kubepods-burstable-pod<uid_>.slice``        ``<pod dir>/cri-containerd-<id>.scope``
              ``custom-kubepods-besteffort-pod<uid_>.slice``
              ``custom-kubepods-pod<uid_>.slice`` (guaranteed)
============  ===================================================  ==========================================

The systemd driver joins the root's components and the kubelet's names with ``-`` (a ``-``
inside a component becomes ``_``, so ``<uid_>`` is the UID with underscores) and nests
each prefix as a slice: ``custom.slice/custom-kubepods.slice/custom-kubepods-burstable.slice/
<leaf>``. The kubelet may send the leaf or that expanded path; both are accepted.

``<uid>`` is an RFC 4122 UID (``8-4-4-4-12`` hex digits) or the 32 hex digits the kubelet
gives static pods. Container IDs are 64 lowercase hex digits.

Nothing a pod supplies reaches a path unless it matches one of these shapes exactly under
the configured root: the root comes from the operator (our ``[cgroups]`` keys) or the
kubelet's own configuration, never from a pod; from the ``cgroup_parent`` only the QoS
class (one of three words) and the validated UID are kept, and the path is rebuilt from
them. A ``cgroup_parent`` of another shape is refused (:class:`InvalidCgroupPath`), and
:meth:`KubeletCgroupLayout.unknown` says once what would fix it.
"""

from __future__ import annotations

import enum
import re
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

CONTAINER_ID_RE = re.compile(r"[0-9a-f]{64}")
_HEX = "[0-9a-fA-F]"
_UUID = "-".join(f"{_HEX}{{{n}}}" for n in (8, 4, 4, 4, 12))
_UUID_SYSTEMD = "_".join(f"{_HEX}{{{n}}}" for n in (8, 4, 4, 4, 12))
_STATIC_UID = f"{_HEX}{{32}}"
POD_UID_RE = re.compile(f"(?:{_UUID}|{_STATIC_UID})")
# One component of a cgroup root as an operator or a kubelet config may write it.
_ROOT_PART_RE = re.compile(r"[A-Za-z0-9_.@:+-]{1,64}")
_MAX_PARENT = 512

CONFIG_KEY_ROOT = "cgroups.kubelet_cgroup_root"
CONFIG_KEY_DRIVER = "cgroups.kubelet_cgroup_driver"


class Driver(str, enum.Enum):
    CGROUPFS = "cgroupfs"
    SYSTEMD = "systemd"


class KubeQosClass(str, enum.Enum):
    GUARANTEED = "guaranteed"
    BURSTABLE = "burstable"
    BESTEFFORT = "besteffort"


class InvalidCgroupPath(ValueError):
    """A ``cgroup_parent``, cgroup root or container ID that matches none of the known shapes."""


def preview(value: object, limit: int = 64) -> str:
    """A printable, bounded rendering of an untrusted value for log lines: non-ASCII,
    control characters, NUL and lone surrogates are escaped, long values cut."""
    if isinstance(value, str) and len(value) > limit:
        return ascii(value[:limit]) + f"...({len(value)} chars)"
    if isinstance(value, (bytes, bytearray)) and len(value) > limit:
        return ascii(bytes(value[:limit])) + f"...({len(value)} bytes)"
    return ascii(value)


def check_container_id(container_id: str) -> str:
    if not isinstance(container_id, str) or not CONTAINER_ID_RE.fullmatch(container_id):
        raise InvalidCgroupPath(f"not a container ID: {preview(container_id)}")
    return container_id


@dataclass(frozen=True)
class PodCgroup:
    """Where a pod's cgroup is, relative to each hierarchy root."""

    driver: Driver
    kube_class: KubeQosClass
    uid: str            # with dashes when it has them
    rel: str            # e.g. "kubepods/burstable/pod<uid>"

    def container_rel(self, container_id: str) -> str:
        """The container's directory relative to a hierarchy root.

        Raises :class:`InvalidCgroupPath` unless ``container_id`` is 64 lowercase hex digits.
        """
        check_container_id(container_id)
        if self.driver is Driver.SYSTEMD:
            return f"{self.rel}/cri-containerd-{container_id}.scope"
        return f"{self.rel}/{container_id}"


def parse_root(root: str) -> Tuple[str, ...]:
    """The components of a kubelet cgroup root written cgroupfs-style (``/``, ``/custom``,
    ``/a/b``), as the kubelet reads ``--cgroup-root``. Raises :class:`InvalidCgroupPath`
    for anything with ``.``/``..`` components or characters no cgroup name needs."""
    if not isinstance(root, str) or not root.startswith("/") or len(root) > 256:
        raise InvalidCgroupPath(f"not an absolute cgroup root: {preview(root)}")
    parts = tuple(p for p in root.split("/") if p)
    for p in parts:
        if p in (".", "..") or not _ROOT_PART_RE.fullmatch(p):
            raise InvalidCgroupPath(f"cgroup root component not allowed: {preview(p)} in {preview(root)}")
    return parts


def _systemd_escape(part: str) -> str:
    return part.replace("-", "_")


class KubeletCgroupLayout:
    """The kubelet's cgroup root and driver(s): parses ``cgroup_parent`` and builds pod
    and QoS-class directories (relative to a hierarchy root).

    ``root``: the kubelet's cgroup root, cgroupfs-style (``/`` default). ``drivers``: the
    drivers whose shapes are accepted (both unless one is known). ``origin``: where the
    layout came from, for messages (``default``, ``config``, the kubelet file that set it).
    Thread-safe (the unknown-layout report is guarded)."""

    def __init__(self, root: str = "/", drivers: Sequence[Driver] = (Driver.CGROUPFS, Driver.SYSTEMD),
                 origin: str = "default") -> None:
        self.root_parts = parse_root(root)
        self.root = "/" + "/".join(self.root_parts)
        self.drivers: Tuple[Driver, ...] = tuple(Driver(d) for d in drivers) or tuple(Driver)
        self.origin = origin
        self._lock = threading.Lock()
        self._reported = False
        self.unknown_seen = 0
        self.last_unknown = ""
        fs_prefix = "/".join(self.root_parts + ("kubepods",))
        sd_names = [_systemd_escape(p) for p in self.root_parts] + ["kubepods"]
        sd_slices = ["-".join(sd_names[:i + 1]) + ".slice" for i in range(len(sd_names))]
        sd_kubepods = "/".join(sd_slices)
        sd_prefix = "-".join(sd_names)
        self._sd_prefix = sd_prefix
        self.qos_class_dirs: Dict[Driver, Dict[KubeQosClass, str]] = {
            Driver.CGROUPFS: {
                KubeQosClass.GUARANTEED: fs_prefix,
                KubeQosClass.BURSTABLE: f"{fs_prefix}/burstable",
                KubeQosClass.BESTEFFORT: f"{fs_prefix}/besteffort",
            },
            Driver.SYSTEMD: {
                KubeQosClass.GUARANTEED: sd_kubepods,
                KubeQosClass.BURSTABLE: f"{sd_kubepods}/{sd_prefix}-burstable.slice",
                KubeQosClass.BESTEFFORT: f"{sd_kubepods}/{sd_prefix}-besteffort.slice",
            },
        }
        self._cgroupfs_re = re.compile(
            "/?" + re.escape(fs_prefix)
            + f"(?:/(?P<cls>burstable|besteffort))?/pod(?P<uid>{_UUID}|{_STATIC_UID})")
        self._systemd_leaf_re = re.compile(
            re.escape(sd_prefix)
            + f"(?:-(?P<cls>burstable|besteffort))?-pod(?P<uid>{_UUID_SYSTEMD}|{_STATIC_UID})\\.slice")

    # ------------------------------------------------------------------ describing
    def describe(self) -> str:
        drivers = "/".join(d.value for d in self.drivers)
        return f"cgroup root {self.root}, driver {drivers} (from {self.origin})"

    def as_dict(self) -> Dict[str, object]:
        return {"root": self.root, "drivers": [d.value for d in self.drivers], "origin": self.origin,
                "kubepods": {d.value: self.qos_class_dirs[d][KubeQosClass.GUARANTEED] for d in self.drivers},
                "unknown_cgroup_parents": self.unknown_seen,
                "last_unknown": self.last_unknown or None}

    def kubepods_dirs(self) -> Dict[Driver, str]:
        """The kubelet's top pod directory per accepted driver (relative)."""
        return {d: self.qos_class_dirs[d][KubeQosClass.GUARANTEED] for d in self.drivers}

    # ------------------------------------------------------------------ parsing, building
    def parse(self, cgroup_parent: str) -> PodCgroup:
        """Map a kubelet ``cgroup_parent`` to its pod cgroup. Raises
        :class:`InvalidCgroupPath` for anything but the shapes of this layout."""
        if not isinstance(cgroup_parent, str) or len(cgroup_parent) > _MAX_PARENT:
            raise InvalidCgroupPath(f"cgroup_parent not recognized: {preview(cgroup_parent)}")
        if Driver.CGROUPFS in self.drivers:
            m = self._cgroupfs_re.fullmatch(cgroup_parent)
            if m:
                cls = _kube_class(m.group("cls"))
                return self.pod_cgroup_for(Driver.CGROUPFS, cls, m.group("uid"))
        if Driver.SYSTEMD in self.drivers:
            leaf = cgroup_parent
            expanded = "/" in cgroup_parent
            if expanded:
                leaf = cgroup_parent.rstrip("/").rsplit("/", 1)[-1]
            m = self._systemd_leaf_re.fullmatch(leaf)
            if m:
                cls = _kube_class(m.group("cls"))
                pc = self.pod_cgroup_for(Driver.SYSTEMD, cls, m.group("uid").replace("_", "-"))
                if expanded and cgroup_parent.strip("/") != pc.rel:
                    raise InvalidCgroupPath(f"cgroup_parent not recognized: {preview(cgroup_parent)}")
                return pc
        raise InvalidCgroupPath(f"cgroup_parent not recognized: {preview(cgroup_parent)}")

    def pod_cgroup_for(self, driver: Driver, kube_class: KubeQosClass, uid: str) -> PodCgroup:
        """The pod cgroup the kubelet makes for ``uid`` (raises :class:`InvalidCgroupPath` for
        a malformed UID)."""
        if not isinstance(uid, str) or not POD_UID_RE.fullmatch(uid):
            raise InvalidCgroupPath(f"not a pod UID: {preview(uid)}")
        base = self.qos_class_dirs[driver][kube_class]
        if driver is Driver.SYSTEMD:
            prefix = self._sd_prefix if kube_class is KubeQosClass.GUARANTEED else \
                f"{self._sd_prefix}-{kube_class.value}"
            return PodCgroup(driver, kube_class, uid, f"{base}/{prefix}-pod{_systemd_escape(uid)}.slice")
        return PodCgroup(driver, kube_class, uid, f"{base}/pod{uid}")

    def candidates(self, uid: str) -> List[PodCgroup]:
        """Every place this layout may have put ``uid``'s cgroup (raises for a bad UID)."""
        return [self.pod_cgroup_for(d, c, uid) for d in self.drivers for c in KubeQosClass]

    def pod_uid_from_cgroup_path(self, path: str) -> Optional[str]:
        """The pod UID in a cgroup path as ``/proc/<pid>/cgroup`` shows it (a container's
        directory or deeper), or ``None`` when the path is not inside a pod cgroup of this
        layout. A prefix before the root (a node in a container) is allowed."""
        if not isinstance(path, str) or len(path) > 4096:
            return None
        parts = path.split("/")
        n = len(self.root_parts)
        for i, part in enumerate(parts):
            if part == "kubepods" and Driver.CGROUPFS in self.drivers and i >= n:
                j = i + 1
                if j < len(parts) and parts[j] in ("burstable", "besteffort"):
                    j += 1
                if j < len(parts) and parts[j].startswith("pod"):
                    try:
                        return self.parse("/" + "/".join(parts[i - n:j + 1])).uid
                    except InvalidCgroupPath:
                        return None
            elif Driver.SYSTEMD in self.drivers and part.endswith(".slice") and "-pod" in part:
                try:
                    return self.parse(part).uid
                except InvalidCgroupPath:
                    continue
        return None

    # ------------------------------------------------------------------ what does not fit
    def unknown(self, cgroup_parent: str) -> Tuple[bool, str]:
        """Count a ``cgroup_parent`` this layout refused; returns (first time for this
        layout, what would fix it). The first refusal is the one to report at warning:
        every pod of a node with another root is refused alike."""
        hint = self.hint(cgroup_parent)
        with self._lock:
            first = not self._reported
            self._reported = True
            self.unknown_seen += 1
            self.last_unknown = preview(cgroup_parent)
        return first, hint

    def hint(self, cgroup_parent: str) -> str:
        """What would make ``cgroup_parent`` recognized: the config key, with the root it
        looks like when it has a kubelet shape under another root (a guess, never used
        to build a path)."""
        guess = guess_root(cgroup_parent)
        have = f"the layout is {self.describe()}"
        if guess is not None and guess[0] != self.root:
            return (f"{have}; the pod looks like a kubelet --cgroup-root={guess[0]} with the {guess[1].value} "
                    f"driver: set [cgroups] kubelet_cgroup_root = \"{guess[0]}\" (or make the kubelet's "
                    f"config readable for kubelet_cgroup_root = \"auto\")")
        if guess is not None and guess[1] not in self.drivers:
            return f"{have}; the pod looks like the {guess[1].value} driver: set [cgroups] kubelet_cgroup_driver"
        return (f"{have}; not a kubelet pod cgroup shape (is --cgroups-per-qos off?): set [cgroups] "
                f"kubelet_cgroup_root and kubelet_cgroup_driver to the kubelet's --cgroup-root and --cgroup-driver")


_GUESS_FS = re.compile(f"(?P<root>(?:/[A-Za-z0-9_.@:+-]{{1,64}}){{0,8}})/kubepods(?:/(?:burstable|besteffort))?"
                       f"/pod(?:{_UUID}|{_STATIC_UID})")
_GUESS_SD = re.compile(f"(?P<prefix>[A-Za-z0-9_.@:+-]{{0,200}}?)-?kubepods(?:-(?:burstable|besteffort))?"
                       f"-pod(?:{_UUID_SYSTEMD}|{_STATIC_UID})\\.slice")


def guess_root(cgroup_parent: str) -> Optional[Tuple[str, Driver]]:
    """(root, driver) that a kubelet would have had to send ``cgroup_parent``, or None.
    For messages only."""
    if not isinstance(cgroup_parent, str) or len(cgroup_parent) > _MAX_PARENT:
        return None
    m = _GUESS_FS.fullmatch(cgroup_parent)
    if m:
        return (m.group("root") or "/", Driver.CGROUPFS)
    leaf = cgroup_parent.rstrip("/").rsplit("/", 1)[-1]
    m = _GUESS_SD.fullmatch(leaf)
    if m:
        prefix = m.group("prefix").strip("-")
        return ("/" + prefix.replace("-", "/") if prefix else "/", Driver.SYSTEMD)
    return None


def _kube_class(group: Optional[str]) -> KubeQosClass:
    return KubeQosClass(group) if group else KubeQosClass.GUARANTEED


DEFAULT_LAYOUT = KubeletCgroupLayout()

# Reads the kubelet's cgroup settings from its unit, environment and config files below a
# root: ``{"root": setting, "driver": setting}``, each with ``.value`` and ``.origin``.
# The reader is `anolisnuma-ctl kubelet`'s, passed in by the daemon: this layer does not
# import the ctl layer (which imports the config, which imports this module).
KubeletSettingsReader = Callable[[str], Mapping[str, Any]]


def resolve_layout(cgroups_config: object = None, log: object = None,
                   kubelet_settings: Optional[KubeletSettingsReader] = None) -> KubeletCgroupLayout:
    """The layout a ``[cgroups]`` section (:class:`anolisnuma.config.CgroupsConfig`; ``None``:
    all "auto") names: its keys where set, else what the kubelet's flags and config files
    below ``kubelet_files_root`` say (read by ``kubelet_settings``; ``None``: not read),
    else the kubelet's defaults (root ``/``, both drivers' shapes). Never raises: a kubelet
    setting that cannot be read or is not a cgroup root is logged (``log``, a structlog
    logger) and the default taken."""
    root = getattr(cgroups_config, "kubelet_cgroup_root", "auto")
    driver = getattr(cgroups_config, "kubelet_cgroup_driver", "auto")
    files_root = getattr(cgroups_config, "kubelet_files_root", "/")
    origins: List[str] = []
    if root == "auto" or driver == "auto":
        kubelet = _kubelet_settings(kubelet_settings, files_root, log)
        if root == "auto":
            setting = kubelet.get("root")
            root = "/"
            if setting is not None and setting.value:
                try:
                    parse_root(setting.value)
                    root = setting.value
                    origins.append(setting.origin)
                except InvalidCgroupPath as e:
                    _warn(log, "kubelet cgroup root not usable; assuming /", error=str(e),
                          origin=setting.origin, fix="set [cgroups] kubelet_cgroup_root")
        else:
            origins.append(CONFIG_KEY_ROOT)
        if driver == "auto":
            setting = kubelet.get("driver")
            if setting is not None and setting.value in (Driver.CGROUPFS.value, Driver.SYSTEMD.value):
                driver = setting.value
                origins.append(setting.origin)
        else:
            origins.append(CONFIG_KEY_DRIVER)
    else:
        origins += [CONFIG_KEY_ROOT, CONFIG_KEY_DRIVER]
    drivers = tuple(Driver) if driver == "auto" else (Driver(driver),)
    layout = KubeletCgroupLayout(root, drivers, "; ".join(origins) or "kubelet defaults")
    if log is not None:
        log.info("kubelet cgroup layout", cgroup_root=layout.root, drivers=[d.value for d in layout.drivers],
                 origin=layout.origin)
    return layout


def _kubelet_settings(read: Optional[KubeletSettingsReader], files_root: str, log: object) -> Mapping[str, Any]:
    if read is None:
        return {}
    try:
        return read(files_root)
    except Exception as e:   # an unreadable kubelet setup must not keep the policies off
        _warn(log, "cannot read the kubelet's cgroup settings; assuming its defaults", error=repr(e),
              fix="set [cgroups] kubelet_cgroup_root and kubelet_cgroup_driver")
        return {}


def _warn(log: object, message: str, **kw: object) -> None:
    if log is not None:
        log.warning(message, **kw)   # type: ignore[attr-defined]
