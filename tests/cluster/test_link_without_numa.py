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
from typing import Any, Iterator

import pytest
from cluster_helpers import Cluster, FakeHostNode, ctl, fake_host_node, pod_events

from anolisnuma.testing.waiting import wait_until


@pytest.fixture
def qos_only(cluster: Cluster, tmp_path: Any, sockdir: str) -> Iterator[FakeHostNode]:
    name = f"qos-{uuid.uuid4().hex[:8]}"
    with fake_host_node(
            str(tmp_path), sockdir, name,
            admin={"socket": os.path.join(sockdir, "admin.sock")},
            numa={"enabled": False},
            qos={"enabled": True, "reconcile_interval_seconds": 1.0},
            kubernetes={"kubeconfig": cluster.node_kubeconfig(name), "node_name": name, "request_timeout_seconds": 3.0,
                        "topology": True}) as node:
        yield node


def test_qos_without_numa_sends_its_events_and_publishes_no_topology(cluster: Cluster, qos_only: Any) -> None:
    name, daemon = qos_only.name, qos_only.proxy.daemon
    assert [h.name for h in daemon.hooks] == ["qos"] and daemon.cluster is not None
    uid, _ = qos_only.run_pod("nonuma-web", {"anolisbox.sh/qoslevel": "BE"})
    found = wait_until(lambda: [e for e in pod_events(cluster, "nonuma-web") if e["reason"] == "QosApplied"],
                       "the pod's QosApplied event")
    ev = found[0]
    assert ev["type"] == "Normal" and ev["regarding"]["uid"] == uid
    assert ev["reportingController"] == "anolisnuma.io/qos"   # (a QoS decision: not NUMA's name)
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
