"""The QoS hook on fake openEuler trees: every level on pod and container cgroups, both
cgroup versions and drivers; rubik's marking; the memcg switch host-wide only when allowed;
an offline pod never turned online (refused with an event, nothing half-applied), across a
restart too; resctrl as on any kernel (MPAM on Kunpeng)."""

import os

import pytest
from structlog.testing import capture_logs
from test_qos_hook import Pod, config, snapshot

from anolisnuma.decision_events import QosApplied, QosLevelRefused
from anolisnuma.hooks.qos import QosHook
from anolisnuma.testing.fake_kernel import family_options
from anolisnuma.testing.qos_defaults import OPENEULER

QL = ("cpu.qos_level", "memory.qos_level")
VALUE = {level: files["cpu.qos_level"] for level, files in OPENEULER.items()}
RUBIK = "volcano.sh/preemptable"


def openeuler(kernel, **kw):
    return kernel(**family_options("openeuler", **kw))


def ql(fk, rel):
    return {n: int(fk.cgroup.read(rel, n)) for n in QL}


def told(hook):
    facts = []
    hook.use_decision_events(facts.append)
    return facts


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("driver", ["cgroupfs", "systemd"])
@pytest.mark.parametrize("level", ["LSE", "LSR", "LS", "BE"])
def test_each_level_lands_on_pod_and_containers(kernel, version, driver, level):
    fk = openeuler(kernel, cgroup_version=version)
    hook = QosHook(config(), fk.paths)
    pod = Pod(fk, hook, driver=driver, annotations={"anolisbox.sh/qoslevel": level})
    call = pod.run()
    want = {n: VALUE[level] for n in QL}
    assert call.notes["qos"] == f"{level}: set " + ", ".join(f"{n}={v}" for n, v in sorted(want.items()))
    assert ql(fk, pod.rel) == want                  # the pod cgroup, before the sandbox runs
    rel = pod.start(pod.create())
    assert ql(fk, rel) == want
    # nothing of the other family was made, the class directories are left alone
    assert not os.path.exists(fk.cgroup.file(pod.rel, "cpu.bvt_warp_ns"))
    assert ql(fk, "kubepods/besteffort") == {n: 0 for n in QL}


def test_the_memcg_switch_is_turned_on_when_allowed(kernel):
    fk = openeuler(kernel)
    QosHook(config(), fk.paths).prepare()
    assert fk.proc.read_sysctl("vm/memcg_qos_enable") == "1"


def test_without_leave_for_the_switch_memory_qos_level_is_held_back_and_said(kernel):
    fk = openeuler(kernel)
    with capture_logs() as logs:
        hook = QosHook(config(preemption={"enable_sysctl": False}), fk.paths)
        hook.prepare()
        pod = Pod(fk, hook, annotations={"anolisbox.sh/qoslevel": "BE"})
        call = pod.run()
    assert fk.proc.read_sysctl("vm/memcg_qos_enable") == "0"           # host-wide: not ours to turn
    assert ql(fk, pod.rel) == {"cpu.qos_level": -1, "memory.qos_level": 0}
    assert "not written: memory.qos_level (vm.memcg_qos_enable is 0" in call.notes["qos"]
    held = [e for e in logs if e["event"].startswith("knob not written")]
    assert len(held) == 1 and held[0]["knob"] == "memory.qos_level" and held[0]["log_level"] == "warning"
    # turned on by someone else (rubik, sysctl.conf): then written
    fk.proc.set_sysctl("vm/memcg_qos_enable", 1)
    hook = QosHook(config(preemption={"enable_sysctl": False}), fk.paths)
    other = Pod(fk, hook, annotations={"anolisbox.sh/qoslevel": "BE"})
    other.run()
    assert ql(fk, other.rel) == {"cpu.qos_level": -1, "memory.qos_level": -1}


def test_turned_off_in_config_nothing_is_written(kernel):
    fk = openeuler(kernel)
    hook = QosHook(config(preemption={"enabled": False}), fk.paths)
    pod = Pod(fk, hook, annotations={"anolisbox.sh/qoslevel": "BE"})
    before = snapshot(fk.base)
    hook.prepare()
    call = pod.run()
    assert snapshot(fk.base) == before
    assert call.notes["qos"] == "BE: nothing written (every knob of this level is turned off in [qos])"


# ------------------------------------------------------------------ rubik's marking

@pytest.mark.parametrize("where,value,kube_class,level", [
    ("annotations", "true", "burstable", "BE"), ("annotations", "false", "besteffort", "LS"),
    ("labels", "true", "guaranteed", "BE"), ("labels", "false", "besteffort", "LS")])
def test_pods_written_for_rubik_get_their_level(kernel, where, value, kube_class, level):
    fk = openeuler(kernel)
    hook = QosHook(config(), fk.paths)
    pod = Pod(fk, hook, kube_class=kube_class, **{where: {RUBIK: value}})
    pod.run()
    assert ql(fk, pod.rel) == {n: VALUE[level] for n in QL}
    managed = hook.state.by_uid(pod.uid)
    assert managed.level.value == level and "(rubik: " in managed.why


def test_anolisbox_and_koordinator_markings_come_before_rubiks(kernel):
    fk = openeuler(kernel)
    hook = QosHook(config(), fk.paths)
    a = Pod(fk, hook, annotations={"anolisbox.sh/qoslevel": "LS", RUBIK: "true"})
    b = Pod(fk, hook, labels={"koordinator.sh/qosClass": "LSR"}, annotations={RUBIK: "true"})
    a.run()
    b.run()
    assert ql(fk, a.rel)["cpu.qos_level"] == 0 and ql(fk, b.rel)["cpu.qos_level"] == 0


HOSTILE = ["True", "TRUE", " true", "true\n", "yes", "1", "", "offline", "t" * 10240, "tr\x00ue",
           "\uff54\uff52\uff55\uff45", "../../sys/fs/cgroup"]


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_rubik_values_are_logged_cut_and_ignored(kernel, value):
    fk = openeuler(kernel)
    hook = QosHook(config(), fk.paths)
    pod = Pod(fk, hook, kube_class="besteffort", annotations={RUBIK: value}, labels={RUBIK: value[:63]})
    before = set(snapshot(fk.base))
    with capture_logs() as logs:
        pod.run()
    assert set(snapshot(fk.base)) == before                       # no file made anywhere
    managed = hook.state.by_uid(pod.uid)
    assert (managed.level.value, managed.source) == ("BE", "kube_class")   # the next source decided
    warned = [e for e in logs if e["event"].startswith("ignored pod annotation/label") and RUBIK in e["event"]]
    assert len(warned) == 2, warned                               # the annotation and the label, once each
    for e in warned:
        assert len(e["event"]) < 400 and e["event"].isascii() and "\x00" not in e["event"] and "\n" not in e["event"]


# ------------------------------------------------------------------ offline is final

def test_online_offline_online_is_handled_as_the_kernel_rule_says(kernel):
    """One pod, three sandboxes in a row (the kubelet recreates a pod's sandbox with the
    pod's markings of the moment): online, then offline (allowed), then online again: refused
    as a whole, told once, the pod and its containers kept offline."""
    fk = openeuler(kernel)
    hook = QosHook(config(), fk.paths)
    facts = told(hook)
    pod = Pod(fk, hook, annotations={RUBIK: "false"})
    pod.run()
    assert ql(fk, pod.rel) == {n: 0 for n in QL}

    pod.config.annotations[RUBIK] = "true"
    pod.sandbox_id = "b" * 64
    pod.run()
    rel = pod.start(pod.create())
    assert ql(fk, pod.rel) == ql(fk, rel) == {n: -1 for n in QL}

    pod.config.annotations[RUBIK] = "false"
    pod.sandbox_id = "c" * 64
    with capture_logs() as logs:
        call = pod.run()
        rel = pod.start(pod.create())
    assert ql(fk, pod.rel) == ql(fk, rel) == {n: -1 for n in QL}     # nothing half-applied
    managed = hook.state.by_uid(pod.uid)
    assert (managed.level.value, managed.source) == ("BE", "kept")
    assert call.notes["qos"].startswith("BE: set cpu.qos_level=-1, memory.qos_level=-1; LS refused, kept at BE: ")
    refused = [f for f in facts if isinstance(f, QosLevelRefused)]
    assert len(refused) == 1 and (refused[0].wanted, refused[0].kept) == ("LS", "BE")
    assert "never turned online" in refused[0].why
    assert [e["log_level"] for e in logs if e["event"].startswith("qos level refused")] == ["warning"]
    # the reconciler keeps it so, and does not try the write the kernel would refuse
    counts = hook.run_once()
    assert counts.errors == 0 and counts.rewritten == 0
    # asked again (a fourth sandbox, same markings): no second event
    pod.sandbox_id = "d" * 64
    pod.run()
    assert len([f for f in facts if isinstance(f, QosLevelRefused)]) == 1
    assert [type(f) for f in facts].count(QosApplied) >= 2


def test_an_offline_pod_found_after_a_restart_stays_offline(kernel):
    """What the kernel holds is the truth: a new daemon (no memory of the pod) reads the
    pod cgroup's cpu.qos_level before turning the pod online."""
    fk = openeuler(kernel)
    first = QosHook(config(), fk.paths)
    pod = Pod(fk, first, annotations={RUBIK: "true"})
    pod.run()
    restarted = QosHook(config(), fk.paths)
    facts = told(restarted)
    pod.hook = restarted
    pod.config.annotations[RUBIK] = "false"
    pod.sandbox_id = "e" * 64
    pod.run()
    assert ql(fk, pod.rel) == {n: -1 for n in QL}
    assert restarted.state.by_uid(pod.uid).level.value == "BE"
    assert [type(f) for f in facts if isinstance(f, QosLevelRefused)] == [QosLevelRefused]


def test_an_online_pod_set_offline_behind_our_back_is_not_fought(kernel):
    """rubik (or an operator) set the pod offline: the reconciler does not try to turn it
    online again (the kernel would refuse it on every pass); it says so once."""
    fk = openeuler(kernel)
    hook = QosHook(config(), fk.paths)
    pod = Pod(fk, hook)
    pod.run()
    fk.cgroup.set(pod.rel, "cpu.qos_level", -1)
    with capture_logs() as logs:
        for _ in range(2):
            counts = hook.run_once()
            assert counts.errors == 0 and counts.rewritten == 0
    assert ql(fk, pod.rel)["cpu.qos_level"] == -1
    said = [e for e in logs if e["event"].startswith("offline cgroup not turned online")]
    assert len(said) == 1 and said[0]["knob"] == "cpu.qos_level"


# ------------------------------------------------------------------ resctrl, as on any kernel

def test_resctrl_on_kunpeng_mpam_as_today(kernel):
    fk = openeuler(kernel, vendor="arm", resctrl={"l3_ways": 16})
    hook = QosHook(config(), fk.paths)
    hook.start()
    assert fk.resctrl.read("anolisnuma-low", "schemata").startswith("L3:0=000f;1=000f\n")
    pod = Pod(fk, hook, annotations={RUBIK: "true"})
    pod.run()
    pod.start(pod.create(), tids=[4321])
    assert fk.resctrl.tasks("anolisnuma-low") == ["4321"]
    hook.close()
