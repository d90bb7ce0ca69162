"""The QoS hook through the proxy on the real containerd, driven by a real CRI client.

This machine runs an upstream kernel (cgroup v1, cgroupfs driver): none of the Anolis knobs
exist and there is no resctrl. So:

- the knob values are checked on a *fake* kernel tree (cgroupfs, /proc/sys, resctrl) that
  the hook is pointed at, while containerd creates the *real* pods and containers. The test
  plays the kubelet/kernel for the fake tree: it makes the fake pod cgroup before
  RunPodSandbox (as the kubelet makes the real one) and mirrors the real container cgroup,
  with its real thread IDs, into the fake tree;
- a second run points the hook at the real ``/sys/fs/cgroup``: the start-up probe reports
  every Anolis knob unsupported, pods start, nothing is written, and the path rules of both
  cgroup drivers resolve real directories.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import uuid
from typing import Any, Dict, Iterator, List, Optional, Sequence, Set, Tuple

import grpc
import pytest
from cri_client import KubeletLike, pb, read_file

from anolisnuma import logsetup
from anolisnuma.config import HookSettings, PathsConfig
from anolisnuma.hooks.qos import QosHook
from anolisnuma.pipeline.hooks import START_CONTAINER, Call, Hook
from anolisnuma.policies.qos.config import QosConfig
from anolisnuma.state.records import PodRecord
from anolisnuma.system import knobs
from anolisnuma.system.cgroups import (
    QOS_CLASS_DIRS, CgroupFs, Driver, InvalidCgroupPath, KubeQosClass, parse_cgroup_parent,
    pod_cgroup_for,
)
from anolisnuma.system.sysctl import cpu_vendor
from anolisnuma.testing.daemon_probes import wait_until
from anolisnuma.testing.fake_kernel import FakeKernel, FakeResctrl
from anolisnuma.testing.proxy import InProcessProxy, make_config
from anolisnuma.testing.qos_defaults import ALINUX_CONTAINER_KNOBS, ALINUX_POD
from anolisnuma.testing.waiting import wait_until

CG = "/sys/fs/cgroup"
NS = "qos-e2e"
QOS = "anolisbox.sh/qoslevel"
LLC = "anolisbox.sh/llc_limit"
KOORD = "koordinator.sh/qosClass"

# Documented defaults (docs/qos.md "What each level gets"; one table for the hook, daemon
# and end-to-end tests).
POD_VALUES, CONTAINER_KNOBS = ALINUX_POD, ALINUX_CONTAINER_KNOBS
# What a fresh fake cgroup holds (knobs.ANOLIS_CGROUP_DEFAULTS): container cgroups keep
# these for the pod-only knobs.
FRESH = dict(knobs.ANOLIS_CGROUP_DEFAULTS)

# 11-way L3 (cbm_mask 7ff, printed with 3 hex digits), 2 cache ids, Intel MBA in percent
# (bandwidth_gran 10).
SCHEMATA_11WAY_INTEL = {
    "anolisnuma-low": "L3:0=00f;1=00f\nMB:0=20;1=20\n",
    "anolisnuma-high": "L3:0=0ff;1=0ff\nMB:0=50;1=50\n",
    "anolisnuma-all": "L3:0=7ff;1=7ff\nMB:0=100;1=100\n",
}
PARENTS = {"guaranteed": "/kubepods", "burstable": "/kubepods/burstable",
           "besteffort": "/kubepods/besteffort"}


# ------------------------------------------------------------------------------ helpers



def _fake_kernel(base: str, **resctrl: Any) -> FakeKernel:
    """cgroup v1 with every Anolis knob, kubepods dirs of both drivers, Intel resctrl
    (11-way L3, cache ids 0 and 1, MBA) unless ``resctrl`` says otherwise."""
    opts = {"l3_ways": 11, "cache_ids": (0, 1), "mb": True}
    opts.update(resctrl)
    return FakeKernel(base, cgroup_version=1, vendor="intel", resctrl=opts)


def _hook_paths(cgroup_root: str, resctrl_root: str, proc_root: str, workdir: str) -> PathsConfig:
    return PathsConfig(cgroup_root=cgroup_root, resctrl_root=resctrl_root, proc_root=proc_root,
                       state_dir=os.path.join(workdir, "hook-state"))


def _qos_hook(workdir: str, cfg: QosConfig, paths: PathsConfig) -> QosHook:
    """A QosHook whose start-up probe lines land in the proxy's log file: the hook probes
    the kernel in its constructor, before InProcessProxy.start() configures logging."""
    log_file = make_config(workdir, "/unused").log.file  # where the proxy will log
    os.makedirs(os.path.dirname(log_file), exist_ok=True)
    logsetup.configure("info", log_file, stderr=False)
    return QosHook(cfg, paths)


@contextlib.contextmanager
def _proxied(containerd: Any, workdir: str, hooks: List[Any]) -> Iterator[Tuple[InProcessProxy, KubeletLike]]:
    """The proxy with ``hooks`` in front of the private containerd, and a KubeletLike on it;
    everything the client made is removed afterwards (through the proxy)."""
    p = InProcessProxy.for_backend(containerd.socket, workdir, hooks=hooks)
    p.start()
    kl: Optional[KubeletLike] = None
    errors: List[str] = []
    try:
        kl = KubeletLike(p.socket, harness=containerd)
        p.wait_resynced()
        yield p, kl
    finally:
        if kl is not None:
            errors = kl.cleanup()
            kl.close()
        p.stop()
    assert not errors, errors


def _new_pod_cgroup(fk: FakeKernel, qos: str) -> Tuple[str, str, str]:
    """(uid, cgroup_parent, rel): the fake pod cgroup made before RunPodSandbox, with the
    same cgroup_parent the KubeletLike gives the real one."""
    uid = str(uuid.uuid4())
    parent = f"{PARENTS[qos]}/pod{uid}"
    return uid, parent, fk.make_pod(parent).rel


def _fake_values(fk: FakeKernel, rel: str, names: Sequence[str]) -> Dict[str, int]:
    return {n: int(fk.cgroup.read(rel, n)) for n in names}


def _real_tids(cgroups_path: str) -> List[int]:
    return [int(t) for t in read_file(f"{CG}/cpu{cgroups_path}/tasks").split()]


def _lines(p: InProcessProxy, message: str, **match: Any) -> List[dict]:
    return [e for e in p.log_lines() if e.get("message") == message
            and all(e.get(k) == v for k, v in match.items())]


def _snapshot(top: str, exclude: Sequence[str] = ()) -> Dict[str, Optional[str]]:
    """Every directory and file under ``top`` (content hashed), ``exclude`` pruned."""
    out: Dict[str, Optional[str]] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = [d for d in dirnames if os.path.join(dirpath, d) not in exclude]
        out[os.path.relpath(dirpath, top) + "/"] = None
        for name in filenames:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, top)] = hashlib.sha1(f.read()).hexdigest()
    return out


class MirrorRealCgroups(Hook):
    """Test stand-in for what the kernel does to the real tree: after StartContainer (and
    *before* the QoS hook's post stage, which runs next in the hook list), create the
    container's cgroup in the fake tree with the thread IDs of the REAL container cgroup.

    The QoS hook reads a container's threads from the cgroup tree it is configured with
    (``CgroupFs.task_ids``: v1 ``<root>/cpu/<container dir>/tasks``); in the fake tree that
    file is empty unless the real PIDs are mirrored into it, so they are mirrored here.
    Pods named in ``skip`` are left for the test to mirror later (reconciler path)."""

    name = "mirror"
    methods = frozenset({START_CONTAINER})

    def __init__(self, fk: FakeKernel, skip: Set[str] = frozenset()) -> None:
        self.fk = fk
        self.skip = set(skip)
        self.mirrored: Dict[str, List[int]] = {}
        self.errors: List[str] = []

    def post(self, call: Call) -> None:
        try:
            if call.pod is None or call.pod.name in self.skip:
                return
            cid = call.request.container_id
            cgroups_path = f"{call.pod.cgroup_parent}/{cid}"   # containerd's cgroupfs layout
            tids = _real_tids(cgroups_path)
            self.fk.cgroup.make_dir(cgroups_path.lstrip("/"), tids)
            self.mirrored[cid] = tids
        except Exception as e:  # pragma: no cover - reported by the test
            self.errors.append(repr(e))
            raise


# ------------------------------------------------------------------- 1. fake tree

# name, kube QoS class, annotations, labels -> level, decided by, resctrl group
LEVEL_PODS = [
    ("be", "burstable", {QOS: "BE"}, {}, "BE", "annotation", "anolisnuma-low"),
    ("ls", "burstable", {}, {}, "LS", "kube_class", "anolisnuma-all"),
    ("lse", "burstable", {QOS: "LSE"}, {}, "LSE", "annotation", "anolisnuma-all"),
    ("koord-lsr", "burstable", {}, {KOORD: "LSR"}, "LSR", "label", "anolisnuma-all"),
    ("late-high", "besteffort", {LLC: "high"}, {}, "BE", "kube_class", "anolisnuma-high"),
]
LATE = "late-high"   # its container cgroup is mirrored by the test after start (reconciler path)


def test_levels_and_knobs_on_fake_tree(containerd, tmp_path):
    fk = _fake_kernel(str(tmp_path / "host"))
    workdir = str(tmp_path / "proxy")
    hook = _qos_hook(workdir, QosConfig(reconcile_interval_seconds=0),
                     _hook_paths(fk.paths.cgroup_root, fk.paths.resctrl_root, fk.paths.proc_root, workdir))
    assert all(hook.support.has(k) for k in knobs.CGROUP_KNOBS + (knobs.RESCTRL_L3, knobs.RESCTRL_MB))
    mirror = MirrorRealCgroups(fk, skip={LATE})
    with _proxied(containerd, workdir, [mirror, hook]) as (p, kl):
        # Global set-up done at start: sysctl, root switch, QoS-class dirs of both drivers,
        # one resctrl group per class with schemata from info/L3 + info/MB.
        assert fk.proc.read_sysctl("sched_group_identity_enabled") == "1"
        assert fk.cgroup.read("", "memory.use_priority_oom") == "1"
        for drv in (Driver.CGROUPFS, Driver.SYSTEMD):
            dirs = QOS_CLASS_DIRS[drv]
            assert fk.cgroup.read(dirs[KubeQosClass.GUARANTEED], "cpu.bvt_warp_ns") == "0"
            assert fk.cgroup.read(dirs[KubeQosClass.BURSTABLE], "cpu.bvt_warp_ns") == "1"
            assert fk.cgroup.read(dirs[KubeQosClass.BURSTABLE], "memory.priority") == "10"
            assert fk.cgroup.read(dirs[KubeQosClass.BESTEFFORT], "cpu.bvt_warp_ns") == "-1"
            assert fk.cgroup.read(dirs[KubeQosClass.BESTEFFORT], "memory.priority") == "0"
        assert fk.resctrl is not None
        for group, text in SCHEMATA_11WAY_INTEL.items():
            assert fk.resctrl.read(group, "schemata") == text, group

        made: Dict[str, Dict[str, Any]] = {}
        for name, qos, ann, labels, level, source, group in LEVEL_PODS:
            uid, parent, rel = _new_pod_cgroup(fk, qos)
            pod = kl.run_pod(name=name, namespace=NS, uid=uid, qos=qos, annotations=ann, labels=labels)
            assert pod.cgroup_parent == parent
            # Written in the RunPodSandbox pre stage, before containerd saw the call.
            assert _fake_values(fk, rel, POD_VALUES[level]) == POD_VALUES[level], name
            cid = kl.run_container(pod, "main")
            status, info = kl.container_status(cid)
            assert status.state == pb.CONTAINER_RUNNING
            cgroups_path = info["runtimeSpec"]["linux"]["cgroupsPath"]
            crel = parse_cgroup_parent(parent).container_rel(cid)
            assert cgroups_path == "/" + crel
            made[name] = dict(pod=pod, rel=rel, cid=cid, crel=crel, pid=info["pid"], level=level,
                              group=group, cgroups_path=cgroups_path)

        # StartContainer post (no reconciler pass yet: interval 0): the container knobs and
        # the REAL PIDs in the fake resctrl group of each mirrored pod.
        for name, m in made.items():
            if name == LATE:
                continue
            wait_until(lambda: str(m["pid"]) in fk.resctrl.tasks(m["group"]),
                  f"pid {m['pid']} of {name} in {m['group']}/tasks")
            assert m["cid"] in mirror.mirrored and m["pid"] in mirror.mirrored[m["cid"]]
            want = {k: POD_VALUES[m["level"]][k] for k in CONTAINER_KNOBS}
            want.update({k: FRESH[k] for k in ("memory.priority", "memory.use_priority_oom")})
            assert _fake_values(fk, m["crel"], want) == want, name
            others = set(SCHEMATA_11WAY_INTEL) - {m["group"]}
            assert not any(str(m["pid"]) in fk.resctrl.tasks(g) for g in others), name
        assert not mirror.errors

        # The late pod: its container cgroup did not exist in the fake tree at StartContainer.
        # Mirror it now from ContainerStatus' cgroupsPath, with the real PIDs (the fake tasks
        # file would be empty otherwise), and let one reconciler pass apply it.
        late = made[LATE]
        assert not os.path.exists(fk.cgroup.file(late["crel"], "tasks"))
        assert str(late["pid"]) not in fk.resctrl.tasks("anolisnuma-high")
        # (said by the StartContainer post-hook, which runs after the reply reached the client,
        # through the log's writer thread: waited for, not read at once)
        wait_until(lambda: _lines(p, "container cgroup not there after start, under its pod's cgroup: the container "
                                     "stopped or exited at once (nothing to apply), or its cgroup comes later (the "
                                     "reconciler applies it then)", pod=f"{NS}/{LATE}"),
                   "the late pod's StartContainer post-hook line", timeout=30)
        late_tids = _real_tids(late["cgroups_path"])
        assert late["pid"] in late_tids, f"the late container's process left its cgroup: {late_tids}"
        fk.cgroup.make_dir(late["cgroups_path"].lstrip("/"), late_tids)
        counts = hook.run_once()
        assert counts.pods == len(LEVEL_PODS) and counts.errors == 0 and counts.forgotten == 0
        assert counts.tasks_moved >= 1
        assert counts.rewritten == len(CONTAINER_KNOBS)     # only the late container drifted
        assert _fake_values(fk, late["crel"], CONTAINER_KNOBS) == \
            {k: POD_VALUES["BE"][k] for k in CONTAINER_KNOBS}
        assert str(late["pid"]) in fk.resctrl.tasks("anolisnuma-high")

        # A process started later by exec does not inherit the resctrl group: the next pass
        # sweeps it in (mirrored again from the real cgroup, as the kernel would list it).
        ls = made["ls"]
        r = kl.exec_sync(ls["cid"], ["sh", "-c", "sleep 31 </dev/null >/dev/null 2>&1 &"])
        assert r.exit_code == 0

        def sleeper() -> Optional[int]:
            for tid in _real_tids(ls["cgroups_path"]):
                try:
                    with open(f"/proc/{tid}/cmdline", "rb") as f:
                        if f.read().split(b"\0")[:2] == [b"sleep", b"31"]:
                            return tid
                except OSError:
                    pass
            return None
        exec_pid = wait_until(sleeper, "the exec'd sleep 31 in the real container cgroup")
        assert str(exec_pid) not in fk.resctrl.tasks("anolisnuma-all")
        fk.cgroup.set_tids(ls["crel"], _real_tids(ls["cgroups_path"]))
        counts = hook.run_once()
        assert counts.tasks_moved >= 1 and counts.rewritten == 0 and counts.errors == 0
        assert str(exec_pid) in fk.resctrl.tasks("anolisnuma-all")

        # Drift is repaired: pod and container files, one pass.
        fk.cgroup.set(made["be"]["rel"], "cpu.bvt_warp_ns", 0)
        fk.cgroup.set(made["ls"]["rel"], "memory.priority", 3)
        fk.cgroup.set(made["lse"]["crel"], "memory.wmark_min_adj", 0)
        counts = hook.run_once()
        assert counts.rewritten == 3 and counts.errors == 0
        assert fk.cgroup.read(made["be"]["rel"], "cpu.bvt_warp_ns") == "-1"
        assert fk.cgroup.read(made["ls"]["rel"], "memory.priority") == "10"
        assert fk.cgroup.read(made["lse"]["crel"], "memory.wmark_min_adj") == "-25"

        # The periodic reconciler thread does the same by itself.
        hook.reconciler.interval = 0.2   # below the config minimum (1 s): test only
        hook.reconciler.start()
        try:
            fk.cgroup.set(made["koord-lsr"]["crel"], "cpu.bvt_warp_ns", -1)
            wait_until(lambda: fk.cgroup.read(made["koord-lsr"]["crel"], "cpu.bvt_warp_ns") == "2",
                  "the reconciler thread to repair cpu.bvt_warp_ns")
        finally:
            hook.reconciler.stop()

        # The log has every decision: level, source, group; and the reply line carries it.
        for name, qos, ann, labels, level, source, group in LEVEL_PODS:
            dec = _lines(p, "qos level", pod=f"{NS}/{name}")
            assert dec, name
            assert (dec[-1]["source"], dec[-1]["llc_group"]) == (source, group)
            assert dec[-1]["cgroup"] == made[name]["rel"]
            assert hook.state.by_uid(made[name]["pod"].uid).level.value == level
            rep = _lines(p, "run pod sandbox reply from containerd", pod_name=name)
            assert rep and rep[-1]["status"] == "OK" and list(rep[-1]["decisions"]) == ["qos"]
            # the decision says what the level set on this (fake, every knob) kernel
            assert rep[-1]["decisions"]["qos"] == (
                f"{level}: set " + ", ".join(f"{k}={v}" for k, v in sorted(POD_VALUES[level].items()))
                + f"; resctrl group {group}")
        written = _lines(p, "knob written")
        assert written and all(e["path"].startswith(fk.base + os.sep) for e in written)
        assert not _lines(p, "hook failed")

        # Pods removed through the proxy are forgotten.
        assert not kl.cleanup()
        wait_until(lambda: len(hook.state) == 0, "the hook to forget the removed pods")


# -------------------------------------------------------------- 2. hostile annotations

HOSTILE = ["../../etc", "a/b", "x\x00y", "A" * 10240, "\uff22\uff25", "BE\n"]   # "ＢＥ" fullwidth


def test_hostile_annotations_are_ignored(containerd, tmp_path):
    fk = _fake_kernel(str(tmp_path / "host"))
    workdir = str(tmp_path / "proxy")
    hook = _qos_hook(workdir, QosConfig(reconcile_interval_seconds=0),
                     _hook_paths(fk.paths.cgroup_root, fk.paths.resctrl_root, fk.paths.proc_root, workdir))
    parent_before = sorted(os.listdir(tmp_path.parent))
    with _proxied(containerd, workdir, [hook]) as (p, kl):
        cgroups = [_new_pod_cgroup(fk, "burstable") for _ in HOSTILE]
        before = _snapshot(str(tmp_path), exclude=[workdir])
        for i, ((uid, parent, rel), value) in enumerate(zip(cgroups, HOSTILE)):
            pod = kl.run_pod(name=f"hostile-{i}", namespace=NS, uid=uid,
                             annotations={QOS: value, LLC: value})
            assert pod.id
        after = _snapshot(str(tmp_path), exclude=[workdir])

        # Only the knob files of these pods' own cgroups changed; nothing was created or
        # removed anywhere under tmp_path (the fake roots included) or next to it.
        assert set(after) == set(before)
        changed = {k for k in after if after[k] != before[k]}
        expected = set()
        for _, _, rel in cgroups:
            for knob in knobs.CGROUP_KNOBS:
                expected.add(os.path.relpath(fk.cgroup.file(rel, knob.name), str(tmp_path)))
        assert changed == expected
        assert sorted(os.listdir(tmp_path.parent)) == parent_before

        for i, ((uid, parent, rel), value) in enumerate(zip(cgroups, HOSTILE)):
            ref = f"{NS}/hostile-{i}"
            # Surrounding blanks are ignored by design (docs/qos.md): "BE\n" is BE.
            level, source = ("BE", "annotation") if value == "BE\n" else ("LS", "kube_class")
            group = "anolisnuma-low" if level == "BE" else "anolisnuma-all"
            dec = _lines(p, "qos level", pod=ref)
            assert dec and (dec[-1]["source"], dec[-1]["llc_group"]) == (source, group)
            assert hook.state.by_uid(uid).level.value == level
            assert _fake_values(fk, rel, POD_VALUES[level]) == POD_VALUES[level], ref
            warned = [e for e in p.log_lines() if e.get("pod") == ref and e["level"] == "warning"]
            llc_warn = [e for e in warned if f"annotation {LLC} has unknown value" in e["message"]]
            qos_warn = [e for e in warned if f"annotation {QOS} has unknown value" in e["message"]]
            assert len(llc_warn) == 1, (ref, warned)
            assert len(qos_warn) == (0 if value == "BE\n" else 1), (ref, warned)
            for e in llc_warn + qos_warn:
                # escaped and cut: no raw NUL/newline/non-ASCII, no 10 KB echo
                assert len(e["message"]) < 400 and e["message"].isascii()
                assert "\x00" not in e["message"] and "\n" not in e["message"]
            if len(value) > 1000:
                assert "(10240 chars)" in llc_warn[0]["message"]
        assert not _lines(p, "hook failed")
        written = _lines(p, "knob written")
        assert written and all(e["path"].startswith(fk.base + os.sep) for e in written)


# ---------------------------------------------------------------- 3. failure policy

def test_refused_knob_write_ignore_and_fail_policy(containerd, kubelet_direct, tmp_path):
    fk = _fake_kernel(str(tmp_path / "host"))
    workdir = str(tmp_path / "proxy")
    hook = _qos_hook(workdir, QosConfig(reconcile_interval_seconds=0),
                     _hook_paths(fk.paths.cgroup_root, fk.paths.resctrl_root, fk.paths.proc_root, workdir))

    def broken_pod() -> Tuple[str, str]:
        # As root, mode 0444 does not stop a write; a directory in place of the file does
        # (open(O_WRONLY) -> EISDIR, a refused write).
        uid, _, rel = _new_pod_cgroup(fk, "burstable")
        path = fk.cgroup.file(rel, "cpu.bvt_warp_ns")
        os.remove(path)
        os.mkdir(path)
        return uid, rel

    with _proxied(containerd, workdir, [hook]) as (p, kl):
        # Default policy `ignore`: the pod starts; the other knobs are still written.
        assert p.config.hooks.settings("qos").failure_policy == "ignore"
        uid, rel = broken_pod()
        pod = kl.run_pod(name="refuse-ignore", namespace=NS, uid=uid)
        assert pod.id in {s.id for s in kubelet_direct.list_pods()}
        want = {k: v for k, v in POD_VALUES["LS"].items() if k != "cpu.bvt_warp_ns"}
        assert _fake_values(fk, rel, want) == want
        refused = _lines(p, "knob write refused", pod=f"{NS}/refuse-ignore")
        assert refused and refused[0]["knob"] == "cpu.bvt_warp_ns"
        failed = _lines(p, "hook failed", hook="qos", stage="pre", pod_name="refuse-ignore")
        assert failed and failed[0]["policy"] == "ignore"

        # Policy `fail` (the interceptor reads the same HooksConfig object at each call):
        # RunPodSandbox is refused with the hook's code and never reaches containerd.
        assert p.daemon.interceptor.config is p.config.hooks
        p.config.hooks.per_hook["qos"] = HookSettings(failure_policy="fail")
        uid2, _ = broken_pod()
        with pytest.raises(grpc.RpcError) as err:
            kl.run_pod(name="refuse-fail", namespace=NS, uid=uid2)
        assert err.value.code() == grpc.StatusCode.INTERNAL
        assert "anolisnuma hook qos" in err.value.details()
        assert "cpu.bvt_warp_ns" in err.value.details()
        assert uid2 not in {s.metadata.uid for s in kubelet_direct.list_pods()}
        # (logged by the relay once the refusal is sent: wait for it)
        rep = wait_until(lambda: _lines(p, "run pod sandbox reply from anolisnuma", pod_name="refuse-fail"),
                    "the refusal's reply log line")
        assert rep[-1]["status"] == "INTERNAL"
        assert not _lines(p, "run pod sandbox reply from containerd", pod_name="refuse-fail")

        # `fail` does not affect healthy pods.
        uid3, _, rel3 = _new_pod_cgroup(fk, "burstable")
        kl.run_pod(name="healthy-fail-policy", namespace=NS, uid=uid3)
        assert _fake_values(fk, rel3, POD_VALUES["LS"]) == POD_VALUES["LS"]
        assert uid3 in {s.metadata.uid for s in kubelet_direct.list_pods()}


# ----------------------------------------------------------------- 4. real cgroup tree

V1_HIERARCHIES = ("cpu", "cpuacct", "cpuset", "memory", "blkio", "devices", "freezer", "pids")


def _probe_leftovers() -> List[str]:
    found = []
    for ctrl in V1_HIERARCHIES:
        d = f"{CG}/{ctrl}"
        if os.path.isdir(d):
            found += [f"{d}/{n}" for n in os.listdir(d) if n.startswith("anolisnuma-probe-")]
    return found


def test_real_cgroup_tree_probe_paths_and_no_writes(containerd, tmp_path):
    workdir = str(tmp_path / "proxy")
    # Real cgroup tree and /proc; a fake resctrl (this machine has none), in the vendor's
    # units, so the real threads' way into a group is visible.
    rc = FakeResctrl(str(tmp_path / "resctrl"), vendor=cpu_vendor("/proc") or "intel")
    hook = _qos_hook(workdir, QosConfig(reconcile_interval_seconds=0),
                     _hook_paths(CG, rc.root, "/proc", workdir))
    cg = CgroupFs(CG)
    assert cg.version == 1
    assert not _probe_leftovers()
    with _proxied(containerd, workdir, [hook]) as (p, kl):
        # Start-up probe: one "unsupported" line per Anolis knob, nothing supported but resctrl.
        unsupported = {e["knob"]: e["message"] for e in p.log_lines()
                       if e.get("message", "").startswith("unsupported knob ")}
        for k in knobs.CGROUP_KNOBS + (knobs.SCHED_GROUP_IDENTITY_ENABLED,):
            assert k.name in unsupported, k.name
            assert not hook.support.has(k)
        assert "does not exist" in unsupported["cpu.bvt_warp_ns"]
        ready = _lines(p, "qos hook ready")
        assert ready and ready[-1]["cgroup_root"] == CG and ready[-1]["cgroup_version"] == 1
        assert ready[-1]["supported"] == ["resctrl.L3", "resctrl.MB"]

        made = []
        for name, qos, ann, level, group in (
                ("real-be", "besteffort", {}, "BE", "anolisnuma-low"),
                ("real-lse", "burstable", {QOS: "LSE"}, "LSE", "anolisnuma-all"),
                ("real-guaranteed", "guaranteed", {}, "LS", "anolisnuma-all")):
            pod = kl.run_pod(name=name, namespace=NS, qos=qos, annotations=ann)
            cid = kl.run_container(pod, "main")
            status, info = kl.container_status(cid)
            assert status.state == pb.CONTAINER_RUNNING
            cgroups_path = info["runtimeSpec"]["linux"]["cgroupsPath"]

            # The path rules resolve the real pod and container cgroups.
            pc = parse_cgroup_parent(pod.cgroup_parent)
            assert (pc.driver, pc.kube_class.value, pc.uid) == (Driver.CGROUPFS, qos, pod.uid)
            assert pod_cgroup_for(Driver.CGROUPFS, pc.kube_class, pod.uid) == pc
            assert cg.locate_pod(pod.uid) == pc
            crel = pc.container_rel(cid)
            assert "/" + crel == cgroups_path
            for ctrl in ("cpu", "memory", "cpuset"):
                assert os.path.isdir(cg.dir(ctrl, pc.rel)), (ctrl, pc.rel)
                assert os.path.isdir(cg.dir(ctrl, crel)), (ctrl, crel)
                assert cg.dir(ctrl, crel) == f"{CG}/{ctrl}{cgroups_path}"
            assert str(info["pid"]) in cg.task_ids(crel)

            managed = hook.state.by_uid(pod.uid)
            assert managed is not None and managed.cgroup == pc and managed.level.value == level
            assert managed.targets == [] and managed.llc_group == group
            assert all(c.targets == [] for c in managed.containers.values())
            # StartContainer post moved the container's REAL threads (read from the real
            # cgroup's tasks file, no mirroring) into the group.
            wait_until(lambda: str(info["pid"]) in rc.tasks(group), f"pid {info['pid']} in {group}/tasks")
            for k in knobs.CGROUP_KNOBS:
                assert not os.path.exists(cg.knob_path(k, pc.rel))
                assert not os.path.exists(cg.knob_path(k, crel))
            dec = _lines(p, "qos level", pod=f"{NS}/{name}")
            assert dec and dec[-1]["cgroup"] == pc.rel
            made.append(pc)

        counts = hook.run_once()
        assert counts.pods == len(made) and counts.errors == 0 and counts.rewritten == 0
        # Nothing was written to (or attempted on) a cgroup file.
        for msg in ("knob written", "knob write refused", "knob file missing in this cgroup; skipped",
                    "hook failed"):
            assert not _lines(p, msg), msg

        assert not kl.cleanup()
        for pc in made:
            for ctrl in V1_HIERARCHIES:
                assert not os.path.exists(cg.dir(ctrl, pc.rel)), (ctrl, pc.rel)
        wait_until(lambda: len(hook.state) == 0, "the hook to forget the removed pods")
    assert not _probe_leftovers()


def test_systemd_driver_rules_resolve_real_dirs(tmp_path):
    """Both drivers' path rules against real cgroup v1 directories: the systemd layout is
    made by hand under /sys/fs/cgroup/cpu (only what did not exist; removed at the end)."""
    cg = CgroupFs(CG)
    pods = []
    for cls, prefix in ((KubeQosClass.BURSTABLE, "kubepods-burstable"),
                        (KubeQosClass.BESTEFFORT, "kubepods-besteffort"),
                        (KubeQosClass.GUARANTEED, "kubepods")):
        uid = str(uuid.uuid4())
        pods.append((cls, uid, f"{prefix}-pod{uid.replace('-', '_')}.slice", uuid.uuid4().hex * 2))
    created: List[str] = []

    def mkdir(path: str) -> None:
        if not os.path.isdir(path):
            os.mkdir(path)
            created.append(path)

    try:
        mkdir(f"{CG}/cpu/kubepods.slice")
        for cls, uid, leaf, cid in pods:
            mid = "" if cls is KubeQosClass.GUARANTEED else f"/kubepods-{cls.value}.slice"
            pod_dir = f"{CG}/cpu/kubepods.slice{mid}/{leaf}"
            mkdir(os.path.dirname(pod_dir))
            mkdir(pod_dir)
            mkdir(f"{pod_dir}/cri-containerd-{cid}.scope")

        assert Driver.SYSTEMD in cg.drivers_present()
        for cls, uid, leaf, cid in pods:
            pc = parse_cgroup_parent(leaf)
            assert (pc.driver, pc.kube_class, pc.uid) == (Driver.SYSTEMD, cls, uid)
            assert parse_cgroup_parent("/" + pc.rel) == pc           # the expanded form
            assert pod_cgroup_for(Driver.SYSTEMD, cls, uid) == pc
            assert os.path.isdir(cg.dir("cpu", pc.rel))
            assert os.path.isdir(cg.dir("cpu", pc.container_rel(cid)))
            assert pc.container_rel(cid).endswith(f"/cri-containerd-{cid}.scope")
            assert cg.locate_pod(uid) == pc                          # found by UID alone
            for bad in (f"{leaf}/../../x", f"/other.slice/{leaf}", f"kubepods.slice/../{leaf}",
                        f"/kubepods.slice/kubepods.slice/{leaf}"):
                with pytest.raises(InvalidCgroupPath):
                    parse_cgroup_parent(bad)
            with pytest.raises(InvalidCgroupPath):
                pc.container_rel("../" + cid[3:])

        # A pod recorded without cgroup_parent (start-up resync) is adopted under the
        # systemd layout; nothing is written on this kernel.
        workdir = str(tmp_path / "hook")
        cfg = QosConfig(reconcile_interval_seconds=0)
        cfg.resctrl.enabled = False
        hook = QosHook(cfg, _hook_paths(CG, str(tmp_path / "no-resctrl"), "/proc", workdir))
        cls, uid, leaf, cid = pods[0]
        hook.resync([PodRecord(sandbox_id="f" * 64, uid=uid, name="sd", namespace=NS)], [])
        managed = hook.state.by_uid(uid)
        assert managed is not None and managed.cgroup == parse_cgroup_parent(leaf)
        assert managed.level.value == "LS" and managed.source == "kube_class"
        counts = hook.run_once()
        assert counts.pods == 1 and counts.rewritten == 0 and counts.errors == 0 and counts.forgotten == 0
    finally:
        for path in reversed(created):
            try:
                os.rmdir(path)
            except OSError as e:  # pragma: no cover
                print(f"could not remove {path}: {e}")
    assert not any(os.path.exists(p) for p in created)
    assert not _probe_leftovers()


# ------------------------------------------------------------- the decision in the JSON log

def test_qos_level_log_line_names_the_level(containerd, tmp_path):
    """The `qos level` decision line says which level the pod got, under ``qos_level``
    (``level`` is the log severity in the daemon's JSON lines)."""
    fk = _fake_kernel(str(tmp_path / "host"))
    workdir = str(tmp_path / "proxy")
    hook = _qos_hook(workdir, QosConfig(reconcile_interval_seconds=0),
                     _hook_paths(fk.paths.cgroup_root, fk.paths.resctrl_root, fk.paths.proc_root, workdir))
    with _proxied(containerd, workdir, [hook]) as (p, kl):
        uid, _, _ = _new_pod_cgroup(fk, "burstable")
        kl.run_pod(name="level-in-log", namespace=NS, uid=uid, annotations={QOS: "BE"})
        assert hook.state.by_uid(uid).level.value == "BE"
        dec = _lines(p, "qos level", pod=f"{NS}/level-in-log")
        assert dec
        assert dec[-1]["qos_level"] == "BE" and dec[-1]["level"] == "info", dec[-1]
