"""Live NUMA moves (traffic affinity): ``NumaHook.move_pod`` applied by the re-pinner, and the
``AffinityController`` moving one of two talking pods next to the other. Fake sysfs, fake
kubelet and containerd (tests/hooks/test_numa_hook.py's FakeNode), fake cgroup v1 tree."""

import dataclasses
import os
from typing import Dict, Mapping, Optional, Set

import pytest

from anolisnuma.hooks.numa import NumaHook
from anolisnuma.policies.numa.config import AffinityConfig, NumaConfig
from anolisnuma.policies.numa.rules import PinSpec
from anolisnuma.reconcile.affinity import AffinityController, ContainerPids
from anolisnuma.reconcile.numa import CpusetRepinner
from anolisnuma.state.gone import PodGone, PodKeys
from anolisnuma.system.traffic import PodProcess, TrafficObserver, TrafficSample, TrafficSource, pod_pair
from anolisnuma.testing import fake_sysfs as F
from test_numa_hook import FakeNode

from cri_proto import api_pb2 as pb


class FakeContainerd:
    """UpdateContainerResources on FakeNode's containers; refuses the ids in ``fail``."""

    def __init__(self, node: FakeNode) -> None:
        self.node = node
        self.fail: Set[str] = set()
        self.calls = []

    def update_container_resources(self, cid, res):
        self.calls.append((cid, res.cpuset_cpus, res.cpuset_mems))
        if cid in self.fail:
            raise RuntimeError("rpc error: code = Unknown desc = cannot update")
        c = self.node.containers[cid].resources
        if res.cpuset_cpus:
            c.cpuset_cpus = res.cpuset_cpus
        if res.cpuset_mems:
            c.cpuset_mems = res.cpuset_mems

    def close(self):
        pass


def fake_cgroup_v1(node: FakeNode) -> str:
    """A cgroup v1 root for a node without pods yet (its hook is made again over it);
    container cpuset dirs are made by ``add_cgroups``."""
    assert not node.pods
    root = os.path.join(node.tmp, "cgroup")
    os.makedirs(os.path.join(root, "cpu"), exist_ok=True)
    os.makedirs(os.path.join(root, "cpuset"), exist_ok=True)
    node.paths.cgroup_root = root
    node.hook = NumaHook(node.config, node.paths, node.topology)
    return root


def add_cgroups(root: str, node: FakeNode) -> None:
    for cid, c in node.containers.items():
        pod = node.pods[c.sandbox_id]
        rel = f"kubepods/burstable/pod{pod.uid}"
        os.makedirs(os.path.join(root, "cpu", rel), exist_ok=True)
        d = os.path.join(root, "cpuset", rel, cid)
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, "cpuset.memory_migrate")
        if not os.path.exists(path):
            with open(path, "w") as f:
                f.write("0\n")


def migrate_flag(root: str, node: FakeNode, cid: str) -> str:
    pod = node.pods[node.containers[cid].sandbox_id]
    with open(os.path.join(root, "cpuset", f"kubepods/burstable/pod{pod.uid}", cid, "cpuset.memory_migrate")) as f:
        return f.read().strip()


@pytest.fixture
def seed(tmp_path):
    return FakeNode(str(tmp_path), F.seed_16cpu())


def two_pods(node: FakeNode, request: int = 1000, containers=("app",)):
    a = node.run_pod("a")
    ca = [node.create(a, n, request=request) for n in containers]
    b = node.run_pod("b")
    cb = [node.create(b, n, request=request) for n in containers]
    return a, ca, b, cb


# ====================================================================== move_pod
def test_move_is_applied_to_every_container_with_memory_following(seed):
    root = fake_cgroup_v1(seed)
    a, ca, b, cb = two_pods(seed, containers=("app", "sidecar"))
    assert seed.hook.placement.ledger.get(a.uid).nodes == (0,) and seed.hook.placement.ledger.get(b.uid).nodes == (1,)
    add_cgroups(root, seed)
    assert seed.hook.placement.move(b.uid, [0], "test")
    # decided, persisted, listed for the re-pinner; the memory of b's containers follows
    assert seed.hook.placement.ledger.get(b.uid).nodes == (0,)
    assert [r["nodes"] for r in seed.saved()["allocations"] if r["pod_uid"] == b.uid] == [[0]]
    assert seed.hook.placement.pending_updates() == sorted((c, "0-3", "0") for c in cb)
    assert [migrate_flag(root, seed, c) for c in cb] == ["1", "1"]
    assert [migrate_flag(root, seed, c) for c in ca] == ["0", "0"]
    assert seed.hook.placement.moves_in_flight() == [b.uid]
    client = FakeContainerd(seed)
    assert CpusetRepinner(seed.hook.placement, client).run_once() == 2
    assert [str(seed.cpus_of(c)) for c in cb] == ["0-3", "0-3"]
    assert [seed.mems_of(c) for c in cb] == ["0", "0"]
    assert seed.hook.placement.pending_updates() == [] and seed.hook.placement.moves_in_flight() == []
    assert seed.hook.placement.ledger.get(b.uid).source == "affinity"


def test_a_resync_never_drops_the_re_pins_of_a_move_not_yet_applied(seed):
    """A record that already shows a move's target (the store's, older than an earlier
    move away from it) is no proof the move was applied: only the re-pinner's word is."""
    a, ca, b, cb = two_pods(seed)
    seed.hook.resync(list(seed.pods.values()), list(seed.containers.values()))   # start-up
    assert seed.hook.placement.move(b.uid, [0], "test")
    stale = [dataclasses.replace(c, resources=dataclasses.replace(c.resources, cpuset_cpus="0-3", cpuset_mems="0"))
             if c.container_id in cb else c for c in seed.containers.values()]
    seed.hook.resync(list(seed.pods.values()), stale)
    assert seed.hook.placement.pending_updates() == [(cb[0], "0-3", "0")]
    assert seed.hook.placement.moves_in_flight() == [b.uid]
    applied = []
    repinner = CpusetRepinner(seed.hook.placement, FakeContainerd(seed), applied=lambda *a: applied.append(a))
    assert repinner.run_once() == 1
    assert applied == [(cb[0], "0-3", "0")]          # what the daemon records in its store
    assert seed.hook.placement.moves_in_flight() == [] and seed.hook.placement.pending_updates() == []
    # the records now say what containerd has: a later resync finds nothing to re-pin
    seed.hook.resync(list(seed.pods.values()), list(seed.containers.values()))
    assert seed.hook.placement.pending_updates() == []


def test_a_move_waiting_only_for_a_container_that_is_gone_ends_at_the_resync(seed):
    a, ca, b, cb = two_pods(seed, containers=("app", "sidecar"))
    seed.hook.resync(list(seed.pods.values()), list(seed.containers.values()))
    assert seed.hook.placement.move(b.uid, [0], "test")
    FakeContainerd(seed).update_container_resources(cb[0], pb.LinuxContainerResources(cpuset_cpus="0-3",
                                                                                      cpuset_mems="0"))
    seed.hook.placement.mark_applied(cb[0], "0-3", "0")
    gone = [c for c in seed.containers.values() if c.container_id != cb[1]]   # the sidecar exited
    seed.hook.resync(list(seed.pods.values()), gone)
    assert seed.hook.placement.moves_in_flight() == [] and seed.hook.placement.pending_updates() == []
    assert seed.hook.placement.move(b.uid, [1], "back")                       # it may move again


def test_move_never_exceeds_capacity(seed):
    a = seed.run_pod("a")
    seed.create(a, "app", request=3000)
    b = seed.run_pod("b")
    seed.create(b, "app", request=2000)
    assert seed.hook.placement.ledger.get(a.uid).nodes == (0,) and seed.hook.placement.ledger.get(b.uid).nodes == (1,)
    before = seed.saved()
    assert not seed.hook.placement.move(b.uid, [0], "test")       # 1 CPU free on node 0, 2 needed
    assert seed.hook.placement.ledger.get(b.uid).nodes == (1,)
    assert seed.hook.placement.pending_updates() == [] and seed.saved() == before
    assert seed.hook.placement.ledger.loads()[0].millicpu == 3000
    assert seed.hook.placement.move(b.uid, [2], "test")            # an empty node takes it


def test_unknown_pod_same_node_and_missing_node_are_refused(seed):
    a, ca, b, cb = two_pods(seed)
    assert not seed.hook.placement.move("nope", [0], "test")
    assert not seed.hook.placement.move(a.uid, [0], "test")
    assert not seed.hook.placement.move(a.uid, [9], "test")
    assert seed.hook.placement.pending_updates() == []


def test_pods_with_kubelet_exclusive_cpus_never_move(tmp_path):
    node = FakeNode(str(tmp_path), F.seed_16cpu(), kubelet_policy="static")
    a, ca, b, cb = two_pods(node)
    node.set_kubelet_state("0-14", {b.uid: {"pinned-sidecar": "15"}})
    assert not node.hook.placement.move(b.uid, [0], "test")
    assert node.hook.placement.ledger.get(b.uid).nodes == (1,)
    assert node.hook.placement.pending_updates() == []


def test_rule_pinned_pods_never_move(tmp_path):
    cfg = NumaConfig(enabled=True, namespaces=["batch"], pins=(PinSpec("batch", "b", (2,)),))
    node = FakeNode(str(tmp_path), F.seed_16cpu(), cfg)
    a, ca, b, cb = two_pods(node)
    assert node.hook.placement.ledger.get(b.uid).nodes == (2,) and node.hook.placement.ledger.get(b.uid).source == "rule"
    assert not node.hook.placement.move(b.uid, [0], "test")
    assert node.hook.placement.ledger.get(b.uid).nodes == (2,)


def test_failed_apply_rolls_the_move_back(seed):
    a, ca, b, cb = two_pods(seed, containers=("app", "sidecar"))
    before = seed.saved()
    assert seed.hook.placement.move(b.uid, [0], "test")
    client = FakeContainerd(seed)
    client.fail.add(cb[1])                 # the second container cannot be updated
    CpusetRepinner(seed.hook.placement, client).run_once()
    # the first container was moved, then moved back in the same pass
    assert client.calls == [(cb[0], "0-3", "0"), (cb[1], "0-3", "0"), (cb[0], "4-7", "1")]
    assert seed.hook.placement.ledger.get(b.uid).nodes == (1,)
    assert seed.hook.placement.ledger.get(b.uid).source == "balance"
    assert [str(seed.cpus_of(c)) for c in cb] == ["4-7", "4-7"]
    assert seed.hook.placement.pending_updates() == [] and seed.hook.placement.moves_in_flight() == []
    assert seed.saved() == before
    assert seed.hook.placement.ledger.loads()[0].millicpu == 2000 and seed.hook.placement.ledger.loads()[1].millicpu == 2000
    assert seed.hook.placement.move(b.uid, [0], "again")   # and it may be tried again


def test_a_container_containerd_no_longer_knows_is_released_not_retried(seed):
    import grpc
    from anolisnuma.cri.client import CallError

    a, ca, b, cb = two_pods(seed, containers=("app", "sidecar"))
    assert seed.hook.placement.move(b.uid, [0], "test")
    client = FakeContainerd(seed)
    gone = cb[1]
    real = client.update_container_resources

    def update(cid, res):
        if cid == gone:   # removed behind our back (crictl rm): containerd's answer
            client.calls.append((cid, res.cpuset_cpus, res.cpuset_mems))
            raise CallError(grpc.StatusCode.NOT_FOUND, f"an error occurred when try to find container {cid!r}")
        real(cid, res)

    client.update_container_resources = update
    repinner = CpusetRepinner(seed.hook.placement, client)
    assert repinner.run_once() == 1
    # the move is done with the container that is left; the gone one was released, not rolled back
    assert seed.hook.placement.ledger.get(b.uid).nodes == (0,)
    assert gone not in seed.hook.placement.ledger.get(b.uid).containers
    assert seed.hook.placement.pending_updates() == [] and seed.hook.placement.moves_in_flight() == []
    assert repinner.counts() == {"applied": 1, "failed": 0, "gone": 1, "deferred": 0}
    calls = len(client.calls)
    assert repinner.run_once() == 0 and len(client.calls) == calls   # nothing tried again


def test_move_survives_a_restart(seed):
    a, ca, b, cb = two_pods(seed)
    assert seed.hook.placement.move(b.uid, [0], "test")
    seed.restart()                      # before the re-pin reached containerd
    assert seed.hook.placement.ledger.get(b.uid).nodes == (0,)
    assert seed.hook.placement.pending_updates() == [(cb[0], "0-3", "0")]
    CpusetRepinner(seed.hook.placement, FakeContainerd(seed)).run_once()
    seed.restart()
    assert seed.hook.placement.ledger.get(b.uid).nodes == (0,)
    assert str(seed.cpus_of(cb[0])) == "0-3"
    assert seed.hook.placement.pending_updates() == []


def test_a_stale_apply_does_not_drop_a_newer_move(seed):
    a, ca, b, cb = two_pods(seed)
    assert seed.hook.placement.move(b.uid, [0], "test")
    seed.hook.placement.mark_applied(cb[0], "4-7", "1")     # an older value applied meanwhile
    assert seed.hook.placement.pending_updates() == [(cb[0], "0-3", "0")]


# ====================================================================== the controller
class ScriptedSource(TrafficSource):
    """Pod-pair rates as the test says; the first sample has none (as the real source)."""

    name = "scripted"

    def __init__(self) -> None:
        self.rates: Dict[tuple, float] = {}
        self.calls = 0
        self.asked: Mapping[str, PodProcess] = {}

    def sample(self, pods: Mapping[str, PodProcess]) -> TrafficSample:
        self.calls += 1
        self.asked = dict(pods)
        if self.calls == 1:
            return TrafficSample(at=float(self.calls), interval=None, rates={})
        rates = {pod_pair(*k): v for k, v in self.rates.items() if k[0] in pods and k[1] in pods}
        return TrafficSample(at=float(self.calls), interval=10.0, rates=rates)


class FakePids:
    def __init__(self) -> None:
        self.asked = []

    def pid(self, cid: str) -> Optional[int]:
        self.asked.append(cid)
        return 1000 + len(cid)


def controller(node: FakeNode, source: ScriptedSource, client: FakeContainerd, **cfg) -> AffinityController:
    config = AffinityConfig(enabled=True, interval_seconds=10, threshold_bytes_per_second=1e6,
                            confirm_samples=2, half_life_seconds=10, **cfg)
    repinner = CpusetRepinner(node.hook.placement, client)
    return AffinityController(node.hook.placement, TrafficObserver(source), FakePids(), config, apply=repinner.run_once,
                              clock=lambda: 1000.0)


def test_controller_moves_one_of_two_talking_pods_onto_the_others_node(seed):
    a, ca, b, cb = two_pods(seed)
    c = seed.run_pod("idle")
    seed.create(c, "app", request=1000)
    source = ScriptedSource()
    client = FakeContainerd(seed)
    ctl = controller(seed, source, client)
    source.rates = {(a.uid, b.uid): 50e6}
    moved = []
    for _ in range(4):
        moved.extend(ctl.run_once())
    assert set(source.asked) == {a.uid, b.uid, c.uid}
    assert len(moved) == 1
    m = moved[0]
    assert m.reason.pair == pod_pair(a.uid, b.uid) and m.reason.kind == "join"
    na, nb = seed.hook.placement.ledger.get(a.uid).nodes, seed.hook.placement.ledger.get(b.uid).nodes
    assert na == nb
    assert str(seed.cpus_of(ca[0])) == str(seed.cpus_of(cb[0]))
    assert seed.hook.placement.ledger.get(c.uid).nodes == (2,)         # the idle pod stays
    assert ctl.counters.snapshot().get("moves") == 1
    assert ctl.counters["samples"] == 4
    assert seed.hook.placement.pending_updates() == []


def test_controller_waits_for_confirmation_and_counts_rollbacks(seed):
    a, ca, b, cb = two_pods(seed)
    source = ScriptedSource()
    client = FakeContainerd(seed)
    client.fail.update(ca + cb)
    ctl = controller(seed, source, client)
    source.rates = {(a.uid, b.uid): 50e6}
    assert ctl.run_once() == [] and ctl.run_once() == []    # first sample; one sample is not enough
    assert ctl.run_once() == []                             # confirmed, moved, re-pin failed: rolled back
    assert ctl.counters["moves_rolled_back"] == 1 and ctl.counters["moves"] == 0
    assert seed.hook.placement.ledger.get(a.uid).nodes != seed.hook.placement.ledger.get(b.uid).nodes
    assert ctl.run_once() == []                             # that pod cools down; its partner is tried
    assert ctl.counters["moves_rolled_back"] == 2
    assert ctl.run_once() == []                             # both cool down: no retry storm
    assert ctl.counters["moves_rolled_back"] == 2 and ctl.counters["moves_refused"] == 0


def test_affinity_config_is_strict():
    from anolisnuma.configfile import ConfigError, Table

    cfg = NumaConfig.from_table(Table({"enabled": True, "affinity": {"enabled": True, "interval_seconds": 5,
                                                                      "max_moves_per_interval": 3}}, "numa"))
    assert cfg.affinity.enabled and cfg.affinity.interval_seconds == 5.0 and cfg.affinity.max_moves_per_interval == 3
    assert NumaConfig.from_table(Table({}, "numa")).affinity == AffinityConfig()
    with pytest.raises(ConfigError, match="numa.affinity.bogus"):
        NumaConfig.from_table(Table({"affinity": {"bogus": 1}}, "numa"))
    with pytest.raises(ConfigError, match="numa.affinity.max_moves_per_interval"):
        NumaConfig.from_table(Table({"affinity": {"max_moves_per_interval": 0}}, "numa"))


def test_memory_migrate_is_a_no_op_on_cgroup_v2_and_refuses_bad_ids(tmp_path):
    from anolisnuma.system.cgroups import CgroupFs, enable_memory_migrate

    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cgroup.controllers").write_text("cpuset cpu memory\n")
    assert enable_memory_migrate(CgroupFs(str(v2)), "00000000-0000-0000-0000-000000000001", ["a" * 64]) == []
    v1 = tmp_path / "v1"
    uid = "00000000-0000-0000-0000-000000000001"
    (v1 / "cpu" / "kubepods" / "burstable" / f"pod{uid}").mkdir(parents=True)
    problems = enable_memory_migrate(CgroupFs(str(v1)), uid, ["../../etc", "b" * 64])
    assert len(problems) == 2 and "not a container ID" in problems[0]
    assert enable_memory_migrate(CgroupFs(str(v1)), "../x", ["b" * 64])


def test_the_controllers_caches_forget_what_the_reaper_says_is_gone(seed):
    """The pair graph and the cool-down clock follow the ledger at each pass; a gone pod
    leaves them at once, without waiting for the next pass."""
    a, ca, b, cb = two_pods(seed)
    source = ScriptedSource()
    ctl = controller(seed, source, FakeContainerd(seed))
    source.rates = {(a.uid, b.uid): 50e6}
    for _ in range(4):
        ctl.run_once()
    assert ctl.held().uids == {a.uid, b.uid} and ctl.structures()["pairs"] == 1
    assert ctl.structures()["last_moved"] == 1
    ctl.forget(PodGone.of_ids("resync", [a.uid]))
    assert ctl.structures()["pairs"] == 0 and ctl.held().uids <= {b.uid}   # b's cool-down stays if b moved
    ctl.forget(PodGone.of_ids("resync", [b.uid]))
    assert ctl.held() == PodKeys() and ctl.structures() == {"pairs": 0, "last_moved": 0, "pids": 0}


def test_container_pids_are_forgotten_with_their_containers():
    class Status:
        def container_status(self, cid, verbose=True):
            return None, {"pid": os.getpid()}

    pids = ContainerPids(Status(), proc_root="/proc")
    assert pids.pid("c1") == os.getpid() and pids.pid("c2") == os.getpid()
    pids.forget(["c1"])
    assert pids.cached() == ["c2"]
