"""NRI mode with the cluster side: an Oenuma CR from the real API server moves a running
pod that was created straight on containerd (1.7.34 and 2.2.7) and placed by the NRI plugin; the move
leaves through NRI's UpdateContainers and lands in the real cgroup; deleting the CR gives
the pod back to the balance. The proxy's twin is tests/cluster/test_oenuma_live.py (there
on a fake containerd). And what NRI mode tells on the pods: a pod created while the daemon
was away gets its NUMA and QoS events when a restart adopts it (on this kernel, which has
no QoS knob), and a pod the kubelet's static CPU manager pushes off its node gets a
NumaMoved event."""

from __future__ import annotations

import os
import sys
import uuid
from typing import Any, Dict, List, Tuple

import pytest
import test_nri_e2e
from cri_client import KubeletLike
from test_nri_e2e import nri_config
from test_numa_e2e import NODE_CPU, alloc_of, real_cpuset, real_cpus, res

from anolisnuma.config import Config
from anolisnuma.daemon import build_hooks
from anolisnuma.testing import kube_apiserver
from anolisnuma.testing.kube_apiserver import PrivateControlPlane
from anolisnuma.testing.fake_sysfs import write_cpu_manager_state
from anolisnuma.testing.proxy import InProcessProxy
from anolisnuma.testing.waiting import wait_until

CLUSTER_TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cluster")
if CLUSTER_TESTS not in sys.path:
    sys.path.insert(0, CLUSTER_TESTS)
from cluster_helpers import install, node_kubeconfig, oenuma  # noqa: E402

CONTAINERD_BUILDS = ("1.7", "2.2")
direct = test_nri_e2e.direct   # the fixture (test_numa_e2e's): a client on containerd's socket, our pods removed after
NS = "numa-e2e"   # (test_numa_e2e's managed namespace: the CR lives there too, so it needs no trust)


def linked_node_config(base: str, containerd: Any, cp: PrivateControlPlane) -> Tuple[Dict[str, Any], str]:
    """(NRI mode's configuration for a node of a name of its own, linked to ``cp`` with that
    node's identity; the name)."""
    name = f"worker-{uuid.uuid4().hex[:8]}"
    data = nri_config(base, containerd, node_name=name)
    data["kubernetes"] = {"kubeconfig": node_kubeconfig(cp, name), "request_timeout_seconds": 3.0,
                          "watch_timeout_seconds": 30.0, "backoff_max_seconds": 1.0}
    return data, name


def test_an_oenuma_cr_moves_a_pod_placed_by_nri_and_its_deletion_gives_it_back(containerd, direct, tmp_path):
    why = kube_apiserver.missing()
    if why is not None:
        pytest.skip(why)
    cp = PrivateControlPlane.start_new()
    try:
        install(cp, NS)
        data, name = linked_node_config(str(tmp_path), containerd, cp)
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
            # (counted once containerd's answer is read, a moment after the cgroup changed)
            wait_until(lambda: plugin.n["updates_sent"] >= 1, "the move counted")
            assert plugin.n["updates_via_cri"] == 0

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


def _registered(proxy: InProcessProxy) -> bool:
    plugin = proxy.daemon.nri
    return plugin is not None and plugin.n["synchronizes"] >= 1 and plugin.n["registrations"] >= 1


def _events(cp: PrivateControlPlane, uid: str) -> Dict[str, List[Any]]:
    """The events.k8s.io events regarding the pod ``uid``, by reason."""
    out: Dict[str, List[Any]] = {}
    for e in cp.request("GET", f"/apis/events.k8s.io/v1/namespaces/{NS}/events")["items"]:
        if e["regarding"].get("uid") == uid:
            out.setdefault(e["reason"], []).append(e)
    return out


def test_nri_mode_tells_the_pods_a_restart_adopts_and_the_pod_the_kubelets_cpus_move(containerd, direct, tmp_path):
    why = kube_apiserver.missing()
    if why is not None:
        pytest.skip(why)
    cp = PrivateControlPlane.start_new()
    kl = KubeletLike(containerd.socket, harness=containerd)
    proxy = None
    try:
        install(cp, NS)
        data, name = linked_node_config(str(tmp_path), containerd, cp)
        # QoS on the real cgroups: this kernel has none of its knobs, so nothing is written
        data["paths"]["cgroup_root"] = "/sys/fs/cgroup"
        data["qos"] = {"enabled": True, "reconcile_interval_seconds": 0, "resctrl": {"enabled": False}}

        def start() -> InProcessProxy:
            config = Config.from_dict(data)
            started = InProcessProxy(config, hooks=build_hooks(config)).start()
            wait_until(lambda: _registered(started), "the NRI plugin registered")
            return started

        proxy = start()
        web = kl.run_pod(name="web-0", namespace=NS)
        cweb = kl.run_container(web, "main", res(kl, shares=512))
        wait_until(lambda: {"NumaPlaced", "QosSkipped"} <= set(_events(cp, web.uid)), "web-0's events at creation")
        proxy.stop()
        proxy = None

        # created while the daemon is away: containerd makes it as asked, unpinned
        late = kl.run_pod(name="late-0", namespace=NS)
        clate = kl.run_container(late, "main", res(kl, shares=512))
        assert real_cpus(direct, clate) == "0-1"
        proxy = start()
        hook = next(h for h in proxy.daemon.hooks if h.name == "numa")
        wait_until(lambda: alloc_of(hook, late.uid) is not None
                   and real_cpus(direct, clate) == NODE_CPU[alloc_of(hook, late.uid).nodes[0]],
                   "the adopted pod pinned")
        told = wait_until(lambda: (lambda ev: ev if {"NumaPlaced", "QosSkipped"} <= set(ev) else None)(
            _events(cp, late.uid)), "late-0's events at its adoption")
        [placed], [qos] = told["NumaPlaced"], told["QosSkipped"]
        node = alloc_of(hook, late.uid).nodes[0]
        assert placed["note"].startswith(f"{name}: NUMA node {node}, cpuset {NODE_CPU[node]}, by balance")
        assert "found running unpinned at a resync" in placed["note"]
        assert qos["note"].startswith(f"{name}: QoS level ") and "no knob written: not on this kernel" in qos["note"]
        plugin = proxy.daemon.nri
        # the adopted pod's re-pin waited for the registration and went through NRI (counted
        # once containerd's answer is read, a moment after the cgroup changed)
        wait_until(lambda: plugin.n["updates_sent"] >= 1, "the re-pin counted")
        assert plugin.n["updates_via_cri"] == 0
        assert proxy.daemon.controllers.get("numa-repin").counts()["deferred"] >= 1
        assert [len(v) for v in _events(cp, web.uid).values()] == [1, 1]   # web-0, known, not told again

        # the kubelet's static CPU manager gives the CPU of web-0's node to a Guaranteed
        # container and re-sends the shared pool (the other CPU) to the shared containers
        first = alloc_of(hook, web.uid).nodes[0]
        other = 1 - first
        write_cpu_manager_state(data["paths"]["kubelet_cpu_manager_state"], policy="static",
                                default_cpuset=NODE_CPU[other], entries={str(uuid.uuid4()): {"g": NODE_CPU[first]}})
        kl.update_resources(cweb, kl.resources(cpu_shares=512, cpuset_cpus=NODE_CPU[other]))
        assert real_cpus(direct, cweb) == NODE_CPU[other] and alloc_of(hook, web.uid).nodes == (other,)
        moved = wait_until(lambda: _events(cp, web.uid).get("NumaMoved"), "web-0's move told")
        assert moved[0]["note"] == (f"{name}: moved from NUMA node {first} to node {other}: the kubelet's static "
                                    f"CPU manager gave the shared CPUs of node {first} to exclusive containers "
                                    f"(shared pool now {NODE_CPU[other]})")
    finally:
        direct.parents.update(kl._cgroups)  # type: ignore[attr-defined]
        kl.cleanup()
        kl.close()
        if proxy is not None:
            proxy.stop()
        cp.close()
