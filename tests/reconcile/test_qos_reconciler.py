"""The QoS reconciler: drift re-applied, no-drift passes write nothing, threads re-swept,
vanished pods forgotten, the background thread."""

import os
import time
import uuid

import pytest

from anolisnuma.hooks.qos import QosHook
from anolisnuma.policies.qos.config import QosConfig
from anolisnuma.state.records import ContainerRecord, PodRecord
from anolisnuma.testing.fake_kernel import FakeKernel
from anolisnuma.testing.waiting import wait_until


@pytest.fixture
def node():
    fk = FakeKernel.temporary(resctrl={}, sched_core=0)
    yield fk
    fk.close()


def adopt(fk, hook, level="BE", tids=(10,), driver_parent=None):
    """A running pod with one container, adopted through resync (as after a restart)."""
    uid = str(uuid.uuid4())
    parent = driver_parent or f"/kubepods/besteffort/pod{uid}"
    sid, cid = uuid.uuid4().hex * 2, uuid.uuid4().hex * 2
    pod_rel = fk.make_pod(parent).rel
    ctr_rel = fk.make_container(parent, cid, tids)
    return (PodRecord(sid, uid, f"p-{uid[:4]}", "default", parent, annotations={"anolisbox.sh/qoslevel": level}),
            ContainerRecord(cid, sid, "c"), pod_rel, ctr_rel)


def mtimes(base):
    out = {}
    for d, _, files in os.walk(base):
        for f in files:
            p = os.path.join(d, f)
            out[p] = os.stat(p).st_mtime_ns
    return out


def test_no_drift_pass_checks_everything_and_writes_nothing(node):
    hook = QosHook(QosConfig(), node.paths)
    recs = [adopt(node, hook, lv) for lv in ("BE", "LS", "LSE", "LSR")]
    hook.resync([r[0] for r in recs], [r[1] for r in recs])
    before = mtimes(node.base)
    time.sleep(0.01)
    counts = hook.run_once()
    assert counts.pods == 4 and counts.rewritten == 0 and counts.tasks_moved == 0 and counts.errors == 0
    assert counts.checked >= 4 * (6 + 4)
    assert mtimes(node.base) == before


def test_drift_is_rewritten(node):
    hook = QosHook(QosConfig(), node.paths)
    pod, ctr, pod_rel, ctr_rel = adopt(node, hook, "BE")
    hook.resync([pod], [ctr])
    node.cgroup.set(pod_rel, "cpu.bvt_warp_ns", 2)
    node.cgroup.set(ctr_rel, "memory.wmark_min_adj", 0)
    node.cgroup.set("kubepods/besteffort", "memory.priority", 7)
    node.cgroup.set("", "memory.use_priority_oom", 0)
    node.proc.set_sysctl("sched_group_identity_enabled", 0)
    counts = hook.run_once()
    assert counts.rewritten == 5
    assert node.cgroup.read(pod_rel, "cpu.bvt_warp_ns") == "-1"
    assert node.cgroup.read(ctr_rel, "memory.wmark_min_adj") == "50"
    assert node.cgroup.read("kubepods/besteffort", "memory.priority") == "0"
    assert node.cgroup.read("", "memory.use_priority_oom") == "1"
    assert node.proc.read_sysctl("sched_group_identity_enabled") == "1"
    assert hook.run_once().rewritten == 0


def test_resctrl_drift_and_new_threads(node):
    hook = QosHook(QosConfig(), node.paths)
    pod, ctr, _, ctr_rel = adopt(node, hook, "BE", tids=(10, 11))
    hook.resync([pod], [ctr])
    assert node.resctrl.tasks("anolisnuma-low") == ["10", "11"]
    node.cgroup.set_tids(ctr_rel, [10, 11, 12])          # kubectl exec started a process
    with open(os.path.join(node.paths.resctrl_root, "anolisnuma-low", "schemata"), "w") as f:
        f.write("L3:0=7ff;1=7ff\nMB:0=100;1=100\n")
    counts = hook.run_once()
    assert counts.tasks_moved == 1 and counts.rewritten == 1
    assert node.resctrl.tasks("anolisnuma-low") == ["10", "11", "12"]
    assert node.resctrl.read("anolisnuma-low", "schemata") == "L3:0=00f;1=00f\nMB:0=20;1=20\n"


def test_removed_group_is_recreated(node):
    hook = QosHook(QosConfig(), node.paths)
    hook.prepare()
    import shutil
    shutil.rmtree(os.path.join(node.paths.resctrl_root, "anolisnuma-high"))
    hook.run_once()
    assert node.resctrl.read("anolisnuma-high", "schemata") == "L3:0=0ff;1=0ff\nMB:0=50;1=50\n"


def test_removed_pods_and_containers_are_forgotten(node):
    hook = QosHook(QosConfig(), node.paths)
    a = adopt(node, hook)
    b = adopt(node, hook)
    hook.resync([a[0], b[0]], [a[1], b[1]])
    node.cgroup.remove(a[2])          # pod a gone entirely
    node.cgroup.remove(b[3])          # b's container gone
    counts = hook.run_once()
    assert counts.forgotten == 1 and counts.errors == 0
    assert len(hook.state) == 1
    _, ctr = hook.state.by_container(b[1].container_id)
    assert ctr is None


def test_a_later_resync_forgets_what_vanished_and_adopts_what_appeared_but_not_what_calls_named(node):
    hook = QosHook(QosConfig(), node.paths)
    gone, busy, stays = adopt(node, hook), adopt(node, hook), adopt(node, hook)
    hook.resync([gone[0], busy[0], stays[0]], [gone[1], busy[1], stays[1]])
    assert len(hook.state) == 3
    new = adopt(node, hook, "LS")                                  # started behind the proxy's back
    late = adopt(node, hook, "LS")                                 # its RunPodSandbox is passing now
    hook.resync([stays[0], new[0], late[0]], [stays[1], new[1], late[1]], frozenset({busy[0].uid, late[0].uid}))
    assert hook.state.by_sandbox(gone[0].sandbox_id) is None
    assert hook.state.by_sandbox(busy[0].sandbox_id) is not None   # a call named it: left alone
    assert hook.state.by_sandbox(late[0].sandbox_id) is None       # ... and the call adopts it
    assert hook.state.by_sandbox(new[0].sandbox_id).level.value == "LS"
    assert node.cgroup.read(new[2], "cpu.bvt_warp_ns") == "1"       # and its knobs are applied (LS)
    assert hook.state.by_container(new[1].container_id)[1] is not None


def test_a_stop_landing_while_a_resync_admits_the_pod_wins(node):
    """The resync checked that no call named the pod, then admits it; a StopPodSandbox whose
    hook runs in between must not be undone by that admission."""
    import threading

    from anolisnuma.pipeline import hooks as H
    from cri_proto import api_pb2 as pb

    hook = QosHook(QosConfig(), node.paths)
    pod, ctr, _, _ = adopt(node, hook)
    stop = H.Call(H.STOP_POD_SANDBOX, pb.StopPodSandboxRequest(pod_sandbox_id=pod.sandbox_id), pod=pod,
                  reply=pb.StopPodSandboxResponse())
    stopper = threading.Thread(target=hook.post, args=(stop,))
    admit = hook.service.admit_record

    def admit_while_stopping(rec):
        stopper.start()
        stopper.join(0.2)            # the stop's hook waits for the admission to finish
        return admit(rec)

    hook.service.admit_record = admit_while_stopping
    hook.resync([pod], [ctr])
    stopper.join(5)
    assert not stopper.is_alive()
    assert hook.state.by_sandbox(pod.sandbox_id) is None


def test_systemd_and_v2_pods(node):
    fk = FakeKernel.temporary(cgroup_version=2)
    try:
        hook = QosHook(QosConfig(), fk.paths)
        uid = str(uuid.uuid4())
        pod, ctr, pod_rel, ctr_rel = adopt(fk, hook, "LSE",
                                           driver_parent=f"kubepods-pod{uid.replace('-', '_')}.slice")
        hook.resync([pod], [ctr])
        fk.cgroup.set(ctr_rel, "cpu.bvt_warp_ns", 0)
        assert hook.run_once().rewritten == 1
        assert fk.cgroup.read(ctr_rel, "cpu.bvt_warp_ns") == "2"
        assert ctr_rel.endswith(f"cri-containerd-{ctr.container_id}.scope")
    finally:
        fk.close()


def test_refused_write_is_counted_not_raised(node):
    hook = QosHook(QosConfig(), node.paths)
    pod, ctr, pod_rel, _ = adopt(node, hook)
    hook.resync([pod], [ctr])
    node.cgroup.set(pod_rel, "memory.priority", 9)
    node.make_readonly(node.cgroup.file(pod_rel, "memory.priority"))
    counts = hook.run_once()
    assert counts.errors == 1 and len(hook.state) == 1


def test_dry_run_pass_counts_but_writes_nothing(node):
    hook = QosHook(QosConfig(dry_run=True), node.paths)
    pod, ctr, pod_rel, _ = adopt(node, hook)
    hook.resync([pod], [ctr])
    before = mtimes(node.base)
    counts = hook.run_once()
    assert counts.rewritten > 0
    assert mtimes(node.base) == before


def test_background_thread_starts_and_stops(node):
    from anolisnuma.configfile import Table
    hook = QosHook(QosConfig.from_table(Table({"reconcile_interval_seconds": 1})), node.paths)
    hook.reconciler.interval = 0.02          # faster than config allows, for the test
    pod, ctr, pod_rel, _ = adopt(node, hook)
    hook.resync([pod], [ctr])
    hook.start()
    assert hook.controllers(lambda timeout: None) == [hook.reconciler]
    hook.reconciler.start()
    try:
        assert hook.reconciler.running
        node.cgroup.set(pod_rel, "cpu.bvt_warp_ns", 1)
        wait_until(lambda: node.cgroup.read(pod_rel, "cpu.bvt_warp_ns") == "-1",
                   "the reconciler to put cpu.bvt_warp_ns back")
    finally:
        hook.close()
    assert not hook.reconciler.running


def test_interval_zero_means_no_thread(node):
    hook = QosHook(QosConfig(reconcile_interval_seconds=0), node.paths)
    hook.start()
    assert hook.controllers(lambda timeout: None) == []
    assert not hook.reconciler.running
    hook.close()


def test_pass_over_200_pods_is_cheap(node):
    hook = QosHook(QosConfig(), node.paths)
    recs = [adopt(node, hook, ("BE", "LS")[i % 2], tids=(1000 + i,)) for i in range(200)]
    hook.resync([r[0] for r in recs], [r[1] for r in recs])
    hook.run_once()
    best = min(_cpu(hook.run_once) for _ in range(3))
    assert best < 0.25      # target 50 ms; generous bound against noisy CI machines


def _cpu(fn):
    t = time.process_time()
    counts = fn()
    assert counts.rewritten == 0
    return time.process_time() - t


def test_a_cgroup_that_appears_while_its_knob_is_written_gets_the_value(node, monkeypatch):
    """A post-hook racing with the cgroup's creation: the write fails because the directory
    is not there yet, and the directory is there a moment later. The knob is written, not
    called missing (a container left without its group identity until the next pass)."""
    from anolisnuma.qos import applier as applier_module
    from anolisnuma.system import knobs

    hook = QosHook(QosConfig(), node.paths)
    parent = f"/kubepods/besteffort/pod{uuid.uuid4()}"
    node.make_pod(parent)
    cid = uuid.uuid4().hex * 2
    rel = f"{parent.strip('/')}/{cid}"
    knob = knobs.BY_NAME["cpu.bvt_warp_ns"]
    real_write = applier_module.write_text
    writes = []

    def racing_write(path, value):
        writes.append(path)
        if len(writes) == 1:
            try:
                real_write(path, value)   # no directory yet
            finally:
                node.make_container(parent, cid)   # ... and now there is, with its files
        else:
            real_write(path, value)

    monkeypatch.setattr(applier_module, "write_text", racing_write)
    report = applier_module.ApplyReport()
    target = applier_module.FileTarget(knob, hook.cgroups.knob_path(knob, rel), -1)
    assert hook.applier.ensure(target, "default/p", report, compare=False) is applier_module.Outcome.WRITTEN
    assert node.cgroup.read(rel, "cpu.bvt_warp_ns") == "-1"
    assert report.written == 1 and not target.missing_logged


def test_a_cgroup_that_appears_just_after_the_failed_write_is_not_called_missing(node, monkeypatch):
    """The write fails (no directory yet), the applier looks, and the directory appears a
    moment after that look (containerd making the container's cgroup while the
    CreateContainer post-hook writes). That is a cgroup not made yet, not a file this kernel
    lacks: not marked missing (which let the container count as applied, its knob never
    written until a reconcile pass), but gone for now, so the next call writes it."""
    from anolisnuma.qos import applier as applier_module
    from anolisnuma.system import knobs

    hook = QosHook(QosConfig(), node.paths)
    parent = f"/kubepods/besteffort/pod{uuid.uuid4()}"
    node.make_pod(parent)
    cid = uuid.uuid4().hex * 2
    rel = f"{parent.strip('/')}/{cid}"
    looks = []

    def late_directory(path):
        looks.append(path)
        if len(looks) == 1:
            node.make_container(parent, cid)   # appears right after the applier looked
            return False
        return os.path.isdir(os.path.dirname(path))

    monkeypatch.setattr(applier_module, "directory_of_exists", late_directory)
    knob = knobs.BY_NAME["cpu.bvt_warp_ns"]
    report = applier_module.ApplyReport()
    target = applier_module.FileTarget(knob, hook.cgroups.knob_path(knob, rel), -1)
    assert hook.applier.ensure(target, "default/p", report, compare=False) is applier_module.Outcome.GONE
    assert not target.missing_logged
    assert hook.applier.ensure(target, "default/p", report, compare=False) is applier_module.Outcome.WRITTEN
    assert node.cgroup.read(rel, "cpu.bvt_warp_ns") == "-1"


def test_a_pod_whose_run_failed_is_forgotten_by_the_resync_with_no_reconciler(node):
    """RunPodSandbox admitted the pod in its pre-hook and failed: no sandbox ID, so nothing
    tied it to containerd's listing, and with reconcile_interval_seconds = 0 nothing else
    freed it. The resync after the next (no call named it since) forgets it."""
    from anolisnuma.pipeline import hooks as H
    from anolisnuma.pipeline.recent import RecentCalls
    from anolisnuma.reconcile.resync import RuntimeResync
    from anolisnuma.state.gone import Reaper
    from anolisnuma.state.store import Store
    from cri_proto import api_pb2 as pb

    class Empty:   # containerd lists nothing
        def list_pod_sandboxes(self):
            return []

        def list_containers(self):
            return []

        def close(self):
            pass

    hook = QosHook(QosConfig(reconcile_interval_seconds=0), node.paths)
    assert hook.controllers(None) == []
    uid = str(uuid.uuid4())
    config = pb.PodSandboxConfig()
    config.metadata.uid, config.metadata.name, config.metadata.namespace = uid, "never-ran", "default"
    config.linux.cgroup_parent = f"/kubepods/besteffort/pod{uid}"
    node.make_pod(config.linux.cgroup_parent)
    recent = RecentCalls()
    recent.note(uid)                                  # the pipeline names the call's pod
    hook.pre(H.Call(H.RUN_POD_SANDBOX, pb.RunPodSandboxRequest(config=config)))
    assert len(hook.state) == 1                       # ... and containerd refused it
    store = Store()
    reaper = Reaper(store)
    for holder in hook.holders():
        reaper.add(holder)
    resync = RuntimeResync(Empty, store, [hook], recent, 60, reaper=reaper)
    resync.step()
    assert len(hook.state) == 1                       # a retry may still come
    resync.step()
    assert len(hook.state) == 0 and hook.service.structures() == {"pods": 0, "containers": 0, "warned_once": 0}
