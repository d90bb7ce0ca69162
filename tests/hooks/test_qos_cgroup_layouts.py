"""The QoS hook and its reconciler on a kubelet run with --cgroup-root=/custom, on fake
kernel trees: the systemd driver on cgroup v1 and v2, cgroupfs on v2 (cgroupfs on real
cgroup v1 is tests/e2e/test_cgroup_layout_e2e.py). Every knob lands in the pod's cgroup
under the custom root, the QoS-class directories there get theirs, and a pod of the default
root is refused once, with the key that fixes it."""

import uuid

import pytest
from structlog.testing import capture_logs

from anolisnuma.configfile import Table
from anolisnuma.hooks.qos import QosHook
from anolisnuma.pipeline.hooks import Call
from anolisnuma.policies.qos.config import QosConfig
from anolisnuma.state.records import PodRecord
from anolisnuma.system.pod_cgroups import Driver, KubeletCgroupLayout
from cri_proto import api_pb2 as pb

BE = {"cpu.bvt_warp_ns": -1, "memory.priority": 0, "memory.use_priority_oom": 1,
      "memory.wmark_ratio": 95, "memory.wmark_scale_factor": 20, "memory.wmark_min_adj": 50}
CONTAINER = {"cpu.bvt_warp_ns": -1, "memory.wmark_ratio": 95, "memory.wmark_scale_factor": 20,
             "memory.wmark_min_adj": 50}


def _parent(driver: Driver, uid: str) -> str:
    if driver is Driver.SYSTEMD:
        return f"custom-kubepods-besteffort-pod{uid.replace('-', '_')}.slice"
    return f"/custom/kubepods/besteffort/pod{uid}"


def _sandbox(uid: str, parent: str, name: str = "web") -> pb.PodSandboxConfig:
    cfg = pb.PodSandboxConfig()
    cfg.metadata.name, cfg.metadata.namespace, cfg.metadata.uid = name, "default", uid
    cfg.linux.cgroup_parent = parent
    return cfg


@pytest.mark.parametrize("version,driver", [(1, Driver.SYSTEMD), (2, Driver.SYSTEMD), (2, Driver.CGROUPFS)])
def test_knobs_land_under_the_custom_root(kernel, version, driver):
    layout = KubeletCgroupLayout("/custom", (driver,), origin="test")
    fk = kernel(cgroup_version=version, sched_core=0, layout=layout, kubepods=(driver,))
    hook = QosHook(QosConfig.from_table(Table({}, "qos")), fk.paths, layout=layout)
    hook.prepare()
    uid, cid = str(uuid.uuid4()), uuid.uuid4().hex * 2
    parent = _parent(driver, uid)
    pod_rel = fk.make_pod(parent).rel
    assert pod_rel.startswith("custom.slice/custom-kubepods.slice/" if driver is Driver.SYSTEMD
                              else "custom/kubepods/besteffort/")
    cfg = _sandbox(uid, parent)
    call = Call("RunPodSandbox", pb.RunPodSandboxRequest(config=cfg))
    hook.pre(call)
    call.reply = pb.RunPodSandboxResponse(pod_sandbox_id="a" * 64)
    hook.post(call)
    assert {k: int(fk.cgroup.read(pod_rel, k)) for k in BE} == BE
    hook.post(Call("CreateContainer", pb.CreateContainerRequest(pod_sandbox_id="a" * 64, sandbox_config=cfg),
                   reply=pb.CreateContainerResponse(container_id=cid)))
    ctr_rel = fk.make_container(parent, cid)
    start = Call("StartContainer", pb.StartContainerRequest(container_id=cid))
    hook.pre(start)
    start.reply = pb.StartContainerResponse()
    hook.post(start)
    assert {k: int(fk.cgroup.read(ctr_rel, k)) for k in CONTAINER} == CONTAINER

    # The kubelet's QoS-class directories under the custom root got their values.
    dirs = layout.qos_class_dirs[driver]
    assert fk.cgroup.read(dirs["besteffort"], "cpu.bvt_warp_ns") == "-1"
    assert fk.cgroup.read(dirs["burstable"], "memory.priority") == "10"
    assert fk.cgroup.read(dirs["guaranteed"], "cpu.bvt_warp_ns") == "0"

    # Drift is put back by the reconciler, which finds the cgroup there (nothing forgotten).
    fk.cgroup.set(pod_rel, "memory.priority", 7)
    counts = hook.run_once()
    assert counts.rewritten == 1 and counts.forgotten == 0 and counts.errors == 0
    assert fk.cgroup.read(pod_rel, "memory.priority") == "0"


def test_a_pod_recorded_without_cgroup_parent_is_found_under_the_custom_root(kernel):
    """The start-up resync's pods from containerd may lack cgroup_parent: located by UID."""
    layout = KubeletCgroupLayout("/custom", (Driver.SYSTEMD,))
    fk = kernel(cgroup_version=2, layout=layout, kubepods=(Driver.SYSTEMD,))
    hook = QosHook(QosConfig.from_table(Table({}, "qos")), fk.paths, layout=layout)
    uid = str(uuid.uuid4())
    rel = fk.make_pod(_parent(Driver.SYSTEMD, uid)).rel
    hook.resync([PodRecord(sandbox_id="b" * 64, uid=uid, name="adopted", namespace="default")], [])
    managed = hook.state.by_uid(uid)
    assert managed is not None and managed.cgroup.rel == rel and managed.level.value == "BE"
    assert fk.cgroup.read(rel, "cpu.bvt_warp_ns") == "-1"


def test_a_pod_of_another_root_is_refused_once_with_the_fix(kernel):
    layout = KubeletCgroupLayout("/custom")
    fk = kernel(layout=layout)
    hook = QosHook(QosConfig.from_table(Table({}, "qos")), fk.paths, layout=layout)
    with capture_logs() as logs:
        for _ in range(3):
            uid = str(uuid.uuid4())
            hook.pre(Call("RunPodSandbox", pb.RunPodSandboxRequest(
                config=_sandbox(uid, f"/kubepods/besteffort/pod{uid}"))))
    warned = [e for e in logs if e["event"] == "qos skipped: cgroup_parent not recognized"
              and e["log_level"] == "warning"]
    assert len(warned) == 1
    assert 'kubelet_cgroup_root = "/"' in warned[0]["fix"] and "/custom" in warned[0]["fix"]
    assert len(hook.state) == 0 and layout.unknown_seen == 3
