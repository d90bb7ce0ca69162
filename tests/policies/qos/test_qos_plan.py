"""Knob values per level, for pods, containers, QoS-class dirs and the global switches, on
each kernel family; and a pod's writes when its level would turn an offline pod online.

(Adapted when the values moved into the family table, ``policies/qos/table.py``: what was
``plan_level`` / ``plan_qos_class_dirs`` / ``plan_globals`` is one decision,
``plan_kernel``, read here at the same places with the same values. "Every knob supported"
now spans two families, so the Alibaba cases say they are on an Alibaba kernel.)"""

import pytest

from anolisnuma.policies.qos.config import QosConfig
from anolisnuma.policies.qos.levels import QosLevel as L
from anolisnuma.policies.qos.plan import (
    KernelFacts, decide_pod, describe_report, family_plans, plan_kernel, sched_core_conflict,
)
from anolisnuma.policies.qos.table import rows
from anolisnuma.system import knobs as k
from anolisnuma.system.cgroups import KubeQosClass as K
from anolisnuma.system.knobs import KnobSupport

ALINUX = KnobSupport.only(k.ALINUX_CGROUP_KNOBS + (k.SCHED_GROUP_IDENTITY_ENABLED, k.SCHED_CORE))
OPENEULER = KnobSupport.only(k.OPENEULER_CGROUP_KNOBS + (k.VM_MEMCG_QOS_ENABLE,))
BOTH = KnobSupport.everything()
NEITHER = KnobSupport.only([])


def plan(support=ALINUX, cfg=None, **host):
    return plan_kernel(rows(cfg or QosConfig()), KernelFacts(support, host))


def values(settings):
    return {s.knob.name: s.value for s in settings}


# ------------------------------------------------------------------ Alibaba Cloud Linux

@pytest.mark.parametrize("level,bvt,prio,min_adj", [
    (L.LSE, 2, 5, -25), (L.LSR, 2, 10, -25), (L.LS, 1, 10, -25), (L.BE, -1, 0, 50)])
def test_each_level_gets_its_values(level, bvt, prio, min_adj):
    p = plan().levels[level]
    assert values(p.pod) == {
        "cpu.bvt_warp_ns": bvt, "memory.priority": prio, "memory.use_priority_oom": 1,
        "memory.wmark_ratio": 95, "memory.wmark_scale_factor": 20, "memory.wmark_min_adj": min_adj}
    assert values(p.container) == {
        "cpu.bvt_warp_ns": bvt, "memory.wmark_ratio": 95, "memory.wmark_scale_factor": 20,
        "memory.wmark_min_adj": min_adj}
    assert p.lacking == () and p.held == ()


def test_unsupported_knobs_are_left_out():
    p = plan(KnobSupport.only([k.MEMORY_WMARK_RATIO])).levels[L.BE]
    assert values(p.pod) == {"memory.wmark_ratio": 95}
    # the Alibaba family is found (one of its files is here): its other files are lacking,
    # openEuler's are not named (a family this kernel does not have)
    assert "cpu.bvt_warp_ns" in p.lacking and "cpu.qos_level" not in p.lacking


def test_features_turned_off_are_left_out():
    cfg = QosConfig()
    cfg.group_identity.enabled = False
    cfg.async_reclaim.enabled = False
    p = plan(cfg=cfg).levels[L.LS]
    assert values(p.pod) == {"memory.priority": 10, "memory.use_priority_oom": 1}
    assert p.container == ()


def test_qos_class_dirs_are_consistent_with_levels():
    dirs = plan().qos_class
    assert values(dirs[K.GUARANTEED]) == {"cpu.bvt_warp_ns": 0}
    assert values(dirs[K.BURSTABLE]) == {"cpu.bvt_warp_ns": 1, "memory.priority": 10}
    assert values(dirs[K.BESTEFFORT]) == {"cpu.bvt_warp_ns": -1, "memory.priority": 0}


def test_qos_class_dirs_can_be_left_alone():
    cfg = QosConfig(manage_qos_class_dirs=False)
    assert all(v == () for v in plan(cfg=cfg).qos_class.values())


def test_globals_follow_enable_global():
    g = plan()
    assert values(g.root) == {"memory.use_priority_oom": 1}
    assert values(g.host) == {"kernel.sched_group_identity_enabled": 1}
    cfg = QosConfig()
    cfg.oom_priority.enable_global = False
    assert values(plan(cfg=cfg).root) == {"memory.use_priority_oom": 0}
    assert plan(NEITHER).host == ()


def test_sched_core_forbids_only_minus_one():
    assert sched_core_conflict(k.CPU_BVT_WARP_NS, -1, True)
    assert sched_core_conflict(k.CPU_BVT_WARP_NS, -1, False) is None
    assert sched_core_conflict(k.CPU_BVT_WARP_NS, 2, True) is None
    assert sched_core_conflict(k.MEMORY_PRIORITY, -1, True) is None


# ------------------------------------------------------------------ openEuler

@pytest.mark.parametrize("level,value", [(L.LSE, 0), (L.LSR, 0), (L.LS, 0), (L.BE, -1)])
def test_openeuler_levels_are_online_or_offline_on_pod_and_containers(level, value):
    p = plan(OPENEULER, memcg=0)
    w = p.levels[level]
    both = {"cpu.qos_level": value, "memory.qos_level": value}
    assert values(w.pod) == both and values(w.container) == both
    assert w.offline is (value < 0) and w.online is (value >= 0)
    assert w.lacking == () and w.held == ()
    # nothing on the class directories (an offline parent would pin its children offline),
    # the memcg switch host-wide, nothing of Alibaba's
    assert all(s == () for s in p.qos_class.values()) and p.root == ()
    assert values(p.host) == {"vm.memcg_qos_enable": 1}
    assert p.families == ("openeuler",)


def test_memory_qos_level_is_held_back_while_its_switch_is_off_and_not_ours_to_turn():
    cfg = QosConfig()
    cfg.preemption.enable_sysctl = False
    p = plan(OPENEULER, cfg, **{"vm.memcg_qos_enable": 0})
    w = p.levels[L.BE]
    assert values(w.pod) == {"cpu.qos_level": -1} and p.host == ()
    [(name, why)] = w.held
    assert name == "memory.qos_level" and "vm.memcg_qos_enable is 0" in why and "enable_sysctl = false" in why
    assert "not written: memory.qos_level (vm.memcg_qos_enable is 0" in describe_report(L.BE, w.report(False))
    # switched on already by someone else (rubik, the node's sysctl.conf): written
    on = plan(OPENEULER, cfg, **{"vm.memcg_qos_enable": 1}).levels[L.BE]
    assert values(on.pod) == {"cpu.qos_level": -1, "memory.qos_level": -1} and on.held == ()


def test_configured_values_are_per_level():
    cfg = QosConfig()
    cfg.preemption.cpu[L.LSE] = 2   # a multi-level kernel's highest online level
    assert values(plan(OPENEULER, cfg).levels[L.LSE].pod)["cpu.qos_level"] == 2
    cfg.preemption.enabled = False
    assert plan(OPENEULER, cfg).levels[L.BE].pod == ()


# ------------------------------------------------------------------ both, neither

def test_a_kernel_with_both_families_gets_each_file_it_has():
    w = plan(BOTH).levels[L.BE]
    assert values(w.pod)["cpu.bvt_warp_ns"] == -1 and values(w.pod)["cpu.qos_level"] == -1
    assert plan(BOTH).families == ("alinux", "openeuler")


def test_a_kernel_with_neither_writes_nothing_and_names_what_it_lacks():
    p = plan(NEITHER)
    assert p.families == ()
    w = p.levels[L.BE]
    assert w.pod == () and w.container == () and p.root == () and p.host == ()
    assert {"cpu.bvt_warp_ns", "memory.priority", "cpu.qos_level", "memory.qos_level"} <= set(w.lacking)
    assert describe_report(L.BE, w.report(False)).startswith("BE: nothing written (not on this kernel: cpu.bvt_warp_ns, ")


# ------------------------------------------------------------------ offline is final

def test_online_to_offline_is_allowed_and_offline_to_online_refused_as_a_whole():
    p = plan(BOTH)
    assert decide_pod(p, L.BE, offline_now=False).writes is p.levels[L.BE]
    assert decide_pod(p, L.LS, offline_now=False).refused == ""
    refused = decide_pod(p, L.LS, offline_now=True)
    # the pod keeps BE in every family: nothing half-applied
    assert refused.level is L.BE and refused.wanted is L.LS and refused.writes is p.levels[L.BE]
    assert "never turned online" in refused.refused and refused.said().startswith("LS refused, kept at BE: ")
    # an offline pod asked to be offline again: nothing refused
    assert decide_pod(p, L.BE, offline_now=True).refused == ""
    # on a kernel without a final knob nothing is offline: nothing to refuse
    assert decide_pod(plan(ALINUX), L.LS, offline_now=True).refused == ""


def test_a_refused_pod_keeps_the_offline_level_it_had():
    cfg = QosConfig()
    cfg.preemption.cpu[L.LS] = -2          # a second offline level (a multi-level kernel)
    p = plan(OPENEULER, cfg)
    kept = decide_pod(p, L.LSE, offline_now=True, previous=L.LS)
    assert kept.level is L.LS and values(kept.writes.pod)["cpu.qos_level"] == -2


def test_with_no_offline_level_the_final_files_are_left_as_they_are():
    cfg = QosConfig()
    cfg.preemption.cpu[L.BE] = cfg.preemption.memory[L.BE] = 0   # nothing offline by configuration
    kept = decide_pod(plan(BOTH, cfg), L.LS, offline_now=True)
    assert kept.level is L.LS and kept.refused
    assert "cpu.qos_level" not in values(kept.writes.pod) and values(kept.writes.pod)["cpu.bvt_warp_ns"] == 1
    assert kept.said().startswith("LS's online values refused, the pod stays offline")


# ------------------------------------------------------------------ each family, for the demo

def test_family_plans_are_each_familys_kernel_plan():
    """What the demo shows a pod would get on each family is what that family's kernel plans."""
    cfg = QosConfig()
    plans = family_plans(rows(cfg))
    assert sorted(plans) == ["alinux", "openeuler"]
    for name, support in (("alinux", ALINUX), ("openeuler", OPENEULER)):
        for level in L:
            assert plans[name].levels[level].knob_values() == plan(support, cfg).levels[level].knob_values()
    assert dict(plans["openeuler"].levels[L.BE].knob_values()) == {"cpu.qos_level": -1, "memory.qos_level": -1}
    assert dict(plans["alinux"].levels[L.LS].knob_values())["cpu.bvt_warp_ns"] == 1
    assert plans["openeuler"].levels[L.BE].held == ()   # the host switch is the family's own row's to turn


def test_family_plans_follow_the_configuration():
    cfg = QosConfig()
    cfg.preemption.enabled = False
    plans = family_plans(rows(cfg))
    assert plans["openeuler"].levels[L.BE].knob_values() == ()
    assert plans["alinux"].levels[L.BE].knob_values() != ()
