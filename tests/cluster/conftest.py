"""A real control plane (etcd + kube-apiserver v1.26, RBAC on) started once for the whole
tests/cluster session, with deploy/'s CRDs and RBAC applied and a kubeconfig for the
anolisnuma ServiceAccount (a token from the TokenRequest API, by tokenFile); and, per test,
a daemon with the NUMA hook on a fake 4-node topology, FakeCri as containerd, and
``[kubernetes]`` pointing at that kubeconfig under a node name of the test's own.

Skipped, saying why, where the Kubernetes binaries, etcd or openssl are absent.
"""

from __future__ import annotations

import os
import uuid
from typing import Any, Iterator

import pytest

from anolisnuma.testing import kube_apiserver
from anolisnuma.testing.kube_apiserver import PrivateControlPlane
from cluster_helpers import DEPLOY, SA_NAMESPACE, Cluster, Node, start_node, stop_node


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    why = kube_apiserver.missing()
    if why is not None:
        pytest.skip(why)
    cp = PrivateControlPlane.start_new()
    try:
        cp.kubectl("apply", "-f", os.path.join(DEPLOY, "crd-oenuma.yaml"), "-f", os.path.join(DEPLOY, "rbac.yaml"),
                   "-f", os.path.join(DEPLOY, "crd-noderesourcetopology.yaml"))
        cp.kubectl("wait", "--for=condition=Established", "crd/oenumas.resource.sop.huawei.com",
                   "crd/noderesourcetopologies.topology.node.k8s.io")
        cp.kubectl("create", "namespace", "batch")
        token = cp.kubectl("create", "token", "anolisnuma", "-n", SA_NAMESPACE, "--duration=4h").stdout.strip()
        token_file = os.path.join(cp.base_dir, "anolisnuma.token")
        with open(token_file, "w") as f:
            f.write(token + "\n")
        path = os.path.join(cp.base_dir, "anolisnuma.kubeconfig")
        with open(path, "w") as f:
            f.write(kube_apiserver.kubeconfig_text(cp.server, cp.ca_file, token_file=token_file))
        yield Cluster(cp, path)
    finally:
        cp.close()


@pytest.fixture
def node(cluster: Cluster, tmp_path: Any, sockdir: str) -> Iterator[Node]:
    n = start_node(str(tmp_path), sockdir, cluster.kubeconfig, f"worker-{uuid.uuid4().hex[:8]}")
    try:
        yield n
    finally:
        stop_node(n)
