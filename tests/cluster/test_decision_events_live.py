"""Events on pods for what the node decided, on the real API server, and the link's metrics.

Given a daemon with NUMA placement and QoS on (a fake 4-node topology, FakeCri as
containerd, a fake kernel tree for the Anolis QoS knobs this kernel lacks) and
``[kubernetes]`` pointing at the session's kube-apiserver: a managed pod created through
the proxy gets a ``NumaPlaced`` event (its nodes and cpuset) and a ``QosApplied`` event
(its level and knobs) regarding it; a bad QoS annotation is a ``QosSkipped`` warning; the
metrics endpoint shows the link. With the API server stopped (SIGSTOP: it accepts
connections and answers nothing, so every send waits its whole timeout), pod creation is
as fast as before and the events past the queue are dropped and counted, not queued.
"""

from __future__ import annotations

import os
import signal
import statistics
import time
import urllib.request
import uuid
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Tuple

import pytest
from cluster_helpers import TOPOLOGY, Cluster
from prometheus_client.parser import text_string_to_metric_families

from anolisnuma.cluster.events import QUEUE
from anolisnuma.config import Config
from anolisnuma.testing.fake_cri import FakeCri
from anolisnuma.testing.fake_kernel import FakeKernel
from anolisnuma.testing.kubelet_client import PERIOD, Kubelet
from anolisnuma.testing.proxy import InProcessProxy, config_dict, write_config
from anolisnuma.testing.waiting import wait_until
from cri_proto import api_pb2 as pb


@dataclass
class QosNode:
    name: str
    proxy: InProcessProxy
    fake: FakeCri
    kubelet: Kubelet
    kernel: FakeKernel

    @property
    def link(self) -> Any:
        return self.proxy.daemon.cluster

    def run_pod(self, name: str, annotations: Dict[str, str], millicpu: int = 10) -> Tuple[str, float]:
        """A pod of one container through the proxy (its cgroup made first, as the
        kubelet does); (its UID, the seconds the two CRI calls took)."""
        uid = str(uuid.uuid4())
        parent = f"/kubepods/burstable/pod{uid}"
        self.kernel.make_pod(parent)
        res = pb.LinuxContainerResources(cpu_period=PERIOD, cpu_quota=PERIOD * millicpu // 1000)
        config = pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(name=name, namespace="batch", uid=uid),
                                     annotations=annotations,
                                     linux=pb.LinuxPodSandboxConfig(cgroup_parent=parent, resources=res))
        t = time.perf_counter()
        sid = self.kubelet.call("RunPodSandbox", pb.RunPodSandboxRequest(config=config),
                                pb.RunPodSandboxResponse).pod_sandbox_id
        self.kubelet.call("CreateContainer", pb.CreateContainerRequest(
            pod_sandbox_id=sid, sandbox_config=config,
            config=pb.ContainerConfig(metadata=pb.ContainerMetadata(name="app"),
                                      linux=pb.LinuxContainerConfig(resources=res))), pb.CreateContainerResponse)
        return uid, time.perf_counter() - t

    def metrics(self) -> Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float]:
        metrics = self.proxy.daemon.admin.metrics
        metrics.scrapes.interval = 0.0   # (this scrape, not the last second's)
        with urllib.request.urlopen(metrics.url, timeout=10) as r:
            text = r.read().decode()
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}


@pytest.fixture
def qnode(cluster: Cluster, tmp_path: Any, sockdir: str) -> Iterator[QosNode]:
    name = f"worker-{uuid.uuid4().hex[:8]}"
    fk = FakeKernel.temporary(sched_core=0)
    TOPOLOGY.write(fk.paths.sys_root)
    fake = FakeCri(os.path.join(sockdir, "containerd.sock"), containers=0, sandboxes=0).start()
    p = fk.paths
    data = config_dict(str(tmp_path), fake.socket_path, listen=os.path.join(sockdir, "cri.sock"), extra={
        "log": {"stderr": False},
        "paths": {"cgroup_root": p.cgroup_root, "resctrl_root": p.resctrl_root, "sys_root": p.sys_root,
                  "proc_root": p.proc_root, "state_dir": p.state_dir,
                  "kubelet_cpu_manager_state": p.kubelet_cpu_manager_state},
        "runtime": {"resync_interval_seconds": 0.0},
        "numa": {"enabled": True, "namespaces": ["batch"], "node_name": name, "poll_interval_seconds": 0.1},
        "qos": {"enabled": True, "reconcile_interval_seconds": 1.0},
        "kubernetes": {"kubeconfig": cluster.kubeconfig, "request_timeout_seconds": 3.0,
                       "watch_timeout_seconds": 30.0, "backoff_max_seconds": 1.0},
        "metrics": {"listen": "127.0.0.1:0"},
    })
    proxy = InProcessProxy(Config.load(write_config(os.path.join(str(tmp_path), "config.toml"), data))).start()
    kubelet = Kubelet(proxy.address)
    try:
        proxy.wait_resynced()
        yield QosNode(name, proxy, fake, kubelet, fk)
    finally:
        kubelet.close()
        proxy.stop()
        fake.stop(0)
        fk.close()


def pod_events(cluster: Cluster, name: str) -> List[Any]:
    items = cluster.cp.request("GET", "/apis/events.k8s.io/v1/namespaces/batch/events")["items"]
    return [e for e in items if e["regarding"]["name"] == name and e["regarding"]["kind"] == "Pod"]


def by_reason(cluster: Cluster, name: str, *reasons: str) -> Dict[str, Any]:
    found = {e["reason"]: e for e in pod_events(cluster, name)}
    return found if all(r in found for r in reasons) else {}


def test_a_managed_pod_gets_its_numa_and_qos_events_and_the_link_its_metrics(cluster: Cluster,
                                                                          qnode: QosNode) -> None:
    uid, _ = qnode.run_pod("ev-web", {"anolisbox.sh/qoslevel": "BE"})
    found = wait_until(lambda: by_reason(cluster, "ev-web", "NumaPlaced", "QosApplied"), "the pod's two events")
    placed, qos = found["NumaPlaced"], found["QosApplied"]
    alloc = qnode.link.sync.placement.ledger.get(uid)
    cpus = alloc.cpus(qnode.link.sync.placement.shared_pool)
    assert placed["type"] == "Normal" and placed["regarding"]["uid"] == uid
    assert placed["reportingController"] == "anolisnuma.io/numa"
    assert placed["note"].startswith(f"{qnode.name}: NUMA node {alloc.nodes[0]}, cpuset {cpus}, ")
    assert "by balance" in placed["note"]
    assert qos["type"] == "Normal" and qos["regarding"]["uid"] == uid
    assert qos["note"].startswith(f"{qnode.name}: QoS level BE (annotation anolisbox.sh/qoslevel=BE): ")
    assert "cpu.bvt_warp_ns=-1" in qos["note"]
    described = cluster.cp.kubectl("get", "events", "-n", "batch", "--field-selector",
                                   "involvedObject.name=ev-web").stdout
    assert "NumaPlaced" in described and "QosApplied" in described

    qnode.run_pod("ev-odd", {"anolisbox.sh/qoslevel": "turbo"})
    odd = wait_until(lambda: by_reason(cluster, "ev-odd", "QosSkipped"), "the bad annotation's event")["QosSkipped"]
    assert odd["type"] == "Warning" and "'turbo'" in odd["note"] and "QoS level LS" in odd["note"]
    # one event per pod per decision: the reconciler's passes add none
    runs = qnode.proxy.daemon.controllers.get("qos-reconcile").runs
    wait_until(lambda: qnode.proxy.daemon.controllers.get("qos-reconcile").runs >= runs + 2, "two reconcile passes")
    assert sorted(e["reason"] for e in pod_events(cluster, "ev-web")) == ["NumaPlaced", "QosApplied"]

    m = qnode.metrics()
    def v(name: str, **labels: str) -> float:
        return m[(name, tuple(sorted(labels.items())))]
    assert v("anolisnuma_cluster_connection_state", state="synced") == 1
    assert v("anolisnuma_cluster_connection_state", state="down") == 0
    assert v("anolisnuma_cluster_watch_requests_total", request="list") >= 1
    assert time.time() - 600 < v("anolisnuma_cluster_last_sync_timestamp_seconds") <= time.time()
    assert v("anolisnuma_cluster_crs_seen") >= 0 and v("anolisnuma_cluster_rules") == 0
    assert v("anolisnuma_cluster_pod_events_total", reason="NumaPlaced") == 2
    assert v("anolisnuma_cluster_pod_events_total", reason="QosApplied") == 1
    assert v("anolisnuma_cluster_pod_events_total", reason="QosSkipped") == 1
    assert v("anolisnuma_cluster_events_sent_total") >= 4
    assert v("anolisnuma_cluster_events_dropped_total", reason="queue_full") == 0
    assert ("anolisnuma_cluster_status_applies_total", (("outcome", "failed"),)) in m


def test_with_the_api_server_stopped_pods_are_not_slowed_and_events_are_dropped_and_counted(
        cluster: Cluster, qnode: QosNode) -> None:
    events = qnode.link.events
    for i in range(5):   # warm
        qnode.run_pod(f"warm-{i}", {"anolisbox.sh/qoslevel": "LS"})
    base = [qnode.run_pod(f"base-{i}", {"anolisbox.sh/qoslevel": "LS"})[1] for i in range(30)]
    wait_until(lambda: events.counts()["events_queued"] == 0 and events.sent >= 70, "the baseline's events sent")
    sent = events.sent
    proc = cluster.cp.apiserver
    assert proc is not None
    proc.send_signal(signal.SIGSTOP)   # connections are taken by the kernel; nothing answers
    try:
        during = [qnode.run_pod(f"stopped-{i}", {"anolisbox.sh/qoslevel": "LS"})[1] for i in range(200)]
        st = events.counts()
        sink = qnode.link.pod_events.counts()
    finally:
        proc.send_signal(signal.SIGCONT)
    print(f"pod creation through the proxy, median: {statistics.median(base) * 1e3:.1f} ms with the API server "
          f"up, {statistics.median(during) * 1e3:.1f} ms stopped; {st}")
    assert statistics.median(during) < 5 * statistics.median(base), (base, during)
    assert st["events_queued"] <= QUEUE
    assert st["events_dropped_full"] > 0 and events.sent - sent <= 1   # (one may have been on its way)
    # every decision is accounted for: queued, or dropped and counted
    assert sink["dropped"] == st["events_dropped_full"] + st["events_dropped_rate"]
    assert sink["NumaPlaced"] + sink["QosApplied"] + sink["dropped"] == 2 * (5 + 30 + 200)
    # once the API server answers again, what was queued is sent or counted as failed
    wait_until(lambda: events.counts()["events_queued"] == 0, "the queue drained", timeout=120)
    wait_until(lambda: qnode.link.status()["state"] == "synced", "the watch back", timeout=60)
