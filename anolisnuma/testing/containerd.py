"""A private, real containerd for end-to-end tests and local runs.

``PrivateContainerd`` runs ``containerd --config FILE`` with its own root, state dir, gRPC
socket, runc root and CNI config, so it never touches a system containerd or another test
run. Everything it creates is recorded in ``<base_dir>/harness.json``, so ``cleanup()`` also
works from another process (``scripts/private-containerd stop``) or after a crash.

What cleanup removes, and only that: containers under our runc root, our containerd and the
shims bound to our socket (matched by exact command-line arguments, never by name), mounts
under our base/run dirs, our CNI bridge and CNI result-cache files, cgroup dirs under
``/kubepods*`` that did not exist when we first started (``rmdir`` only, so a cgroup that is
in use is never touched; and only when no other private containerd runs on the host: an empty
cgroup of another instance, a pod's made ahead of its containers or one runc has just made
and not yet put its process in, is in use all the same, see :data:`HOST_LOCK`), shared dirs we created (``/run/containerd/s``, ``/var/lib/cni``)
when no other containerd runs, and finally the base/run dirs.

Needs root, the ``containerd``, ``runc`` and ``ctr`` binaries, and ``ip`` for the bridge.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from typing import Collection, Dict, Iterable, List, Optional, Set, Tuple

from anolisnuma.state.persist import atomic_write_bytes
from anolisnuma.testing.containerd_builds import DEBIAN, ContainerdBuild
from anolisnuma.testing.images import IMAGES, PAUSE_IMAGE, build_image_archive

__all__ = ["PrivateContainerd", "PrivateContainerdError", "ensure_private_containerd",
           "cleanup_dead_instances", "make_pod_cgroup", "remove_pod_cgroup",
           "cgroup_hierarchies", "mounts_under", "other_containerd_running", "IMAGES",
           "PAUSE_IMAGE", "oom_score_adj_restricted", "release_of_version"]

CGROUP_ROOT = "/sys/fs/cgroup"
CRI_NAMESPACE = "k8s.io"
CNI_BIN_DIR = "/usr/lib/cni"
CNI_RESULTS_DIR = "/var/lib/cni/results"
# containerd 1.6 hard-codes the shim socket dir; libcni hard-codes its result cache.
SHARED_DIRS = ("/run/containerd/s", "/run/containerd", CNI_RESULTS_DIR, "/var/lib/cni")

_CGROUP_PARENT_RE = re.compile(r"^(/[A-Za-z0-9_.:-]+)+$")


class PrivateContainerdError(RuntimeError):
    """containerd could not be started, did not answer, or a ctr call failed."""


# --------------------------------------------------------------------------- processes

def _cmdline(pid: int) -> Optional[List[str]]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    if not raw:
        return None
    return [a.decode(errors="replace") for a in raw.rstrip(b"\0").split(b"\0")]


def _alive(pid: int) -> bool:
    """True for a live process; a zombie counts as dead (nobody may reap it here)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


def _all_pids() -> List[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _wait_gone(pids: Iterable[int], timeout: float,
               proc: Optional[subprocess.Popen] = None) -> List[int]:
    """Wait until every pid is dead; returns those still alive after ``timeout``."""
    deadline = time.monotonic() + timeout
    left = list(pids)
    while True:
        if proc is not None:
            proc.poll()  # reap our own child, or it stays a zombie
        left = [p for p in left if _alive(p)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.02)


def _terminate(pids: List[int], timeout: float, proc: Optional[subprocess.Popen] = None) -> None:
    """SIGTERM, then SIGKILL whatever is still alive after ``timeout`` seconds."""
    for p in pids:
        _signal(p, signal.SIGTERM)
    left = _wait_gone(pids, timeout, proc)
    for p in left:
        _signal(p, signal.SIGKILL)
    _wait_gone(left, 5.0, proc)


def other_containerd_running(exclude: Iterable[int] = ()) -> bool:
    """True when any containerd daemon other than ``exclude`` runs on this machine."""
    skip = set(exclude)
    for pid in _all_pids():
        if pid in skip:
            continue
        argv = _cmdline(pid)
        if argv and os.path.basename(argv[0]) == "containerd" and _alive(pid):
            return True
    return False


# --------------------------------------------------------------------------- mounts

def _unescape_mount(path: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), path)


def _mounts() -> List[Tuple[str, str, str]]:
    """(mount point, fs type, super options) from /proc/self/mountinfo."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, rfields = left.split(), right.split()
            if len(fields) < 5 or len(rfields) < 3:
                continue
            out.append((_unescape_mount(fields[4]), rfields[0], rfields[2]))
    return out


def mounts_under(dirs: Iterable[str]) -> List[str]:
    """Mount points at or below any of ``dirs``, deepest first."""
    roots = [os.path.realpath(d).rstrip("/") for d in dirs]
    found = {m for m, _, _ in _mounts()
             if any(m == r or m.startswith(r + "/") for r in roots)}
    return sorted(found, key=lambda m: (m.count("/"), m), reverse=True)


_libc = None


def _umount(path: str) -> bool:
    global _libc
    import ctypes
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    for flags in (0, 2):  # 2 = MNT_DETACH
        if _libc.umount2(path.encode(), flags) == 0:
            return True
        if ctypes.get_errno() in (errno.EINVAL, errno.ENOENT):  # not a mount point (any more)
            return True
    return False


# --------------------------------------------------------------------------- cgroups

def cgroup_hierarchies(cgroup_root: str = CGROUP_ROOT,
                       include_v2: bool = False) -> List[Tuple[str, Set[str]]]:
    """(mount point, controllers) of each cgroup v1 hierarchy under ``cgroup_root``; named
    hierarchies (``name=systemd``) included. ``include_v2`` adds a cgroup2 mount as well."""
    root = cgroup_root.rstrip("/")
    out = []
    seen = set()
    for mnt, fstype, opts in _mounts():
        if not mnt.startswith(root + "/") or mnt in seen:
            continue
        if fstype == "cgroup" or (include_v2 and fstype == "cgroup2"):
            seen.add(mnt)
            ctrls = {o for o in opts.split(",") if o not in ("rw", "ro")} if fstype == "cgroup" else set()
            out.append((mnt, ctrls))
    return sorted(out)


def _check_parent(parent: str) -> List[str]:
    if not _CGROUP_PARENT_RE.match(parent) or any(p in (".", "..") for p in parent.split("/")):
        raise ValueError(f"not a plain absolute cgroup path: {parent!r}")
    return parent.strip("/").split("/")


def _read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def _init_cpuset(child: str, parent: str) -> None:
    # A new v1 cpuset cgroup starts with empty cpus/mems and accepts no tasks or children
    # that need CPUs; inherit the parent's, as the kubelet does.
    for fname in ("cpuset.cpus", "cpuset.mems"):
        target = os.path.join(child, fname)
        try:
            if _read(target):
                continue
            with open(target, "w") as f:
                f.write(_read(os.path.join(parent, fname)))
        except OSError:
            pass


def _make_cgroup_dir(child: str, parent: str, ctrls: Collection[str], created: List[str]) -> None:
    """mkdir the cgroup ``child`` of ``parent`` (added to ``created`` when made now); in a
    cpuset hierarchy (``ctrls`` has "cpuset") it gets the parent's cpus/mems."""
    try:
        os.mkdir(child, 0o755)
        created.append(child)
    except FileExistsError:
        pass
    if "cpuset" in ctrls:
        _init_cpuset(child, parent)


def make_pod_cgroup(parent: str, cgroup_root: str = CGROUP_ROOT) -> List[str]:
    """Create ``parent`` (e.g. ``/kubepods/burstable/pod<uid>``) in every cgroup v1
    hierarchy, as the kubelet does before RunPodSandbox. New cpuset dirs get their parent's
    cpus/mems. Returns the dirs it created; raises ValueError for a non-plain path."""
    parts = _check_parent(parent)
    created = []
    for mnt, ctrls in cgroup_hierarchies(cgroup_root):
        cur = mnt
        for p in parts:
            nxt = os.path.join(cur, p)
            _make_cgroup_dir(nxt, cur, ctrls, created)
            cur = nxt
    return created


# Every running instance holds this file locked shared (from start to cleanup, released
# with its process however it ends); cleanup sweeps new dirs under /kubepods* only when it
# can lock it exclusively, i.e. when no other instance (another test process, a benchmark,
# a local run) may be making cgroups there at that moment. Without it, a sweep removed a
# container cgroup another instance's runc had just made, and that StartContainer failed
# ("openat2 .../cgroup.procs: no such file or directory").
HOST_LOCK = "/run/anolisnuma-private-containerd.lock"


def _host_lock(mode: int, wait: bool = False) -> Optional[int]:
    """An fd holding HOST_LOCK in ``mode`` (fcntl.LOCK_SH / LOCK_EX), or None when it is
    taken (``wait``: waits for it; a sweep holds it exclusively for a moment only)."""
    try:
        fd = os.open(HOST_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(fd, mode if wait else mode | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _rmdir_tree(top: str, keep: Set[str] = frozenset(), retries: int = 10) -> List[str]:
    """rmdir ``top`` and every cgroup below it, deepest first, skipping ``keep``.
    Returns the dirs that could not be removed (in use)."""
    if not os.path.isdir(top):
        return []
    failed = []
    for dirpath, _, _ in list(os.walk(top, topdown=False)):
        if dirpath in keep:
            continue
        for attempt in range(retries):
            try:
                os.rmdir(dirpath)
                break
            except FileNotFoundError:
                break
            except OSError as e:
                # EBUSY right after the last task exited is transient; ENOTEMPTY/EBUSY
                # for a live cgroup is not: give up after a short while.
                if e.errno != errno.EBUSY or attempt == retries - 1:
                    failed.append(dirpath)
                    break
                time.sleep(0.05)
    return failed


def remove_pod_cgroup(parent: str, cgroup_root: str = CGROUP_ROOT) -> List[str]:
    """rmdir ``parent`` and any container cgroups below it in every hierarchy (ancestors are
    left alone). Returns the dirs still present (e.g. with live tasks)."""
    parts = _check_parent(parent)
    left = []
    for mnt, _ in cgroup_hierarchies(cgroup_root, include_v2=True):
        left += _rmdir_tree(os.path.join(mnt, *parts), retries=3)
    return left


def _kubepods_dirs(cgroup_root: str) -> Set[str]:
    found = set()
    for mnt, _ in cgroup_hierarchies(cgroup_root, include_v2=True):
        try:
            tops = [e.path for e in os.scandir(mnt) if e.is_dir() and e.name.startswith("kubepods")]
        except OSError:
            continue
        for top in tops:
            for dirpath, _, _ in os.walk(top):
                found.add(dirpath)
    return found


# --------------------------------------------------------------------------- misc helpers

CAP_SYS_RESOURCE = 24


def oom_score_adj_restricted(status_path: str = "/proc/self/status") -> bool:
    """Whether a containerd started from this process needs ``restrict_oom_score_adj``:
    CAP_SYS_RESOURCE is missing from this process's effective or bounding set (which
    containerd and runc inherit), so the kernel refuses a lower oom_score_adj than the
    parent's, as containerd asks for every sandbox (-998)."""
    try:
        with open(status_path) as f:
            caps = {k: int(v, 16) for k, _, v in (line.partition(":\t") for line in f)
                    if k in ("CapEff", "CapBnd")}
    except (OSError, ValueError):
        return True   # unknown: the setting that works everywhere
    return any(not caps.get(k, 0) >> CAP_SYS_RESOURCE & 1 for k in ("CapEff", "CapBnd"))


def release_of_version(word: str) -> Tuple[int, int]:
    """``(major, minor)`` of ``containerd --version``'s version word (``v2.2.7``,
    ``1.6.20~ds1``) or a build's name (``1.7``); ``(0, 0)`` when it reads as neither."""
    m = re.match(r"v?(\d+)\.(\d+)", word)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)

def _q(s: str) -> str:
    """A TOML basic string (JSON escaping is a subset TOML accepts)."""
    return json.dumps(s)


def _atomic_write(path: str, text: str, mode: int = 0o644) -> None:
    atomic_write_bytes(path, text.encode(), mode)


def _link_exists(name: str) -> bool:
    return os.path.exists(f"/sys/class/net/{name}")


def _used_ipv4_text() -> str:
    try:
        return subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, timeout=5,
                              text=True).stdout + \
            subprocess.run(["ip", "-4", "route"], capture_output=True, timeout=5, text=True).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _ctr_ready(socket_path: str, timeout: float) -> Optional[str]:
    # Without grpc: `ctr version` proves the daemon serves; the CRI plugin is registered by
    # then but may still be initialising, so callers should tolerate a first-call retry.
    try:
        r = subprocess.run(["ctr", "-a", socket_path, "version"], capture_output=True,
                           text=True, timeout=max(timeout, 0.5))
    except (OSError, subprocess.SubprocessError) as e:
        return str(e)
    return None if r.returncode == 0 else r.stderr.strip()


def _grpc_ready(socket_path: str, timeout: float) -> Optional[str]:
    """None when the CRI service answers ``Version``; else the error text."""
    try:
        import grpc  # a runtime dependency of the package; imported lazily for cheap imports
    except ImportError:
        return _ctr_ready(socket_path, timeout)

    # No min_reconnect_backoff_ms: grpc core uses it as the connect timeout (channel_options.py).
    opts = [("grpc.initial_reconnect_backoff_ms", 20), ("grpc.max_reconnect_backoff_ms", 200)]
    ch = grpc.insecure_channel(f"unix://{socket_path}", options=opts)
    try:
        # Raw bytes: an empty VersionRequest; the CRI plugin refuses calls until it is
        # initialised, so success means RunPodSandbox etc. will be served too.
        call = ch.unary_unary("/runtime.v1.RuntimeService/Version")
        call(b"", timeout=timeout, wait_for_ready=True)
        return None
    except grpc.RpcError as e:
        return f"{e.code()}: {e.details()}"
    finally:
        ch.close()


# --------------------------------------------------------------------------- the harness

class PrivateContainerd:
    """One private containerd instance rooted at ``base_dir`` (config, root, logs, CNI) and
    ``run_dir`` (state, socket, runc root). Construction only reads ``harness.json``;
    nothing is started until ``start()``."""

    def __init__(self, base_dir: str, run_dir: str, cni: bool = False,
                 snapshotter: str = "overlayfs", containerd_bin: Optional[str] = None,
                 ctr_bin: Optional[str] = None, runc_bin: str = "runc",
                 image_cache: Optional[str] = None, start_timeout: float = 30.0,
                 cgroup_root: str = CGROUP_ROOT, build: ContainerdBuild = DEBIAN,
                 nri: Optional[bool] = None) -> None:
        if nri and not build.has_nri:
            raise ValueError(f"containerd {build.name} has no NRI")
        self.base_dir = os.path.abspath(base_dir)
        self.run_dir = os.path.abspath(run_dir)
        self.cni = cni
        self.snapshotter = snapshotter
        self.build = build   # which containerd (containerd_builds.py): Debian's 1.6 unless told
        # NRI on the private socket: None keeps the build's own default (1.7 off, 2.x on)
        self.nri = build.has_nri and (build.nri_by_default if nri is None else nri)
        self.containerd_bin = containerd_bin or build.containerd
        self.ctr_bin = ctr_bin or build.ctr
        self.runc_bin = shutil.which(runc_bin, path="/usr/sbin:/usr/bin:/sbin:/bin") or runc_bin
        self.image_cache = image_cache
        self.start_timeout = start_timeout
        self.cgroup_root = cgroup_root
        self._proc: Optional[subprocess.Popen] = None
        self._lock = threading.RLock()
        self._host_fd: Optional[int] = None   # HOST_LOCK held shared while we run
        self._state = self._load_state()

    # ---- paths
    @property
    def socket(self) -> str:
        """The containerd gRPC socket (CRI + containerd API)."""
        return os.path.join(self.run_dir, "containerd.sock")

    @property
    def config_path(self) -> str:
        return os.path.join(self.base_dir, "config.toml")

    @property
    def log_path(self) -> str:
        return os.path.join(self.base_dir, "containerd.log")

    @property
    def pidfile(self) -> str:
        return os.path.join(self.base_dir, "containerd.pid")

    @property
    def nri_socket(self) -> str:
        """Where containerd serves NRI when ``self.nri`` (1.6 has none)."""
        return os.path.join(self.run_dir, "nri.sock")

    @property
    def runc_root(self) -> str:
        return os.path.join(self.run_dir, "runc")

    @property
    def cni_conf_dir(self) -> str:
        return os.path.join(self.base_dir, "cni", "net.d")

    @property
    def pod_log_root(self) -> str:
        """A dir tests can use for ``log_directory`` of pods; removed by cleanup."""
        return os.path.join(self.base_dir, "pods")

    @property
    def _state_path(self) -> str:
        return os.path.join(self.base_dir, "harness.json")

    @property
    def bridge(self) -> Optional[str]:
        return self._state.get("bridge")

    @property
    def subnet(self) -> Optional[str]:
        return self._state.get("subnet")

    @property
    def network_name(self) -> Optional[str]:
        return self._state.get("network")

    # ---- recorded state
    def _load_state(self) -> Dict:
        try:
            with open(self._state_path) as f:
                data = json.load(f)
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def _save_state(self) -> None:
        _atomic_write(self._state_path, json.dumps(self._state, indent=1, sort_keys=True))

    def _record_preexisting(self) -> None:
        """Remember, once per base_dir, what existed before us, so cleanup keeps it."""
        with self._lock:
            changed = False
            if "preexisting_cgroups" not in self._state:
                self._state["preexisting_cgroups"] = sorted(_kubepods_dirs(self.cgroup_root))
                changed = True
            if "created_shared_dirs" not in self._state:
                self._state["created_shared_dirs"] = [d for d in SHARED_DIRS if not os.path.exists(d)]
                changed = True
            self._state.setdefault("pod_cgroups", [])
            if changed:
                os.makedirs(self.base_dir, exist_ok=True)
                self._save_state()

    def _choose_network(self) -> None:
        if self._state.get("bridge"):
            return
        n = os.getpid() % 10000
        while _link_exists(f"anbr{n}"):
            n = (n + 1) % 10000
        used = _used_ipv4_text()
        third = 100 + os.getpid() % 150
        for i in range(150):
            x = 100 + (third - 100 + i) % 150
            if f"10.254.{x}." not in used:
                third = x
                break
        self._state.update(bridge=f"anbr{n}", subnet=f"10.254.{third}.0/24",
                           network=f"anolisnuma-anbr{n}")
        self._save_state()

    # ---- config
    def write_config(self) -> str:
        """Write config.toml (and the CNI conflist when ``cni``); returns the config path."""
        for d in (self.base_dir, self.run_dir, self.cni_conf_dir, self.pod_log_root,
                  os.path.join(self.base_dir, "tmp"), os.path.join(self.base_dir, "certs.d")):
            os.makedirs(d, exist_ok=True)
        self._record_preexisting()
        cri = '[plugins."io.containerd.grpc.v1.cri"'
        lines = [
            "# written by anolisnuma.testing.containerd -- private test instance",
            "version = 2",
            f"root = {_q(os.path.join(self.base_dir, 'root'))}",
            f"state = {_q(os.path.join(self.run_dir, 'state'))}",
            "disabled_plugins = [",
            '  "io.containerd.snapshotter.v1.aufs",',
            '  "io.containerd.snapshotter.v1.btrfs",',
            '  "io.containerd.snapshotter.v1.devmapper",',
            '  "io.containerd.snapshotter.v1.zfs",',
            '  "io.containerd.tracing.processor.v1.otlp",',
            '  "io.containerd.internal.v1.tracing",',
            "]",
            "",
            "[grpc]",
            f"  address = {_q(self.socket)}",
            "",
            "[debug]",
            '  level = "info"',
            "",
            "[plugins]",
            '  [plugins."io.containerd.internal.v1.opt"]',
            f"    path = {_q(os.path.join(self.base_dir, 'opt'))}",
            f"  {cri}]",
            # Imported by import_images(); never pulled.
            f"    sandbox_image = {_q(PAUSE_IMAGE)}",
            # Without CAP_SYS_RESOURCE (missing from these VMs' bounding set) lowering
            # oom_score_adj fails and every RunPodSandbox dies in runc init unless
            # containerd keeps it at least ours: said only where this machine needs it.
            f"    restrict_oom_score_adj = {'true' if oom_score_adj_restricted() else 'false'}",
            "    netns_mounts_under_state_dir = true",
            "    disable_apparmor = true",
            "    systemd_cgroup = false",
            "    disable_hugetlb_controller = true",
            "    tolerate_missing_hugetlb_controller = true",
            '    stream_server_address = "127.0.0.1"',
            '    stream_server_port = "0"',
            f"    {cri}.containerd]",
            f"      snapshotter = {_q(self.snapshotter)}",
            '      default_runtime_name = "runc"',
            f"      {cri}.containerd.runtimes.runc]",
            '        runtime_type = "io.containerd.runc.v2"',
            f"        {cri}.containerd.runtimes.runc.options]",
            f"          BinaryName = {_q(self.runc_bin)}",
            f"          Root = {_q(self.runc_root)}",
            "          SystemdCgroup = false",
            f"    {cri}.cni]",
            f"      bin_dir = {_q(CNI_BIN_DIR)}",
            f"      conf_dir = {_q(self.cni_conf_dir)}",
            "      max_conf_num = 1",
            f"    {cri}.registry]",
            f"      config_path = {_q(os.path.join(self.base_dir, 'certs.d'))}",
            "",
        ]
        if self.build.has_nri:
            # containerd serves NRI on /var/run/nri/nri.sock unless told otherwise, which a
            # second instance (or the node's own containerd) would fight over: ours is private.
            # 1.7 reads the same keys (NRI v0.8.0's config), with disable = true by default.
            lines += [
                '  [plugins."io.containerd.nri.v1.nri"]',
                f"    disable = {'false' if self.nri else 'true'}",
                f"    socket_path = {_q(self.nri_socket)}",
                f"    plugin_path = {_q(os.path.join(self.base_dir, 'nri', 'plugins'))}",
                f"    plugin_config_path = {_q(os.path.join(self.base_dir, 'nri', 'conf.d'))}",
                '    plugin_registration_timeout = "5s"',
                '    plugin_request_timeout = "2s"',
                "",
            ]
        _atomic_write(self.config_path, "\n".join(lines))
        conflist = os.path.join(self.cni_conf_dir, "10-anolisnuma.conflist")
        if self.cni:
            self._choose_network()
            net = {
                "cniVersion": "0.4.0",
                "name": self.network_name,
                "plugins": [{
                    "type": "bridge", "bridge": self.bridge,
                    # No gateway, no masquerade: pod traffic stays on this bridge.
                    "isGateway": False, "ipMasq": False, "hairpinMode": False,
                    "ipam": {"type": "host-local", "ranges": [[{"subnet": self.subnet}]],
                             "dataDir": os.path.join(self.base_dir, "cni", "ipam")},
                }],
            }
            _atomic_write(conflist, json.dumps(net, indent=1))
        elif os.path.exists(conflist):
            os.unlink(conflist)
        return self.config_path

    # ---- process
    def _is_ours(self, pid: int) -> bool:
        argv = _cmdline(pid)
        return bool(argv) and os.path.basename(argv[0]) == "containerd" \
            and argv[1:] == ["--config", self.config_path]

    def _our_containerd_pids(self) -> List[int]:
        return [p for p in _all_pids() if self._is_ours(p) and _alive(p)]

    def _our_shim_pids(self) -> List[int]:
        out = []
        for p in _all_pids():
            argv = _cmdline(p)
            if not argv or not os.path.basename(argv[0]).startswith("containerd-shim"):
                continue
            for i, a in enumerate(argv[:-1]):
                if a in ("-address", "--address") and argv[i + 1] == self.socket:
                    out.append(p)
                    break
        return out

    @property
    def pid(self) -> Optional[int]:
        """PID of our running containerd, or None."""
        if self._proc is not None and self._proc.poll() is None:
            return self._proc.pid
        try:
            pid = int(_read(self.pidfile))
            if self._is_ours(pid) and _alive(pid):
                return pid
        except (OSError, ValueError):
            pass
        pids = self._our_containerd_pids()
        return pids[0] if pids else None

    def is_running(self) -> bool:
        return self.pid is not None

    def log_tail(self, lines: int = 40) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 64 * 1024))
                return "\n".join(f.read().decode(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def start(self, timeout: Optional[float] = None) -> float:
        """Start containerd in the background and wait until its CRI service answers.
        A leftover containerd of ours (crashed run) is stopped first; a stale pidfile or
        socket is ignored. Returns the seconds it took; raises PrivateContainerdError with
        the log tail when it dies or does not answer within ``timeout``."""
        timeout = self.start_timeout if timeout is None else timeout
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                raise PrivateContainerdError(f"containerd already running (pid {self._proc.pid})")
            stale = self._our_containerd_pids()
            if stale:
                _terminate(stale, 10.0)
            self.write_config()
            for p in (self.socket, self.socket + ".ttrpc", self.pidfile):
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    pass
            env = dict(os.environ)
            # Temporary mounts (image unpack, volume copy) land under our base dir, where
            # cleanup finds them.
            env["TMPDIR"] = os.path.join(self.base_dir, "tmp")
            env["PATH"] = self.build.path_env(
                env.get("PATH", "") + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
            t0 = time.monotonic()
            if self._host_fd is None:   # (waits out another instance's sweep)
                self._host_fd = _host_lock(fcntl.LOCK_SH, wait=True)
            with open(self.log_path, "ab") as log:
                log.write(f"==== start {time.strftime('%Y-%m-%dT%H:%M:%S')} ====\n".encode())
                log.flush()
                self._proc = subprocess.Popen(
                    [self.containerd_bin, "--config", self.config_path],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    cwd=self.base_dir, env=env, start_new_session=True, close_fds=True)
            _atomic_write(self.pidfile, f"{self._proc.pid}\n")
            self._wait_ready(t0 + timeout)
            return time.monotonic() - t0

    def _wait_ready(self, deadline: float) -> None:
        proc = self._proc
        assert proc is not None
        last = "socket not created"
        while True:
            if proc.poll() is not None:
                raise PrivateContainerdError(
                    f"containerd exited with {proc.returncode} during start-up; log tail:\n"
                    f"{self.log_tail()}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise PrivateContainerdError(
                    f"containerd (pid {proc.pid}) did not answer on {self.socket}: {last}; "
                    f"log tail:\n{self.log_tail()}")
            if os.path.exists(self.socket):
                err = _grpc_ready(self.socket, min(1.0, left))
                if err is None:
                    return
                last = err
            time.sleep(0.02)

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Block until a running containerd (e.g. after restart) answers CRI Version."""
        deadline = time.monotonic() + timeout
        while True:
            err = _grpc_ready(self.socket, max(0.05, min(1.0, deadline - time.monotonic())))
            if err is None:
                return
            if time.monotonic() >= deadline:
                raise PrivateContainerdError(f"containerd not ready: {err}")
            time.sleep(0.02)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM our containerd, SIGKILL after ``timeout``. Shims and containers keep
        running (as after a real containerd restart)."""
        with self._lock:
            pids = set(self._our_containerd_pids())
            if self._proc is not None and self._proc.poll() is None:
                pids.add(self._proc.pid)
            _terminate(sorted(pids), timeout, self._proc)
            self._reap()

    def kill(self) -> None:
        """SIGKILL our containerd at once (fault injection); shims keep running."""
        with self._lock:
            pids = set(self._our_containerd_pids())
            if self._proc is not None and self._proc.poll() is None:
                pids.add(self._proc.pid)
            for p in pids:
                _signal(p, signal.SIGKILL)
            _wait_gone(pids, 5.0, self._proc)
            self._reap()

    def _reap(self) -> None:
        if self._proc is not None:
            try:
                self._proc.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.unlink(self.pidfile)
        except FileNotFoundError:
            pass

    def restart(self, timeout: Optional[float] = None) -> float:
        """Stop (if running) and start again on the same root/state: running containers
        are recovered from their shims. Returns the start time in seconds."""
        if self.is_running():
            self.stop()
        return self.start(timeout)

    # ---- images
    def ctr(self, *args: str, timeout: float = 60.0) -> str:
        """Run ``ctr -a SOCKET -n k8s.io ARGS``; returns stdout, raises on failure."""
        cmd = [self.ctr_bin, "-a", self.socket, "-n", CRI_NAMESPACE, *args]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise PrivateContainerdError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()}")
        return r.stdout

    def import_images(self) -> bool:
        """Import the busybox/pause test images (``IMAGES``) unless this base_dir has them
        already. Returns True when it imported."""
        archive = build_image_archive(self.image_cache)
        marker = os.path.join(self.base_dir, "images.imported")
        want = f"{os.path.basename(archive)} {self.snapshotter}\n"
        try:
            if _read(marker) + "\n" == want:
                return False
        except OSError:
            pass
        self.ctr("images", "import", "--snapshotter", self.snapshotter, archive)
        _atomic_write(marker, want)
        return True

    # ---- pod cgroups
    def make_pod_cgroup(self, parent: str) -> List[str]:
        """``make_pod_cgroup`` + record ``parent`` so cleanup removes it even after a crash."""
        self._record_preexisting()
        with self._lock:
            if parent not in self._state["pod_cgroups"]:
                _check_parent(parent)
                self._state["pod_cgroups"].append(parent)
                self._save_state()
        return make_pod_cgroup(parent, self.cgroup_root)

    def kill_lost_tasks(self, known: Set[str]) -> List[str]:
        """Containers runc still has that containerd no longer knows (ids not in ``known``,
        what the CRI lists now), killed and deleted; their ids. containerd 2.x makes one when
        a StartContainer it runs is cancelled (its client's connection closed, e.g. a kill -9
        of the proxy) after ``runc create``: its ``runc init`` waits in the pod's cgroup,
        which no CRI call reaches and which keeps the pod cgroup from being removed."""
        root = os.path.join(self.runc_root, CRI_NAMESPACE)
        runc = [self.runc_bin, "--root", root]
        listed = subprocess.run(runc + ["list", "-q"], capture_output=True, text=True, timeout=20).stdout.split()
        lost = [cid for cid in listed if cid not in known]
        for cid in lost:
            for args in (["kill", "--all", cid, "KILL"], ["delete", "--force", cid]):
                subprocess.run(runc + args, capture_output=True, timeout=20)
        return lost

    def remove_pod_cgroup(self, parent: str) -> List[str]:
        """rmdir the pod cgroup in every hierarchy; returns the dirs still in use."""
        left = remove_pod_cgroup(parent, self.cgroup_root)
        if not left:
            with self._lock:
                if parent in self._state.get("pod_cgroups", []):
                    self._state["pod_cgroups"].remove(parent)
                    self._save_state()
        return left

    # ---- cleanup
    def _known_ids(self) -> Set[str]:
        """Container/sandbox IDs our instance knows of: shim arguments, task state dirs."""
        ids: Set[str] = set()
        for p in self._our_shim_pids():
            argv = _cmdline(p) or []
            for i, a in enumerate(argv[:-1]):
                if a in ("-id", "--id"):
                    ids.add(argv[i + 1])
        task_root = os.path.join(self.run_dir, "state", "io.containerd.runtime.v2.task")
        for root in (task_root, self.runc_root):
            try:
                for ns in os.listdir(root):
                    ids.update(os.listdir(os.path.join(root, ns)))
            except OSError:
                pass
        return {i for i in ids if re.fullmatch(r"[0-9a-f]{64}", i)}

    def _shared_leftovers(self, ids: Set[str]) -> None:
        """Files containerd/libcni put in shared dirs for our IDs (a clean shutdown leaves
        none; a crash does)."""
        import hashlib
        for cid in ids:
            for ns in (CRI_NAMESPACE,):
                digest = hashlib.sha256(os.path.join(self.socket, ns, cid).encode()).hexdigest()
                for p in (f"/run/containerd/s/{digest}",):
                    try:
                        os.unlink(p)
                    except OSError:
                        pass
        if ids and os.path.isdir(CNI_RESULTS_DIR):
            for name in os.listdir(CNI_RESULTS_DIR):
                parts = name.split("-")
                if any(cid in parts for cid in ids):
                    try:
                        os.unlink(os.path.join(CNI_RESULTS_DIR, name))
                    except OSError:
                        pass

    def _runc_leftovers(self) -> None:
        if not os.path.isdir(self.runc_root):
            return
        for ns in sorted(os.listdir(self.runc_root)):
            root = os.path.join(self.runc_root, ns)
            if not os.path.isdir(root):
                continue
            try:
                out = subprocess.run([self.runc_bin, "--root", root, "list", "-q"],
                                     capture_output=True, text=True, timeout=20).stdout
            except (OSError, subprocess.SubprocessError):
                continue
            for cid in out.split():
                for args in (["kill", "--all", cid, "KILL"], ["delete", "--force", cid]):
                    try:
                        subprocess.run([self.runc_bin, "--root", root, *args],
                                       capture_output=True, timeout=20)
                    except (OSError, subprocess.SubprocessError):
                        pass

    def cleanup(self, save_log: Optional[str] = None) -> List[str]:
        """Remove everything this instance created (see the module docstring); safe to call
        repeatedly, from any process, and after a crash. ``save_log`` copies containerd.log
        there first. Returns a list of problems (things that could not be removed)."""
        problems: List[str] = []
        with self._lock:
            self._state = self._load_state() or self._state
            # 1. containerd itself
            pids = set(self._our_containerd_pids())
            if self._proc is not None and self._proc.poll() is None:
                pids.add(self._proc.pid)
            if pids:
                _terminate(sorted(pids), 5.0, self._proc)
            self._reap()
            self._proc = None
            # 2. containers still alive under our runc root, then their shims
            ids = self._known_ids()
            self._runc_leftovers()
            shims = self._our_shim_pids()
            if shims:
                _terminate(shims, 2.0)
            self._shared_leftovers(ids)
            # 3. mounts (rootfs overlays, netns, shm, temp mounts), deepest first
            for _ in range(3):
                mounts = mounts_under([self.base_dir, self.run_dir])
                if not mounts:
                    break
                for m in mounts:
                    _umount(m)
            for m in mounts_under([self.base_dir, self.run_dir]):
                problems.append(f"still mounted: {m}")
            # 4. network
            bridge = self._state.get("bridge")
            if bridge and _link_exists(bridge):
                r = subprocess.run(["ip", "link", "del", bridge], capture_output=True, text=True)
                if r.returncode != 0 and _link_exists(bridge):
                    problems.append(f"bridge {bridge}: {r.stderr.strip()}")
            net = self._state.get("network")
            if net and os.path.isdir(CNI_RESULTS_DIR):
                for name in os.listdir(CNI_RESULTS_DIR):
                    if name.startswith(net + "-"):
                        try:
                            os.unlink(os.path.join(CNI_RESULTS_DIR, name))
                        except OSError:
                            pass
            # 5. cgroups: recorded pod dirs, then anything new under /kubepods*
            for parent in self._state.get("pod_cgroups", []):
                problems += [f"cgroup in use: {d}" for d in remove_pod_cgroup(parent, self.cgroup_root)]
            if self._host_fd is not None:   # (our own share must not stand in our way)
                os.close(self._host_fd)
                self._host_fd = None
            alone = _host_lock(fcntl.LOCK_EX)
            if "preexisting_cgroups" in self._state and alone is not None:
                keep = set(self._state["preexisting_cgroups"])
                for mnt, _ in cgroup_hierarchies(self.cgroup_root, include_v2=True):
                    try:
                        tops = [e.path for e in os.scandir(mnt)
                                if e.is_dir() and e.name.startswith("kubepods")]
                    except OSError:
                        continue
                    for top in tops:
                        _rmdir_tree(top, keep, retries=3)
            if alone is not None:
                os.close(alone)
            # 6. shared dirs we created, unless another containerd may be using them now
            created = self._state.get("created_shared_dirs", [])
            if created and not other_containerd_running():
                for d in created:  # SHARED_DIRS order: children before parents
                    try:
                        os.rmdir(d)
                    except OSError:
                        pass
            # 7. our dirs
            if save_log and os.path.exists(self.log_path):
                try:
                    shutil.copyfile(self.log_path, save_log)
                except OSError as e:
                    problems.append(f"save log: {e}")
            if not mounts_under([self.base_dir, self.run_dir]):
                for d in (self.run_dir, self.base_dir):
                    shutil.rmtree(d, ignore_errors=True)
                    if os.path.exists(d):
                        problems.append(f"could not remove {d}")
            else:
                problems.append("base/run dirs kept: mounts remain below them")
            self._state = {}
        return problems

    def __enter__(self) -> "PrivateContainerd":
        return self

    def __exit__(self, *exc) -> None:
        self.cleanup()


# --------------------------------------------------------------------------- convenience

def ensure_private_containerd(base_dir: str, run_dir: str, cni: bool = False,
                              snapshotter: str = "overlayfs", images: bool = True,
                              timeout: float = 30.0, build: ContainerdBuild = DEBIAN,
                              nri: Optional[bool] = None) -> PrivateContainerd:
    """A running, image-loaded instance for ``base_dir``/``run_dir`` of ``build`` (``nri``:
    see PrivateContainerd): reuses one that is already running and answering, else
    (re)starts it. Raises PrivateContainerdError."""
    pc = PrivateContainerd(base_dir, run_dir, cni=cni, snapshotter=snapshotter,
                           start_timeout=timeout, build=build, nri=nri)
    if pc.is_running():
        try:
            pc.wait_ready(min(timeout, 5.0))
        except PrivateContainerdError:
            pc.stop()
            pc.start()
    else:
        pc.start()
    if images:
        pc.import_images()
    return pc


def cleanup_dead_instances(base_prefix: str, run_prefix: str) -> List[str]:
    """Clean up instances left by crashed runs: dirs named ``<base_prefix><pid>`` /
    ``<run_prefix><pid>`` (or ``<pid>-<suffix>``, one instance per containerd build) whose
    owner ``pid`` is no longer alive. Returns the base dirs it cleaned."""
    found: Dict[str, int] = {}   # the name's tail after the prefix -> owner pid
    for prefix in (base_prefix, run_prefix):
        parent, stem = os.path.split(prefix)
        try:
            names = os.listdir(parent or ".")
        except OSError:
            continue
        for name in names:
            m = re.fullmatch(r"(\d+)(-[A-Za-z0-9]+)?", name[len(stem):]) if name.startswith(stem) else None
            if m:
                found[name[len(stem):]] = int(m.group(1))
    cleaned = []
    for tail, owner in sorted(found.items()):
        if owner == os.getpid() or _alive(owner):
            continue
        base = f"{base_prefix}{tail}"
        PrivateContainerd(base, f"{run_prefix}{tail}").cleanup()
        cleaned.append(base)
    return cleaned
