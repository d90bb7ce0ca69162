"""The QoS hook on fake kernel trees: every level x knob, both drivers, v1 and v2;
unsupported knobs, read-only files, vanished pods, hostile annotations, dry run,
sched_core, resctrl."""

import os
import uuid

import pytest
from structlog.testing import capture_logs

from anolisnuma.configfile import Table
from anolisnuma.hooks.qos import QosApplyError, QosHook
from anolisnuma.pipeline.hooks import Call, HookRefused
from anolisnuma.policies.qos.config import QosConfig
from anolisnuma.state.gone import PodGone, PodKeys
from anolisnuma.state.records import ContainerRecord, PodRecord
from anolisnuma.system.cgroups import parse_cgroup_parent
from anolisnuma.testing.qos_defaults import ALINUX_CONTAINER_KNOBS, ALINUX_POD
from cri_proto import api_pb2 as pb

# The documented defaults (one table for the hook, daemon and end-to-end tests).
POD, CONTAINER_KNOBS = ALINUX_POD, ALINUX_CONTAINER_KNOBS
FRESH = {"cpu.bvt_warp_ns": 0, "memory.priority": 0, "memory.use_priority_oom": 0, "memory.wmark_ratio": 0,
         "memory.wmark_scale_factor": 50, "memory.wmark_min_adj": 0}


def config(**qos):
    return QosConfig.from_table(Table(qos, "qos"))


class Pod:
    """A pod as the kubelet would drive it through the hook."""

    def __init__(self, fk, hook, kube_class="burstable", driver="cgroupfs", annotations=None, labels=None,
                 make=True, name="web"):
        self.fk, self.hook = fk, hook
        self.uid = str(uuid.uuid4())
        self.sandbox_id = uuid.uuid4().hex * 2
        if driver == "cgroupfs":
            mid = "" if kube_class == "guaranteed" else f"/{kube_class}"
            self.parent = f"/kubepods{mid}/pod{self.uid}"
        else:
            mid = "" if kube_class == "guaranteed" else f"-{kube_class}"
            self.parent = f"kubepods{mid}-pod{self.uid.replace('-', '_')}.slice"
        self.rel = fk.make_pod(self.parent).rel if make else None
        self.config = pb.PodSandboxConfig()
        self.config.metadata.name, self.config.metadata.namespace, self.config.metadata.uid = name, "default", self.uid
        self.config.linux.cgroup_parent = self.parent
        self.config.annotations.update(annotations or {})
        self.config.labels.update(labels or {})

    def run(self):
        call = Call("RunPodSandbox", pb.RunPodSandboxRequest(config=self.config))
        self.hook.pre(call)
        call.reply = pb.RunPodSandboxResponse(pod_sandbox_id=self.sandbox_id)
        self.hook.post(call)
        return call

    def create(self, cid=None):
        cid = cid or uuid.uuid4().hex * 2
        req = pb.CreateContainerRequest(pod_sandbox_id=self.sandbox_id, sandbox_config=self.config)
        self.hook.post(Call("CreateContainer", req, reply=pb.CreateContainerResponse(container_id=cid)))
        return cid

    def start(self, cid, tids=(), make=True):
        if make:
            self.fk.make_container(self.parent, cid, tids)
        call = Call("StartContainer", pb.StartContainerRequest(container_id=cid))
        self.hook.pre(call)
        call.reply = pb.StartContainerResponse()
        self.hook.post(call)
        return self.ctr_rel(cid)

    def ctr_rel(self, cid):
        return parse_cgroup_parent(self.parent).container_rel(cid)

    def knobs(self, rel=None):
        rel = rel or self.rel
        return {k: int(self.fk.cgroup.read(rel, k)) for k in FRESH
                if os.path.exists(self.fk.cgroup.file(rel, k))}


@pytest.fixture
def node(kernel):
    return kernel(resctrl={}, sched_core=0)


def snapshot(base):
    out = {}
    for d, _, files in os.walk(base):
        for f in files:
            p = os.path.join(d, f)
            with open(p) as fh:
                out[p] = fh.read()
    return out


# ------------------------------------------------------------------ levels x knobs

@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("driver", ["cgroupfs", "systemd"])
@pytest.mark.parametrize("level", ["LSE", "LSR", "LS", "BE"])
def test_each_level_and_knob_lands(kernel, version, driver, level):
    fk = kernel(cgroup_version=version, sched_core=0)
    hook = QosHook(config(), fk.paths)
    pod = Pod(fk, hook, driver=driver, annotations={"anolisbox.sh/qoslevel": level.lower()})
    call = pod.run()
    # the decision says what was set, knob by knob (every knob is on this fake kernel)
    assert call.notes["qos"] == f"{level}: set " + ", ".join(f"{k}={v}" for k, v in sorted(POD[level].items()))
    assert pod.knobs() == POD[level]
    cid = pod.create()
    rel = pod.start(cid)
    want = dict(FRESH, **{k: POD[level][k] for k in CONTAINER_KNOBS})
    assert pod.knobs(rel) == want


@pytest.mark.parametrize("kube_class,level", [("guaranteed", "LS"), ("burstable", "LS"), ("besteffort", "BE")])
def test_kube_class_decides_without_annotations(node, kube_class, level):
    hook = QosHook(config(), node.paths)
    pod = Pod(node, hook, kube_class=kube_class)
    pod.run()
    assert pod.knobs() == POD[level]


def test_koordinator_label_and_custom_mapping(node):
    hook = QosHook(config(kube_class_mapping={"burstable": "BE"}), node.paths)
    labelled = Pod(node, hook, labels={"koordinator.sh/qosClass": "LSR"})
    labelled.run()
    assert labelled.knobs() == POD["LSR"]
    mapped = Pod(node, hook)
    mapped.run()
    assert mapped.knobs() == POD["BE"]


def test_qos_class_dirs_and_global_switches(node):
    hook = QosHook(config(), node.paths)
    with capture_logs() as logs:
        hook.start()
    hook.close()
    cg = node.cgroup
    for base in ("kubepods", "kubepods.slice"):
        assert cg.read(base, "cpu.bvt_warp_ns") == "0"
    for burstable in ("kubepods/burstable", "kubepods.slice/kubepods-burstable.slice"):
        assert (cg.read(burstable, "cpu.bvt_warp_ns"), cg.read(burstable, "memory.priority")) == ("1", "10")
    for be in ("kubepods/besteffort", "kubepods.slice/kubepods-besteffort.slice"):
        assert (cg.read(be, "cpu.bvt_warp_ns"), cg.read(be, "memory.priority")) == ("-1", "0")
    assert cg.read("", "memory.use_priority_oom") == "1"
    assert node.proc.read_sysctl("sched_group_identity_enabled") == "1"
    changed = [e for e in logs if e["event"] == "knob written" and e["knob"] == "memory.use_priority_oom"]
    assert changed and changed[0]["old"] == 0 and changed[0]["value"] == 1


def test_enable_global_off_turns_the_root_switch_off(node):
    node.cgroup.set("", "memory.use_priority_oom", 1)
    QosHook(config(oom_priority={"enable_global": False}), node.paths).prepare()
    assert node.cgroup.read("", "memory.use_priority_oom") == "0"


def test_each_feature_can_be_turned_off(node):
    hook = QosHook(config(group_identity={"enabled": False}, async_reclaim={"enabled": False},
                          manage_qos_class_dirs=False), node.paths)
    pod = Pod(node, hook, annotations={"anolisbox.sh/qoslevel": "BE"})
    pod.run()
    assert pod.knobs() == dict(FRESH, **{"memory.priority": 0, "memory.use_priority_oom": 1})
    assert node.cgroup.read("kubepods/besteffort", "cpu.bvt_warp_ns") == "0"


def test_disabled_hook_does_nothing(node):
    hook = QosHook(config(enabled=False), node.paths)
    pod = Pod(node, hook)
    before = snapshot(node.base)
    hook.start()
    pod.run()
    hook.close()
    assert snapshot(node.base) == before


# ------------------------------------------------------------------ kernel differences

def test_unsupported_knobs_are_reported_and_skipped(kernel):
    fk = kernel(anolis=["memory.wmark_ratio"], sched_group_identity_enabled=None)
    with capture_logs() as logs:
        hook = QosHook(config(), fk.paths)
        pod = Pod(fk, hook, annotations={"anolisbox.sh/qoslevel": "BE"})
        pod.run()
        pod.start(pod.create())
    unsupported = [e["knob"] for e in logs if e["event"].startswith("unsupported knob")]
    assert "cpu.bvt_warp_ns" in unsupported and "resctrl.L3" in unsupported
    assert "memory.wmark_ratio" not in unsupported
    assert pod.knobs() == {"memory.wmark_ratio": 95}
    assert not [e for e in logs if e["log_level"] == "error"]


def test_read_only_knob_raises_after_writing_the_others(node):
    hook = QosHook(config(), node.paths)
    pod = Pod(node, hook, annotations={"anolisbox.sh/qoslevel": "BE"})
    node.make_readonly(node.cgroup.file(pod.rel, "cpu.bvt_warp_ns"))
    with pytest.raises(QosApplyError) as e:
        pod.run()
    assert isinstance(e.value, HookRefused) and "cpu.bvt_warp_ns" in str(e.value)
    assert pod.knobs() == dict(POD["BE"], **{"cpu.bvt_warp_ns": 0})


def test_read_only_container_knob_raises_in_start(node):
    hook = QosHook(config(), node.paths)
    pod = Pod(node, hook)
    pod.run()
    cid = pod.create()
    rel = node.make_container(pod.parent, cid)
    node.make_readonly(node.cgroup.file(rel, "memory.wmark_ratio"))
    with pytest.raises(QosApplyError):
        hook.pre(Call("StartContainer", pb.StartContainerRequest(container_id=cid)))


def test_sched_core_on_refuses_minus_one(kernel):
    fk = kernel(sched_core=1)
    with capture_logs() as logs:
        hook = QosHook(config(), fk.paths)
        be = Pod(fk, hook, annotations={"anolisbox.sh/qoslevel": "BE"})
        be.run()
        ls = Pod(fk, hook)
        ls.run()
    assert be.knobs() == dict(POD["BE"], **{"cpu.bvt_warp_ns": 0})
    assert ls.knobs() == POD["LS"]
    assert fk.cgroup.read("kubepods/besteffort", "cpu.bvt_warp_ns") == "0"
    assert any("sched_core" in e.get("reason", "") for e in logs if e["event"] == "knob not set")
    # core scheduling switched off later: the reconciler writes -1 then
    fk.proc.set_sysctl("sched_core", 0)
    hook.run_once()
    assert be.knobs()["cpu.bvt_warp_ns"] == -1
    assert fk.cgroup.read("kubepods/besteffort", "cpu.bvt_warp_ns") == "-1"


# ------------------------------------------------------------------ lifecycle edge cases

def test_pod_removed_midway_is_skipped_quietly(node):
    hook = QosHook(config(), node.paths)
    pod = Pod(node, hook)
    pod.run()
    cid = pod.create()
    node.cgroup.remove(pod.rel)
    with capture_logs() as logs:
        pod.start(cid, make=False)
        counts = hook.run_once()
    assert not [e for e in logs if e["log_level"] == "error"]
    assert counts.forgotten == 1 and len(hook.state) == 0


def test_pod_cgroup_missing_in_pre_is_retried_in_post(node):
    hook = QosHook(config(), node.paths)
    pod = Pod(node, hook, make=False)
    call = Call("RunPodSandbox", pb.RunPodSandboxRequest(config=pod.config))
    hook.pre(call)
    pod.rel = node.make_pod(pod.parent).rel
    call.reply = pb.RunPodSandboxResponse(pod_sandbox_id=pod.sandbox_id)
    hook.post(call)
    assert pod.knobs() == POD["LS"]


def test_container_knobs_land_when_the_cgroup_appears(node):
    # containerd makes the container cgroup during StartContainer: the post stage applies
    hook = QosHook(config(), node.paths)
    pod = Pod(node, hook, annotations={"anolisbox.sh/qoslevel": "LSE"})
    pod.run()
    cid = pod.create()
    call = Call("StartContainer", pb.StartContainerRequest(container_id=cid))
    hook.pre(call)                           # no cgroup yet: nothing, no error
    rel = node.make_container(pod.parent, cid)
    call.reply = pb.StartContainerResponse()
    hook.post(call)
    assert pod.knobs(rel)["cpu.bvt_warp_ns"] == 2


def test_container_created_before_the_proxy_knew_the_pod(node):
    hook = QosHook(config(), node.paths)
    pod = Pod(node, hook, annotations={"anolisbox.sh/qoslevel": "BE"})
    cid = uuid.uuid4().hex * 2
    rel = node.make_container(pod.parent, cid)
    rec = PodRecord(pod.sandbox_id, pod.uid, "web", "default", pod.parent,
                    annotations={"anolisbox.sh/qoslevel": "BE"})
    call = Call("StartContainer", pb.StartContainerRequest(container_id=cid), pod=rec,
                container=ContainerRecord(cid, pod.sandbox_id, "c"))
    hook.pre(call)
    assert pod.knobs(rel)["cpu.bvt_warp_ns"] == -1 and pod.knobs()["cpu.bvt_warp_ns"] == -1


def test_a_stopped_pod_is_forgotten_and_what_is_gone_when_the_reaper_says_so(node):
    hook = QosHook(config(), node.paths)
    a, b = Pod(node, hook), Pod(node, hook)
    a.run()
    b.run()
    cid = b.create()
    b.start(cid)
    hook.post(Call("StopPodSandbox", pb.StopPodSandboxRequest(pod_sandbox_id=a.sandbox_id),
                   reply=pb.StopPodSandboxResponse()))
    assert hook.state.by_sandbox(a.sandbox_id) is None and len(hook.state) == 1
    assert hook.service.held() == PodKeys.of([], [b.sandbox_id], [cid])
    hook.service.forget(PodGone.of_ids("removed", container_ids=[cid]))
    assert hook.state.by_container(cid) == (None, None)
    hook.service.forget(PodGone.of_ids("removed", [b.uid], [b.sandbox_id]))
    assert len(hook.state) == 0 and hook.service.held() == PodKeys()
    assert hook.service.structures() == {"pods": 0, "containers": 0, "warned_once": 0}


def test_a_pod_whose_run_failed_is_held_by_its_uid_until_the_reaper_forgets_it(node):
    """Admitted at RunPodSandbox pre, no reply: no sandbox ID, so only its UID names it."""
    hook = QosHook(config(), node.paths)
    pod = Pod(node, hook)
    hook.pre(Call("RunPodSandbox", pb.RunPodSandboxRequest(config=pod.config)))
    assert len(hook.state) == 1 and hook.service.held().uids == {pod.uid}
    hook.service.forget(PodGone.of_ids("resync", [pod.uid]))
    assert len(hook.state) == 0 and hook.service.held() == PodKeys()


def test_a_container_that_ended_before_its_start_post_hook_is_said_at_info(node):
    """StopContainer right after StartContainer: runc removed the cgroup before the
    post-hook ran. Under a pod cgroup that is there, that is no problem."""
    hook = QosHook(config(), node.paths)
    pod = Pod(node, hook)
    pod.run()
    cid = pod.create()
    with capture_logs() as logs:
        pod.start(cid, make=False)
    lines = [e for e in logs if "container" in e["event"] and e.get("container") == cid]
    assert [e["log_level"] for e in lines] == ["info"], lines
    assert lines[0]["event"].startswith("container cgroup not there after start, under its pod's cgroup")


def test_unknown_cgroup_parent_is_skipped_without_error(node):
    hook = QosHook(config(), node.paths)
    cfg = pb.PodSandboxConfig()
    cfg.metadata.uid, cfg.metadata.name = "x", "odd"
    cfg.linux.cgroup_parent = "/custom/../../etc"
    with capture_logs() as logs:
        hook.pre(Call("RunPodSandbox", pb.RunPodSandboxRequest(config=cfg)))
    assert any("cgroup_parent not recognized" in e["event"] for e in logs)
    assert len(hook.state) == 0


def test_a_pod_outside_kubepods_is_warned_about_once_then_at_debug(node):
    """Every call of such a pod admits it again; the layout that refuses it is reported once,
    with the fix, not once per pod: every pod of such a node is refused alike."""
    hook = QosHook(config(), node.paths)
    cfg = pb.PodSandboxConfig()
    cfg.metadata.uid, cfg.metadata.name, cfg.metadata.namespace = str(uuid.uuid4()), "outside", "default"
    cfg.linux.cgroup_parent = "/system.slice/outside.scope"
    sandbox_id = uuid.uuid4().hex * 2
    with capture_logs() as logs:
        for _ in range(3):
            hook.pre(Call("RunPodSandbox", pb.RunPodSandboxRequest(config=cfg)))
            hook.post(Call("CreateContainer", pb.CreateContainerRequest(pod_sandbox_id=sandbox_id, sandbox_config=cfg),
                           reply=pb.CreateContainerResponse(container_id=uuid.uuid4().hex * 2)))
    lines = [e for e in logs if e["event"] == "qos skipped: cgroup_parent not recognized"]
    levels = [e["log_level"] for e in lines]
    # (debug lines reach capture_logs only when no earlier test configured logging at info)
    assert levels[0] == "warning" and set(levels[1:]) <= {"debug"} and len(levels) in (1, 6)
    assert "kubelet_cgroup_root" in lines[0]["fix"]
    # another pod of the same node: no second warning; the count says how many were refused
    other = pb.PodSandboxConfig()
    other.CopyFrom(cfg)
    other.metadata.uid = str(uuid.uuid4())
    with capture_logs() as logs:
        hook.pre(Call("RunPodSandbox", pb.RunPodSandboxRequest(config=other)))
    assert [e["log_level"] for e in logs if "cgroup_parent not recognized" in e["event"]] in ([], ["debug"])
    assert hook.cgroups.layout.unknown_seen == 7
    # all that is kept of a refused pod is the mark that it was told, forgotten when it goes
    assert cfg.metadata.uid in hook.service.held().uids
    hook.service.forget(PodGone.of_ids("resync", uids=[cfg.metadata.uid, other.metadata.uid]))
    assert cfg.metadata.uid not in hook.service.held().uids and len(hook.service.admission.warned) == 0


# ------------------------------------------------------------------ hostile input

HOSTILE = ["../../../etc/passwd", "/BE", "BE\x00", "x" * 10240, "B\udcffE", "..", "low/../../x",
           "\u202eEB", "LS\nBE"]


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_annotations_are_logged_cut_and_ignored(node, value):
    hook = QosHook(config(), node.paths)
    hook.prepare()
    pod = Pod(node, hook, kube_class="besteffort")
    # protobuf refuses invalid UTF-8 strings; records from elsewhere may still carry them
    rec = PodRecord(pod.sandbox_id, pod.uid, "web", "default", pod.parent,
                    annotations={"anolisbox.sh/qoslevel": value, "anolisbox.sh/llc_limit": value},
                    labels={"koordinator.sh/qosClass": value})
    before = snapshot(node.base)
    cid = uuid.uuid4().hex * 2
    rel = node.make_container(pod.parent, cid, tids=[4242])
    with capture_logs() as logs:
        hook.resync([rec], [ContainerRecord(cid, pod.sandbox_id, "c")])
    assert pod.knobs() == POD["BE"]
    warnings = [e for e in logs if e["log_level"] == "warning" and "ignored pod" in e["event"]]
    assert len(warnings) == 3
    for w in warnings:
        assert len(w["event"]) < 400 and w["pod"] == "default/web"
        w["event"].encode("ascii")
    # nothing appeared anywhere but the container's cgroup and the low group's tasks
    new = set(snapshot(node.base)) - set(before)
    assert all(p.startswith(tuple(os.path.join(d, "") for d in node.cgroup.dirs(rel))) or
               p == os.path.join(node.paths.resctrl_root, "anolisnuma-low", "tasks") for p in new), new
    assert node.resctrl.tasks("anolisnuma-low") == ["4242"]


def test_hostile_values_through_protobuf(node):
    hook = QosHook(config(), node.paths)
    pod = Pod(node, hook, annotations={"anolisbox.sh/qoslevel": "../" * 4000 + "\x00",
                                       "anolisbox.sh/llc_limit": "/sys/fs/resctrl/tasks"})
    pod.run()
    assert pod.knobs() == POD["LS"]


# ------------------------------------------------------------------ dry run

def test_dry_run_logs_decisions_and_writes_nothing(node):
    before = snapshot(node.base)
    with capture_logs() as logs:
        hook = QosHook(config(dry_run=True), node.paths)
        hook.start()
        pod = Pod(node, hook, annotations={"anolisbox.sh/qoslevel": "BE"})
        pod.run()
        cid = pod.create()
        node.make_container(pod.parent, cid, tids=[99])
        made = snapshot(node.base)
        pod.start(cid, make=False)
        hook.run_once()
        hook.close()
    assert snapshot(node.base) == made
    assert before == {k: made[k] for k in before}
    would = [e for e in logs if e["event"].startswith("dry run")]
    assert {e.get("knob") for e in would if "knob" in e} >= set(POD["BE"]) | {"kernel.sched_group_identity_enabled"}
    assert any(e["event"] == "dry run: would create resctrl group" for e in would)
    assert any(e["event"] == "qos level" and e["qos_level"] == "BE" for e in logs)


# ------------------------------------------------------------------ resctrl

def test_threads_go_to_the_class_group(node):
    hook = QosHook(config(), node.paths)
    be = Pod(node, hook, annotations={"anolisbox.sh/qoslevel": "BE"})
    be.run()
    be.start(be.create(), tids=[101, 102])
    hi = Pod(node, hook, annotations={"anolisbox.sh/llc_limit": "High"})
    hi.run()
    hi.start(hi.create(), tids=[201])
    ls = Pod(node, hook)
    ls.run()
    ls.start(ls.create(), tids=[301])
    r = node.resctrl
    assert r.tasks("anolisnuma-low") == ["101", "102"]
    assert r.tasks("anolisnuma-high") == ["201"]
    assert r.tasks("anolisnuma-all") == ["301"]
    assert r.read("anolisnuma-low", "schemata") == "L3:0=00f;1=00f\nMB:0=20;1=20\n"
    assert r.read("anolisnuma-high", "schemata") == "L3:0=0ff;1=0ff\nMB:0=50;1=50\n"
    assert r.read("anolisnuma-all", "schemata") == "L3:0=7ff;1=7ff\nMB:0=100;1=100\n"


@pytest.mark.parametrize("vendor,ways,low", [
    ("intel", 12, "L3:0=00f;1=00f\nMB:0=20;1=20\n"),
    ("amd", 16, "L3:0=000f;1=000f\nMB:0=410;1=410\n"),
    ("arm", 16, "L3:0=000f;1=000f\nMB:0=20;1=20\n"),
])
def test_schemata_per_vendor(kernel, vendor, ways, low):
    fk = kernel(vendor=vendor, resctrl={"l3_ways": ways})
    QosHook(config(), fk.paths).prepare()
    assert fk.resctrl.read("anolisnuma-low", "schemata") == low


def test_too_few_closids_logs_and_skips(kernel):
    fk = kernel(resctrl={"num_closids": 2})
    with capture_logs() as logs:
        hook = QosHook(config(), fk.paths)
        ls = Pod(fk, hook)
        ls.run()
        ls.start(ls.create(), tids=[5])
        be = Pod(fk, hook, annotations={"anolisbox.sh/qoslevel": "BE"})
        be.run()
        be.start(be.create(), tids=[6])
    assert sorted(os.listdir(fk.paths.resctrl_root)) == ["anolisnuma-low", "cpus", "info", "schemata", "tasks"]
    assert fk.resctrl.tasks("anolisnuma-low") == ["6"]
    skipped = [e for e in logs if e["event"] == "resctrl class skipped"]
    assert {e["llc_class"] for e in skipped} == {"high", "all"}


def test_mkdir_refused_with_enospc_is_survived(kernel, monkeypatch):
    import errno as _errno
    fk = kernel(resctrl={})
    real_mkdir = os.mkdir

    def mkdir(path, *a, **kw):
        if os.path.basename(path) == "anolisnuma-high":
            raise OSError(_errno.ENOSPC, "No space left on device")
        return real_mkdir(path, *a, **kw)
    monkeypatch.setattr(os, "mkdir", mkdir)
    hook = QosHook(config(), fk.paths)
    pod = Pod(fk, hook, annotations={"anolisbox.sh/llc_limit": "high"})
    pod.run()
    pod.start(pod.create(), tids=[7])
    assert not os.path.exists(os.path.join(fk.paths.resctrl_root, "anolisnuma-high"))


def test_resync_adopts_existing_pods_and_drops_the_rest(node):
    hook = QosHook(config(), node.paths)
    old = Pod(node, hook)
    old.run()
    pod = Pod(node, hook, annotations={"anolisbox.sh/qoslevel": "LSE"})
    cid = uuid.uuid4().hex * 2
    rel = node.make_container(pod.parent, cid, tids=[55])
    rec = PodRecord(pod.sandbox_id, pod.uid, "web", "default", "",   # no cgroup_parent recorded
                    annotations={"anolisbox.sh/qoslevel": "LSE"})
    hook.resync([rec], [ContainerRecord(cid, pod.sandbox_id, "c")])
    assert hook.state.by_sandbox(old.sandbox_id) is None
    assert pod.knobs() == POD["LSE"] and pod.knobs(rel)["cpu.bvt_warp_ns"] == 2
    assert node.resctrl.tasks("anolisnuma-all") == ["55"]


def test_in_nri_mode_qos_is_sent_start_container(node, nri_subscription):
    """QoS sets the container's knobs when its task is made (StartContainer): with QoS on,
    NRI mode subscribes to that event."""
    events = nri_subscription([QosHook(config(), node.paths)])
    assert "START_CONTAINER" in events and "STOP_CONTAINER" not in events
