"""kill -9 in each window write-behind opens: numa.json lags the ledger by the changes the
writer thread has not written, and a crash loses them. The start-up resync with what
containerd runs makes up for each (docs/restarts.md, "What a crash can lose"): after the
crash nothing is forgotten and nothing is counted twice.

Each test runs the hook with its writer thread (as the daemon does), holds the disk from one
instant on (the writes after it never land: the process dies before them), then "kills" the
daemon: a new hook is made from the state directory, the old one is abandoned without a
flush, and it resyncs with what the fake containerd has (tests/hooks/test_numa_hook.py's
FakeNode), as the daemon's start-up does."""

from __future__ import annotations

import threading
from typing import Any, Dict, Iterator, List

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, rule

from anolisnuma.hooks.numa import NumaHook
from anolisnuma.policies.numa.balance import millicpu_of
from anolisnuma.policies.numa.cpuset import CpuSet
from anolisnuma.reconcile.numa import CpusetRepinner
from anolisnuma.testing import fake_sysfs as F
from test_numa_hook import FakeNode, NumaLifecycle
from test_numa_move import FakeContainerd


class Disk:
    """Holds the writes of a hook's writer from :meth:`hold` on: they never land."""

    def __init__(self) -> None:
        self.released = threading.Event()
        self.held: List[NumaHook] = []

    def hold(self, node: FakeNode) -> None:
        """Everything so far is on disk; nothing after this is."""
        p = node.hook.placement
        assert p.flush()

        def never(_data: object) -> None:
            self.released.wait()    # (a dead process writes nothing: dropped when released)

        p.writer._write = never
        self.held.append(node.hook)


@pytest.fixture
def disk() -> Iterator[Disk]:
    d = Disk()
    yield d
    d.released.set()


@pytest.fixture
def seed(tmp_path) -> Iterator[FakeNode]:
    node = FakeNode(str(tmp_path), F.seed_16cpu())
    node.hook.placement.writer.start()   # the daemon's way: the hook's first loop
    yield node
    node.hook.close()


def on_disk(node: FakeNode) -> Dict[str, Dict[str, Any]]:
    """numa.json's allocations by pod uid (none when it was never written)."""
    try:
        return {r["pod_uid"]: r for r in node.saved()["allocations"]}
    except FileNotFoundError:
        return {}


def kill9(node: FakeNode) -> None:
    """The daemon dies (its hook abandoned, unflushed) and starts again: a new hook from the
    state directory, its writer running, the start-up resync with containerd's listing."""
    node.hook = NumaHook(node.config, node.paths, node.topology)
    node.hook.placement.writer.start()
    node.hook.resync(list(node.pods.values()), list(node.containers.values()))


def assert_nothing_forgotten_or_counted_twice(node: FakeNode) -> None:
    """Every managed container containerd runs is counted once, under its own pod, on the
    nodes its cpuset is on (or listed to be re-pinned there); every allocation is a live pod;
    the loads are the sums of what is counted, and numa.json says the same once written."""
    p = node.hook.placement
    ledger = p.ledger
    live = {pod.sandbox_id: pod for pod in node.pods.values()}
    pending = {cid for cid, _, _ in p.pending_updates()}
    for alloc in ledger:
        assert alloc.sandbox_id in live and live[alloc.sandbox_id].uid == alloc.pod_uid, alloc.ref
        assert alloc.pending == {}, alloc.ref
        for cid in alloc.containers:
            assert node.containers[cid].sandbox_id == alloc.sandbox_id, cid
    for cid, c in node.containers.items():
        if live[c.sandbox_id].namespace != "batch":
            continue
        alloc = ledger.by_container(cid)
        assert alloc is not None, f"running container {cid[:8]} forgotten"
        assert sum(1 for a in ledger if cid in a.containers) == 1, f"container {cid[:8]} counted twice"
        share = alloc.containers[cid]
        r = c.resources
        assert share.millicpu == millicpu_of(r.cpu_period, r.cpu_quota, r.cpu_shares)
        if cid not in pending:
            assert CpuSet.parse(r.cpuset_cpus) == alloc.cpus(ledger.pool), (cid[:8], r.cpuset_cpus)
    assert ledger.loads() == ledger.recomputed_loads()
    assert sum(load.millicpu for load in ledger.loads().values()) == sum(
        max(a.pod_millicpu, sum(s.millicpu for s in a.containers.values())) for a in ledger)
    assert p.flush() and node.saved()["allocations"] == ledger.to_json()


# ====================================================================== 1. placed, not yet created
def test_placed_in_the_pre_hook_and_created_but_the_reply_lost(seed, disk):
    # given a pod placed in the pre-hook (not on disk), its container created by containerd
    # with the placement's cpuset, and the daemon killed before the reply came
    first = seed.run_pod("first")
    seed.create(first, "app", request=2000)
    disk.hold(seed)
    pod = seed.run_pod("p")
    cid = seed.create(pod, "app", request=1000, post=False)
    placed = seed.cpus_of(cid)
    assert pod.uid not in on_disk(seed)
    # when the daemon comes back
    kill9(seed)
    # then the container is counted once, on the node its cpuset is on (adopted from it)
    alloc = seed.hook.placement.ledger.by_container(cid)
    assert alloc is not None and alloc.pod_uid == pod.uid and alloc.cpus(seed.hook.placement.shared_pool) == placed
    assert seed.hook.placement.pending_updates() == []
    assert_nothing_forgotten_or_counted_twice(seed)


def test_placed_in_the_pre_hook_but_never_created(seed, disk):
    # given a pod placed in the pre-hook (not on disk) whose CreateContainer containerd
    # never carried out (the kill cut the call first)
    disk.hold(seed)
    pod = seed.run_pod("p")
    cid = seed.create(pod, "app", request=1000, post=False)
    del seed.containers[cid]
    assert pod.uid not in on_disk(seed)
    # when the daemon comes back
    kill9(seed)
    # then nothing holds capacity for it, and the kubelet's retry places it
    assert pod.uid not in seed.hook.placement.ledger
    assert_nothing_forgotten_or_counted_twice(seed)
    again = seed.create(pod, "app", request=1000)
    assert seed.hook.placement.ledger.by_container(again).pod_uid == pod.uid
    assert_nothing_forgotten_or_counted_twice(seed)


# ====================================================================== 2. created, not yet written
def test_created_but_not_written(seed, disk):
    # given a pod whose first container is on disk, and a second container, and a second
    # pod, created after the disk was held
    pod = seed.run_pod("p")
    seed.create(pod, "app", request=1000)
    disk.hold(seed)
    side = seed.create(pod, "side", request=500)
    other = seed.run_pod("q")
    oc = seed.create(other, "app", request=1000)
    nodes = {pod.uid: seed.hook.placement.ledger.get(pod.uid).nodes,
             other.uid: seed.hook.placement.ledger.get(other.uid).nodes}
    assert other.uid not in on_disk(seed) and side not in on_disk(seed)[pod.uid]["containers"]
    # when the daemon is killed and comes back
    kill9(seed)
    # then both are counted once, where they run
    ledger = seed.hook.placement.ledger
    assert ledger.by_container(side).pod_uid == pod.uid and ledger.by_container(oc).pod_uid == other.uid
    assert {uid: ledger.get(uid).nodes for uid in nodes} == nodes
    assert_nothing_forgotten_or_counted_twice(seed)


# ====================================================================== 3. removed, not yet written
def test_removed_but_not_written(seed, disk):
    # given pods on disk, then a container and a whole pod removed after the disk was held
    pod = seed.run_pod("p")
    a = seed.create(pod, "a", request=1000)
    seed.create(pod, "b", request=1000)
    gone = seed.run_pod("gone")
    seed.create(gone, "app", request=3000)
    disk.hold(seed)
    seed.remove_container(a)
    seed.remove_pod(gone)
    # when the daemon is killed and comes back (numa.json still lists both)
    assert set(on_disk(seed)) == {pod.uid, gone.uid} and a in on_disk(seed)[pod.uid]["containers"]
    kill9(seed)
    # then what containerd no longer runs holds nothing
    assert gone.uid not in seed.hook.placement.ledger
    assert not seed.hook.placement.ledger.knows_container(a)
    assert sum(load.millicpu for load in seed.hook.placement.ledger.loads().values()) == 1000
    assert_nothing_forgotten_or_counted_twice(seed)


def test_released_in_the_pre_hook_but_containerd_never_removed_it(seed, disk):
    # given a pod whose StopPodSandbox released it in the pre-hook, the kill cutting the call
    # before containerd stopped it
    pod = seed.run_pod("p")
    cid = seed.create(pod, "app", request=1000)
    disk.hold(seed)
    assert seed.hook.placement.release_sandbox(pod.sandbox_id) is not None
    assert pod.uid in on_disk(seed)
    # when the daemon comes back
    kill9(seed)
    # then it still counts (it runs), until the kubelet's retry releases it
    assert seed.hook.placement.ledger.by_container(cid).pod_uid == pod.uid
    assert_nothing_forgotten_or_counted_twice(seed)
    seed.remove_pod(pod)
    assert pod.uid not in seed.hook.placement.ledger
    assert_nothing_forgotten_or_counted_twice(seed)


# ====================================================================== 4. a live move, partly applied
def test_a_live_move_decided_and_partly_applied_but_not_written(seed, disk):
    # given pod b (two containers) on node 1, moved to node 0 after the disk was held, one of
    # its containers re-pinned there before the kill
    a = seed.run_pod("a")
    seed.create(a, "app", request=1000)
    b = seed.run_pod("b")
    cb = [seed.create(b, n, request=1000) for n in ("app", "side")]
    assert seed.hook.placement.ledger.get(b.uid).nodes == (1,)
    disk.hold(seed)
    assert seed.hook.placement.move(b.uid, [0], "test")
    client = FakeContainerd(seed)
    client.fail.add(cb[1])     # (the re-pinner's pass is cut after the first container...)
    seed.hook.placement.apply_failed = lambda cid, error="": False   # (...not rolled back: killed)
    CpusetRepinner(seed.hook.placement, client).run_once()
    assert str(seed.cpus_of(cb[0])) == "0-3" and str(seed.cpus_of(cb[1])) == "4-7"
    assert on_disk(seed)[b.uid]["nodes"] == [1]
    # when the daemon is killed and comes back (numa.json: b on node 1)
    kill9(seed)
    # then the move is as if rolled back: b counted once on node 1, the container already
    # moved listed to go back, and the re-pinner puts it back
    p = seed.hook.placement
    assert p.ledger.get(b.uid).nodes == (1,)
    assert p.pending_updates() == [(cb[0], "4-7", "1")]
    assert_nothing_forgotten_or_counted_twice(seed)
    assert CpusetRepinner(p, FakeContainerd(seed)).run_once() == 1
    assert [str(seed.cpus_of(c)) for c in cb] == ["4-7", "4-7"] and p.pending_updates() == []
    assert_nothing_forgotten_or_counted_twice(seed)


# ====================================================================== the graceful stop
def test_close_writes_what_the_writer_had_not_written(seed):
    # given changes the writer thread has been told of
    pods = [seed.run_pod(f"p{i}") for i in range(3)]
    for pod in pods:
        seed.create(pod, "app", request=1000)
    # when the hook is closed (the daemon's SIGTERM)
    seed.hook.close()
    # then numa.json holds them all, and a change after the close is written at once
    assert seed.saved()["allocations"] == seed.hook.placement.ledger.to_json()
    seed.remove_pod(pods[0])
    assert seed.saved()["allocations"] == seed.hook.placement.ledger.to_json()


# ====================================================================== any instant
class CrashAnyInstant(NumaLifecycle):
    """tests/hooks/test_numa_hook.py's random lifecycles (creates with or without their
    reply, removals, the kubelet's exclusive CPUs, restarts) with the writer thread running,
    the disk dropping every write from a random instant on, and kill -9 instead of a clean
    restart: the same invariants hold after each crash (nothing forgotten, nothing counted
    twice, capacity the sum of what runs)."""

    @initialize(spec=st.sampled_from([F.seed_16cpu, F.with_cpuless_node, F.with_offline_cpus]))
    def setup(self, spec):
        super().setup(spec)
        self.node.hook.placement.writer.start()
        self.dropping = False

    def _drop_from_now(self) -> None:
        self.node.hook.placement.writer._write = lambda _data: None   # never lands
        self.dropping = True

    @rule()
    def disk_stops_taking_writes(self):
        assert self.node.hook.placement.flush()
        self._drop_from_now()

    def _kill9(self) -> None:
        old = self.node.hook
        if not self.dropping:
            self._drop_from_now()   # (the kill comes before the writer's next write)
        old.placement.writer.stop()   # (its thread ended; what it "writes" is dropped)
        self.dropping = False
        kill9(self.node)

    @rule()
    def restart(self):
        self._kill9()

    @invariant()
    def saved_state_is_what_is_in_memory(self):
        if not self.dropping:
            assert self.node.hook.placement.flush()
            super().saved_state_is_what_is_in_memory()


CrashAnyInstant.TestCase.settings = settings(max_examples=25, stateful_step_count=20, deadline=None,
                                             suppress_health_check=[HealthCheck.too_slow])
TestCrashAnyInstant = CrashAnyInstant.TestCase
