"""LLC masks, MB values and CLOSID planning, for Intel, AMD and ARM facts."""

import pytest

from anolisnuma.policies.qos.config import ResctrlClass, ResctrlConfig
from anolisnuma.policies.qos.levels import QosLevel as L
from anolisnuma.policies.qos.resctrl import (
    class_schemata, l3_mask, llc_class_for, mb_value, plan_groups, schemata_drift,
)
from anolisnuma.system.resctrl import (
    MB_AMD_UNITS, MB_PERCENT, BandwidthInfo, CacheInfo, ResctrlInfo, render_schemata,
)

LOW, HIGH, ALL = ResctrlClass(4, 20), ResctrlClass(8, 50), ResctrlClass(0, 100)


def cache(ways, ids=(0, 1), min_bits=1, shift=0, res=("L3",)):
    return CacheInfo(res, ((1 << ways) - 1) << shift, min_bits, 0, 16, tuple(ids))


def intel_mb(ids=(0, 1), gran=10, min_bw=10):
    return BandwidthInfo(gran, min_bw, 8, tuple(ids), MB_PERCENT, 100)


def info(l3=None, mb=None, groups=()):
    return ResctrlInfo("intel", l3, mb, tuple(groups))


@pytest.mark.parametrize("ways,cls,mask", [
    (11, LOW, 0x00f), (11, HIGH, 0x0ff), (11, ALL, 0x7ff),
    (12, LOW, 0x00f), (12, HIGH, 0x0ff), (12, ALL, 0xfff),
    (20, ALL, 0xfffff), (6, HIGH, 0x3f),   # more ways asked than exist: capped
])
def test_l3_masks(ways, cls, mask):
    assert l3_mask(cache(ways), cls.l3_ways) == mask


def test_l3_mask_respects_min_cbm_bits_and_offset():
    assert l3_mask(cache(11, min_bits=6), 4) == 0x3f
    assert l3_mask(cache(8, shift=4), 4) == 0xf0


def test_masks_are_contiguous_for_every_size():
    for ways in range(1, 33):
        for want in range(0, 34):
            m = l3_mask(cache(ways), want)
            run = m >> ((m & -m).bit_length() - 1)   # drop trailing zeros
            assert m and run & (run + 1) == 0          # then all ones: contiguous
            assert bin(m).count("1") == (ways if want == 0 else min(want, ways))


def test_intel_mb_rounds_up_to_granularity_and_minimum():
    assert mb_value(intel_mb(), 20) == 20
    assert mb_value(intel_mb(), 25) == 30
    assert mb_value(intel_mb(), 100) == 100
    assert mb_value(intel_mb(min_bw=30), 20) == 30
    assert mb_value(intel_mb(gran=1, min_bw=1), 7) == 7


def test_amd_mb_is_absolute_with_2048_unlimited():
    amd = BandwidthInfo(1, 0, 16, (0, 1, 2, 3), MB_AMD_UNITS, 2048)
    assert mb_value(amd, 100) == 2048
    assert mb_value(amd, 50) == 1024
    assert mb_value(amd, 20) == 410


def test_schemata_one_entry_per_cache_id():
    i = info(cache(11, ids=(0, 1)), intel_mb(ids=(0, 1)))
    s = class_schemata(i, LOW)
    assert s == {"L3": {0: 0xf, 1: 0xf}, "MB": {0: 20, 1: 20}}
    assert render_schemata(s, 3) == "L3:0=00f;1=00f\nMB:0=20;1=20\n"


def test_schemata_with_cdp_writes_code_and_data():
    i = info(cache(12, res=("L3CODE", "L3DATA")))
    assert class_schemata(i, HIGH) == {"L3CODE": {0: 0xff, 1: 0xff}, "L3DATA": {0: 0xff, 1: 0xff}}


def test_schemata_arm_mpam_ids_and_percentages():
    i = ResctrlInfo("arm", cache(16, ids=(1, 57)), BandwidthInfo(1, 1, 16, (1, 57), MB_PERCENT, 100), ())
    assert class_schemata(i, LOW) == {"L3": {1: 0xf, 57: 0xf}, "MB": {1: 20, 57: 20}}


def test_drift_detects_changed_domains():
    want = {"L3": {0: 0xf, 1: 0xf}}
    assert schemata_drift(want, {"L3": {0: 0xf, 1: 0xf}, "MB": {0: 100}}) == []
    assert schemata_drift(want, {"L3": {0: 0xf, 1: 0x7ff}}) == ["L3"]
    assert schemata_drift(want, {}) == ["L3"]


def test_groups_fit_when_closids_suffice():
    names = {"low": "a-low", "high": "a-high", "all": "a-all"}
    p = plan_groups(info(cache(11)), ["all", "high", "low"], names)
    assert p.create == ("low", "high", "all") and p.skipped == {}


def test_too_few_closids_skips_classes_in_order():
    names = {"low": "a-low", "high": "a-high", "all": "a-all"}
    c = CacheInfo(("L3",), 0x7ff, 1, 0, 3, (0,))          # root + 2 groups
    p = plan_groups(info(c), ["low", "high", "all"], names)
    assert p.create == ("low", "high") and list(p.skipped) == ["all"]
    assert "num_closids=3" in p.skipped["all"]
    # a foreign group takes one more; our own existing group keeps its CLOSID
    p = plan_groups(info(c, groups=("koordlet-BE", "a-all")), ["low", "high", "all"], names)
    assert p.create == ("low", "all") and list(p.skipped) == ["high"]


def test_no_resources_means_no_groups():
    p = plan_groups(info(), ["low"], {"low": "a-low"})
    assert p.create == () and "low" in p.skipped


def test_llc_annotation_overrides_level_default():
    cfg = ResctrlConfig()
    assert llc_class_for(cfg, L.BE, {}) == ("low", None)
    assert llc_class_for(cfg, L.LS, {}) == ("all", None)
    assert llc_class_for(cfg, L.BE, {"anolisbox.sh/llc_limit": "HIGH"}) == ("high", None)
    cls, warning = llc_class_for(cfg, L.BE, {"anolisbox.sh/llc_limit": "../../x\x00" * 1000})
    assert cls == "low" and warning and len(warning) < 300
