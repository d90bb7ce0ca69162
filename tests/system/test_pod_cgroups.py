"""The kubelet's pod cgroup layout: any --cgroup-root with either driver, found from the
kubelet's flags/config or set in [cgroups]; what does not fit is refused and explained."""

import os
import uuid

import pytest

from anolisnuma.config import CgroupsConfig, Config
from anolisnuma.configfile import ConfigError
from anolisnuma.daemon import read_kubelet_cgroup_settings
from anolisnuma.system.cgroups import CgroupFs, enable_memory_migrate
from anolisnuma.system.pod_cgroups import (
    Driver, InvalidCgroupPath, KubeletCgroupLayout, KubeQosClass, guess_root, resolve_layout,
)

UID = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
UID_ = UID.replace("-", "_")
CID = "c" * 64
CUSTOM = KubeletCgroupLayout("/custom")


# ------------------------------------------------------------------ cgroupfs, custom root

@pytest.mark.parametrize("parent,cls,rel", [
    (f"/custom/kubepods/burstable/pod{UID}", KubeQosClass.BURSTABLE, f"custom/kubepods/burstable/pod{UID}"),
    (f"/custom/kubepods/besteffort/pod{UID}", KubeQosClass.BESTEFFORT, f"custom/kubepods/besteffort/pod{UID}"),
    (f"/custom/kubepods/pod{UID}", KubeQosClass.GUARANTEED, f"custom/kubepods/pod{UID}"),
])
def test_cgroupfs_parents_under_a_custom_root(parent, cls, rel):
    pc = CUSTOM.parse(parent)
    assert (pc.driver, pc.kube_class, pc.uid, pc.rel) == (Driver.CGROUPFS, cls, UID, rel)
    assert pc.container_rel(CID) == f"{rel}/{CID}"
    assert CUSTOM.pod_cgroup_for(Driver.CGROUPFS, cls, UID) == pc


# ------------------------------------------------------------------ systemd, custom root

@pytest.mark.parametrize("cls,leaf,rel", [
    (KubeQosClass.BURSTABLE, f"custom-kubepods-burstable-pod{UID_}.slice",
     f"custom.slice/custom-kubepods.slice/custom-kubepods-burstable.slice/custom-kubepods-burstable-pod{UID_}.slice"),
    (KubeQosClass.BESTEFFORT, f"custom-kubepods-besteffort-pod{UID_}.slice",
     f"custom.slice/custom-kubepods.slice/custom-kubepods-besteffort.slice/custom-kubepods-besteffort-pod{UID_}.slice"),
    (KubeQosClass.GUARANTEED, f"custom-kubepods-pod{UID_}.slice",
     f"custom.slice/custom-kubepods.slice/custom-kubepods-pod{UID_}.slice"),
])
def test_systemd_leaf_and_expanded_parents_under_a_custom_root(cls, leaf, rel):
    for parent in (leaf, "/" + rel):
        pc = CUSTOM.parse(parent)
        assert (pc.driver, pc.kube_class, pc.uid, pc.rel) == (Driver.SYSTEMD, cls, UID, rel)
    assert CUSTOM.parse(leaf).container_rel(CID) == f"{rel}/cri-containerd-{CID}.scope"


def test_a_nested_root_with_a_dash_is_escaped_as_the_kubelet_does():
    layout = KubeletCgroupLayout("/my-root/nodes")
    assert layout.qos_class_dirs[Driver.SYSTEMD][KubeQosClass.BURSTABLE] == (
        "my_root.slice/my_root-nodes.slice/my_root-nodes-kubepods.slice/my_root-nodes-kubepods-burstable.slice")
    assert layout.qos_class_dirs[Driver.CGROUPFS][KubeQosClass.BESTEFFORT] == "my-root/nodes/kubepods/besteffort"
    assert layout.parse(f"my_root-nodes-kubepods-burstable-pod{UID_}.slice").uid == UID


def test_the_default_root_keeps_the_known_shapes():
    layout = KubeletCgroupLayout()
    assert layout.parse(f"/kubepods/burstable/pod{UID}").rel == f"kubepods/burstable/pod{UID}"
    assert layout.parse(f"kubepods-pod{UID_}.slice").rel == f"kubepods.slice/kubepods-pod{UID_}.slice"


# ------------------------------------------------------------------ what is refused

@pytest.mark.parametrize("parent", [
    f"/kubepods/burstable/pod{UID}",                                  # the default root, not ours
    f"kubepods-burstable-pod{UID_}.slice",
    f"/other/kubepods/burstable/pod{UID}",
    f"/custom/../kubepods/burstable/pod{UID}",
    f"/custom/kubepods/gold/pod{UID}",
    f"/custom/kubepods/burstable/pod{UID}/../../x",
    f"/custom.slice/custom-kubepods-burstable-pod{UID_}.slice",       # expanded, wrong nesting
    f"other-kubepods-burstable-pod{UID_}.slice",
    "custom-kubepods-burstable-pod../x.slice",
    "/custom/kubepods/burstable/pod" + "x" * 600,
    "",
])
def test_other_shapes_are_refused(parent):
    with pytest.raises(InvalidCgroupPath):
        CUSTOM.parse(parent)


@pytest.mark.parametrize("root", ["custom", "/a/../b", "/a/./b", "/a b", "/a\x00", "/" + "x" * 300, "/é"])
def test_a_root_that_is_no_cgroup_path_is_refused(root):
    with pytest.raises(InvalidCgroupPath):
        KubeletCgroupLayout(root)
    with pytest.raises(ConfigError) as e:
        Config.from_dict({"cgroups": {"kubelet_cgroup_root": root}})
    assert str(e.value).startswith("cgroups.kubelet_cgroup_root")


def test_one_driver_only_refuses_the_other():
    fs_only = KubeletCgroupLayout("/", (Driver.CGROUPFS,))
    with pytest.raises(InvalidCgroupPath):
        fs_only.parse(f"kubepods-burstable-pod{UID_}.slice")
    assert list(fs_only.kubepods_dirs()) == [Driver.CGROUPFS]


def test_an_unknown_layout_is_reported_once_with_the_key_that_fixes_it():
    layout = KubeletCgroupLayout()
    first, fix = layout.unknown(f"/custom/kubepods/burstable/pod{UID}")
    assert first and 'kubelet_cgroup_root = "/custom"' in fix
    again, _ = layout.unknown(f"/custom/kubepods/besteffort/pod{uuid.uuid4()}")
    assert not again and layout.unknown_seen == 2
    assert 'kubelet_cgroup_root = "/custom"' in layout.hint(f"custom-kubepods-pod{UID_}.slice")
    sd_only = KubeletCgroupLayout("/", (Driver.SYSTEMD,))
    assert "kubelet_cgroup_driver" in sd_only.hint(f"/kubepods/pod{UID}")
    assert "kubelet_cgroup_root and kubelet_cgroup_driver" in layout.hint("/system.slice/x.scope")


@pytest.mark.parametrize("parent,guess", [
    (f"/custom/kubepods/burstable/pod{UID}", ("/custom", Driver.CGROUPFS)),
    (f"/a/b/kubepods/pod{UID}", ("/a/b", Driver.CGROUPFS)),
    (f"a-b-kubepods-besteffort-pod{UID_}.slice", ("/a/b", Driver.SYSTEMD)),
    (f"kubepods-pod{UID_}.slice", ("/", Driver.SYSTEMD)),
    ("/system.slice/x.scope", None),
])
def test_guess_root(parent, guess):
    assert guess_root(parent) == guess


# ------------------------------------------------------------------ /proc/<pid>/cgroup

@pytest.mark.parametrize("path,uid", [
    (f"/custom/kubepods/burstable/pod{UID}/{CID}", UID),
    (f"/docker/{CID}/custom/kubepods/pod{UID}", UID),          # a node in a container
    (f"/custom.slice/custom-kubepods.slice/custom-kubepods-burstable.slice/custom-kubepods-burstable-pod{UID_}.slice"
     f"/cri-containerd-{CID}.scope", UID),
    (f"/kubepods/burstable/pod{UID}/{CID}", None),              # not under this kubelet's root
    (f"/other/kubepods/pod{UID}", None),
    ("/custom/kubepods/burstable", None),
])
def test_traffic_observer_maps_processes_under_the_custom_root(path, uid):
    assert CUSTOM.pod_uid_from_cgroup_path(path) == uid


# ------------------------------------------------------------------ where the layout comes from

KUBELET_UNIT = """[Service]
EnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env
ExecStart=/usr/bin/kubelet --config=/var/lib/kubelet/config.yaml $KUBELET_KUBEADM_ARGS
"""


def _kubelet_files(root, flags="", config="", dropin=None):
    files = {"etc/systemd/system/kubelet.service": KUBELET_UNIT,
             "var/lib/kubelet/kubeadm-flags.env": f'KUBELET_KUBEADM_ARGS="{flags}"\n',
             "var/lib/kubelet/config.yaml": "kind: KubeletConfiguration\n" + config}
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    return CgroupsConfig(kubelet_files_root=str(root))


def _resolve(cfg):
    """The layout as the daemon resolves it: the kubelet's files read with ctl's reader."""
    return resolve_layout(cfg, kubelet_settings=read_kubelet_cgroup_settings)


def test_auto_reads_the_kubelet_config_file(tmp_path):
    cfg = _kubelet_files(tmp_path, config="cgroupRoot: /custom\ncgroupDriver: systemd\n")
    layout = _resolve(cfg)
    assert (layout.root, layout.drivers) == ("/custom", (Driver.SYSTEMD,))
    assert "cgroupRoot in config file /var/lib/kubelet/config.yaml" in layout.origin


def test_auto_takes_the_flag_over_the_config_file(tmp_path):
    cfg = _kubelet_files(tmp_path, flags="--cgroup-root=/flagged --node-ip=10.0.0.5",
                         config="cgroupRoot: /custom\n")
    layout = _resolve(cfg)
    assert layout.root == "/flagged" and layout.drivers == tuple(Driver)   # no driver set: both shapes
    assert "--cgroup-root" in layout.origin


def test_auto_without_a_kubelet_gives_its_defaults(tmp_path):
    layout = _resolve(CgroupsConfig(kubelet_files_root=str(tmp_path)))
    assert (layout.root, layout.drivers, layout.origin) == ("/", tuple(Driver), "kubelet defaults")


def test_a_kubelet_root_that_is_no_cgroup_path_falls_back_to_the_default(tmp_path):
    cfg = _kubelet_files(tmp_path, config="cgroupRoot: ../etc\n")
    assert _resolve(cfg).root == "/"


def test_our_keys_win_over_the_kubelet(tmp_path):
    cfg = _kubelet_files(tmp_path, config="cgroupRoot: /custom\n")
    cfg.kubelet_cgroup_root, cfg.kubelet_cgroup_driver = "/ours", "cgroupfs"
    layout = _resolve(cfg)
    assert (layout.root, layout.drivers) == ("/ours", (Driver.CGROUPFS,))
    assert layout.origin == "cgroups.kubelet_cgroup_root; cgroups.kubelet_cgroup_driver"


def test_config_keys_parse():
    cfg = Config.from_dict({"cgroups": {"kubelet_cgroup_root": "/custom/", "kubelet_cgroup_driver": "systemd"}})
    assert cfg.cgroups.kubelet_cgroup_driver == "systemd"
    assert KubeletCgroupLayout(cfg.cgroups.kubelet_cgroup_root).root == "/custom"
    with pytest.raises(ConfigError):
        Config.from_dict({"cgroups": {"kubelet_cgroup_driver": "cgroupv2"}})


# ------------------------------------------------------------------ the hierarchy follows it

def test_locate_pod_and_memory_migrate_follow_the_custom_root(tmp_path):
    """A pod recorded without cgroup_parent is found under the custom root, and NUMA's
    memory migration lands in its containers' cpuset cgroups there (fake v1 tree)."""
    from anolisnuma.testing.fake_kernel import FakeKernel

    fk = FakeKernel(str(tmp_path / "host"), layout=CUSTOM)
    fk.make_container(f"/custom/kubepods/besteffort/pod{UID}", CID)
    fs = CgroupFs(fk.paths.cgroup_root, CUSTOM)
    assert fs.drivers_present() == [Driver.CGROUPFS, Driver.SYSTEMD]
    assert fs.locate_pod(UID).rel == f"custom/kubepods/besteffort/pod{UID}"
    assert CgroupFs(fk.paths.cgroup_root).locate_pod(UID) is None      # the default layout does not see it
    fk.cgroup.make_dir(f"custom/kubepods/besteffort/pod{UID}/{CID}")
    open(os.path.join(fs.dir("cpuset", f"custom/kubepods/besteffort/pod{UID}/{CID}"), "cpuset.memory_migrate"),
         "w").write("0\n")
    assert enable_memory_migrate(fs, UID, [CID]) == []
    assert fk.cgroup.read(f"custom/kubepods/besteffort/pod{UID}/{CID}", "cpuset.memory_migrate").strip() == "1"
