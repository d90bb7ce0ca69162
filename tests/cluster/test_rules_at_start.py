"""Saved rules never delay the socket: a ``cluster-oenumas.json`` holding the CRs of the
findings (an older daemon kept them: 10,000 entries, a 6,000-character pattern) costs the
kubelet's first CreateContainer no more than a file with one good CR does, and the good CR's
rule applies from that first call, the API server being unreachable."""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from typing import Any, Dict, List, Tuple

import yaml
from cluster_helpers import Cluster, start_node, stop_node

NODE = f"worker-{uuid.uuid4().hex[:8]}"


def oenuma(name: str, affinity: List[Dict[str, Any]]) -> Dict[str, Any]:
    return {"apiVersion": "resource.sop.huawei.com/v1alpha1", "kind": "Oenuma",
            "metadata": {"name": name, "namespace": "batch", "uid": f"u-{name}", "generation": 1},
            "spec": {"node": [{"name": NODE, "podAffinity": affinity}]}}


GOOD = oenuma("good", [{"podName": "first-0", "numaNum": 2}])
HOSTILE = [oenuma("many", [{"podName": f"p-{i}", "numaNum": i % 4} for i in range(10000)]),
           oenuma("brackets", [{"podName": "[" * 6000, "numaNum": 0}])]


def unreachable_kubeconfig(cluster: Cluster, path: str) -> str:
    """The cluster's kubeconfig with its server on a port nobody listens on."""
    with open(cluster.node_kubeconfig("unreachable-node")) as f:
        config = yaml.safe_load(f)
    config["clusters"][0]["cluster"]["server"] = "https://127.0.0.1:9"
    with open(path, "w") as f:
        json.dump(config, f)
    return path


def first_create(cluster: Cluster, base: str, sockdir: str, saved: List[Dict[str, Any]]) -> Tuple[float, Any]:
    """Seconds from the daemon's start to its first pod's CreateContainer returning, and
    the NUMA nodes that pod got."""
    os.makedirs(os.path.join(base, "state"))
    with open(os.path.join(base, "state", "cluster-oenumas.json"), "w") as f:
        json.dump({"version": 1, "node_name": NODE, "saved_at": 0, "objects": saved}, f)
    kubeconfig = unreachable_kubeconfig(cluster, os.path.join(base, "kubeconfig"))
    t = time.perf_counter()
    node = start_node(base, sockdir, kubeconfig, NODE)
    try:
        pod = node.kubelet.run("first-0")
        return time.perf_counter() - t, node.nodes_of(pod)
    finally:
        stop_node(node)


def test_hostile_saved_rules_cost_the_first_create_container_no_more_than_good_ones(
        cluster: Cluster, tmp_path: Any, sockdir: str) -> None:
    first_create(cluster, str(tmp_path / "warm"), sockdir, [GOOD])   # (the link's imports: paid once)
    good: List[float] = []
    hostile: List[float] = []
    for run in range(2):   # (alternately, the best of two each: the machine is shared)
        took, nodes = first_create(cluster, str(tmp_path / f"good-{run}"), sockdir, [GOOD])
        assert nodes == (2,)
        good.append(took)
        took, nodes = first_create(cluster, str(tmp_path / f"hostile-{run}"), sockdir, HOSTILE + [GOOD])
        assert nodes == (2,)   # the good CR's rule, from the first call
        hostile.append(took)
    assert min(hostile) < 2 * min(good), (good, hostile)
    # and while the link parses CRs, the relay waits at most 1 ms for the interpreter lock
    assert sys.getswitchinterval() <= 0.001
