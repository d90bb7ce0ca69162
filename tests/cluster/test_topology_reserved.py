"""The NodeResourceTopology's ``allocatable`` leaves out the CPUs the kubelet reserves by name
(``reservedSystemCPUs``, or ``--reserved-cpus`` over it), read from the kubelet's own files
as the daemon reads its cgroup layout; ``capacity`` still counts them."""

from __future__ import annotations

import os
import uuid
from typing import Any

import pytest
from cluster_helpers import TOPOLOGY, Cluster
from test_topology_live import published, zone_resources

from anolisnuma.config import Config
from anolisnuma.testing.fake_cri import FakeCri
from anolisnuma.testing.proxy import InProcessProxy, config_dict, write_config
from anolisnuma.testing.waiting import wait_until

KUBELET_UNIT = """[Service]
EnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env
ExecStart=/usr/bin/kubelet --config=/var/lib/kubelet/config.yaml $KUBELET_KUBEADM_ARGS
"""


def kubelet_files(root: str, flags: str, config: str) -> None:
    for rel, text in (("etc/systemd/system/kubelet.service", KUBELET_UNIT),
                      ("var/lib/kubelet/kubeadm-flags.env", f'KUBELET_KUBEADM_ARGS="{flags}"\n'),
                      ("var/lib/kubelet/config.yaml", "kind: KubeletConfiguration\n" + config)):
        os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
        with open(os.path.join(root, rel), "w") as f:
            f.write(text)


@pytest.mark.parametrize("flags, config, left_out", [
    ("", 'reservedSystemCPUs: "0,2-3"\n', {0: 1, 1: 2}),
    ("--reserved-cpus=7", 'reservedSystemCPUs: "0"\n', {3: 1}),     # the flag wins, as in the kubelet
])
def test_the_kubelets_reserved_cpus_are_not_allocatable(cluster: Cluster, tmp_path: Any, sockdir: str,
                                                        flags: str, config: str, left_out: dict) -> None:
    kubelet_files(str(tmp_path / "kubelet"), flags, config)
    name = f"worker-{uuid.uuid4().hex[:8]}"
    fake = FakeCri(os.path.join(sockdir, "containerd.sock"), containers=0, sandboxes=0).start()
    data = config_dict(str(tmp_path), fake.socket_path, listen=os.path.join(sockdir, "cri.sock"), extra={
        "log": {"stderr": False}, "runtime": {"resync_interval_seconds": 0.0},
        "cgroups": {"kubelet_files_root": str(tmp_path / "kubelet")},
        "numa": {"enabled": True, "namespaces": ["batch"], "node_name": name},
        "kubernetes": {"kubeconfig": cluster.node_kubeconfig(name), "request_timeout_seconds": 3.0, "topology": True,
                       "topology_interval_seconds": 1.0}})
    TOPOLOGY.write(data["paths"]["sys_root"])
    proxy = InProcessProxy(Config.load(write_config(str(tmp_path / "config.toml"), data))).start()
    try:
        obj = wait_until(lambda: published(cluster, name), "the NodeResourceTopology published")
        for zone, cpus in zone_resources(obj).items():
            n = int(zone.split("-")[1])
            allocatable = str(2 - left_out.get(n, 0))
            assert cpus["cpu"] == ("2", allocatable, allocatable), (zone, cpus)
    finally:
        proxy.stop()
        fake.stop(0)
        cluster.cp.kubectl("delete", "noderesourcetopology", name, "--ignore-not-found")
