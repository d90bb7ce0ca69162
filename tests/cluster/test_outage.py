"""The API server down, slow or gone mid-watch never touches the CRI path; the rules seen
last stay in force, and a restarted API server is caught up with."""

from __future__ import annotations

import statistics
import time
from typing import List

from cluster_helpers import Cluster, Node, oenuma

from anolisnuma.testing.waiting import wait_until


def version_latencies(node: Node, n: int = 30) -> List[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        assert node.kubelet.version().runtime_name
        out.append(time.perf_counter() - t)
    return out


def test_api_server_killed_and_restarted_mid_watch(cluster: Cluster, node: Node) -> None:
    pod = node.kubelet.run("cache-0")
    cluster.apply(oenuma("cache", node.name, {"cache-*": 2}))
    wait_until(lambda: node.settled(pod, (2,)), "the pod pinned by the CR")
    version_latencies(node, 5)   # warm
    base = statistics.median(version_latencies(node))

    cluster.cp.kill_apiserver()
    try:
        wait_until(lambda: node.link.status()["state"] == "down", "the daemon to notice the API server is gone")
        # CRI calls do not wait for the API server
        down = version_latencies(node)
        assert statistics.median(down) < 5 * base, (base, down)
        # the rules stay in force: a new pod the CR names is pinned by it
        late = node.kubelet.run("cache-1")
        assert node.nodes_of(late) == (2,) and node.nodes_of(pod) == (2,)
        assert any("cache-*" in r for r in node.link.status()["rules"])
    finally:
        cluster.cp.start_apiserver()
    # what changed while the daemon was away is caught up with (a relist)
    cluster.apply(oenuma("cache", node.name, {"cache-*": 0}))
    wait_until(lambda: node.settled(pod, (0,)) and node.settled(late, (0,)), "both pods re-pinned after the restart")
    st = node.link.status()
    print(st)
    assert st["state"] == "synced" and st["failures"] >= 1
    cluster.cp.kubectl("delete", "oenuma", "-n", "batch", "cache")


def test_a_watch_answered_410_gone_is_followed_by_a_relist(cluster: Cluster, node: Node) -> None:
    """The watch is made again from a resourceVersion the API server no longer keeps (as
    after a long outage): the server answers 410 Gone in the stream, the daemon lists
    again and goes on watching from the new list."""
    pod = node.kubelet.run("queue-0")
    cluster.apply(oenuma("queue", node.name, {"queue-0": 1}))
    wait_until(lambda: node.settled(pod, (1,)), "the pod pinned by the CR")
    w = node.link.watcher
    wait_until(lambda: w.watching, "the watch to be open")
    lists, gone = w.lists, w.gone
    w.resource_version = "1"          # long compacted away
    w.client.abort()                  # the watch ends; the next one asks from "1"
    wait_until(lambda: w.gone > gone and w.lists > lists and w.watching, "a 410 then a relist")
    assert node.link.status()["state"] == "synced" and int(w.resource_version) > 1
    # and the watch still delivers
    cluster.apply(oenuma("queue", node.name, {"queue-0": 3}))
    wait_until(lambda: node.settled(pod, (3,)), "the pod re-pinned after the relist")
    cluster.cp.kubectl("delete", "oenuma", "-n", "batch", "queue")


def test_the_last_rules_seen_apply_at_start_when_the_api_server_is_down(cluster: Cluster, node: Node,
                                                                        sockdir: str) -> None:
    from cluster_helpers import start_node, stop_node

    cluster.apply(oenuma("saved", node.name, {"saved-*": 3}))
    wait_until(lambda: node.link.status()["rules"], "the CR's rules in force")
    wait_until(lambda: node.link.sync._persisted is not None, "the rules saved")
    stop_node(node)
    kubeconfig = cluster.node_kubeconfig(node.name)
    cluster.cp.kill_apiserver()
    try:
        again = start_node(node.base, sockdir, kubeconfig, node.name)
        try:
            st = again.link.status()
            assert st["rules_from"] == "saved" and any("saved-*" in r for r in st["rules"])
            pod = again.kubelet.run("saved-0")     # placed at once, by the saved rule
            assert again.nodes_of(pod) == (3,)
            wait_until(lambda: again.link.status()["state"] == "down", "the API server seen down")
        finally:
            stop_node(again)
    finally:
        cluster.cp.start_apiserver()
        cluster.cp.kubectl("delete", "oenuma", "-n", "batch", "saved")


def test_the_watch_loop_stops_at_once_while_its_watch_is_open(cluster: Cluster, node: Node) -> None:
    """A watch blocks reading until the server ends it (30-60 s here): stopping the loop
    cuts it, the thread ends well before."""
    w = node.link.watcher
    thread = w._thread
    wait_until(lambda: w.watching and w.client.transport._watches, "the watch to be open")
    started = time.monotonic()
    w.stop(timeout=25.0)
    took = time.monotonic() - started
    print(f'stopped in {took:.3f} s')
    assert thread is not None and not thread.is_alive() and took < 10.0, took
