"""The API server link is the daemon's, not the NUMA hook's: a node with QoS on, NUMA
placement off and ``[kubernetes]`` on (``topology = true`` too) still tells the cluster
what it decided.

Against the session's real kube-apiserver: a pod created through the proxy gets its
``QosApplied`` event; no Oenuma CR is watched and no NodeResourceTopology is published
(its ``available`` is the NUMA ledger's, which this node has not); ``anolisnuma-ctl
status`` shows the link as events only.
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any, Dict, Iterator, List, Tuple

import pytest
from cluster_helpers import TOPOLOGY, Cluster, ctl

from anolisnuma.config import Config
from anolisnuma.testing.fake_cri import FakeCri
from anolisnuma.testing.fake_kernel import FakeKernel
from anolisnuma.testing.kubelet_client import PERIOD, Kubelet
from anolisnuma.testing.proxy import InProcessProxy, config_dict, write_config
from anolisnuma.testing.waiting import wait_until
from cri_proto import api_pb2 as pb


@pytest.fixture
def qos_only(cluster: Cluster, tmp_path: Any, sockdir: str) -> Iterator[Tuple[str, InProcessProxy, Kubelet, FakeKernel]]:
    name = f"qos-{uuid.uuid4().hex[:8]}"
    fk = FakeKernel.temporary(sched_core=0)
    TOPOLOGY.write(fk.paths.sys_root)
    fake = FakeCri(os.path.join(sockdir, "containerd.sock"), containers=0, sandboxes=0).start()
    p = fk.paths
    data = config_dict(str(tmp_path), fake.socket_path, listen=os.path.join(sockdir, "cri.sock"), extra={
        "log": {"stderr": False},
        "admin": {"socket": os.path.join(sockdir, "admin.sock")},
        "paths": {"cgroup_root": p.cgroup_root, "resctrl_root": p.resctrl_root, "sys_root": p.sys_root,
                  "proc_root": p.proc_root, "state_dir": p.state_dir,
                  "kubelet_cpu_manager_state": p.kubelet_cpu_manager_state},
        "runtime": {"resync_interval_seconds": 0.0},
        "numa": {"enabled": False},
        "qos": {"enabled": True, "reconcile_interval_seconds": 1.0},
        "kubernetes": {"kubeconfig": cluster.kubeconfig, "node_name": name, "request_timeout_seconds": 3.0,
                       "topology": True},
    })
    proxy = InProcessProxy(Config.load(write_config(os.path.join(str(tmp_path), "config.toml"), data))).start()
    kubelet = Kubelet(proxy.address)
    try:
        proxy.wait_resynced()
        yield name, proxy, kubelet, fk
    finally:
        kubelet.close()
        proxy.stop()
        fake.stop(0)
        fk.close()


def run_pod(kubelet: Kubelet, kernel: FakeKernel, name: str, annotations: Dict[str, str]) -> str:
    uid = str(uuid.uuid4())
    parent = f"/kubepods/burstable/pod{uid}"
    kernel.make_pod(parent)
    res = pb.LinuxContainerResources(cpu_period=PERIOD, cpu_quota=PERIOD // 100)
    config = pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(name=name, namespace="batch", uid=uid),
                                 annotations=annotations,
                                 linux=pb.LinuxPodSandboxConfig(cgroup_parent=parent, resources=res))
    sid = kubelet.call("RunPodSandbox", pb.RunPodSandboxRequest(config=config), pb.RunPodSandboxResponse).pod_sandbox_id
    kubelet.call("CreateContainer", pb.CreateContainerRequest(
        pod_sandbox_id=sid, sandbox_config=config,
        config=pb.ContainerConfig(metadata=pb.ContainerMetadata(name="app"),
                                  linux=pb.LinuxContainerConfig(resources=res))), pb.CreateContainerResponse)
    return uid


def pod_events(cluster: Cluster, name: str) -> List[Any]:
    items = cluster.cp.request("GET", "/apis/events.k8s.io/v1/namespaces/batch/events")["items"]
    return [e for e in items if e["regarding"]["name"] == name and e["regarding"]["kind"] == "Pod"]


def test_qos_without_numa_sends_its_events_and_publishes_no_topology(cluster: Cluster, qos_only: Any) -> None:
    name, proxy, kubelet, kernel = qos_only
    daemon = proxy.daemon
    assert [h.name for h in daemon.hooks] == ["qos"] and daemon.cluster is not None
    uid = run_pod(kubelet, kernel, "nonuma-web", {"anolisbox.sh/qoslevel": "BE"})
    found = wait_until(lambda: [e for e in pod_events(cluster, "nonuma-web") if e["reason"] == "QosApplied"],
                       "the pod's QosApplied event")
    ev = found[0]
    assert ev["type"] == "Normal" and ev["regarding"]["uid"] == uid
    assert ev["note"].startswith(f"{name}: QoS level BE (annotation anolisbox.sh/qoslevel=BE): ")
    assert not any(e["reason"].startswith("Numa") for e in pod_events(cluster, "nonuma-web"))

    # no Oenuma watch, no topology: the link's loops are the events' only
    loops = {c.name for c in daemon.controllers}
    assert "cluster-events" in loops and not loops & {"cluster-watch", "cluster-rules", "cluster-topology"}
    nrt = cluster.cp.request("GET", "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies")["items"]
    assert name not in [o["metadata"]["name"] for o in nrt]

    wait_until(lambda: daemon.cluster.status()["state"] == "up", "the link up after an event sent")
    code, text, err = ctl("--admin-socket", daemon.config.admin.socket, "status")
    assert code == 0, err
    line = next(ln for ln in text.splitlines() if ln.startswith("api server"))
    assert f"up ({cluster.cp.server})" in line and "NUMA placement is off" in line and "events sent" in line
    code, text, err = ctl("--admin-socket", daemon.config.admin.socket, "-o", "json", "status")
    c = json.loads(text)["cluster"]
    assert c["node_name"] == name and c["rules"] == [] and c["events_sent"] >= 1
    assert c["pod_events"]["QosApplied"] == 1 and "topology" not in c
