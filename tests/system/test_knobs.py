"""The knob table and the start-up support probe."""

import os

import pytest

from anolisnuma.system import knobs
from anolisnuma.system.cgroups import CgroupFs, Driver
from anolisnuma.system.knobs import ALL_KNOBS, BY_NAME, KnobKind, ValueRange, probe_support
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
        elif k.kind is KnobKind.SYSCTL:
            assert k.sysctl_path.startswith("kernel/") and k.valid == ValueRange(0, 1)
        else:
            assert k.resctrl_info in ("L3", "MB")
    ranges = {k.name: (k.valid.low, k.valid.high) for k in knobs.CGROUP_KNOBS}
    assert ranges == {"cpu.bvt_warp_ns": (-1, 2), "memory.priority": (0, 12),
                      "memory.use_priority_oom": (0, 1), "memory.wmark_ratio": (0, 100),
                      "memory.wmark_scale_factor": (1, 1000), "memory.wmark_min_adj": (-25, 50)}


def test_value_range_check():
    r = ValueRange(-1, 2)
    assert r.check(-1) is None and r.check(2) is None
    assert "-1..2" in r.check(3) and r.check(True) and r.check("1")


@pytest.mark.parametrize("version", [1, 2])
def test_everything_supported_on_a_full_anolis_tree(kernel, version):
    fk = kernel(cgroup_version=version, resctrl={}, sched_core=0)
    s = probe(fk)
    assert s.unsupported == {}


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
