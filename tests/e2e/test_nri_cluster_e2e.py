"""NRI mode with the cluster side: an Oenuma CR from the real API server moves a running
pod that was created straight on containerd (1.7.34 and 2.2.7) and placed by the NRI plugin; the move
leaves through NRI's UpdateContainers and lands in the real cgroup; deleting the CR gives
the pod back to the balance. The proxy's twin is tests/cluster/test_oenuma_live.py (there
on a fake containerd)."""

from __future__ import annotations

import os
import sys
import uuid

import pytest
import test_nri_e2e
from cri_client import KubeletLike
from test_nri_e2e import nri_config
from test_numa_e2e import NODE_CPU, alloc_of, real_cpuset, real_cpus, res

from anolisnuma.config import Config
from anolisnuma.daemon import build_hooks
from anolisnuma.testing import kube_apiserver
from anolisnuma.testing.kube_apiserver import PrivateControlPlane
from anolisnuma.testing.proxy import InProcessProxy
from anolisnuma.testing.waiting import wait_until

CLUSTER_TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cluster")
if CLUSTER_TESTS not in sys.path:
    sys.path.insert(0, CLUSTER_TESTS)
from cluster_helpers import install, node_kubeconfig, oenuma  # noqa: E402

CONTAINERD_BUILDS = ("1.7", "2.2")
direct = test_nri_e2e.direct   # the fixture (test_numa_e2e's): a client on containerd's socket, our pods removed after
NS = "numa-e2e"   # (test_numa_e2e's managed namespace: the CR lives there too, so it needs no trust)


def test_an_oenuma_cr_moves_a_pod_placed_by_nri_and_its_deletion_gives_it_back(containerd, direct, tmp_path):
    why = kube_apiserver.missing()
    if why is not None:
        pytest.skip(why)
    cp = PrivateControlPlane.start_new()
    try:
        install(cp, NS)
        name = f"worker-{uuid.uuid4().hex[:8]}"
        data = nri_config(str(tmp_path), containerd, node_name=name)
        data["kubernetes"] = {"kubeconfig": node_kubeconfig(cp, name), "request_timeout_seconds": 3.0,
                              "watch_timeout_seconds": 30.0, "backoff_max_seconds": 1.0}
        config = Config.from_dict(data)
        proxy = InProcessProxy(config, hooks=build_hooks(config)).start()
        kl = KubeletLike(containerd.socket, harness=containerd)
        try:
            wait_until(lambda: proxy.daemon.nri is not None and proxy.daemon.nri.n["synchronizes"] >= 1
                       and proxy.daemon.nri.n["registrations"] >= 1,
                       "the NRI plugin registered")
            hook = proxy.daemon.hooks[0]
            pod = kl.run_pod(name="web-0", namespace=NS)
            cid = kl.run_container(pod, "main", res(kl, shares=512))
            first = alloc_of(hook, pod.uid).nodes[0]
            assert real_cpus(direct, cid) == NODE_CPU[first]   # placed by NRI at creation
            other = 1 - first

            cp.kubectl("apply", "-f", "-", input=oenuma("web", name, {"web-*": other}, namespace=NS))
            wait_until(lambda: real_cpus(direct, cid) == NODE_CPU[other], "the pod moved to the CR's node")
            assert alloc_of(hook, pod.uid).nodes == (other,) and alloc_of(hook, pod.uid).source == "rule"
            assert real_cpuset(direct, cid)[2] == NODE_CPU[other]   # containerd's own spec follows
            plugin = proxy.daemon.nri
            assert plugin.n["updates_sent"] >= 1 and plugin.n["updates_via_cri"] == 0

            cp.kubectl("delete", "oenuma", "-n", NS, "web")
            wait_until(lambda: alloc_of(hook, pod.uid).source == "balance", "the pod back to the balance")
            back = alloc_of(hook, pod.uid).nodes[0]
            wait_until(lambda: real_cpus(direct, cid) == NODE_CPU[back], "the balanced placement applied")
        finally:
            direct.parents.update(kl._cgroups)  # type: ignore[attr-defined]
            kl.cleanup()
            kl.close()
            proxy.stop()
    finally:
        cp.close()
