"""[qos] configuration: defaults, overrides, and refusals naming the dotted key."""

import pytest

from anolisnuma.configfile import ConfigError, Table
from anolisnuma.policies.qos.config import QosConfig, ResctrlClass
from anolisnuma.policies.qos.levels import QosLevel as L
from anolisnuma.system.cgroups import KubeQosClass


def parse(data):
    return QosConfig.from_table(Table(data, "qos"))


def test_defaults_are_the_anolisbox_values():
    c = parse({})
    assert c.enabled and not c.dry_run and c.reconcile_interval_seconds == 10
    assert c.kube_class_mapping == {KubeQosClass.GUARANTEED: L.LS, KubeQosClass.BURSTABLE: L.LS,
                                    KubeQosClass.BESTEFFORT: L.BE}
    assert c.group_identity.values == {L.LSE: 2, L.LSR: 2, L.LS: 1, L.BE: -1}
    assert c.oom_priority.values == {L.LSE: 5, L.LSR: 10, L.LS: 10, L.BE: 0}
    assert c.oom_priority.enable_global
    assert (c.async_reclaim.wmark_ratio, c.async_reclaim.wmark_scale_factor) == (95, 20)
    assert c.async_reclaim.wmark_min_adj == {L.LSE: -25, L.LSR: -25, L.LS: -25, L.BE: 50}
    assert c.resctrl.classes == {"low": ResctrlClass(4, 20), "high": ResctrlClass(8, 50),
                                 "all": ResctrlClass(0, 100)}
    assert c.resctrl.default == {L.LSE: "all", L.LSR: "all", L.LS: "all", L.BE: "low"}
    assert c.preemption.enabled and c.preemption.enable_sysctl
    assert c.preemption.cpu == c.preemption.memory == {L.LSE: 0, L.LSR: 0, L.LS: 0, L.BE: -1}


def test_preemption_block_is_read():
    c = parse({"preemption": {"cpu": {"LSE": 2, "BE": -2}, "memory": {"BE": -1024}, "enable_sysctl": False}})
    assert c.preemption.cpu == {L.LSE: 2, L.LSR: 0, L.LS: 0, L.BE: -2}
    assert c.preemption.memory[L.BE] == -1024 and not c.preemption.enable_sysctl


def test_a_full_block_is_read():
    c = parse({
        "dry_run": True, "reconcile_interval_seconds": 30,
        "kube_class_mapping": {"guaranteed": "lsr"},
        "group_identity": {"values": {"BE": 0}, "enable_sysctl": False},
        "oom_priority": {"enable_global": False, "values": {"LS": 12}},
        "async_reclaim": {"wmark_ratio": 80, "wmark_min_adj": {"BE": 30}},
        "resctrl": {"classes": {"low": {"l3_ways": 2, "mb_percent": 10}}, "default": {"LS": "high"},
                    "group_prefix": "qos_"},
    })
    assert c.dry_run and c.reconcile_interval_seconds == 30
    assert c.kube_class_mapping[KubeQosClass.GUARANTEED] is L.LSR
    assert c.group_identity.values[L.BE] == 0 and c.group_identity.values[L.LS] == 1
    assert not c.group_identity.enable_sysctl
    assert not c.oom_priority.enable_global and c.oom_priority.values[L.LS] == 12
    assert c.async_reclaim.wmark_ratio == 80 and c.async_reclaim.wmark_min_adj[L.BE] == 30
    assert c.resctrl.classes["low"] == ResctrlClass(2, 10)
    assert c.resctrl.default[L.LS] == "high"
    assert c.resctrl.group_name("low") == "qos_low"


@pytest.mark.parametrize("data,key", [
    ({"bogus": 1}, "qos.bogus"),
    ({"group_identity": {"values": {"BE": -2}}}, "qos.group_identity.values.BE"),
    ({"group_identity": {"values": {"LS": 3}}}, "qos.group_identity.values.LS"),
    ({"group_identity": {"values": {"GOLD": 1}}}, "qos.group_identity.values.GOLD"),
    ({"group_identity": {"values": {"LS": 1, "ls": 2}}}, "qos.group_identity.values.ls"),
    ({"oom_priority": {"values": {"LS": 13}}}, "qos.oom_priority.values.LS"),
    ({"oom_priority": {"enable_global": "yes"}}, "qos.oom_priority.enable_global"),
    ({"async_reclaim": {"wmark_ratio": 101}}, "qos.async_reclaim.wmark_ratio"),
    ({"async_reclaim": {"wmark_scale_factor": 0}}, "qos.async_reclaim.wmark_scale_factor"),
    ({"async_reclaim": {"wmark_min_adj": {"BE": 51}}}, "qos.async_reclaim.wmark_min_adj.BE"),
    ({"async_reclaim": {"typo": 1}}, "qos.async_reclaim.typo"),
    ({"resctrl": {"classes": {"medium": {}}}}, "qos.resctrl.classes.medium"),
    ({"resctrl": {"classes": {"low": {"mb_percent": 0}}}}, "qos.resctrl.classes.low.mb_percent"),
    ({"resctrl": {"classes": {"low": {"ways": 3}}}}, "qos.resctrl.classes.low.ways"),
    ({"resctrl": {"default": {"BE": "medium"}}}, "qos.resctrl.default.BE"),
    ({"resctrl": {"group_prefix": "../x"}}, "qos.resctrl.group_prefix"),
    ({"kube_class_mapping": {"burstable": "gold"}}, "qos.kube_class_mapping.burstable"),
    ({"kube_class_mapping": {"other": "LS"}}, "qos.kube_class_mapping.other"),
    ({"reconcile_interval_seconds": 0.5}, "qos.reconcile_interval_seconds"),
    ({"reconcile_interval_seconds": -1}, "qos.reconcile_interval_seconds"),
    ({"preemption": {"cpu": {"BE": -3}}}, "qos.preemption.cpu.BE"),
    ({"preemption": {"cpu": {"LSE": 3}}}, "qos.preemption.cpu.LSE"),
    ({"preemption": {"memory": {"BE": -1025}}}, "qos.preemption.memory.BE"),
    ({"preemption": {"cpu": {"BE": "-1"}}}, "qos.preemption.cpu.BE"),
    ({"preemption": {"enable_sysctl": 1}}, "qos.preemption.enable_sysctl"),
    ({"preemption": {"offline": True}}, "qos.preemption.offline"),
])
def test_bad_values_are_refused_naming_the_key(data, key):
    with pytest.raises(ConfigError) as e:
        parse(data)
    assert e.value.key == key


def test_reconciler_can_be_turned_off():
    assert parse({"reconcile_interval_seconds": 0}).reconcile_interval_seconds == 0


def test_the_documented_example_block_is_the_defaults():
    import os
    import re
    import sys
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    doc = os.path.join(os.path.dirname(__file__), "..", "..", "..", "docs", "qos.md")
    with open(doc) as f:
        block = re.search(r"```toml\n(.*?)```", f.read(), re.S).group(1)
    assert parse(tomllib.loads(block)["qos"]) == QosConfig()
