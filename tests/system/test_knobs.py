"""The knob table and the start-up support probe, on each kernel family's tree.

(Adapted when the table gained openEuler's rows: its sysctl lives under ``vm/`` and takes
0..2, and a full Alibaba tree lacks openEuler's files: "everything supported" there means
every file of its own family, and the other family is not found rather than listed.)"""

import os

import pytest

from anolisnuma.system import knobs
from anolisnuma.system.cgroups import CgroupFs, Driver
from anolisnuma.system.knobs import ALL_KNOBS, BY_NAME, FAMILY_BY_NAME, KnobKind, ValueRange, probe_support
from anolisnuma.testing.fake_kernel import family_options
from anolisnuma.system.resctrl import ResctrlFs
from anolisnuma.system.sysctl import Sysctls


def probe(fk, probe_cgroup=True):
    p = fk.paths
    return probe_support(CgroupFs(p.cgroup_root), Sysctls(p.proc_root), ResctrlFs(p.resctrl_root, p.proc_root),
                         probe_cgroup=probe_cgroup)


def test_table_is_complete_and_consistent():
    assert len(BY_NAME) == len(ALL_KNOBS)
    for k in ALL_KNOBS:
        if k.kind is KnobKind.CGROUP:
            assert k.controller in ("cpu", "memory") and k.name.startswith(k.controller + ".")
            assert k.v2_name and k.valid is not None
            assert k.family in FAMILY_BY_NAME
        elif k.kind is KnobKind.SYSCTL:
            assert k.sysctl_path.split("/")[0] in ("kernel", "vm") and k.name == k.sysctl_path.replace("/", ".")
            assert k.valid == (ValueRange(0, 2) if k is knobs.VM_MEMCG_QOS_ENABLE else ValueRange(0, 1))
            assert k.family in FAMILY_BY_NAME
        else:
            assert k.resctrl_info in ("L3", "MB") and k.family == ""   # the hardware's, any kernel's
    ranges = {k.name: (k.valid.low, k.valid.high) for k in knobs.ALL_CGROUP_KNOBS}
    assert ranges == {"cpu.bvt_warp_ns": (-1, 2), "memory.priority": (0, 12),
                      "memory.use_priority_oom": (0, 1), "memory.wmark_ratio": (0, 100),
                      "memory.wmark_scale_factor": (1, 1000), "memory.wmark_min_adj": (-25, 50),
                      "cpu.qos_level": (-2, 2), "memory.qos_level": (-1024, 1023)}
    assert [k.name for k in ALL_KNOBS if k.offline_is_final] == ["cpu.qos_level", "memory.qos_level"]


def test_value_range_check():
    r = ValueRange(-1, 2)
    assert r.check(-1) is None and r.check(2) is None
    assert "-1..2" in r.check(3) and r.check(True) and r.check("1")


@pytest.mark.parametrize("version", [1, 2])
def test_everything_supported_on_a_full_anolis_tree(kernel, version):
    fk = kernel(cgroup_version=version, resctrl={}, sched_core=0)
    s = probe(fk)
    assert s.families_found() == ("alinux",)
    assert s.lacking_lines() == []
    assert set(s.unsupported) == {"cpu.qos_level", "memory.qos_level", "vm.memcg_qos_enable"}


@pytest.mark.parametrize("version", [1, 2])
def test_everything_supported_on_a_full_openeuler_tree(kernel, version):
    """Files named and placed as openEuler's kernel has them: cpu.qos_level in the cpu
    hierarchy, memory.qos_level in the memory one (v1), both in the unified tree (v2),
    on the root cgroup too; the memcg switch under /proc/sys/vm."""
    fk = kernel(**family_options("openeuler", cgroup_version=version, resctrl={}))
    root = fk.paths.cgroup_root
    for name, v1_dir in (("cpu.qos_level", "cpu"), ("memory.qos_level", "memory")):
        assert os.path.isfile(os.path.join(root, v1_dir if version == 1 else "", name))
    assert os.path.isfile(os.path.join(fk.paths.proc_root, "sys", "vm", "memcg_qos_enable"))
    s = probe(fk)
    assert s.families_found() == ("openeuler",)
    assert s.lacking_lines() == []
    assert {"cpu.bvt_warp_ns", "kernel.sched_group_identity_enabled"} <= set(s.unsupported)


def test_a_tree_with_both_families_finds_both_and_one_with_neither_finds_none(kernel):
    assert probe(kernel(**family_options("both"))).families_found() == ("alinux", "openeuler")
    mainline = probe(kernel(**family_options("mainline")))
    assert mainline.families_found() == ()
    # no family found: every file is worth naming (what this kernel lacks, as today)
    assert [n for n, _ in mainline.lacking_lines()] == [n for n, _ in mainline.report_lines()]


def test_missing_files_are_reported_one_line_each(kernel):
    fk = kernel(anolis=["memory.wmark_ratio"], sched_group_identity_enabled=None)
    s = probe(fk)
    assert set(s.supported) == {"memory.wmark_ratio"}
    names = [n for n, _ in s.report_lines()]
    assert names == [k.name for k in ALL_KNOBS if k.name != "memory.wmark_ratio"]
    assert "resctrl not mounted" in s.unsupported["resctrl.L3"]


def test_unmounted_controller_is_unsupported(kernel):
    fk = kernel()
    os.rename(os.path.join(fk.paths.cgroup_root, "cpu"), os.path.join(fk.paths.cgroup_root, "cpu.off"))
    assert "not mounted" in probe(fk).unsupported["cpu.bvt_warp_ns"]


def test_probe_cgroup_used_only_without_kubepods(kernel):
    # No kubepods yet and the root lacks the per-cgroup files: a temporary cgroup is made.
    # A fake cgroup gets no files on mkdir, so the knobs stay unsupported -- but the
    # probe directory is removed again and never made in dry runs.
    fk = kernel(kubepods=())
    root = fk.paths.cgroup_root
    before = sorted(os.listdir(os.path.join(root, "memory")))
    s = probe(fk)
    assert "memory.priority" in s.unsupported and "memory.use_priority_oom" in s.supported
    assert sorted(os.listdir(os.path.join(root, "memory"))) == before


def test_kubepods_of_either_driver_counts(kernel):
    fk = kernel(kubepods=(Driver.SYSTEMD,))
    assert probe(fk, probe_cgroup=False).has(knobs.CPU_BVT_WARP_NS)
