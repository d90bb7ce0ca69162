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

import signal
import statistics
import time
import uuid
from typing import Any, Dict, Iterator

import pytest
from cluster_helpers import Cluster, FakeHostNode, fake_host_node, pod_events

from anolisnuma.cluster.events import QUEUE
from anolisnuma.testing.waiting import wait_until


@pytest.fixture
def qnode(cluster: Cluster, tmp_path: Any, sockdir: str) -> Iterator[FakeHostNode]:
    name = f"worker-{uuid.uuid4().hex[:8]}"
    with fake_host_node(
            str(tmp_path), sockdir, name,
            numa={"enabled": True, "namespaces": ["batch"], "node_name": name, "poll_interval_seconds": 0.1},
            qos={"enabled": True, "reconcile_interval_seconds": 1.0},
            kubernetes={"kubeconfig": cluster.node_kubeconfig(name), "request_timeout_seconds": 3.0,
                        "watch_timeout_seconds": 30.0, "backoff_max_seconds": 1.0},
            metrics={"listen": "127.0.0.1:0"}) as node:
        yield node


def by_reason(cluster: Cluster, name: str, *reasons: str) -> Dict[str, Any]:
    found = {e["reason"]: e for e in pod_events(cluster, name)}
    return found if all(r in found for r in reasons) else {}


def test_a_managed_pod_gets_its_numa_and_qos_events_and_the_link_its_metrics(cluster: Cluster,
                                                                          qnode: FakeHostNode) -> None:
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
        cluster: Cluster, qnode: FakeHostNode) -> None:
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
