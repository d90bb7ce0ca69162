"""Traffic affinity on the real containerd: two managed pods on different (fake) NUMA nodes
"talk" (a scripted traffic source says so: the observer's own tests cover real traffic);
the AffinityController moves one next to the other through the daemon's re-pinner
(UpdateContainerResources), the real ``cpuset.cpus`` changes, and a proxy restart keeps the
move. The fake 2-node topology over this machine's CPUs 0 and 1, memory pinning off, as in
test_numa_e2e.py."""

from __future__ import annotations

from typing import Dict, Mapping

from cri_client import KubeletLike
from test_numa_e2e import NS, alloc_of, direct, numa_config, real_cpus, res  # noqa: F401 (fixture)

from anolisnuma.config import Config
from anolisnuma.cri.client import CriClient
from anolisnuma.daemon import build_hooks
from anolisnuma.policies.numa.config import AffinityConfig
from anolisnuma.reconcile.affinity import AffinityController, ContainerPids
from anolisnuma.system.traffic import PodProcess, TrafficObserver, TrafficSample, TrafficSource, pod_pair
from anolisnuma.testing.proxy import InProcessProxy


class ScriptedSource(TrafficSource):
    def __init__(self, rates: Dict[tuple, float]) -> None:
        self.rates = rates
        self.calls = 0
        self.asked: Dict[str, PodProcess] = {}

    def sample(self, pods: Mapping[str, PodProcess]) -> TrafficSample:
        self.calls += 1
        self.asked = dict(pods)
        if self.calls == 1:
            return TrafficSample(at=0.0, interval=None, rates={})
        return TrafficSample(at=float(self.calls), interval=10.0,
                             rates={pod_pair(*k): v for k, v in self.rates.items()
                                    if k[0] in pods and k[1] in pods})


def test_talking_pods_are_moved_together_live_and_the_move_survives_a_restart(containerd, direct, tmp_path):
    data = numa_config(str(tmp_path), containerd.socket)
    config = Config.from_dict(data)
    hooks = build_hooks(config)
    hook = hooks[0]
    proxy = InProcessProxy(config, hooks=hooks).start()
    kl = None
    try:
        proxy.wait_resynced()
        kl = KubeletLike(proxy.socket_path, harness=containerd)
        a = kl.run_pod(name="talk-a", namespace=NS)
        ca = kl.run_container(a, "main", res(kl, quota=30000, period=100000))
        b = kl.run_pod(name="talk-b", namespace=NS)
        cb = kl.run_container(b, "main", res(kl, quota=30000, period=100000))
        assert alloc_of(hook, a.uid).nodes == (0,) and alloc_of(hook, b.uid).nodes == (1,)
        assert (real_cpus(direct, ca), real_cpus(direct, cb)) == ("0", "1")

        repinner = proxy.daemon.controllers.get("numa-repin")
        source = ScriptedSource({(a.uid, b.uid): 20e6})
        pids = ContainerPids(CriClient(containerd.socket, timeout_seconds=10.0))
        ctl = AffinityController(hook.placement, TrafficObserver(source), pids,
                                 AffinityConfig(enabled=True, threshold_bytes_per_second=1e6, confirm_samples=2,
                                                half_life_seconds=10.0),
                                 apply=repinner.run_once)
        try:
            moved = []
            for _ in range(3):
                moved += ctl.run_once()
        finally:
            ctl.stop()
        # the PIDs came from containerd's ContainerStatus (info.pid), one per pod
        assert set(source.asked) == {a.uid, b.uid} and all(p.pid > 1 for p in source.asked.values())
        assert len(moved) == 1 and ctl.counters["moves"] == 1
        node = moved[0].to_nodes[0]
        assert alloc_of(hook, a.uid).nodes == alloc_of(hook, b.uid).nodes == (node,)
        assert real_cpus(direct, ca) == real_cpus(direct, cb) == str(node)   # the real cgroups
        assert hook.placement.pending_updates() == [] and hook.placement.moves_in_flight() == []

        # restart the proxy: the ledger was persisted, the resync agrees with the cgroups
        proxy.stop()
        hooks = build_hooks(Config.from_dict(data))
        hook = hooks[0]
        proxy = InProcessProxy(Config.from_dict(data), hooks=hooks).start()
        proxy.wait_resynced()
        assert alloc_of(hook, a.uid).nodes == alloc_of(hook, b.uid).nodes == (node,)
        assert alloc_of(hook, moved[0].pod).source == "affinity"
        assert hook.placement.pending_updates() == []
        assert real_cpus(direct, ca) == real_cpus(direct, cb) == str(node)
    finally:
        if kl is not None:
            direct.parents.update(kl._cgroups)  # type: ignore[attr-defined]
            kl.cleanup()
            kl.close()
        proxy.stop()
