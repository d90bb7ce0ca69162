"""Knob values per level, for pods, containers, QoS-class dirs and the global switches."""

import pytest

from anolisnuma.policies.qos.config import QosConfig
from anolisnuma.policies.qos.levels import QosLevel as L
from anolisnuma.policies.qos.plan import (
    plan_globals, plan_level, plan_qos_class_dirs, sched_core_conflict,
)
from anolisnuma.system import knobs as k
from anolisnuma.system.cgroups import KubeQosClass as K
from anolisnuma.system.knobs import KnobSupport

ALL = KnobSupport.everything()


def values(settings):
    return {s.knob.name: s.value for s in settings}


@pytest.mark.parametrize("level,bvt,prio,min_adj", [
    (L.LSE, 2, 5, -25), (L.LSR, 2, 10, -25), (L.LS, 1, 10, -25), (L.BE, -1, 0, 50)])
def test_each_level_gets_its_values(level, bvt, prio, min_adj):
    p = plan_level(QosConfig(), level, ALL)
    assert values(p.pod) == {
        "cpu.bvt_warp_ns": bvt, "memory.priority": prio, "memory.use_priority_oom": 1,
        "memory.wmark_ratio": 95, "memory.wmark_scale_factor": 20, "memory.wmark_min_adj": min_adj}
    assert values(p.container) == {
        "cpu.bvt_warp_ns": bvt, "memory.wmark_ratio": 95, "memory.wmark_scale_factor": 20,
        "memory.wmark_min_adj": min_adj}


def test_unsupported_knobs_are_left_out():
    support = KnobSupport.only([k.MEMORY_WMARK_RATIO])
    p = plan_level(QosConfig(), L.BE, support)
    assert values(p.pod) == {"memory.wmark_ratio": 95}


def test_features_turned_off_are_left_out():
    cfg = QosConfig()
    cfg.group_identity.enabled = False
    cfg.async_reclaim.enabled = False
    p = plan_level(cfg, L.LS, ALL)
    assert values(p.pod) == {"memory.priority": 10, "memory.use_priority_oom": 1}
    assert p.container == ()


def test_qos_class_dirs_are_consistent_with_levels():
    dirs = plan_qos_class_dirs(QosConfig(), ALL)
    assert values(dirs[K.GUARANTEED]) == {"cpu.bvt_warp_ns": 0}
    assert values(dirs[K.BURSTABLE]) == {"cpu.bvt_warp_ns": 1, "memory.priority": 10}
    assert values(dirs[K.BESTEFFORT]) == {"cpu.bvt_warp_ns": -1, "memory.priority": 0}


def test_qos_class_dirs_can_be_left_alone():
    cfg = QosConfig(manage_qos_class_dirs=False)
    assert all(v == () for v in plan_qos_class_dirs(cfg, ALL).values())


def test_globals_follow_enable_global():
    g = plan_globals(QosConfig(), ALL)
    assert values(g.root_cgroup) == {"memory.use_priority_oom": 1}
    assert values(g.sysctls) == {"kernel.sched_group_identity_enabled": 1}
    cfg = QosConfig()
    cfg.oom_priority.enable_global = False
    assert values(plan_globals(cfg, ALL).root_cgroup) == {"memory.use_priority_oom": 0}
    assert plan_globals(QosConfig(), KnobSupport.only([])).sysctls == ()


def test_sched_core_forbids_only_minus_one():
    assert sched_core_conflict(k.CPU_BVT_WARP_NS, -1, True)
    assert sched_core_conflict(k.CPU_BVT_WARP_NS, -1, False) is None
    assert sched_core_conflict(k.CPU_BVT_WARP_NS, 2, True) is None
    assert sched_core_conflict(k.MEMORY_PRIORITY, -1, True) is None
