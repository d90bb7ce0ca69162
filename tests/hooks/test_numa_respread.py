"""Re-spread, live: the RespreadController moves placed pods back toward balance through
``PlacementService.move`` (source ``respread``) and the re-pinner, when pods leave and when
the kubelet's shared pool grows back; rule pins, exclusive CPUs and affinity groups hold;
the cap, the settle time and the cool-down bound it; a failed re-pin rolls back. Fake sysfs
(4 nodes x 4 CPUs), fake kubelet and containerd (test_numa_hook.py's FakeNode)."""

import dataclasses

from anolisnuma.hooks.numa import NumaHook
from anolisnuma.policies.numa.config import NumaConfig, RespreadConfig
from anolisnuma.policies.numa.rules import PinSpec
from anolisnuma.reconcile.numa import CpusetRepinner
from anolisnuma.reconcile.respread import RespreadController
from anolisnuma.state.gone import PodGone
from anolisnuma.testing import fake_sysfs as F
from test_numa_hook import FakeNode
from test_numa_move import FakeContainerd

# on the 4 x 4-CPU machine: move when the spread exceeds 1 CPU, at once
FAST = RespreadConfig(threshold_cpus=1.0, settle_seconds=0.0, max_moves_per_interval=4, cooldown_seconds=600.0)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def controller(node: FakeNode, config: RespreadConfig = FAST, groups=None, client=None):
    client = client or FakeContainerd(node)
    repinner = CpusetRepinner(node.hook.placement, client)
    clock = Clock()
    ctl = RespreadController(node.hook.placement, config, apply=repinner.run_once, groups=groups, clock=clock)
    return ctl, clock, client


def nodes(node: FakeNode, pod) -> tuple:
    return node.hook.placement.ledger.get(pod.uid).nodes


def fill(node: FakeNode, n: int, request: int = 2000):
    """n pods of ``request`` milli-CPUs, placed by balance (round robin on the empty machine)."""
    out = []
    for i in range(n):
        pod = node.run_pod(f"p{i}")
        out.append((pod, node.create(pod, "app", request=request)))
    return out


def test_pods_leaving_one_by_one_the_rest_spread_again_live(tmp_path):
    node = FakeNode(str(tmp_path), F.seed_16cpu())
    pods = fill(node, 8)                     # two per node, 2 CPUs each: free 0 everywhere
    ctl, clock, client = controller(node)
    assert ctl.run_once() == []              # balanced
    # the pods of nodes 1, 2 and 3 leave one by one; node 0 keeps its two
    for pod, _ in pods:
        if nodes(node, pod) != (0,):
            node.remove_pod(pod)
            clock.now += 1
            ctl.run_once()
    left = [(pod, cid) for pod, cid in pods if pod.sandbox_id in node.pods]
    assert len(left) == 2
    assert sorted(nodes(node, p) for p, _ in left) != [(0,), (0,)]        # spread again
    moved = [(p, c) for p, c in left if nodes(node, p) != (0,)]
    assert len(moved) == 1
    pod, cid = moved[0]
    a = node.hook.placement.ledger.get(pod.uid)
    assert a.source == "respread"
    # the container's cpuset is the new node's, applied by the re-pinner (memory too)
    assert node.cpus_of(cid) == node.topology.cpus_of(a.nodes) and node.mems_of(cid) == str(a.nodes[0])
    assert node.hook.placement.pending_updates() == [] and node.hook.placement.moves_in_flight() == []
    assert [r["source"] for r in node.saved()["allocations"] if r["pod_uid"] == pod.uid] == ["respread"]
    assert ctl.counts()["moves"] == 1 and ctl.counts()["moves_refused"] == 0 and ctl.counts()["plans"] >= 1
    # balanced now: nothing more moves, however often it checks
    for _ in range(3):
        clock.now += 60
        assert ctl.run_once() == []


def test_the_pool_growing_back_after_an_exclusive_allocation_re_spreads(tmp_path):
    node = FakeNode(str(tmp_path), F.seed_16cpu(), kubelet_policy="static")
    node.set_kubelet_state("4-15", {"guaranteed-uid": {"main": "0-3"}})     # node 0 all exclusive
    pods = fill(node, 6, request=1000)       # on nodes 1-3 only
    assert all(nodes(node, p) != (0,) for p, _ in pods)
    ctl, clock, _ = controller(node)
    assert ctl.run_once() == []              # node 0 has no shared CPU: nothing to spread to
    node.set_kubelet_state("0-15", {})       # the Guaranteed pod ended: its CPUs come back
    node.hook.placement.follow_pool()
    clock.now += 1
    moves = ctl.run_once()
    assert moves and all(m.to_node == 0 for m in moves)
    on0 = [p for p, _ in pods if nodes(node, p) == (0,)]
    assert len(on0) == 1                     # free 4 / 2 / 2 / 2 -> 3 / 2 / 2 / 3: one 1-CPU pod is enough
    cid = next(c for p, c in pods if p is on0[0])
    assert node.cpus_of(cid) == node.topology.cpus_of([0])


def test_rule_pins_and_exclusive_cpus_hold_and_an_affinity_group_moves_whole(tmp_path):
    cfg = NumaConfig(enabled=True, namespaces=["batch"], pins=(PinSpec("batch", "pinned", (0,)),))
    node = FakeNode(str(tmp_path), F.seed_16cpu(), cfg, kubelet_policy="static")
    pinned = node.run_pod("pinned")
    node.create(pinned, "app", request=2000)
    excl = node.run_pod("excl")
    node.create(excl, "shared", request=1000)
    a = node.run_pod("a")
    node.create(a, "app", request=500)
    b = node.run_pod("b")
    node.create(b, "app", request=500)
    p = node.hook.placement
    # put everything on node 0 by hand (as if the others had left)
    for pod in (excl, a, b):
        if nodes(node, pod) != (0,):
            assert p.move(pod.uid, [0], "test")
    CpusetRepinner(p, FakeContainerd(node)).run_once()
    node.set_kubelet_state("0-14", {excl.uid: {"pinned-sidecar": "15"}})
    p.follow_pool()
    ctl, clock, _ = controller(node, groups=lambda: [(a.uid, b.uid)])
    moves = ctl.run_once()
    # the rule-pinned and the exclusive pod stay; a and b move together
    assert nodes(node, pinned) == (0,) and nodes(node, excl) == (0,)
    assert [sorted(m.pods) for m in moves] == [sorted((a.uid, b.uid))]
    assert nodes(node, a) == nodes(node, b) != (0,)
    assert ctl.counts()["moves"] == 2


def test_cap_settle_and_cooldown_bound_the_moves(tmp_path):
    node = FakeNode(str(tmp_path), F.seed_16cpu())
    pods = fill(node, 8, request=500)
    for pod, _ in pods:                       # everything on node 0: free -0 / 4 / 4 / 4
        if nodes(node, pod) != (0,):
            assert node.hook.placement.move(pod.uid, [0], "test")
    CpusetRepinner(node.hook.placement, FakeContainerd(node)).run_once()
    cfg = dataclasses.replace(FAST, settle_seconds=30.0, max_moves_per_interval=2, interval_seconds=30.0)
    ctl, clock, _ = controller(node, cfg)
    assert ctl.run_once() == []               # over the threshold, not for long enough yet
    clock.now += 30
    assert len(ctl.run_once()) == 2           # the cap: 2 pods
    clock.now += 1
    assert ctl.run_once() == []               # the window is full
    clock.now += 30
    assert len(ctl.run_once()) == 2
    moved = [uid for uid in ctl.last_moved]
    assert len(moved) == 4
    # cooling down: pods that moved are not moved again within cooldown_seconds
    assert all(nodes(node, p) != (0,) for p, _ in pods if p.uid in moved)
    # a Reaper's word: the controller forgets gone pods
    ctl.forget(PodGone.of_ids("test", uids=moved[:1]))
    assert ctl.structures() == {"last_moved": 3}


def test_a_failed_re_pin_rolls_the_move_back_and_is_counted(tmp_path):
    node = FakeNode(str(tmp_path), F.seed_16cpu())
    pods = fill(node, 2, request=1000)
    assert nodes(node, pods[1][0]) == (1,)
    assert node.hook.placement.move(pods[1][0].uid, [0], "test")
    CpusetRepinner(node.hook.placement, FakeContainerd(node)).run_once()
    client = FakeContainerd(node)
    client.fail.update(c for _, c in pods)
    ctl, clock, _ = controller(node, client=client)
    assert ctl.run_once() == []
    assert ctl.counts()["moves_rolled_back"] == 1 and ctl.counts()["moves"] == 0
    assert [nodes(node, p) for p, _ in pods] == [(0,), (0,)]
    assert node.hook.placement.moves_in_flight() == []


def test_the_hook_registers_it_by_default_and_not_when_off(tmp_path):
    node = FakeNode(str(tmp_path), F.seed_16cpu())
    loops = node.hook.controllers(lambda timeout=None: FakeContainerd(node))
    assert "numa-respread" in [c.name for c in loops]
    assert node.hook.respread in node.hook.holders()
    cfg = NumaConfig(enabled=True, namespaces=["batch"], respread=RespreadConfig(enabled=False))
    hook = NumaHook(cfg, node.paths, node.topology)
    assert "numa-respread" not in [c.name for c in hook.controllers(lambda timeout=None: FakeContainerd(node))]
