"""A private Kubernetes node for tests: the real kubelet v1.26 -> anolisnuma -> a private containerd.

:class:`KubeletNode` runs, in one mount namespace of its own (``unshare --mount
--propagation slave``, held by a ``sleep`` and entered with ``nsenter``):

- a private containerd (:class:`~anolisnuma.testing.containerd.PrivateContainerd`, its
  ``containerd`` binary wrapped in ``nsenter``) with the test images imported and a
  loopback-only CNI network (so the runtime reports ``NetworkReady``; pods use the host's
  network);
- anolisnuma, ``python -m anolisnuma``, under a
  :class:`~anolisnuma.testing.socket_supervisor.SocketSupervisor` (systemd's socket
  activation and restarts), optionally with NUMA placement on a fake two-node topology
  mapped onto CPUs 0 and 1;
- the kubelet of ``../shared/k8s`` on anolisnuma's socket, registered with a
  :class:`~anolisnuma.testing.kube_apiserver.PrivateControlPlane` under a node name of its
  own (the admin kubeconfig: ``system:masters``), static CPU manager optional.

Why the namespace (facts checked on these machines, ../shared/k8s/README.md): the kubelet
kills every pod sandbox its runtime lists and every ``kubepods/**/pod<uid>`` cgroup it does
not know, so it gets a containerd and a cgroup view of its own (in each hierarchy a
sub-cgroup ``anolisnuma-node-<name>`` is bound to a staging dir, the hierarchy's own mount
is unmounted in the namespace and the bind moved there with ``mount --move``: left
underneath, runc takes the hierarchy's root mount from mountinfo and fails every
container with ``error mounting "cgroup" to rootfs``; containerd, runc and anolisnuma live
in the same view, so the ``cgroup_parent`` the kubelet sends means the same directory to
all of them); it writes
host-wide sysctls unless they already hold its values, so read-only files holding those
values are bind-mounted over the ones that differ; it hard-codes
``/var/lib/kubelet/device-plugins`` and ``/var/log/pods``: private directories are bound
over ``/var/lib/kubelet`` and ``/var/log``. The VM lacks CAP_SYS_RESOURCE:
``oomScoreAdj: 0`` and containerd's ``restrict_oom_score_adj``. The kubelet serves no port
(``enableServer: false``, no healthz, no read-only port) and leaves iptables alone.

:meth:`KubeletNode.close` removes everything, also after a failed test: the kubelet and the
daemon are stopped, containerd's cleanup runs inside the namespace (its containers, shims
and the kubelet's cgroups), every process still in the namespace is killed, the
sub-cgroups and the directories are removed. What a crashed run left is recorded in
``<base>/node.json``: :func:`cleanup_dead_nodes` removes it.

    with PrivateControlPlane.start_new() as cp:
        node = KubeletNode(cp, "/tmp/anolisnuma-kubelet-x", cpu_manager_static=True, numa=True)
        try:
            node.start()
            node.run_pod("web", "batch")
            node.wait_running("batch", ["web"])
        finally:
            node.close()
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from typing import Any, Dict, List, Optional, Sequence

from anolisnuma.testing.containerd import (CGROUP_ROOT, PrivateContainerd, _alive, _all_pids, _make_cgroup_dir,
                                           _rmdir_tree, cgroup_hierarchies)
from anolisnuma.testing.containerd_builds import DEBIAN, ContainerdBuild
from anolisnuma.testing.fake_sysfs import GIB, FakeTopology
from anolisnuma.testing.images import BUSYBOX_IMAGE
from anolisnuma.testing.kube_apiserver import PrivateControlPlane, k8s_dir
from anolisnuma.testing.proxy import REPO_ROOT, config_dict, write_config
from anolisnuma.testing.socket_supervisor import SocketSupervisor
from anolisnuma.testing.waiting import wait_until

KUBELET = "kubelet"
BASE_PREFIX = "/tmp/anolisnuma-kubelet-"
VAR_LIB_KUBELET = "/var/lib/kubelet"
VAR_LOG = "/var/log"
# The values the kubelet sets when a sysctl differs (setupKernelTunables, protectKernelDefaults off).
KUBELET_SYSCTLS = {"vm/overcommit_memory": "1", "vm/panic_on_oom": "0", "kernel/panic": "10",
                   "kernel/panic_on_oops": "1", "kernel/keys/root_maxkeys": "1000000",
                   "kernel/keys/root_maxbytes": "25000000"}
NODE_CPUS = {0: "0", 1: "1"}      # the fake topology's NUMA node -> this machine's CPU
SLEEP = "trap 'exit 0' TERM INT; while :; do sleep 1 & wait $!; done"
# What the kubelet logs when a CRI call to its runtime failed (remote_runtime.go,
# remote_image.go, the PLEG and the status loop): any of these in its log is a runtime error.
RUNTIME_ERROR_PATTERNS = ("rpc error", "connection refused", "Unavailable", "code = ", "transport is closing",
                          "error reading from server", "ContainerRuntimeUnhealthy",
                          "container runtime is down", "PLEG is not healthy", "runtime not ready")
_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,40}[a-z0-9])?$")


def missing() -> Optional[str]:
    """Why a kubelet node cannot run on this machine; None when it can."""
    if os.geteuid() != 0:
        return "needs root (mount namespace, cgroups, containerd)"
    where = k8s_dir()
    for name in (KUBELET, "kube-apiserver", "kubectl"):
        if not os.access(os.path.join(where, name), os.X_OK):
            return f"{name} not found in {where} (set ANOLISNUMA_K8S_DIR to the Kubernetes v1.26 binaries)"
    for tool in ("unshare", "nsenter", "mount", "etcd", "openssl", "containerd", "ctr", "runc",
                 "containerd-shim-runc-v2"):
        if shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") is None:
            return f"{tool} not found (scripts/install-deps.sh)"
    if not os.path.exists("/bin/busybox"):
        return "/bin/busybox not found: install busybox-static"
    if not os.path.isdir(os.path.join(CGROUP_ROOT, "cpuset")):
        return "needs the cgroup v1 hierarchies under /sys/fs/cgroup"
    if not os.path.isdir("/usr/lib/cni") or not os.path.exists("/usr/lib/cni/loopback"):
        return "the CNI loopback plugin is missing: install containernetworking-plugins"
    return None


def _run(argv: Sequence[str], timeout: float = 60.0, input: Optional[str] = None) -> str:
    done = subprocess.run(list(argv), input=input, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def _mnt_ns(pid: int) -> Optional[str]:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def _wait_for(cond: Any, what: str, timeout: float, proc: Optional[subprocess.Popen] = None,
              hint: Any = None) -> Any:
    """:func:`~anolisnuma.testing.waiting.wait_until`, given up at once when ``proc`` exits;
    RuntimeError (with ``hint()``, e.g. a log's tail) either way."""
    def condition() -> Any:
        got = cond()
        if not got and proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: the process exited with {proc.returncode}"
                               f"{'' if hint is None else ': ' + hint()}")
        return got

    try:
        return wait_until(condition, what, timeout, interval=0.1)
    except AssertionError:
        raise RuntimeError(f"{what}: not within {timeout:g}s{'' if hint is None else ': ' + hint()}") from None


def _tail(path: str, n: int = 4000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - n))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


class KubeletNode:
    """One private node (see the module docstring). ``cpu_manager_static``: the static CPU
    manager with CPU ``reserved_cpus`` reserved (it stays shared); ``numa``: anolisnuma's
    NUMA placement on for ``numa_namespaces`` over a fake 2-node topology (node i = CPU i,
    memory pinning off: this machine has one memory node), ``respread`` the
    ``[numa.respread]`` table; ``via_daemon=False``: the kubelet straight on containerd (a
    baseline for what its log says without anolisnuma)."""

    def __init__(self, cp: PrivateControlPlane, base_dir: str, *, node_name: Optional[str] = None,
                 cpu_manager_static: bool = False, reserved_cpus: str = "0", numa: bool = False,
                 numa_namespaces: Sequence[str] = (), respread: Optional[Dict[str, Any]] = None,
                 tree: str = REPO_ROOT, run_dir: Optional[str] = None, via_daemon: bool = True,
                 build: ContainerdBuild = DEBIAN) -> None:
        self.cp = cp
        self.base = os.path.abspath(base_dir)
        self.name = node_name or f"an-node-{uuid.uuid4().hex[:8]}"
        if not _NAME_RE.match(self.name):
            raise ValueError(f"not a plain node name: {self.name!r}")
        self.cpu_manager_static = cpu_manager_static
        self.reserved_cpus = reserved_cpus
        self.numa = numa
        self.numa_namespaces = list(numa_namespaces)
        self.respread = dict(respread or {})
        self.tree = tree
        self.via_daemon = via_daemon
        self.run_dir = run_dir or os.path.join("/run", os.path.basename(self.base))
        self.cgroup_name = f"anolisnuma-node-{self.name}"
        self.holder: Optional[subprocess.Popen] = None
        self.ns_id: Optional[str] = None
        self.containerd = PrivateContainerd(os.path.join(self.base, "containerd"), self.run_dir,
                                            containerd_bin=os.path.join(self.base, "bin", "containerd"), build=build)
        self.supervisor: Optional[SocketSupervisor] = None
        self.kubelet: Optional[subprocess.Popen] = None
        self._kubelet_log: Optional[Any] = None
        self._record: Dict[str, Any] = {}

    # ------------------------------------------------------------------ paths
    @property
    def kubelet_dir(self) -> str:
        """The kubelet's --root-dir (also /var/lib/kubelet inside the namespace)."""
        return os.path.join(self.base, "kubelet")

    @property
    def kubelet_log_path(self) -> str:
        return os.path.join(self.base, "kubelet.log")

    @property
    def cpu_manager_state(self) -> str:
        return os.path.join(self.kubelet_dir, "cpu_manager_state")

    @property
    def daemon_dir(self) -> str:
        return os.path.join(self.base, "anolisnuma")

    @property
    def socket(self) -> str:
        """anolisnuma's socket: the kubelet's runtime endpoint."""
        return os.path.join(self.run_dir, "anolisnuma.sock")

    @property
    def runtime_endpoint(self) -> str:
        """The kubelet's: anolisnuma's socket, or containerd's own without the daemon (a baseline)."""
        return self.socket if self.via_daemon else self.containerd.socket

    @property
    def admin_socket(self) -> str:
        return os.path.join(self.run_dir, "admin.sock")

    @property
    def config_path(self) -> str:
        return os.path.join(self.daemon_dir, "anolisnuma.toml")

    @property
    def daemon_log_path(self) -> str:
        return os.path.join(self.daemon_dir, "anolisnuma.log")

    def host_cgroup(self, controller: str, path: str = "/") -> str:
        """Where ``path`` of the node's cgroup view is in the host's ``controller`` hierarchy."""
        return os.path.join(CGROUP_ROOT, controller, self.cgroup_name, path.lstrip("/"))

    def ns(self, *argv: str) -> List[str]:
        """``argv`` run inside the node's mount namespace."""
        assert self.holder is not None, "the node is not started"
        return ["nsenter", f"--target={self.holder.pid}", "--mount", "--", *argv]

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "KubeletNode":
        os.makedirs(self.base, exist_ok=True)
        os.makedirs(self.run_dir, exist_ok=True)
        self._save(base=self.base, run_dir=self.run_dir, cgroup=self.cgroup_name, node=self.name,
                   owner=os.getpid())
        self._start_namespace()
        self._start_containerd()
        if self.via_daemon:
            self._start_daemon()
        self._start_kubelet()
        return self

    def _save(self, **kw: Any) -> None:
        self._record.update(kw)
        with open(os.path.join(self.base, "node.json"), "w") as f:
            json.dump(self._record, f, indent=1)

    def _start_namespace(self) -> None:
        self.holder = subprocess.Popen(["unshare", "--mount", "--propagation", "slave", "--", "sleep", "infinity"],
                                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL, start_new_session=True)
        mine = _mnt_ns(os.getpid())
        self.ns_id = _wait_for(lambda: (lambda n: n if n and n != mine else None)(_mnt_ns(self.holder.pid)),
                               "the mount namespace", 10, self.holder)
        self._save(holder=self.holder.pid, ns=self.ns_id)
        script = ["set -e"]
        sysctl_dir = os.path.join(self.base, "sysctl")
        os.makedirs(sysctl_dir, exist_ok=True)
        for key, want in KUBELET_SYSCTLS.items():
            path = os.path.join("/proc/sys", key)
            try:
                with open(path) as f:
                    if f.read().strip() == want:
                        continue
            except OSError:
                continue
            fake = os.path.join(sysctl_dir, key.replace("/", "."))
            with open(fake, "w") as f:
                f.write(want + "\n")
            script += [f"mount --bind {fake} {path}", f"mount -o remount,bind,ro {path}"]
        created = []
        stage = os.path.join(self.base, "cgroup-stage")
        for mnt, ctrls in cgroup_hierarchies(CGROUP_ROOT, include_v2=True):
            sub = os.path.join(mnt, self.cgroup_name)
            _make_cgroup_dir(sub, mnt, ctrls, created)
            tmp = os.path.join(stage, os.path.basename(mnt))
            os.makedirs(tmp, exist_ok=True)
            # The hierarchy's own mount is taken away and the bind moved in its place: one
            # mount there, whose root is the sub-cgroup (runc and cadvisor take the first
            # mount of a hierarchy in mountinfo and make paths relative to its root).
            script += [f"mount --bind {sub} {tmp}", f"umount {mnt}", f"mount --move {tmp} {mnt}"]
        self._save(cgroups=created)
        for d in ("device-plugins", "pods", "plugins", "volume-plugins"):
            os.makedirs(os.path.join(self.kubelet_dir, d), exist_ok=True)
        varlog = os.path.join(self.base, "varlog")
        for d in ("pods", "containers"):
            os.makedirs(os.path.join(varlog, d), exist_ok=True)
        if not os.path.isdir(VAR_LIB_KUBELET):
            os.makedirs(VAR_LIB_KUBELET)
            self._save(created_var_lib_kubelet=True)
        script += [f"mount --bind {self.kubelet_dir} {VAR_LIB_KUBELET}", f"mount --bind {varlog} {VAR_LOG}"]
        _run(self.ns("/bin/sh", "-c", "\n".join(script)))

    def _start_containerd(self) -> None:
        wrapper = self.containerd.containerd_bin
        os.makedirs(os.path.dirname(wrapper), exist_ok=True)
        real = self.containerd.build.containerd
        assert self.holder is not None
        with open(wrapper, "w") as f:
            # exec: containerd keeps the pid (nsenter --mount does not fork) and its own argv[0]
            f.write(f'#!/bin/sh\nexec nsenter --target={self.holder.pid} --mount -- {real} "$@"\n')
        os.chmod(wrapper, 0o755)
        os.makedirs(self.containerd.cni_conf_dir, exist_ok=True)
        with open(os.path.join(self.containerd.cni_conf_dir, "05-loopback.conflist"), "w") as f:
            json.dump({"cniVersion": "0.4.0", "name": "anolisnuma-loopback", "plugins": [{"type": "loopback"}]}, f)
        self.containerd.start()
        self.containerd.import_images()

    def _daemon_config(self) -> Dict[str, Any]:
        extra: Dict[str, Any] = {"log": {"stderr": False, "file": self.daemon_log_path},
                                 "runtime": {"connect_timeout_seconds": 5.0},
                                 "admin": {"socket": self.admin_socket}}
        data = config_dict(self.daemon_dir, self.containerd.socket, listen=self.socket, grace=10.0, extra=extra)
        data["paths"].update(cgroup_root=CGROUP_ROOT, kubelet_cpu_manager_state=self.cpu_manager_state)
        if self.numa:
            data["numa"] = {"enabled": True, "namespaces": self.numa_namespaces, "memory_pinning": "off",
                            "poll_interval_seconds": 0.2, "node_name": self.name}
            if self.respread:
                data["numa"]["respread"] = dict(self.respread)
            FakeTopology(name="2n-2c-kubelet", node_cpus=NODE_CPUS, distances=[[10, 20], [20, 10]],
                         memory_bytes={0: 2 * GIB, 1: 2 * GIB}).write(data["paths"]["sys_root"])
        return data

    def _start_daemon(self) -> None:
        os.makedirs(self.daemon_dir, exist_ok=True)
        write_config(self.config_path, self._daemon_config())
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NOTIFY_SOCKET")}
        env["PYTHONPATH"] = self.tree
        self.supervisor = SocketSupervisor(self.socket, self.ns(sys.executable, "-m", "anolisnuma", "-c",
                                                               self.config_path),
                                           env=env, cwd=self.tree, log_path=os.path.join(self.daemon_dir, "daemon.out"))
        self.supervisor.start()

    def _kubelet_config(self) -> Dict[str, Any]:
        cfg: Dict[str, Any] = {
            "kind": "KubeletConfiguration", "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "enableServer": False, "healthzPort": 0, "readOnlyPort": 0, "address": "127.0.0.1",
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                               "x509": {"clientCAFile": self.cp.ca_file}},
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs", "cgroupRoot": "/", "cgroupsPerQOS": True,
            "failSwapOn": False, "oomScoreAdj": 0, "makeIPTablesUtilChains": False,
            "volumePluginDir": os.path.join(self.kubelet_dir, "volume-plugins"),
            # the imported images are all this node has: never collect them
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                             "nodefs.inodesFree": "1%"},
            "syncFrequency": "10s", "fileCheckFrequency": "20s", "nodeStatusUpdateFrequency": "2s",
            "serializeImagePulls": False, "registerNode": True,
            "runtimeRequestTimeout": "2m", "shutdownGracePeriod": "0s",
        }
        if self.cpu_manager_static:
            cfg.update(cpuManagerPolicy="static", reservedSystemCPUs=self.reserved_cpus,
                       cpuManagerReconcilePeriod="1s")
        return cfg

    def _start_kubelet(self) -> None:
        config = os.path.join(self.base, "kubelet.json")
        with open(config, "w") as f:
            json.dump(self._kubelet_config(), f, indent=1)
        argv = [os.path.join(k8s_dir(), KUBELET), f"--config={config}",
                f"--kubeconfig={self.cp.admin_kubeconfig}", f"--container-runtime-endpoint=unix://{self.runtime_endpoint}",
                f"--hostname-override={self.name}", f"--root-dir={self.kubelet_dir}",
                f"--cert-dir={os.path.join(self.kubelet_dir, 'pki')}", "--v=2"]
        self._kubelet_log = open(self.kubelet_log_path, "ab")
        self.kubelet = subprocess.Popen(self.ns(*argv), stdin=subprocess.DEVNULL, stdout=self._kubelet_log,
                                        stderr=subprocess.STDOUT, start_new_session=True)
        self._save(kubelet=self.kubelet.pid)
        _wait_for(self.ready, f"node {self.name} Ready", 90, self.kubelet, lambda: _tail(self.kubelet_log_path))

    def ready(self) -> bool:
        done = self.cp.kubectl("get", "node", self.name, "-o", "json", check=False, timeout=20)
        if done.returncode != 0:
            return False
        conds = json.loads(done.stdout).get("status", {}).get("conditions", [])
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)

    def stop_kubelet(self) -> None:
        proc, self.kubelet = self.kubelet, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        if self._kubelet_log is not None:
            self._kubelet_log.close()
            self._kubelet_log = None

    def close(self) -> List[str]:
        """Stop and remove everything (see the module docstring); returns what could not be removed."""
        problems: List[str] = []
        self.stop_kubelet()
        # The node's pods leave the API server with it (no controller manager here would):
        # the next node of the session may run pods of the same names.
        self.cp.kubectl("delete", "pods", "--all-namespaces", f"--field-selector=spec.nodeName={self.name}",
                        "--force", "--grace-period=0", "--wait=false", "--ignore-not-found", check=False, timeout=20)
        self.cp.kubectl("delete", "node", self.name, "--wait=false", "--ignore-not-found", check=False, timeout=20)
        if self.supervisor is not None:
            self.supervisor.close()
            self.supervisor = None
        problems += cleanup_node(self.base, self._record, containerd=self.containerd)
        return problems

    def __enter__(self) -> "KubeletNode":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ pods
    def kubectl(self, *args: str, **kw: Any) -> subprocess.CompletedProcess:
        return self.cp.kubectl(*args, **kw)

    def ensure_namespace(self, namespace: str) -> None:
        """The namespace and its ``default`` ServiceAccount (there is no controller manager
        to make it, and pod admission wants it)."""
        if self.kubectl("get", "namespace", namespace, check=False).returncode != 0:
            self.kubectl("create", "namespace", namespace)
        if self.kubectl("get", "serviceaccount", "default", "-n", namespace, check=False).returncode != 0:
            self.kubectl("create", "serviceaccount", "default", "-n", namespace)

    def run_pod(self, name: str, namespace: str, *, cpu: Optional[str] = None, memory: str = "32Mi",
                command: str = SLEEP) -> None:
        """``kubectl run`` a busybox pod bound to this node (no scheduler here), on the host's
        network, without a service-account token (no controller publishes the root CA),
        ``imagePullPolicy: Never``. ``cpu`` given: requests = limits (Guaranteed); else
        BestEffort."""
        self.ensure_namespace(namespace)
        container: Dict[str, Any] = {"name": name}
        if cpu is not None:
            container["resources"] = {"requests": {"cpu": cpu, "memory": memory},
                                      "limits": {"cpu": cpu, "memory": memory}}
        overrides = {"apiVersion": "v1", "spec": {
            "nodeName": self.name, "hostNetwork": True, "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 5, "containers": [container]}}
        self.kubectl("run", name, "-n", namespace, f"--image={BUSYBOX_IMAGE}", "--image-pull-policy=Never",
                     "--restart=Never", "--override-type=strategic", f"--overrides={json.dumps(overrides)}",
                     "--command", "--", "/bin/sh", "-c", command)

    def pods(self, namespace: str) -> Dict[str, Dict[str, Any]]:
        items = self.cp.kubectl_json("get", "pods", "-n", namespace)["items"]
        return {p["metadata"]["name"]: p for p in items}

    def running(self, namespace: str, names: Sequence[str]) -> Optional[Dict[str, Dict[str, Any]]]:
        """The pods when every one of ``names`` is Running with its containers ready, else None."""
        pods = self.pods(namespace)
        for n in names:
            st = pods.get(n, {}).get("status", {})
            cs = st.get("containerStatuses") or []
            if st.get("phase") != "Running" or not cs or not all(c.get("ready") for c in cs):
                return None
        return pods

    def wait_running(self, namespace: str, names: Sequence[str], timeout: float = 60.0) -> Dict[str, Dict[str, Any]]:
        return _wait_for(lambda: self.running(namespace, names), f"pods {list(names)} Running", timeout,
                         self.kubelet, lambda: _tail(self.kubelet_log_path, 3000))

    def delete_pod(self, name: str, namespace: str, wait: bool = True) -> None:
        self.kubectl("delete", "pod", name, "-n", namespace, f"--wait={'true' if wait else 'false'}",
                     timeout=90)

    @staticmethod
    def container_id(pod: Dict[str, Any]) -> str:
        """The containerd id of the pod's (first) container."""
        cid = pod["status"]["containerStatuses"][0]["containerID"]
        return cid.split("://", 1)[1]

    def real_cpus(self, container_id: str) -> Dict[str, str]:
        """What the kernel has for a running container: its cgroup's ``cpuset.cpus`` (read
        in the host's view of the node's sub-cgroup) and its PID 1's ``Cpus_allowed_list``."""
        from anolisnuma.cri.client import CriClient

        client = CriClient(self.containerd.socket)
        try:
            _, info = client.container_status(container_id)
        finally:
            client.close()
        path = info["runtimeSpec"]["linux"]["cgroupsPath"]
        with open(os.path.join(self.host_cgroup("cpuset", path), "cpuset.cpus")) as f:
            cgroup = f.read().strip()
        allowed = ""
        with open(f"/proc/{int(info['pid'])}/status") as f:
            for line in f:
                if line.startswith("Cpus_allowed_list:"):
                    allowed = line.split(":", 1)[1].strip()
        return {"cgroup": cgroup, "allowed": allowed}

    # ------------------------------------------------------------------ the daemon and the kubelet's log
    def ctl(self, *args: str) -> str:
        """``anolisnuma-ctl --admin-socket <the node's> ARGS`` (this tree's)."""
        env = dict(os.environ, PYTHONPATH=self.tree)
        done = subprocess.run([sys.executable, "-m", "anolisnuma.ctl.main", "--admin-socket", self.admin_socket,
                               *args], capture_output=True, text=True, timeout=60, env=env, cwd=self.tree)
        if done.returncode != 0:
            raise RuntimeError(f"anolisnuma-ctl {' '.join(args)} failed ({done.returncode}): {done.stderr}")
        return done.stdout

    def kubelet_log(self) -> List[str]:
        with open(self.kubelet_log_path, errors="replace") as f:
            return f.read().splitlines()

    def runtime_errors(self, since_line: int = 0) -> List[str]:
        """The kubelet's log lines (from ``since_line``) that report a failed call to its
        runtime (``RUNTIME_ERROR_PATTERNS``)."""
        return [line for line in self.kubelet_log()[since_line:] if any(p in line for p in RUNTIME_ERROR_PATTERNS)]


# --------------------------------------------------------------------------- cleanup

def _ns_pids(ns_id: str) -> List[int]:
    return [p for p in _all_pids() if p != os.getpid() and _mnt_ns(p) == ns_id and _alive(p)]


def cleanup_node(base: str, record: Dict[str, Any], containerd: Optional[PrivateContainerd] = None) -> List[str]:
    """Remove what a node recorded in ``record`` (its ``node.json``): containerd's pods,
    shims and the kubelet's cgroups (cleaned inside the namespace, where their paths mean
    what they meant to them), every process left in the namespace, the sub-cgroups,
    ``/var/lib/kubelet`` if the node made it, the directories. Returns the problems."""
    problems: List[str] = []
    holder, ns_id = record.get("holder"), record.get("ns")
    run_dir = record.get("run_dir", "")
    pc = containerd or PrivateContainerd(os.path.join(base, "containerd"), run_dir)
    alive = bool(holder) and _alive(int(holder)) and _mnt_ns(int(holder)) == ns_id
    if alive:
        code = ("import json, sys; from anolisnuma.testing.containerd import PrivateContainerd; "
                "print(json.dumps(PrivateContainerd(sys.argv[1], sys.argv[2]).cleanup()))")
        done = subprocess.run(["nsenter", f"--target={holder}", "--mount", "--", sys.executable, "-c", code,
                               pc.base_dir, pc.run_dir], capture_output=True, text=True, timeout=120,
                              env=dict(os.environ, PYTHONPATH=REPO_ROOT))
        if done.returncode != 0:
            problems.append(f"containerd cleanup in the namespace failed: {done.stderr.strip()[-500:]}")
        else:
            problems += [p for p in json.loads(done.stdout.strip().splitlines()[-1])
                         if not p.startswith("could not remove")]
    if ns_id:
        left = _ns_pids(ns_id)
        for p in left:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while _ns_pids(ns_id) and time.monotonic() < deadline:
            time.sleep(0.05)   # the kernel ending the processes just killed
        problems += [f"process {p} still in the node's namespace" for p in _ns_pids(ns_id)]
    if holder:
        try:
            os.waitpid(int(holder), os.WNOHANG)
        except ChildProcessError:
            pass
    problems += pc.cleanup()          # the host's side: shared dirs, base/run dirs
    for sub in reversed(record.get("cgroups", [])):
        problems += [f"cgroup left: {d}" for d in _rmdir_tree(sub, retries=20)]
    if record.get("created_var_lib_kubelet"):
        try:
            os.rmdir(VAR_LIB_KUBELET)
        except OSError as e:
            problems.append(f"{VAR_LIB_KUBELET}: {e}")
    for d in (run_dir, base):
        if d:
            shutil.rmtree(d, ignore_errors=True)
            if os.path.exists(d):
                problems.append(f"could not remove {d}")
    return problems


def cleanup_dead_nodes(prefix: str = BASE_PREFIX) -> List[str]:
    """Clean up the nodes of runs that died: ``<prefix>*/node.json`` whose owner pid is gone."""
    parent, stem = os.path.split(prefix)
    cleaned = []
    try:
        names = os.listdir(parent)
    except OSError:
        return cleaned
    for name in names:
        base = os.path.join(parent, name)
        if not name.startswith(stem):
            continue
        try:
            with open(os.path.join(base, "node.json")) as f:
                record = json.load(f)
        except (OSError, ValueError):
            continue
        if _alive(int(record.get("owner", 0))):
            continue
        cleanup_node(base, record)
        cleaned.append(base)
    return cleaned


__all__ = ["KubeletNode", "missing", "cleanup_node", "cleanup_dead_nodes", "RUNTIME_ERROR_PATTERNS", "NODE_CPUS"]
