"""The periodic resync on the real containerd: what happens behind the proxy's back (a pod
removed, a pod created, straight on containerd's socket) is caught up with by the next
resync: the removed pod's NUMA capacity is released and its record dropped, the new pod is
placed and its real cgroup pinned by the re-pinner, which the resync's pass wakes. What calls
named lately is left alone for one more resync (the calls are newer than the listing)."""

from __future__ import annotations

from test_numa_e2e import NODE_CPU, NS, alloc_of, direct, inprocess_numa_proxy, real_cpus, res  # noqa: F401

from anolisnuma.testing.waiting import wait_until


def test_the_periodic_resync_catches_up_with_what_happened_behind_the_proxys_back(containerd, direct, tmp_path):
    with inprocess_numa_proxy(containerd, str(tmp_path), direct) as (proxy, hook, kl, _):
        resync = proxy.daemon.controllers.get("runtime-resync")
        repin = proxy.daemon.controllers.get("numa-repin")
        assert resync is not None and resync.interval == 60.0 and repin is not None
        lost = kl.run_pod(name="lost", namespace=NS)
        kl.run_container(lost, "main", res(kl, quota=30000, period=100000))
        assert alloc_of(hook, lost.uid) is not None
        # behind the proxy's back: one pod removed, one created (no cpuset: nobody pinned it)
        direct.stop_pod(lost)
        direct.remove_pod(lost)
        late = direct.run_pod(name="late", namespace=NS)
        c_late = direct.run_container(late, "main", res(direct, quota=30000, period=100000))
        assert alloc_of(hook, late.uid) is None and real_cpus(direct, c_late) == "0-1"

        # the first resync after the calls leaves what they named alone, and adopts and places
        # the new pod at once...
        assert resync.step() is not None
        assert alloc_of(hook, lost.uid) is not None
        placed = alloc_of(hook, late.uid)
        assert placed is not None and len(placed.nodes) == 1 and c_late in placed.containers
        # ... whose real cgroup the re-pinner, woken by the pass, gives the placement's CPUs
        # (recorded in the store: the next pass sees no drift, so it is not re-pinned twice)
        wait_until(lambda: real_cpus(direct, c_late) == NODE_CPU[placed.nodes[0]], "the adopted pod pinned")
        wait_until(lambda: hook.placement.pending_updates() == [], "the re-pin recorded")
        assert proxy.daemon.store.container(c_late).resources.cpuset_cpus == NODE_CPU[placed.nodes[0]]
        # the next one drops the removed pod
        assert resync.step() is not None
        assert alloc_of(hook, lost.uid) is None
        assert proxy.daemon.store.pod(lost.id) is None
        assert proxy.daemon.store.container(c_late) is not None
        counts = resync.counts()
        assert counts["dropped_pods"] >= 1 and counts["adopted_pods"] >= 1 and counts["hook_errors"] == 0
        assert hook.placement.pending_updates() == [] and repin.counts()["applied"] == 1
        assert hook.placement.ledger.loads() == hook.placement.ledger.recomputed_loads()
        assert resync.step() is not None
        assert hook.placement.pending_updates() == [] and repin.step() == 0
