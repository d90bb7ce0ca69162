"""A kubelet run with --cgroup-root=/<custom> (cgroupfs driver) on the real containerd and
the real cgroup v1 hierarchies: the daemon's hooks are built from a config that names the
root in ``[cgroups] kubelet_cgroup_root``; the sandbox's cgroup_parent is
``/<custom>/kubepods/burstable/pod<uid>``.

- NUMA: the container is pinned; its REAL ``cpuset.cpus`` under the custom root says so; a
  live move re-pins it there; memory migration (``cpuset.memory_migrate``) is written in
  the real container cgroup found through the layout;
- QoS: the pod is admitted with its real cgroup under the custom root (this kernel has no
  Anolis knob, so nothing is written: the fake-tree tests check values), and the
  reconciler finds that cgroup (nothing forgotten);
- a pod of the default root on the same node is refused by QoS once, with the fix.

The systemd driver and cgroup v2 with a custom root: tests/hooks/test_qos_cgroup_layouts.py
(fake trees: this machine has neither).
"""

from __future__ import annotations

import os
import uuid

from cri_client import KubeletLike, read_file
from test_numa_e2e import numa_config, real_cpus, res

from anolisnuma.config import Config
from anolisnuma.daemon import build_hooks
from anolisnuma.hooks.numa import NumaHook
from anolisnuma.hooks.qos import QosHook
from anolisnuma.system.cgroups import CgroupFs, enable_memory_migrate
from anolisnuma.testing.containerd import cgroup_hierarchies
from anolisnuma.testing.proxy import InProcessProxy
from anolisnuma.testing.waiting import wait_until

CG = "/sys/fs/cgroup"
NS = "layout-e2e"


def _remove_tree(root: str) -> list:
    """rmdir the custom root and what is left below it (deepest first) in every hierarchy."""
    left = []
    for mnt, _ in cgroup_hierarchies(CG, include_v2=True):
        top = mnt + root
        if not os.path.isdir(top):
            continue
        for dirpath, _, _ in sorted(os.walk(top), key=lambda w: -w[0].count("/")):
            try:
                os.rmdir(dirpath)
            except OSError:
                left.append(dirpath)
    return left


def test_cgroupfs_with_a_custom_root_on_real_cgroups(containerd, tmp_path):
    root = f"/anolisnuma-layout-{os.getpid()}"
    data = numa_config(str(tmp_path), containerd.socket, namespaces=[NS])
    data["paths"]["cgroup_root"] = CG
    data["qos"] = {"enabled": True, "reconcile_interval_seconds": 0, "resctrl": {"enabled": False}}
    data["cgroups"] = {"kubelet_cgroup_root": root, "kubelet_cgroup_driver": "cgroupfs"}
    config = Config.from_dict(data)
    hooks = build_hooks(config)
    numa = next(h for h in hooks if isinstance(h, NumaHook))
    qos = next(h for h in hooks if isinstance(h, QosHook))
    layout = qos.cgroups.layout
    assert layout is numa.layout and layout.root == root     # one layout for every hook
    proxy = InProcessProxy(config, hooks=hooks).start()
    kl = None
    try:
        proxy.wait_resynced()
        kl = KubeletLike(proxy.socket_path, harness=containerd)
        uid = str(uuid.uuid4())
        parent = f"{root}/kubepods/burstable/pod{uid}"
        pod = kl.run_pod(name="custom-root", namespace=NS, uid=uid, cgroup_parent=parent)
        cid = kl.run_container(pod, "main", res(kl, quota=30000, period=100000))
        _, info = kl.container_status(cid)
        assert info["runtimeSpec"]["linux"]["cgroupsPath"] == f"{parent}/{cid}"

        # NUMA: pinned, and the real cgroup under the custom root holds the pinning.
        alloc = next(a for a in numa.placement.allocations() if a.pod_uid == uid)
        node = alloc.nodes[0]
        assert real_cpus(kl, cid) == str(node)
        assert read_file(f"{CG}/cpuset{parent}/{cid}/cpuset.cpus") == str(node)

        # A live move re-pins it there (the re-pinner through containerd).
        other = 1 - node
        assert numa.placement.move(uid, [other], reason="layout test")
        proxy.daemon.controllers.get("numa-repin").run_once()
        wait_until(lambda: read_file(f"{CG}/cpuset{parent}/{cid}/cpuset.cpus") == str(other),
                   "the moved container's real cpuset.cpus", 30.0)

        # Memory migration finds the container's real cpuset cgroup through the layout.
        migrate = f"{CG}/cpuset{parent}/{cid}/cpuset.memory_migrate"
        with open(migrate, "w") as f:
            f.write("0")
        assert enable_memory_migrate(CgroupFs(CG, layout), uid, [cid]) == []
        assert read_file(migrate) == "1"
        assert CgroupFs(CG).locate_pod(uid) is None              # the default layout would not find it

        # QoS: admitted with the real cgroup under the custom root; the reconciler finds it.
        managed = qos.state.by_uid(uid)
        assert managed is not None and managed.cgroup.rel == parent.lstrip("/")
        assert os.path.isdir(f"{CG}/cpu/{managed.cgroup.rel}")
        assert cid in managed.containers and os.path.isdir(f"{CG}/cpu/{managed.containers[cid].rel}")
        counts = qos.run_once()
        assert counts.forgotten == 0 and counts.errors == 0

        # A pod of the default root on this node: refused by QoS, reported once with the fix.
        stray_uid = str(uuid.uuid4())
        kl.run_pod(name="default-root", namespace="other", uid=stray_uid,
                   cgroup_parent=f"/kubepods/besteffort/pod{stray_uid}")
        assert qos.state.by_uid(stray_uid) is None
        refused = [e for e in proxy.log_lines() if e.get("message") == "qos skipped: cgroup_parent not recognized"]
        assert len([e for e in refused if e.get("level") == "warning"]) == 1
        assert 'kubelet_cgroup_root = "/"' in refused[0]["fix"]
    finally:
        errors = []
        if kl is not None:
            errors = kl.cleanup()
            kl.close()
        proxy.stop()
        left = _remove_tree(root)
    assert not errors, errors
    assert not left, left
