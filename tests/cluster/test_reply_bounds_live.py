"""The bound on a reply against the real API server (kube_client.py, bounded_transport.py):
the largest Oenuma etcd takes, found by trying, fits ``LIST_PAGE`` times in the bound the
daemon puts on a reply, and the bound counts the reply as decoded (the API server gzips a
large reply for a client that asks: such a CR is about 14 kB on the wire)."""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any, Dict, Iterator, Tuple

import pytest
from cluster_helpers import Cluster

from anolisnuma.cluster.kube_client import LIST_PAGE, MAX_CR_BYTES, MAX_REPLY_BYTES, ApiError, KubeClient
from anolisnuma.cluster.kubeconfig import load_kubeconfig

OENUMAS = "/apis/resource.sop.huawei.com/v1alpha1/namespaces/batch/oenumas"
PODS_A_NODE = 256     # the CRD's podAffinity maxItems
STEP = 32             # entries: how close the search comes to the largest CR (about 9 kB)


def big(name: str, pods: int) -> Dict[str, Any]:
    """An Oenuma of ``pods`` podAffinity entries of 253-character names, 256 to a node."""
    def node(i: int, n: int) -> Dict[str, Any]:
        return {"name": f"node-{i:05d}", "podAffinity": [
            {"podName": f"{'p' * 240}-{i:05d}-{j:05d}", "numaNum": 0} for j in range(n)]}
    nodes = [node(i, min(PODS_A_NODE, pods - i * PODS_A_NODE)) for i in range(-(-pods // PODS_A_NODE))]
    return {"apiVersion": "resource.sop.huawei.com/v1alpha1", "kind": "Oenuma",
            "metadata": {"name": name, "namespace": "batch"}, "spec": {"node": nodes}}


def stored(cluster: Cluster, cr: Dict[str, Any]) -> bool:
    """Made (True), or refused by etcd as too large (False)."""
    try:
        cluster.cp.request("POST", OENUMAS, cr, timeout=30.0)
        return True
    except urllib.error.HTTPError as e:
        if "request is too large" not in e.read().decode(errors="replace"):
            raise
        return False


def raw_get(cluster: Cluster, path: str) -> bytes:
    """The reply's bytes, as JSON without any Content-Encoding (urllib asks for none)."""
    req = urllib.request.Request(cluster.cp.server + path, headers={"Accept": "application/json"})
    with urllib.request.urlopen(req, context=cluster.cp.ssl_context(), timeout=30) as reply:
        assert reply.headers.get("Content-Encoding") is None
        return reply.read()


@pytest.fixture(scope="module")
def largest(cluster: Cluster) -> Iterator[Tuple[str, int]]:
    """The largest Oenuma of :func:`big`'s shape that etcd takes, to within ``STEP``
    entries, made: (its name, the bytes of a list reply of it alone, and of ``STEP``
    entries more)."""
    low, high = 4000, 7000   # (about 1.1 and 2.0 MB of JSON, around etcd's 1.5 MiB)
    assert stored(cluster, big("largest", low))
    cluster.cp.request("DELETE", f"{OENUMAS}/largest")
    while high - low > STEP:
        mid = (low + high) // 2
        if stored(cluster, big("largest", mid)):   # (the same name: its length counts too)
            cluster.cp.request("DELETE", f"{OENUMAS}/largest")
            low = mid
        else:
            high = mid
    assert stored(cluster, big("largest", low))
    try:
        size = len(raw_get(cluster, f"{OENUMAS}?limit=1&fieldSelector=metadata.name=largest"))
        yield "largest", size + size * STEP // low
    finally:
        cluster.cp.request("DELETE", f"{OENUMAS}/largest")


def test_a_page_of_the_largest_oenumas_etcd_takes_is_within_the_reply_bound(largest: Tuple[str, int]) -> None:
    _, size = largest
    assert 1_400_000 < size <= MAX_CR_BYTES, size     # (etcd's 1.5 MiB, and the search's step)
    assert LIST_PAGE * MAX_CR_BYTES <= MAX_REPLY_BYTES and LIST_PAGE >= 32


def test_the_bound_counts_the_reply_as_decoded(cluster: Cluster, largest: Tuple[str, int]) -> None:
    """Given the largest CR, when a node's client whose bound is 1 MiB lists it, then the
    reply is refused as larger than the bound (gzipped, as the API server sends it to a
    client that asks, it would have been 1 % of it); with the daemon's bound it lists."""
    kubeconfig = load_kubeconfig(cluster.node_kubeconfig("reply-bounds"))
    small = KubeClient(kubeconfig, timeout=30.0, max_reply_bytes=1 << 20)
    full = KubeClient(kubeconfig, timeout=30.0)
    try:
        with pytest.raises(ApiError, match=r"larger than 1048576 bytes \(decoded\)"):
            list(small.list_oenumas(1))
        assert "largest" in [cr["metadata"]["name"] for cr in full.list_oenumas(LIST_PAGE)]
    finally:
        small.close()
        full.close()
