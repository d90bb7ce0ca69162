"""``[kubernetes] topology = true``: the daemon publishes its NUMA zones as a
NodeResourceTopology on the real API server (deploy/'s CRD, RBAC and node policy, the
node's own identity),
zones as the topology has them, available changed once a pod is placed, nothing applied
while nothing changed."""

from __future__ import annotations

import json
import urllib.error
import uuid
from typing import Any, Dict, Optional

from cluster_helpers import TOPOLOGY, Cluster, ctl, start_node, stop_node

from anolisnuma.testing.waiting import wait_until

NRT = "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies/"


def published(cluster: Cluster, name: str) -> Optional[Dict[str, Any]]:
    try:
        return cluster.cp.request("GET", NRT + name)
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise


def zone_resources(obj: Dict[str, Any]) -> Dict[str, Dict[str, tuple]]:
    return {z["name"]: {r["name"]: (r["capacity"], r["allocatable"], r["available"]) for r in z["resources"]}
            for z in obj["zones"]}


def test_the_node_publishes_its_zones_and_they_follow_placements(cluster: Cluster, tmp_path: Any,
                                                                 sockdir: str) -> None:
    name = f"worker-{uuid.uuid4().hex[:8]}"
    node = start_node(str(tmp_path), sockdir, cluster.node_kubeconfig(name), name, topology=True,
                      topology_interval_seconds=1.0, topology_manager_policy="single-numa-node")
    try:
        # (the object is on the API server a moment before the publisher counts its apply)
        obj = wait_until(lambda: node.link.topology.publishes >= 1 and published(cluster, name),
                         "the NodeResourceTopology published")
        gib4 = str(4 * 1024 ** 3)
        assert zone_resources(obj) == {f"node-{n}": {"cpu": ("2", "2", "2"), "memory": (gib4, gib4, gib4)}
                                       for n in range(4)}
        for z in obj["zones"]:
            n = int(z["name"].split("-")[1])
            assert z["type"] == "Node"
            assert [c["value"] for c in z["costs"]] == TOPOLOGY.distances[n]
        assert {"name": "topologyManagerPolicy", "value": "single-numa-node"} in obj["attributes"]
        assert obj["topologyPolicies"] == ["SingleNUMANodeContainerLevel"]
        publisher = node.link.topology
        fields = [f["manager"] for f in obj["metadata"]["managedFields"]]
        assert fields == [f"anolisnuma/{name}"]

        # nothing changed: passes go by, no apply
        publishes, runs = publisher.publishes, publisher.runs
        wait_until(lambda: publisher.runs >= runs + 2, "two more passes")
        assert publisher.publishes == publishes and publisher.unchanged >= 2

        pod = node.kubelet.run("nrt-0")          # 1 CPU and 1 GiB on one NUMA node
        placed = node.nodes_of(pod)
        assert placed is not None and len(placed) == 1
        zone = f"node-{placed[0]}"

        def changed() -> Any:
            o = published(cluster, name)
            return o is not None and zone_resources(o)[zone]["cpu"][2] != "2" and o
        # (the object is on the API server a moment before the publisher counts its apply)
        obj = wait_until(lambda: publisher.publishes > publishes and changed(), "the zone's available CPU changed")
        res = zone_resources(obj)
        assert res[zone] == {"cpu": ("2", "2", "1"), "memory": (gib4, gib4, str(3 * 1024 ** 3))}
        assert all(res[f"node-{n}"]["cpu"] == ("2", "2", "2") for n in range(4) if n != placed[0])
        assert publisher.publishes == publishes + 1 and publisher.failures == 0

        code, out, _ = ctl("--admin-socket", node.admin_socket, "-o", "json", "status")
        topo = json.loads(out)["cluster"]["topology"]
        assert code == 0 and topo["publishes"] == publisher.publishes and topo["last_publish"] and topo["zones"] == 4
        code, text, _ = ctl("--admin-socket", node.admin_socket, "status")
        assert "NodeResourceTopology published" in text, text
        from anolisnuma.admin.metrics import DaemonCollector

        families = {f.name: f for f in DaemonCollector(node.proxy.daemon).collect()}
        samples = {s.labels["outcome"]: s.value for s in families["anolisnuma_cluster_topology_publishes"].samples
                   if s.name.endswith("_total")}
        assert samples == {"ok": publisher.publishes, "failed": 0}
        assert "anolisnuma_cluster_topology_last_publish_timestamp_seconds" in families
    finally:
        stop_node(node)
        cluster.cp.kubectl("delete", "noderesourcetopology", name, "--ignore-not-found")


def test_without_the_option_nothing_is_published(cluster: Cluster, node: Any) -> None:
    assert node.link.topology is None and "topology" not in node.link.status()
    assert published(cluster, node.name) is None
