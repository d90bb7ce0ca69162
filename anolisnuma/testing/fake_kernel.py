"""Fake kernel trees for tests and benchmarks: cgroupfs (v1 or v2) with the knob files of
a kernel family (Alibaba Cloud Linux / Anolis, openEuler, both or neither: see
:func:`family_options`), ``/proc`` (``sys/kernel`` and ``sys/vm`` sysctls, ``cpuinfo``) and
resctrl (Intel, AMD, ARM MPAM).

Layouts follow the real kernels:

- cgroup v1: one directory per controller, ``<root>/cpu/...``, ``<root>/cpuacct/...``,
  ``<root>/cpuset/...``, ``<root>/memory/...``; each cgroup has ``tasks`` and
  ``cgroup.procs``; Anolis files ``cpu.bvt_warp_ns`` (cpu) and ``memory.priority``,
  ``memory.use_priority_oom``, ``memory.wmark_ratio``, ``memory.wmark_scale_factor``,
  ``memory.wmark_min_adj`` (memory). The root memcg has ``memory.use_priority_oom`` (the
  global switch) but not the per-cgroup files. openEuler files ``cpu.qos_level`` (cpu) and
  ``memory.qos_level`` (memory) are on every cgroup, the root one too (rubik's own check
  looks for ``/sys/fs/cgroup/cpu/cpu.qos_level``), with the switch
  ``/proc/sys/vm/memcg_qos_enable``.
- cgroup v2: one tree with ``cgroup.controllers`` at the root; same file names; each
  cgroup has ``cgroup.procs`` and ``cgroup.threads``.
- resctrl: root ``schemata``, ``tasks``, ``cpus``, ``info/last_cmd_status``,
  ``info/L3/{cbm_mask,min_cbm_bits,num_closids,shareable_bits}``,
  ``info/MB/{bandwidth_gran,min_bandwidth,num_closids,delay_linear}``. A fake cannot make
  files appear on ``mkdir``; :meth:`FakeResctrl.make_group` lays out a group as the kernel
  would, and the adapter itself tolerates a bare directory (see ``system/resctrl.py``).

What a fake cannot do: validate written values (the kernel's EINVAL), make files appear in
a new cgroup, move threads. A *read-only* file is made by bind-mounting it read-only when
running as root (writes fail with EROFS, reads work) or with mode 0444 otherwise; call
:meth:`FakeKernel.close` (or use the object as a context manager) to undo the mounts.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import tempfile
from typing import Dict, Iterable, List, Optional, Sequence

from anolisnuma.config import PathsConfig
from anolisnuma.system import knobs
from anolisnuma.system.pod_cgroups import DEFAULT_LAYOUT, Driver, KubeletCgroupLayout, KubeQosClass, PodCgroup

V1_CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory")
ANOLIS_KNOBS = tuple(k.name for k in knobs.ALINUX_CGROUP_KNOBS)
ROOT_ANOLIS_KNOBS = (knobs.MEMORY_USE_PRIORITY_OOM.name,)
OPENEULER_KNOBS = tuple(k.name for k in knobs.OPENEULER_CGROUP_KNOBS)
FRESH_VALUES: Dict[str, int] = {**knobs.ANOLIS_CGROUP_DEFAULTS, **knobs.OPENEULER_CGROUP_DEFAULTS}
ALINUX_RELEASE = "5.10.134-16.al8.x86_64"
OPENEULER_RELEASE = "5.10.0-182.0.0.95.oe2203sp3.x86_64"
MAINLINE_RELEASE = "6.18.0-1-amd64"

# The kernel families a fake host can be, as FakeKernel keyword arguments: adding a family
# is a row here (and its files in the knob table), not a new kind of tree.
FAMILIES: Dict[str, Dict[str, object]] = {
    knobs.ALINUX: dict(anolis=ANOLIS_KNOBS, openeuler=(), sched_group_identity_enabled=0,
                       memcg_qos_enable=None, release=ALINUX_RELEASE),
    knobs.OPENEULER: dict(anolis=(), openeuler=OPENEULER_KNOBS, sched_group_identity_enabled=None,
                          memcg_qos_enable=0, release=OPENEULER_RELEASE),
    "both": dict(anolis=ANOLIS_KNOBS, openeuler=OPENEULER_KNOBS, sched_group_identity_enabled=0,
                 memcg_qos_enable=0, release=OPENEULER_RELEASE),
    "mainline": dict(anolis=(), openeuler=(), sched_group_identity_enabled=None, memcg_qos_enable=None,
                     release=MAINLINE_RELEASE),
}


def family_options(family: str, **overrides: object) -> Dict[str, object]:
    """The FakeKernel keyword arguments of a host whose kernel is ``family``
    (``alinux``, ``openeuler``, ``both`` or ``mainline``), with ``overrides``."""
    return {**FAMILIES[family], **overrides}

# Ordinary files a cgroup has, per controller, with a plausible fresh value.
_V1_FILES: Dict[str, Dict[str, str]] = {
    "cpu": {"cpu.shares": "1024", "cpu.cfs_quota_us": "-1", "cpu.cfs_period_us": "100000"},
    "cpuacct": {"cpuacct.usage": "0"},
    "cpuset": {"cpuset.cpus": "0-3", "cpuset.mems": "0"},
    "memory": {"memory.limit_in_bytes": "9223372036854771712", "memory.usage_in_bytes": "0"},
}
_V2_FILES: Dict[str, str] = {
    "cpu.weight": "100", "cpu.max": "max 100000", "cpuset.cpus": "", "cpuset.mems": "",
    "memory.max": "max", "memory.current": "0",
}


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


class FakeCgroupTree:
    """A cgroup mount. ``anolis`` lists the Anolis knob files this kernel has (default: all;
    ``()`` = another kernel); ``root_anolis`` those also present on the root cgroup;
    ``openeuler`` the openEuler files (on every cgroup, the root one too)."""

    def __init__(self, root: str, version: int = 1, controllers: Sequence[str] = V1_CONTROLLERS,
                 anolis: Iterable[str] = ANOLIS_KNOBS, root_anolis: Iterable[str] = ROOT_ANOLIS_KNOBS,
                 kubepods: Sequence[Driver] = (Driver.CGROUPFS,),
                 layout: KubeletCgroupLayout = DEFAULT_LAYOUT, openeuler: Iterable[str] = ()) -> None:
        if version not in (1, 2):
            raise ValueError("version must be 1 or 2")
        self.root = root
        self.version = version
        self.controllers = tuple(controllers)
        self.anolis = frozenset(anolis)
        self.root_anolis = frozenset(root_anolis) & self.anolis
        self.openeuler = frozenset(openeuler)
        os.makedirs(root, exist_ok=True)
        if version == 2:
            _write(os.path.join(root, "cgroup.controllers"), "cpuset cpu io memory pids\n")
            _write(os.path.join(root, "cgroup.subtree_control"), "cpuset cpu io memory pids\n")
        for base in self._bases():
            os.makedirs(base, exist_ok=True)
            self._populate(base, self._controller_of(base), root=True)
        for driver in kubepods:
            for cls in KubeQosClass:
                self.make_dir(layout.qos_class_dirs[driver][cls])

    def _bases(self) -> List[str]:
        if self.version == 2:
            return [self.root]
        return [os.path.join(self.root, c) for c in self.controllers]

    def _controller_of(self, base: str) -> str:
        return "" if self.version == 2 else os.path.basename(base)

    def _populate(self, d: str, ctrl: str, root: bool = False, tids: Sequence[int] = ()) -> None:
        ids = "".join(f"{t}\n" for t in tids)
        if self.version == 2:
            _write(os.path.join(d, "cgroup.procs"), ids)
            _write(os.path.join(d, "cgroup.threads"), ids)
            if not root:
                _write(os.path.join(d, "cgroup.controllers"), "cpuset cpu io memory pids\n")
                for name, value in _V2_FILES.items():
                    _write(os.path.join(d, name), value + "\n")
            knob_set = [k for k in knobs.ALL_CGROUP_KNOBS]
        else:
            _write(os.path.join(d, "tasks"), ids)
            _write(os.path.join(d, "cgroup.procs"), ids)
            for name, value in _V1_FILES.get(ctrl, {}).items():
                _write(os.path.join(d, name), value + "\n")
            knob_set = [k for k in knobs.ALL_CGROUP_KNOBS if k.controller == ctrl]
        for k in knob_set:
            if (k.name in self.anolis and (not root or k.name in self.root_anolis)) or k.name in self.openeuler:
                name = k.v2_name if self.version == 2 else k.name
                _write(os.path.join(d, name), f"{FRESH_VALUES[k.name]}\n")

    def dirs(self, rel: str) -> List[str]:
        """The directory of ``rel`` in every hierarchy."""
        return [os.path.join(b, rel) if rel else b for b in self._bases()]

    def make_dir(self, rel: str, tids: Sequence[int] = ()) -> None:
        """Create cgroup ``rel`` (and missing parents) in every hierarchy, with its files."""
        parts = rel.strip("/").split("/")
        for base in self._bases():
            d = base
            for i, part in enumerate(parts):
                d = os.path.join(d, part)
                if not os.path.isdir(d):
                    # The kernel makes a cgroup with all its files at once: a reader racing
                    # with us (a hook running after its call returned) must never see the
                    # directory without its files. So populate aside, then rename.
                    tmp = tempfile.mkdtemp(prefix=f".{part}.", dir=os.path.dirname(d))
                    os.chmod(tmp, 0o755)
                    self._populate(tmp, self._controller_of(base), tids=tids if i == len(parts) - 1 else ())
                    try:
                        os.rename(tmp, d)
                    except OSError:
                        shutil.rmtree(tmp, ignore_errors=True)   # made meanwhile by another caller
                        if not os.path.isdir(d):
                            raise
                elif i == len(parts) - 1 and tids:
                    self._populate_tids(d, tids)

    def _populate_tids(self, d: str, tids: Sequence[int]) -> None:
        ids = "".join(f"{t}\n" for t in tids)
        names = ("cgroup.procs", "cgroup.threads") if self.version == 2 else ("tasks", "cgroup.procs")
        for n in names:
            _write(os.path.join(d, n), ids)

    def set_tids(self, rel: str, tids: Sequence[int]) -> None:
        for d in self.dirs(rel):
            self._populate_tids(d, tids)

    def remove(self, rel: str) -> None:
        """Remove cgroup ``rel`` (and below) from every hierarchy, like a pod going away.
        The directory goes with all its files at once, as the kernel's rmdir does: a
        reader racing with us sees it there whole or not at all (moved aside, then
        deleted), never a directory whose files are half gone."""
        for d in self.dirs(rel):
            if not os.path.isdir(d):
                continue
            aside = tempfile.mkdtemp(prefix=f".{os.path.basename(d)}.gone.", dir=os.path.dirname(d))
            try:
                os.rename(d, os.path.join(aside, "cgroup"))
            except OSError:
                pass   # removed meanwhile by another caller
            shutil.rmtree(aside, ignore_errors=True)

    def file(self, rel: str, name: str) -> str:
        """Path of file ``name`` (v1 name; its controller is looked up) in cgroup ``rel``."""
        knob = knobs.BY_NAME.get(name)
        if self.version == 2:
            return os.path.join(self.root, rel, knob.v2_name if knob else name)
        ctrl = knob.controller if knob else name.split(".", 1)[0]
        return os.path.join(self.root, ctrl, rel, name)

    def read(self, rel: str, name: str) -> str:
        with open(self.file(rel, name)) as f:
            return f.read().strip()

    def set(self, rel: str, name: str, value: object) -> None:
        _write(self.file(rel, name), f"{value}\n")


class FakeProc:
    """``<root>/sys/kernel/<sysctl>``, ``<root>/sys/vm/<sysctl>`` and ``<root>/cpuinfo``. A
    sysctl given as ``None`` is absent (kernel lacks it)."""

    def __init__(self, root: str, sched_group_identity_enabled: Optional[int] = 0,
                 sched_core: Optional[int] = None, vendor: str = "intel", memcg_qos_enable: Optional[int] = None,
                 release: str = ALINUX_RELEASE) -> None:
        self.root = root
        kernel = os.path.join(root, "sys", "kernel")
        os.makedirs(kernel, exist_ok=True)
        os.makedirs(os.path.join(root, "sys", "vm"), exist_ok=True)
        _write(os.path.join(kernel, "osrelease"), f"{release}\n")
        if sched_group_identity_enabled is not None:
            _write(os.path.join(kernel, "sched_group_identity_enabled"), f"{sched_group_identity_enabled}\n")
        if sched_core is not None:
            _write(os.path.join(kernel, "sched_core"), f"{sched_core}\n")
        if memcg_qos_enable is not None:
            _write(self.sysctl("vm/memcg_qos_enable"), f"{memcg_qos_enable}\n")
        self.set_vendor(vendor)

    def set_vendor(self, vendor: str) -> None:
        if vendor == "arm":
            block = ("processor\t: 0\nBogoMIPS\t: 200.00\nFeatures\t: fp asimd\n"
                     "CPU implementer\t: 0x48\nCPU architecture: 8\nCPU variant\t: 0x1\n"
                     "CPU part\t: 0xd01\nCPU revision\t: 0\n")
        else:
            vid = {"intel": "GenuineIntel", "amd": "AuthenticAMD", "hygon": "HygonGenuine"}.get(vendor, vendor)
            block = (f"processor\t: 0\nvendor_id\t: {vid}\ncpu family\t: 6\nmodel\t\t: 85\n"
                     f"flags\t\t: fpu rdt_a cat_l3 mba\n")
        _write(os.path.join(self.root, "cpuinfo"), block + "\n" + block.replace(": 0\n", ": 1\n", 1))

    def sysctl(self, name: str) -> str:
        """The file of sysctl ``name``: under ``sys/kernel`` unless ``name`` says where
        (``vm/memcg_qos_enable``)."""
        return os.path.join(self.root, "sys", name if "/" in name else os.path.join("kernel", name))

    def set_sysctl(self, name: str, value: int) -> None:
        _write(self.sysctl(name), f"{value}\n")

    def read_sysctl(self, name: str) -> str:
        with open(self.sysctl(name)) as f:
            return f.read().strip()


# Vendor presets: (bandwidth_gran, min_bandwidth, root MB value, delay_linear)
_MB_PRESETS = {"intel": (10, 10, 100, 1), "amd": (1, 0, 2048, None), "arm": (1, 1, 100, None)}


class FakeResctrl:
    """A mounted resctrl filesystem. ``l3_ways``/``cache_ids`` shape the L3 resource (set
    ``l3_ways=0`` for none), ``mb`` adds the MB resource with the ``vendor``'s units."""

    def __init__(self, root: str, vendor: str = "intel", l3_ways: int = 11,
                 cache_ids: Sequence[int] = (0, 1), min_cbm_bits: int = 1, num_closids: int = 16,
                 mb: bool = True, mb_num_closids: Optional[int] = None, cdp: bool = False,
                 shareable_bits: int = 0, mb_root_value: Optional[int] = None) -> None:
        self.root = root
        self.vendor = vendor
        info = os.path.join(root, "info")
        os.makedirs(info, exist_ok=True)
        _write(os.path.join(info, "last_cmd_status"), "ok\n")
        lines = []
        self.cbm_mask = (1 << l3_ways) - 1 if l3_ways else 0
        width = (l3_ways + 3) // 4
        if l3_ways:
            names = ("L3CODE", "L3DATA") if cdp else ("L3",)
            for name in names:
                d = os.path.join(info, name)
                os.makedirs(d, exist_ok=True)
                _write(os.path.join(d, "cbm_mask"), f"{self.cbm_mask:x}\n")
                _write(os.path.join(d, "min_cbm_bits"), f"{min_cbm_bits}\n")
                _write(os.path.join(d, "num_closids"), f"{num_closids // 2 if cdp else num_closids}\n")
                _write(os.path.join(d, "shareable_bits"), f"{shareable_bits:x}\n")
                lines.append(f"{name:>6}:" + ";".join(f"{i}={self.cbm_mask:0{width}x}" for i in cache_ids))
        if mb:
            gran, min_bw, root_value, delay = _MB_PRESETS.get(vendor, _MB_PRESETS["intel"])
            if mb_root_value is not None:
                root_value = mb_root_value
            d = os.path.join(info, "MB")
            os.makedirs(d, exist_ok=True)
            _write(os.path.join(d, "bandwidth_gran"), f"{gran}\n")
            _write(os.path.join(d, "min_bandwidth"), f"{min_bw}\n")
            _write(os.path.join(d, "num_closids"), f"{mb_num_closids or num_closids}\n")
            if delay is not None:
                _write(os.path.join(d, "delay_linear"), f"{delay}\n")
            lines.append("    MB:" + ";".join(f"{i}={root_value:>4}" for i in cache_ids))
        self.root_schemata = "\n".join(lines) + "\n"
        _write(os.path.join(root, "schemata"), self.root_schemata)
        _write(os.path.join(root, "tasks"), "1\n")
        _write(os.path.join(root, "cpus"), "f\n")

    def make_group(self, name: str, tasks: Sequence[int] = ()) -> str:
        """A group as the kernel lays it out after ``mkdir`` (schemata = root's values)."""
        d = os.path.join(self.root, name)
        os.makedirs(d, exist_ok=True)
        _write(os.path.join(d, "schemata"), self.root_schemata)
        _write(os.path.join(d, "tasks"), "".join(f"{t}\n" for t in tasks))
        _write(os.path.join(d, "cpus"), "0\n")
        return d

    def read(self, group: str, name: str) -> str:
        with open(os.path.join(self.root, group, name)) as f:
            return f.read()

    def tasks(self, group: str) -> List[str]:
        p = os.path.join(self.root, group, "tasks")
        if not os.path.exists(p):
            return []
        with open(p) as f:
            return f.read().split()


class FakeKernel:
    """A whole fake host under ``base``: ``cgroup/``, ``proc/``, ``resctrl/`` (optional),
    ``sys/``, ``state/``; :attr:`paths` points a :class:`PathsConfig` at them."""

    def __init__(self, base: str, cgroup_version: int = 1, anolis: Iterable[str] = ANOLIS_KNOBS,
                 root_anolis: Iterable[str] = ROOT_ANOLIS_KNOBS,
                 kubepods: Sequence[Driver] = (Driver.CGROUPFS, Driver.SYSTEMD),
                 sched_group_identity_enabled: Optional[int] = 0, sched_core: Optional[int] = None,
                 vendor: str = "intel", resctrl: Optional[dict] = None,
                 layout: KubeletCgroupLayout = DEFAULT_LAYOUT, openeuler: Iterable[str] = (),
                 memcg_qos_enable: Optional[int] = None, release: str = ALINUX_RELEASE) -> None:
        """``resctrl``: keyword arguments for :class:`FakeResctrl` (``{}`` = defaults for
        the vendor), or ``None`` for a kernel without resctrl. ``layout``: the kubelet's
        cgroup root the ``kubepods`` directories are made under. The defaults are an
        Alibaba Cloud Linux host; :func:`family_options` gives the others."""
        self.base = base
        self.layout = layout
        self.cgroup = FakeCgroupTree(os.path.join(base, "cgroup"), cgroup_version, anolis=anolis,
                                     root_anolis=root_anolis, kubepods=kubepods, layout=layout, openeuler=openeuler)
        self.proc = FakeProc(os.path.join(base, "proc"), sched_group_identity_enabled, sched_core, vendor,
                             memcg_qos_enable, release)
        self.resctrl: Optional[FakeResctrl] = None
        if resctrl is not None:
            self.resctrl = FakeResctrl(os.path.join(base, "resctrl"), vendor=vendor, **resctrl)
        os.makedirs(os.path.join(base, "sys"), exist_ok=True)
        self.paths = PathsConfig(
            cgroup_root=self.cgroup.root, resctrl_root=os.path.join(base, "resctrl"),
            sys_root=os.path.join(base, "sys"), proc_root=self.proc.root,
            state_dir=os.path.join(base, "state"),
            kubelet_cpu_manager_state=os.path.join(base, "cpu_manager_state"))
        self._mounts: List[str] = []
        self._owned = False

    @classmethod
    def temporary(cls, **kwargs: object) -> "FakeKernel":
        """A fake host in a new directory on tmpfs (``/dev/shm`` when there is one: file
        creation there is ~10x cheaper than on disk), removed again by :meth:`close`."""
        shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        fk = cls(tempfile.mkdtemp(prefix="anolisnuma-fake-", dir=shm), **kwargs)  # type: ignore[arg-type]
        fk._owned = True
        return fk

    def paths_table(self) -> Dict[str, str]:
        """The ``[paths]`` table of a daemon's config that points it at this fake host."""
        return dataclasses.asdict(self.paths)

    # -- pods ---------------------------------------------------------------------------
    def make_pod(self, cgroup_parent: str, tids: Sequence[int] = ()) -> PodCgroup:
        pc = self.layout.parse(cgroup_parent)
        self.cgroup.make_dir(pc.rel, tids)
        return pc

    def make_container(self, cgroup_parent: str, container_id: str, tids: Sequence[int] = ()) -> str:
        rel = self.layout.parse(cgroup_parent).container_rel(container_id)
        self.cgroup.make_dir(rel, tids)
        return rel

    # -- read-only files ----------------------------------------------------------------
    def make_readonly(self, path: str) -> None:
        """Make writes to ``path`` fail (EROFS as root via a read-only bind mount, else
        EACCES via mode 0444); reads keep working."""
        if os.geteuid() != 0:
            os.chmod(path, 0o444)
            return
        subprocess.run(["mount", "--bind", path, path], check=True, capture_output=True)
        self._mounts.append(path)
        subprocess.run(["mount", "-o", "remount,bind,ro", path], check=True, capture_output=True)

    def close(self) -> None:
        """Undo read-only bind mounts and remove a :meth:`temporary` tree (idempotent)."""
        while self._mounts:
            path = self._mounts.pop()
            subprocess.run(["umount", path], check=False, capture_output=True)
        if self._owned:
            self._owned = False
            shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> "FakeKernel":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["FakeKernel", "FakeCgroupTree", "FakeProc", "FakeResctrl", "ANOLIS_KNOBS",
           "ROOT_ANOLIS_KNOBS", "OPENEULER_KNOBS", "FAMILIES", "family_options", "V1_CONTROLLERS"]
