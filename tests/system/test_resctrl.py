"""The resctrl adapter: facts for Intel, AMD, ARM MPAM; groups, schemata and tasks."""

import os

import pytest

from anolisnuma.system.cgroups import FileGone, ReadFailed
from anolisnuma.system.resctrl import (
    MB_AMD_UNITS, MB_PERCENT, ResctrlFs, parse_schemata, render_schemata,
)


def rfs(fk):
    return ResctrlFs(fk.paths.resctrl_root, fk.paths.proc_root)


def test_intel_11_ways_two_cache_ids(kernel):
    fk = kernel(vendor="intel", resctrl={"l3_ways": 11, "cache_ids": (0, 1)})
    i = rfs(fk).read_info()
    assert i.vendor == "intel"
    assert (i.l3.cbm_mask, i.l3.ways, i.l3.domain_ids, i.l3.resources) == (0x7ff, 11, (0, 1), ("L3",))
    assert (i.mb.unit, i.mb.bandwidth_gran, i.mb.min_bandwidth, i.mb.domain_ids) == (MB_PERCENT, 10, 10, (0, 1))
    assert i.num_closids == 16 and i.notes == []


def test_amd_uses_absolute_units(kernel):
    fk = kernel(vendor="amd", resctrl={"l3_ways": 16, "cache_ids": (0, 1, 2, 3)})
    i = rfs(fk).read_info()
    assert i.vendor == "amd" and i.mb.unit == MB_AMD_UNITS and i.mb.max_value == 2048
    assert i.l3.domain_ids == (0, 1, 2, 3)


def test_hygon_is_amd(kernel):
    fk = kernel(vendor="hygon", resctrl={})
    assert rfs(fk).read_info().mb.unit == MB_AMD_UNITS


def test_arm_mpam_percentages(kernel):
    fk = kernel(vendor="arm", resctrl={"l3_ways": 16, "cache_ids": (1, 57)})
    i = rfs(fk).read_info()
    assert i.vendor == "arm" and i.mb.unit == MB_PERCENT and i.l3.domain_ids == (1, 57)


def test_unknown_vendor_infers_unit_from_layout_and_says_so(kernel):
    fk = kernel(vendor="intel", resctrl={"mb_root_value": 2048})
    os.remove(os.path.join(fk.paths.proc_root, "cpuinfo"))
    i = rfs(fk).read_info()
    assert i.vendor is None and i.mb.unit == MB_AMD_UNITS
    assert any("vendor unknown" in n for n in i.notes)


def test_intel_mbps_mode_is_unsupported(kernel):
    fk = kernel(vendor="intel", resctrl={"mb_root_value": 4294967295})
    i = rfs(fk).read_info()
    assert i.mb is None and any("MBps" in n for n in i.notes) and i.l3 is not None


def test_cdp_and_min_closids(kernel):
    fk = kernel(resctrl={"cdp": True, "num_closids": 16, "mb_num_closids": 4})
    i = rfs(fk).read_info()
    assert i.l3.resources == ("L3CODE", "L3DATA")
    assert i.num_closids == 4


def test_not_mounted(kernel):
    fk = kernel()
    r = rfs(fk)
    assert not r.mounted() and "not mounted" in r.missing_reason("L3")
    with pytest.raises(ReadFailed):
        r.read_info()


def test_groups_schemata_and_tasks(kernel):
    fk = kernel(resctrl={})
    r = rfs(fk)
    assert r.make_group("anolisnuma-low") is True
    assert r.make_group("anolisnuma-low") is False
    r.write_group_schemata("anolisnuma-low", "L3:0=00f;1=00f\nMB:0=20;1=20\n")
    assert r.read_group_schemata("anolisnuma-low") == {"L3": {0: 0xf, 1: 0xf}, "MB": {0: 20, 1: 20}}
    assert r.group_tasks("anolisnuma-low") == set()
    assert r.add_tasks("anolisnuma-low", ["10", "11", "x/../1"]) == []
    assert r.group_tasks("anolisnuma-low") == {"10", "11"}
    assert r.list_groups() == ["anolisnuma-low"]
    with pytest.raises(FileGone):
        r.write_group_schemata("anolisnuma-gone", "L3:0=f\n")


@pytest.mark.parametrize("name", ["../x", "info", "mon_groups", "", "a/b", "-x", "x" * 65])
def test_group_names_are_validated(kernel, name):
    fk = kernel(resctrl={})
    with pytest.raises(ValueError):
        rfs(fk).group_dir(name)


def test_kernel_style_schemata_parse():
    text = "    L3:0=7ff;1=7ff\n    MB:0= 100;1= 100\nL2:0=ff\nbogus\nXX:0=zz\n"
    assert parse_schemata(text) == {"L3": {0: 0x7ff, 1: 0x7ff}, "MB": {0: 100, 1: 100}, "L2": {0: 0xff}}
    assert render_schemata({"L3": {0: 0xf}, "MB": {0: 20}}, 3) == "L3:0=00f\nMB:0=20\n"


def test_fake_make_group_looks_like_the_kernel(kernel):
    fk = kernel(resctrl={})
    fk.resctrl.make_group("g", tasks=[5])
    r = rfs(fk)
    assert r.read_group_schemata("g") == parse_schemata(fk.resctrl.root_schemata)
    assert r.group_tasks("g") == {"5"}
    assert parse_schemata(fk.resctrl.root_schemata)["L3"] == {0: 0x7ff, 1: 0x7ff}
