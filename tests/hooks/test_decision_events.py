"""What the policies tell their decision sink (``anolisnuma/decision_events.py``): one fact
per pod per decision, from the NUMA hook and placement service (placed by balance, by a
rule, kubelet-exclusive; a live move rolled back), the affinity controller (a move and
its peer) and the QoS hook (level applied, knobs this kernel lacks, a bad marking, a pod
it cannot place), never one per container or per reconcile pass. Fake sysfs, kubelet and
containerd (test_numa_hook's FakeNode), fake kernel trees for the QoS knobs."""

from __future__ import annotations

import uuid
from typing import List

from anolisnuma.decision_events import (
    Decision, NumaMoved, NumaMoveFailed, NumaPlaced, NumaPoolMoved, PodRef, QosApplied, QosSkipped)
from anolisnuma.hooks.numa import NumaHook
from anolisnuma.hooks.qos import QosHook
from anolisnuma.policies.numa.config import NumaConfig
from anolisnuma.policies.numa.cpuset import CpuSet
from anolisnuma.policies.numa.rules import PinSpec
from anolisnuma.reconcile.numa import CpusetRepinner
from anolisnuma.state.records import ContainerRecord, ContainerResources, PodRecord
from anolisnuma.testing import fake_sysfs as F
from test_numa_hook import PERIOD, FakeNode, kunpeng_static
from test_numa_move import FakeContainerd, ScriptedSource, controller, two_pods
from test_qos_hook import Pod, config


def told(hook) -> List[Decision]:
    out: List[Decision] = []
    hook.use_decision_events(out.append)
    return out


# ====================================================================== NUMA
def test_a_pod_placed_by_balance_is_told_once_with_its_nodes_and_cpuset(tmp_path):
    node = FakeNode(str(tmp_path), F.seed_16cpu())
    facts = told(node.hook)
    pod = node.run_pod("web")
    node.create(pod, "app", request=1000)
    node.create(pod, "sidecar", request=500)     # the pod is placed already: nothing new
    assert facts == [NumaPlaced(PodRef("batch", "web", pod.uid), (0,), "0-3", "0", "balance",
                                detail="most free capacity (4 of 4 CPUs free)")]


def test_a_pod_pinned_by_a_rule_is_told_with_the_rule(tmp_path):
    cfg = NumaConfig(enabled=True, namespaces=["batch"], pins=(PinSpec("batch", "db", (2,)),))
    node = FakeNode(str(tmp_path), F.seed_16cpu(), cfg)
    facts = told(node.hook)
    pod = node.run_pod("db")
    node.create(pod, "app", request=1000)
    [fact] = facts
    assert isinstance(fact, NumaPlaced) and fact.why == "rule" and fact.nodes == (2,) and fact.cpus == "8-11"
    assert fact.rule and fact.rule in fact.detail


def test_a_kubelet_exclusive_container_is_told_with_the_kubelets_cpus(tmp_path):
    node = kunpeng_static(tmp_path)
    uid = "88ee6d1e-f436-45ca-a8ae-3db9d2309358"
    node.default, node.entries = CpuSet.parse("0-31,34-127"), {uid: {"main": "32-33"}}
    node._write_state()
    facts = told(node.hook)
    pod = node.run_pod("specjb", uid=uid)
    node.create(pod, "main", request=2000, limit=2000)
    [fact] = facts
    assert fact == NumaPlaced(PodRef("batch", "specjb", uid), (1,), "32-33", "", "kubelet-exclusive",
                              container="main")


def restarted(node: FakeNode) -> List[Decision]:
    """kill -9 and start again, the new hook's sink wired before its start-up resync (as the
    daemon wires it when it builds the hooks): what the resync told."""
    node.hook.close()
    node.hook = NumaHook(node.config, node.paths, node.topology)
    facts = told(node.hook)
    node.hook.resync(list(node.pods.values()), list(node.containers.values()))
    return facts


def test_pods_adopted_at_a_restart_are_told_and_pods_it_knew_are_not(tmp_path):
    node = FakeNode(str(tmp_path), F.seed_16cpu())
    known = node.run_pod("known")
    node.create(known, "app", request=1000)
    node.hook.placement.flush()
    # created while the daemon was away: one unpinned, one found pinned on node 2 (its
    # allocation lost with numa.json's last write)
    late, pinned = node.run_pod("late"), node.run_pod("pinned")
    for pod, cpus in ((late, ""), (pinned, "8-11")):
        cid = uuid.uuid4().hex * 2
        node.containers[cid] = ContainerRecord(cid, pod.sandbox_id, "app", resources=ContainerResources(
            cpu_period=PERIOD, cpu_quota=-1, cpu_shares=1024, cpuset_cpus=cpus))
    facts = restarted(node)
    by_name = {f.pod.name: f for f in facts}
    assert sorted(by_name) == ["late", "pinned"] and len(facts) == 2   # the known pod: told at its creation
    placed, found = by_name["late"], by_name["pinned"]
    assert isinstance(placed, NumaPlaced) and placed.adopted and placed.why == "balance"
    alloc = node.hook.placement.ledger.get(late.uid)
    assert placed.nodes == tuple(alloc.nodes) and placed.cpus == str(alloc.cpus(node.hook.placement.shared_pool))
    assert placed.detail   # the balance's own reason
    assert found == NumaPlaced(PodRef("batch", "pinned", pinned.uid), (2,), "8-11", "", "adopted", adopted=True)
    assert restarted(node) == []   # a second restart knows them all


def test_a_pod_the_kubelets_exclusive_cpus_push_off_its_node_is_told_moved(tmp_path):
    node = kunpeng_static(tmp_path)
    pod = node.run_pod("web")
    node.create(pod, "app", request=1000)
    node.create(pod, "side", request=1000)
    g = node.run_pod("g", namespace="default")
    node.create(g, "app", request=32000, limit=32000, kubelet_cpus="0-31")
    facts = told(node.hook)
    node.set_kubelet_state("32-127", {g.uid: {"app": "0-31"}})   # the pool leaves node 0
    assert facts == [NumaPoolMoved(PodRef("batch", "web", pod.uid), (0,), (1,), "32-127")]   # once, not per container


def test_a_failed_live_move_is_told_and_a_rule_repin_is_not(tmp_path):
    node = FakeNode(str(tmp_path), F.seed_16cpu())
    a, ca, b, cb = two_pods(node, containers=("app", "sidecar"))
    facts = told(node.hook)
    assert node.hook.placement.move(b.uid, [0], "test move")
    client = FakeContainerd(node)
    client.fail.add(cb[1])
    CpusetRepinner(node.hook.placement, client).run_once()
    [fact] = facts
    assert isinstance(fact, NumaMoveFailed) and fact.pod == PodRef("batch", "b", b.uid)
    assert fact.to_nodes == (0,) and fact.back_to == (1,) and "cannot update" in fact.error
    assert fact.reason == "test move"


def test_the_affinity_controller_tells_the_move_and_its_peer(tmp_path):
    node = FakeNode(str(tmp_path), F.seed_16cpu())
    a, ca, b, cb = two_pods(node)
    source = ScriptedSource()
    ctl = controller(node, source, FakeContainerd(node))
    facts = told(node.hook)
    ctl.decisions = facts.append   # (the hook wires the controller it makes itself)
    source.rates = {(a.uid, b.uid): 50e6}
    moved = [m for _ in range(4) for m in ctl.run_once()]
    assert len(moved) == 1 and len(facts) == 1
    fact, m = facts[0], moved[0]
    assert isinstance(fact, NumaMoved) and fact.pod.uid == m.pod
    assert fact.peer == ("batch/b" if m.pod == a.uid else "batch/a")
    assert fact.from_nodes == tuple(m.from_nodes) and fact.to_nodes == tuple(m.to_nodes)
    assert fact.bytes_per_second > 1e6 and fact.kind == "join"


def test_a_rolled_back_affinity_move_is_not_told_as_moved(tmp_path):
    node = FakeNode(str(tmp_path), F.seed_16cpu())
    a, ca, b, cb = two_pods(node)
    source = ScriptedSource()
    client = FakeContainerd(node)
    client.fail.update(ca + cb)
    ctl = controller(node, source, client)
    facts = told(node.hook)
    ctl.decisions = facts.append
    source.rates = {(a.uid, b.uid): 50e6}
    for _ in range(3):
        ctl.run_once()
    assert ctl.counters["moves_rolled_back"] == 1
    assert [type(f) for f in facts] == [NumaMoveFailed]


# ====================================================================== QoS
def test_a_level_applied_is_told_once_not_per_container_or_pass(kernel):
    fk = kernel(sched_core=0)
    hook = QosHook(config(), fk.paths)
    facts = told(hook)
    pod = Pod(fk, hook, annotations={"anolisbox.sh/qoslevel": "be"}, name="batch-job")
    pod.run()
    for _ in range(2):
        pod.start(pod.create())
    hook.run_once()
    [fact] = facts
    assert isinstance(fact, QosApplied) and fact.pod == PodRef("default", "batch-job", pod.uid)
    assert fact.level == "BE" and "annotation" in fact.why
    assert ("cpu.bvt_warp_ns", -1) in fact.knobs and ("memory.priority", 0) in fact.knobs
    assert fact.lacking == () and fact.ignored == () and fact.refused == ()


def test_knobs_this_kernel_lacks_are_told(kernel):
    fk = kernel(anolis=["memory.wmark_ratio"], sched_group_identity_enabled=None)
    hook = QosHook(config(), fk.paths)
    facts = told(hook)
    Pod(fk, hook, annotations={"anolisbox.sh/qoslevel": "BE"}).run()
    [fact] = facts
    assert isinstance(fact, QosApplied) and fact.knobs == (("memory.wmark_ratio", 95),)
    assert "cpu.bvt_warp_ns" in fact.lacking and "memory.priority" in fact.lacking


def test_a_bad_marking_is_told_with_the_level_the_pod_got_instead(kernel):
    fk = kernel(sched_core=0)
    hook = QosHook(config(), fk.paths)
    facts = told(hook)
    Pod(fk, hook, annotations={"anolisbox.sh/qoslevel": "turbo"}, kube_class="besteffort").run()
    [fact] = facts
    assert isinstance(fact, QosApplied) and fact.level == "BE" and "kube QoS class" in fact.why
    assert len(fact.ignored) == 1 and "'turbo'" in fact.ignored[0]


def test_a_pod_whose_cgroup_cannot_be_placed_is_told_skipped_once(kernel):
    fk = kernel(sched_core=0)
    hook = QosHook(config(), fk.paths)
    facts = told(hook)
    pod = Pod(fk, hook, make=False)
    pod.config.linux.cgroup_parent = "/somewhere/else"
    pod.run()
    pod.create()
    [fact] = facts
    assert isinstance(fact, QosSkipped) and fact.pod.uid == pod.uid and "cgroup_parent not recognized" in fact.why


def test_a_restart_that_finds_the_values_in_place_tells_nothing(kernel):
    fk = kernel(sched_core=0)
    first = QosHook(config(), fk.paths)
    pod = Pod(fk, first, annotations={"anolisbox.sh/qoslevel": "LS"})
    pod.run()
    again = QosHook(config(), fk.paths)   # the daemon restarted
    facts = told(again)
    rec = PodRecord(pod.sandbox_id, pod.uid, "web", "default", pod.parent,
                    annotations={"anolisbox.sh/qoslevel": "LS"})
    again.resync([rec], [])
    assert facts == []
    # a pod that came while the daemon was away is told
    late = Pod(fk, first, annotations={"anolisbox.sh/qoslevel": "BE"}, name="late")
    cid = uuid.uuid4().hex * 2
    fk.make_container(late.parent, cid)
    again.resync([rec, PodRecord(late.sandbox_id, late.uid, "late", "default", late.parent,
                                 annotations={"anolisbox.sh/qoslevel": "BE"})],
                 [ContainerRecord(cid, late.sandbox_id, "c")])
    assert [(type(f), f.pod.name) for f in facts] == [(QosApplied, "late")]


def test_a_pod_adopted_on_a_kernel_with_no_qos_knob_is_told_once(kernel):
    """Nothing is written for it (this kernel has no knob of any family): a resync alone
    would tell nothing; the pods the store first learned of from the listing are told."""
    fk = kernel(anolis=[], sched_group_identity_enabled=None)
    first = QosHook(config(), fk.paths)
    known = Pod(fk, first, annotations={"anolisbox.sh/qoslevel": "LS"}, name="known")
    known.run()
    late = Pod(fk, first, annotations={"anolisbox.sh/qoslevel": "BE"}, name="late")   # came while away
    again = QosHook(config(), fk.paths)   # the daemon restarted
    facts = told(again)
    recs = [PodRecord(p.sandbox_id, p.uid, p.config.metadata.name, "default", p.parent,
                      annotations=dict(p.config.annotations)) for p in (known, late)]
    again.resync(recs, [])
    assert facts == []
    again.pods_adopted(recs[1:])   # (RuntimeResync.adopted: not in the store before the listing)
    [fact] = facts
    assert isinstance(fact, QosApplied) and fact.pod == PodRef("default", "late", late.uid) and fact.level == "BE"
    assert fact.knobs == () and "cpu.bvt_warp_ns" in fact.lacking
    again.pods_adopted(recs[1:])
    again.resync(recs, [])
    assert len(facts) == 1   # told once


def test_without_a_sink_nothing_is_told_and_nothing_fails(kernel, tmp_path):
    node = FakeNode(str(tmp_path), F.seed_16cpu())
    pod = node.run_pod("web")
    node.create(pod, "app", request=1000)
    fk = kernel(sched_core=0)
    hook = QosHook(config(), fk.paths)
    Pod(fk, hook).run()
    assert node.hook.decisions is node.hook.placement.decisions and hook.decisions is hook.applier.decisions
