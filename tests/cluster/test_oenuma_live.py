"""Oenuma CRs on a real API server move running pods (given a daemon on a fake 4-node
topology with FakeCri as containerd, when CRs are created, changed, deleted)."""

from __future__ import annotations

import uuid
from typing import Any

from cluster_helpers import Cluster, Node, oenuma, start_node, stop_node

from anolisnuma.testing.waiting import wait_until


def test_a_cr_created_changed_and_deleted_moves_a_running_pod(cluster: Cluster, node: Node) -> None:
    pod = node.kubelet.run("web-0", containers=2)
    start = node.nodes_of(pod)
    assert start is not None and len(start) == 1
    target = (start[0] + 2) % 4
    cluster.apply(oenuma("web", node.name, {"web-*": target}))
    wait_until(lambda: node.settled(pod, (target,)), "the pod re-pinned to the CR's node")
    assert node.placement.ledger.get(pod.uid).source == "rule"

    again = (target + 1) % 4
    cluster.apply(oenuma("web", node.name, {"web-*": again}))
    wait_until(lambda: node.settled(pod, (again,)), "the pod re-pinned to the changed CR's node")

    cluster.cp.kubectl("delete", "oenuma", "-n", "batch", "web")
    wait_until(lambda: node.placement.ledger.get(pod.uid).source == "balance", "the pod back to balance")
    back = node.nodes_of(pod)
    wait_until(lambda: node.settled(pod, back), "the balanced placement applied")


def test_the_node_reports_in_the_cr_status(cluster: Cluster, tmp_path: Any, sockdir: str) -> None:
    # (a numa[] table: honoured from a namespace the node trusts only, test_cr_trust_live.py)
    name = f"worker-{uuid.uuid4().hex[:8]}"
    node = start_node(str(tmp_path), sockdir, cluster.node_kubeconfig(name), name, trusted_namespaces=["batch"])
    try:
        _reports_in_the_cr_status(cluster, node)
    finally:
        stop_node(node)


def _reports_in_the_cr_status(cluster: Cluster, node: Node) -> None:
    pod = node.kubelet.run("db-0")
    cluster.apply(oenuma("db", node.name, {"db-0": 3, "ghost": 1}, numa=[{"numaNum": 3, "cpuset": "7"}]))
    wait_until(lambda: node.settled(pod, (3,)), "the pod pinned")

    def entry():
        cr = cluster.oenuma("batch", "db")
        mine = [e for e in (cr.get("status") or {}).get("nodes") or [] if e["name"] == node.name]
        return mine and mine[0]["observedGeneration"] == cr["metadata"]["generation"] and \
            any(p["state"] == "Pinned" for p in mine[0]["pods"]) and mine[0]
    e = wait_until(entry, "this node's status entry")
    pods = {p["name"]: p for p in e["pods"]}
    assert pods["db-0"]["cpuset"] == "7" and pods["db-0"]["numaNodes"] == [3] and pods["db-0"]["uid"] == pod.uid
    assert pods["ghost"]["state"] == "Absent"
    assert e["conditions"][0]["type"] == "Applied" and e["conditions"][0]["status"] == "True"
    table = cluster.cp.kubectl("get", "oenumas", "-n", "batch").stdout
    assert "REPORT" in table and f"{node.name}, gen 1: 1/1 pods pinned, 1 absent" in table


def test_a_cr_with_garbage_fields_is_reported_and_skipped_the_others_apply(cluster: Cluster, node: Node) -> None:
    import json

    pod = node.kubelet.run("api-0")
    other = node.kubelet.run("worker-0")
    # what the CRD's schema lets through: a cpuset of CPU-list characters that is no CPU
    # list (a reversed range), a podAffinity entry without its numaNum, fields it does not
    # know (pruned)
    bad = {"apiVersion": "resource.sop.huawei.com/v1alpha1", "kind": "Oenuma",
           "metadata": {"name": "bad", "namespace": "batch"},
           "spec": {"node": [{"name": node.name, "bogus": {"x": 1},
                              "numa": [{"numaNum": 1, "cpuset": "3-1"}],
                              "podAffinity": [{"podName": "worker-0"}]}]}}
    cluster.cp.kubectl("apply", "--validate=false", "-f", "-", input=json.dumps(bad))
    cluster.apply(oenuma("good", node.name, {"api-0": 2}))
    wait_until(lambda: node.settled(pod, (2,)), "the good CR applied")
    st = wait_until(lambda: node.link.status()["crs_skipped"] == ["batch/bad"] and node.link.status(),
                    "the bad CR skipped")
    assert all("worker-0" not in r for r in st["rules"])
    assert node.placement.ledger.get(other.uid).source == "balance"

    def condition():
        entries = (cluster.oenuma("batch", "bad").get("status") or {}).get("nodes") or []
        mine = [e for e in entries if e["name"] == node.name]
        return mine and mine[0]["conditions"][0]
    cond = wait_until(condition, "the bad CR's status condition")
    # (batch is not trusted: its numa[] is refused unread, so the podAffinity entry is what
    # the parser finds malformed)
    assert cond["status"] == "False" and cond["reason"] == "Malformed" and "numaNum" in cond["message"]
    lines = [e for e in node.proxy.log_lines() if e.get("message") == "Oenuma CR skipped: malformed"]
    assert len(lines) == 1 and lines[0]["cr"] == "batch/bad"
    cluster.cp.kubectl("delete", "oenuma", "-n", "batch", "bad", "good")


def test_two_nodes_write_one_crs_status_at_once(cluster: Cluster) -> None:
    """Server-side apply under one field manager per node, each with its own identity:
    entries are merged by node name."""
    import threading

    from anolisnuma.cluster.kube_client import KubeClient
    from anolisnuma.cluster.kubeconfig import load_kubeconfig
    from anolisnuma.cluster.oenumas import CrRules
    from anolisnuma.cluster.report import StatusReporter

    names = [f"node-{i}" for i in range(2)]
    cluster.apply(oenuma("shared", names[0], {"x": 0}).replace(
        '"spec": {"node": [', f'"spec": {{"node": [{{"name": "{names[1]}"}}, '))

    class NoPods:   # a placement service with nothing placed
        shared_pool = None
        allocations = staticmethod(lambda: [])
        pending_pods = staticmethod(lambda: set())
        rule_of = staticmethod(lambda a: None)
        rule_failure = staticmethod(lambda uid: "")

    cr = CrRules(key=("batch", "shared"), generation=1, uid="")
    reporters = [StatusReporter(KubeClient(load_kubeconfig(cluster.node_kubeconfig(n)), 5.0), n) for n in names]
    barrier = threading.Barrier(2)

    def write(r: StatusReporter) -> None:
        barrier.wait()
        assert r.report([cr], NoPods()) == 1, r.last_error
    threads = [threading.Thread(target=write, args=(r,)) for r in reporters]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    status = cluster.oenuma("batch", "shared")["status"]
    assert sorted(e["name"] for e in status["nodes"]) == names
    managers = {m["manager"] for m in cluster.oenuma("batch", "shared")["metadata"]["managedFields"]}
    assert {f"anolisnuma/{n}" for n in names} <= managers
    # a node that stops reporting on the CR (it no longer names it) takes its entry away
    assert reporters[0].report([], NoPods()) == 1
    assert [e["name"] for e in cluster.oenuma("batch", "shared")["status"]["nodes"]] == [names[1]]
    assert reporters[1].report([], NoPods()) == 1, reporters[1].last_error    # (the last one too)
    assert not cluster.oenuma("batch", "shared").get("status", {}).get("nodes")
    cluster.cp.kubectl("delete", "oenuma", "-n", "batch", "shared")


def test_a_nodes_identity_may_do_exactly_what_the_daemon_does(cluster: Cluster) -> None:
    cluster.node_kubeconfig("rights-node")
    sa = "system:serviceaccount:anolisnuma-nodes:rights-node"

    def can(*args: str) -> bool:
        done = cluster.cp.kubectl("auth", "can-i", "--as", sa, *args, check=False)
        return done.stdout.strip() == "yes"
    assert can("list", "oenumas.resource.sop.huawei.com", "--all-namespaces")
    assert can("watch", "oenumas.resource.sop.huawei.com", "--all-namespaces")
    assert can("patch", "oenumas.resource.sop.huawei.com", "--subresource=status", "-n", "batch")
    for verb in ("get", "create", "update", "patch", "delete"):
        assert not can(verb, "oenumas.resource.sop.huawei.com", "-n", "batch"), verb
    assert can("create", "events.events.k8s.io", "-n", "batch") and can("patch", "events.events.k8s.io", "-n", "batch")
    assert not can("get", "events.events.k8s.io", "-n", "batch")
    assert not can("delete", "events.events.k8s.io", "-n", "batch")
    assert not can("list", "pods", "--all-namespaces") and not can("get", "secrets", "-n", "anolisnuma-nodes")
    assert not can("create", "events", "-n", "batch")      # (core/v1 events: none)
    assert not can("create", "serviceaccounts/token", "-n", "anolisnuma-nodes")   # (no other node's identity)
