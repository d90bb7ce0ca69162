"""A real control plane (etcd + kube-apiserver v1.26, RBAC on, ValidatingAdmissionPolicy on)
started once for the whole tests/cluster session, with deploy/'s CRDs, RBAC and node policy
applied; and, per test, a daemon with the NUMA hook on a fake 4-node topology, FakeCri as
containerd, and ``[kubernetes]`` on under a node name of the test's own, with that node's
own identity (its ServiceAccount's token, by tokenFile: ``Cluster.node_kubeconfig``).

Skipped, saying why, where the Kubernetes binaries, etcd or openssl are absent.
"""

from __future__ import annotations

import uuid
from typing import Any, Iterator

import pytest

from anolisnuma.testing import kube_apiserver
from anolisnuma.testing.kube_apiserver import PrivateControlPlane
from cluster_helpers import Cluster, Node, install, start_node, stop_node


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    why = kube_apiserver.missing()
    if why is not None:
        pytest.skip(why)
    cp = PrivateControlPlane.start_new()
    try:
        install(cp, "batch")
        yield Cluster(cp)
    finally:
        cp.close()


@pytest.fixture
def node(cluster: Cluster, tmp_path: Any, sockdir: str) -> Iterator[Node]:
    name = f"worker-{uuid.uuid4().hex[:8]}"
    n = start_node(str(tmp_path), sockdir, cluster.node_kubeconfig(name), name)
    try:
        yield n
    finally:
        stop_node(n)
