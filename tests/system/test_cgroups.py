"""Cgroup path rules (both drivers, v1 and v2), file helpers and their typed errors, and
the path rules on this machine's real cgroup v1 tree."""

import os
import uuid

import pytest
from hypothesis import given, strategies as st

from anolisnuma.system import knobs
from anolisnuma.system.cgroups import (
    CgroupFs, Driver, FileGone, InvalidCgroupPath, KnobFileMissing, KubeQosClass, WriteRefused,
    parse_cgroup_parent, pod_cgroup_for, read_int, read_text, write_text,
)
from anolisnuma.system.knobs import probe_support
from anolisnuma.system.sysctl import Sysctls


UID = "0f8fad5b-d9cb-469f-a165-70867728950e"
UID_ = UID.replace("-", "_")
CID = "a" * 64


# ------------------------------------------------------------------ path rules

@pytest.mark.parametrize("parent,cls,rel", [
    (f"/kubepods/burstable/pod{UID}", KubeQosClass.BURSTABLE, f"kubepods/burstable/pod{UID}"),
    (f"/kubepods/besteffort/pod{UID}", KubeQosClass.BESTEFFORT, f"kubepods/besteffort/pod{UID}"),
    (f"/kubepods/pod{UID}", KubeQosClass.GUARANTEED, f"kubepods/pod{UID}"),
    (f"kubepods/burstable/pod{UID}", KubeQosClass.BURSTABLE, f"kubepods/burstable/pod{UID}"),
])
def test_cgroupfs_driver_shapes(parent, cls, rel):
    pc = parse_cgroup_parent(parent)
    assert (pc.driver, pc.kube_class, pc.uid, pc.rel) == (Driver.CGROUPFS, cls, UID, rel)
    assert pc.container_rel(CID) == f"{rel}/{CID}"


@pytest.mark.parametrize("parent,cls,rel", [
    (f"kubepods-burstable-pod{UID_}.slice", KubeQosClass.BURSTABLE,
     f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice"),
    (f"kubepods-besteffort-pod{UID_}.slice", KubeQosClass.BESTEFFORT,
     f"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice"),
    (f"kubepods-pod{UID_}.slice", KubeQosClass.GUARANTEED, f"kubepods.slice/kubepods-pod{UID_}.slice"),
    (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice", KubeQosClass.BURSTABLE,
     f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice"),
])
def test_systemd_driver_shapes(parent, cls, rel):
    pc = parse_cgroup_parent(parent)
    assert (pc.driver, pc.kube_class, pc.uid, pc.rel) == (Driver.SYSTEMD, cls, UID, rel)
    assert pc.container_rel(CID) == f"{rel}/cri-containerd-{CID}.scope"


def test_static_pod_uid_is_accepted():
    static = "6b5d7e0c9a1f4e2d8c3b7a6f5e4d3c2b"
    assert parse_cgroup_parent(f"/kubepods/burstable/pod{static}").uid == static
    assert parse_cgroup_parent(f"kubepods-pod{static}.slice").uid == static


@pytest.mark.parametrize("parent", [
    "", "/", "/kubepods", "/kubepods/burstable", f"/kubepods/gold/pod{UID}",
    f"/kubepods/burstable/pod{UID}/..", f"/kubepods/burstable/pod{UID}/x",
    "/kubepods/burstable/pod../../etc", f"/kubepods/burstable/pod{UID}\n", f"/kubepods/burstable/pod{UID}\x00",
    f"/kubepods/burstable/../burstable/pod{UID}", f"/sys/fs/cgroup/kubepods/pod{UID}",
    f"kubepods-burstable-pod{UID}.slice",          # systemd with dashes: not what the kubelet makes
    f"/other.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice",
    f"/kubepods.slice/kubepods-besteffort.slice/kubepods-burstable-pod{UID_}.slice",
    "x" * 10240, "/kubepods/burstable/pod\udcff", None, 5,
])
def test_other_shapes_are_refused(parent):
    with pytest.raises(InvalidCgroupPath) as e:
        parse_cgroup_parent(parent)
    assert len(str(e.value)) < 300


@pytest.mark.parametrize("cid", ["A" * 64, "a" * 63, "a" * 65, "../" + "a" * 61, "a" * 63 + "\n", "", None])
def test_container_ids_are_validated(cid):
    with pytest.raises(InvalidCgroupPath):
        parse_cgroup_parent(f"/kubepods/pod{UID}").container_rel(cid)


@given(st.text(max_size=120))
def test_no_string_escapes_the_kubepods_tree(s):
    try:
        pc = parse_cgroup_parent(s)
    except InvalidCgroupPath:
        return
    assert pc.rel.startswith("kubepods") and ".." not in pc.rel and "\x00" not in pc.rel


def test_pod_cgroup_for_matches_parse():
    for driver in Driver:
        for cls in KubeQosClass:
            pc = pod_cgroup_for(driver, cls, UID)
            assert parse_cgroup_parent(pc.rel) == pc if driver is Driver.CGROUPFS else \
                parse_cgroup_parent(pc.rel.rsplit("/", 1)[1]) == pc
    with pytest.raises(InvalidCgroupPath):
        pod_cgroup_for(Driver.CGROUPFS, KubeQosClass.BURSTABLE, "../x")


# ------------------------------------------------------------------ hierarchy

def test_v1_and_v2_are_detected_and_paths_built_under_the_root(kernel):
    v1 = kernel(cgroup_version=1)
    v2 = kernel(cgroup_version=2)
    c1, c2 = CgroupFs(v1.paths.cgroup_root), CgroupFs(v2.paths.cgroup_root)
    assert (c1.version, c2.version) == (1, 2)
    rel = parse_cgroup_parent(f"/kubepods/pod{UID}").rel
    assert c1.knob_path(knobs.CPU_BVT_WARP_NS, rel) == f"{c1.root}/cpu/{rel}/cpu.bvt_warp_ns"
    assert c1.knob_path(knobs.MEMORY_PRIORITY, rel) == f"{c1.root}/memory/{rel}/memory.priority"
    assert c2.knob_path(knobs.MEMORY_PRIORITY, rel) == f"{c2.root}/{rel}/memory.priority"
    assert c1.knob_path(knobs.MEMORY_USE_PRIORITY_OOM, "") == f"{c1.root}/memory/memory.use_priority_oom"


def test_locate_pod_finds_either_driver(kernel):
    fk = kernel()
    cg = CgroupFs(fk.paths.cgroup_root)
    assert cg.locate_pod(UID) is None
    fk.make_pod(f"kubepods-besteffort-pod{UID_}.slice")
    pc = cg.locate_pod(UID)
    assert pc.driver is Driver.SYSTEMD and pc.kube_class is KubeQosClass.BESTEFFORT
    assert cg.locate_pod("../../etc") is None


@pytest.mark.parametrize("version", [1, 2])
def test_task_ids(kernel, version):
    fk = kernel(cgroup_version=version)
    rel = fk.make_container(f"/kubepods/pod{UID}", CID, tids=[7, 8, 9])
    cg = CgroupFs(fk.paths.cgroup_root)
    assert cg.task_ids(rel) == ["7", "8", "9"]
    with pytest.raises(FileGone):
        cg.task_ids(rel + "x")


def test_drivers_present(kernel):
    from anolisnuma.system.cgroups import Driver as D
    fk = kernel(kubepods=(D.SYSTEMD,))
    assert CgroupFs(fk.paths.cgroup_root).drivers_present() == [D.SYSTEMD]


# ------------------------------------------------------------------ files and errors

def test_read_and_write_round_trip(kernel):
    fk = kernel()
    pc = fk.make_pod(f"/kubepods/pod{UID}")
    path = CgroupFs(fk.paths.cgroup_root).knob_path(knobs.MEMORY_WMARK_SCALE_FACTOR, pc.rel)
    assert read_int(path) == 50
    write_text(path, "7")           # shorter than "50": no stale tail
    assert read_text(path) == "7"


def test_write_errors_are_typed(kernel):
    with kernel(anolis=()) as fk:
        pc = fk.make_pod(f"/kubepods/pod{UID}")
        cg = CgroupFs(fk.paths.cgroup_root)
        with pytest.raises(KnobFileMissing):
            write_text(cg.knob_path(knobs.CPU_BVT_WARP_NS, pc.rel), "1")
        assert not os.path.exists(cg.knob_path(knobs.CPU_BVT_WARP_NS, pc.rel))   # never created
        with pytest.raises(FileGone):
            write_text(cg.knob_path(knobs.CPU_BVT_WARP_NS, pc.rel + "/gone"), "1")
        shares = os.path.join(cg.dir("cpu", pc.rel), "cpu.shares")
        fk.make_readonly(shares)
        with pytest.raises(WriteRefused) as e:
            write_text(shares, "2")
        assert e.value.errno is not None and read_int(shares) == 1024
        with pytest.raises(FileGone):
            read_text(cg.knob_path(knobs.CPU_BVT_WARP_NS, pc.rel))


# ------------------------------------------------------------------ the real cgroup v1 tree

REAL_ROOT = "/sys/fs/cgroup"


def _real_v1_usable():
    return os.geteuid() == 0 and all(os.path.isdir(f"{REAL_ROOT}/{c}") for c in ("cpu", "memory", "cpuset")) \
        and not os.path.exists(f"{REAL_ROOT}/cgroup.controllers")


@pytest.fixture
def real_pod_dirs():
    """Create kubepods/burstable/pod<uuid> (cgroupfs) and the systemd equivalent in the real
    cpu, memory and cpuset hierarchies; remove exactly the directories made here."""
    uid = str(uuid.uuid4())
    rels = [f"kubepods/burstable/pod{uid}",
            f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid.replace('-', '_')}.slice"]
    made = []
    try:
        for ctrl in ("cpu", "memory", "cpuset"):
            for rel in rels:
                d = os.path.join(REAL_ROOT, ctrl)
                for part in rel.split("/"):
                    d = os.path.join(d, part)
                    if not os.path.isdir(d):
                        os.mkdir(d)
                        made.append(d)
        yield uid
    finally:
        for d in reversed(made):
            try:
                os.rmdir(d)
            except OSError:
                pass


@pytest.mark.skipif(not _real_v1_usable(), reason="needs root and a cgroup v1 tree at /sys/fs/cgroup")
def test_real_cgroup_v1_tree(real_pod_dirs):
    uid = real_pod_dirs
    cg = CgroupFs(REAL_ROOT)
    assert cg.version == 1
    for parent in (f"/kubepods/burstable/pod{uid}", f"kubepods-burstable-pod{uid.replace('-', '_')}.slice"):
        pc = parse_cgroup_parent(parent)
        for ctrl in ("cpu", "memory", "cpuset"):
            assert os.path.isdir(cg.dir(ctrl, pc.rel))
        assert cg.locate_pod(uid) is not None
        # files this kernel has read fine
        assert read_int(os.path.join(cg.dir("cpu", pc.rel), "cpu.shares")) > 0
        assert read_text(os.path.join(cg.dir("cpuset", pc.rel), "cpuset.cpus")) is not None
        assert cg.task_ids(pc.rel) == []
    support = probe_support(cg, Sysctls("/proc"), probe_cgroup=False)
    for name in ("cpu.bvt_warp_ns", "memory.priority", "memory.wmark_ratio", "memory.wmark_min_adj",
                 "memory.wmark_scale_factor", "memory.use_priority_oom"):
        if not os.path.exists(f"{REAL_ROOT}/{name.split('.')[0]}/{name}"):
            assert name in support.unsupported, name
    if not os.path.exists("/proc/sys/kernel/sched_group_identity_enabled"):
        assert "kernel.sched_group_identity_enabled" in support.unsupported
