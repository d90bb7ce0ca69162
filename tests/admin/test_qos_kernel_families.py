"""QoS through the real CRI path on each kernel family: the daemon, its QoS hook on a fake
kernel tree laid out as that family's kernel (cgroup v1 and v2), a fake containerd behind
it, a kubelet-like client in front; what reached each file, when, and what ``status`` and
``explain`` say about it.

- openEuler: every level gets exactly ``cpu.qos_level`` and ``memory.qos_level`` on the pod
  and each container cgroup, already in place when containerd receives RunPodSandbox and
  StartContainer (so no container runs a moment online), the memcg switch host-wide;
- Alibaba Cloud Linux: the same pods get exactly the Alibaba files, as before;
- both families' files: each file the kernel has; neither: nothing, and said;
- one pod online, offline, online again: the last refused, kept offline, said.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from typing import Any, Dict, Iterator, List, Tuple

import pytest
from conftest import Kubelet, Node

from anolisnuma.config import Config
from anolisnuma.testing.fake_cri import FakeCri, hex_id, runtime_path
from anolisnuma.testing.fake_kernel import FRESH_VALUES, FakeKernel, family_options
from anolisnuma.testing.proxy import REPO_ROOT, InProcessProxy, config_dict, write_config
from anolisnuma.testing.qos_defaults import ALINUX_CONTAINER_KNOBS, ALINUX_POD, OPENEULER
from cri_proto import api_pb2 as pb

QOS, KOORD, RUBIK = "anolisbox.sh/qoslevel", "koordinator.sh/qosClass", "volcano.sh/preemptable"

# name, kube class, annotations, labels -> level (every way a pod gets one)
PODS = [
    ("lse", "burstable", {QOS: "LSE"}, {}, "LSE"),
    ("lsr", "burstable", {}, {KOORD: "LSR"}, "LSR"),
    ("ls", "burstable", {}, {}, "LS"),
    ("be", "besteffort", {}, {}, "BE"),
    ("rubik-offline", "burstable", {RUBIK: "true"}, {}, "BE"),
    ("rubik-online", "besteffort", {RUBIK: "false"}, {}, "LS"),
]


def pod_writes(family: str, level: str) -> Tuple[Dict[str, int], Dict[str, int]]:
    """(pod cgroup, container cgroup) files and values a pod of ``level`` gets."""
    pod: Dict[str, int] = {}
    ctr: Dict[str, int] = {}
    if family in ("alinux", "both"):
        pod.update(ALINUX_POD[level])
        ctr.update({k: ALINUX_POD[level][k] for k in ALINUX_CONTAINER_KNOBS})
    if family in ("openeuler", "both"):
        pod.update(OPENEULER[level])
        ctr.update(OPENEULER[level])
    return pod, ctr


class SeenByContainerd:
    """The fake containerd's RunPodSandbox and StartContainer: answer as containerd does,
    and first note what the pod's (the container's) cgroup holds at that moment."""

    def __init__(self, fake: FakeCri, fk: FakeKernel) -> None:
        self.fk = fk
        self.at_run: Dict[str, Dict[str, str]] = {}     # pod name -> file -> value
        self.at_start: Dict[str, Dict[str, str]] = {}   # container id -> file -> value
        self.parents: Dict[str, str] = {}               # sandbox id -> cgroup_parent
        fake.set_reply(runtime_path("RunPodSandbox"), self.run)
        fake.set_reply(runtime_path("StartContainer"), self.start)

    def files(self, rel: str) -> Dict[str, str]:
        return {n: self.fk.cgroup.read(rel, n) for n in FRESH_VALUES if os.path.exists(self.fk.cgroup.file(rel, n))}

    def run(self, request: bytes, context: Any) -> Any:
        config = pb.RunPodSandboxRequest.FromString(request).config
        sandbox_id = hex_id(str(uuid.uuid4()))
        self.parents[sandbox_id] = config.linux.cgroup_parent
        self.at_run[config.metadata.name] = self.files(self.fk.layout.parse(config.linux.cgroup_parent).rel)
        return pb.RunPodSandboxResponse(pod_sandbox_id=sandbox_id)

    def start(self, request: bytes, context: Any) -> Any:
        cid = pb.StartContainerRequest.FromString(request).container_id
        for parent in self.parents.values():
            rel = self.fk.layout.parse(parent).container_rel(cid)
            if os.path.isdir(self.fk.cgroup.dirs(rel)[0]):
                self.at_start[cid] = self.files(rel)
        return pb.StartContainerResponse()


@contextlib.contextmanager
def daemon_on(family: str, version: int, base: str, sockdir: str, **qos: Any) -> Iterator[Tuple[Node, SeenByContainerd]]:
    fk = FakeKernel.temporary(**family_options(family, cgroup_version=version))
    fake = FakeCri(os.path.join(sockdir, "containerd.sock"), containers=0, sandboxes=0).start()
    seen = SeenByContainerd(fake, fk)
    data = config_dict(base, fake.socket_path, listen=os.path.join(sockdir, "cri.sock"), extra={
        "log": {"stderr": False}, "paths": fk.paths_table(),
        "qos": {"enabled": True, "reconcile_interval_seconds": 0, **qos},
        "admin": {"socket": os.path.join(sockdir, "admin.sock")}})
    path = write_config(os.path.join(base, "config.toml"), data)
    proxy = InProcessProxy(Config.load(path)).start()
    kubelet = Kubelet(proxy.address, fk)
    try:
        proxy.wait_resynced()
        yield Node(proxy, kubelet, fk, fake, path, data, data["admin"]["socket"]), seen
    finally:
        kubelet.close()
        proxy.stop()
        fake.stop(0)
        fk.close()


def cgroup_files(fk: FakeKernel) -> Dict[str, str]:
    """Every file of the fake cgroup tree and /proc/sys with its content."""
    out = {}
    for top in (fk.paths.cgroup_root, os.path.join(fk.paths.proc_root, "sys")):
        for d, _, files in os.walk(top):
            for f in files:
                with open(os.path.join(d, f)) as fh:
                    out[os.path.join(d, f)] = fh.read().strip()
    return out


def written(node: Node) -> List[Tuple[str, int]]:
    return sorted((e["path"], e["value"]) for e in node.proxy.log_lines() if e.get("message") == "knob written")


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("family", ["openeuler", "alinux", "both"])
def test_every_level_gets_exactly_its_familys_files(family, version, tmp_path, sockdir):
    with daemon_on(family, version, str(tmp_path), sockdir) as (node, seen):
        fk = node.kernel
        at_start_up = written(node)                       # the globals, written once at start
        before = cgroup_files(fk)
        made = {}
        for name, kube_class, ann, labels, level in PODS:
            pod = node.kubelet.run_started(name, kube_class=kube_class, annotations=ann, labels=labels)
            made[name] = (pod, level)
        node.settle()

        expected = []
        for name, (pod, level) in made.items():
            want_pod, want_ctr = pod_writes(family, level)
            rel = fk.layout.parse(pod.parent).rel
            crel = fk.layout.parse(pod.parent).container_rel(pod.containers["app"])
            # in place when containerd got the call: the pod cgroup at RunPodSandbox, the
            # container's at StartContainer (no container runs a moment at another level)
            assert {k: seen.at_run[name][k] for k in want_pod} == {k: str(v) for k, v in want_pod.items()}, name
            assert {k: seen.at_start[pod.containers["app"]][k] for k in want_ctr} == \
                {k: str(v) for k, v in want_ctr.items()}, name
            expected += [(fk.cgroup.file(rel, k), v) for k, v in want_pod.items()]
            expected += [(fk.cgroup.file(crel, k), v) for k, v in want_ctr.items()]
        # exactly these writes, nothing else; and no file but the pods' own changed
        assert sorted(set(written(node)) - set(at_start_up)) == sorted(set(expected))
        after = cgroup_files(fk)
        changed = {p for p in before if after.get(p) != before[p]}
        assert changed <= {p for p, _ in expected}
        assert {k for k, v in before.items() if k.startswith(fk.paths.proc_root)} == \
            {k for k in after if k.startswith(fk.paths.proc_root)}

        # the globals of the family: openEuler's memcg switch; Alibaba's class dirs, root, sysctl
        if family in ("openeuler", "both"):
            assert fk.proc.read_sysctl("vm/memcg_qos_enable") == "1"
            assert fk.cgroup.read("kubepods/besteffort", "cpu.qos_level") == "0"   # class dirs untouched
        if family in ("alinux", "both"):
            assert fk.cgroup.read("kubepods/besteffort", "cpu.bvt_warp_ns") == "-1"
            assert fk.proc.read_sysctl("sched_group_identity_enabled") == "1"

        # status names what it found and what it writes; explain what each pod got
        s = node.ctl_json("status")["knobs"]
        assert s["family"] == {"openeuler": "openeuler", "alinux": "alinux", "both": "alinux+openeuler"}[family]
        assert s["writes"]["levels"]["BE"]["pod"] == [f"{k}={v}" for k, v in pod_writes(family, "BE")[0].items()]
        for name, (pod, level) in made.items():
            [e] = node.ctl_json("explain", f"batch/{name}")
            assert e["qos"]["level"] == level and e["qos"]["knobs"]["family"] == s["family"]
            want_pod, _ = pod_writes(family, level)
            assert e["qos"]["knobs"]["set"] == sorted(f"{k}={v}" for k, v in want_pod.items())
            assert e["qos"]["knobs"]["unsupported"] == [] and e["qos"]["knobs"]["held"] == {}


def test_status_and_explain_on_openeuler_as_text(tmp_path, sockdir):
    with daemon_on("openeuler", 1, str(tmp_path), sockdir) as (node, _):
        node.kubelet.run_started("job", annotations={RUBIK: "true"})
        code, out, _ = node.ctl("status")
        assert code == 0
        assert ("kernel family:      openEuler (cpu.qos_level, memory.qos_level, vm.memcg_qos_enable); "
                "not found: Alibaba Cloud Linux / Anolis") in out
        assert "kernel knobs:       cpu.qos_level, memory.qos_level, vm.memcg_qos_enable" in out
        block = next(b for b in out.split("\n\n") if b.startswith("QOS WRITES ON THIS KERNEL"))
        rows = [line.split("  ", 1)[0] + " | " + line.split("  ", 1)[1].strip() for line in block.splitlines()[1:]]
        assert rows == [
            "level LSE, LSR, LS | pod: cpu.qos_level=0, memory.qos_level=0; containers: cpu.qos_level=0, "
            "memory.qos_level=0",
            "level BE | pod: cpu.qos_level=-1, memory.qos_level=-1; containers: cpu.qos_level=-1, memory.qos_level=-1",
            "host (sysctl) | vm.memcg_qos_enable=1"]
        # the other family is one line, not a row per file (resctrl, any kernel's, is listed)
        unsupported = next(b for b in out.split("\n\n") if b.startswith("UNSUPPORTED KNOB"))
        assert "resctrl.L3" in unsupported and "cpu.bvt_warp_ns" not in unsupported
        code, out, _ = node.ctl("explain", "batch/job")
        assert "qos:" in out and ("BE (annotation volcano.sh/preemptable=true (rubik: offline): BE); set cpu.qos_level=-1, "
                                  "memory.qos_level=-1") in out
        assert "volcano.sh/preemptable=true" in next(line for line in out.splitlines() if line.startswith("markings:"))
        explain = out
        code, status, _ = node.ctl("status")
    # docs/qos.md shows these two outputs ("How to check a node"): each line it shows is a
    # line they print (the status sample is cut where it says "...")
    samples = _doc_blocks(os.path.join(REPO_ROOT, "docs", "qos.md"), "### How to check a node")
    assert len(samples) == 2
    for sample, real in zip(samples, (status, explain)):
        printed = [" ".join(line.split()) for line in real.splitlines()]
        for line in sample:
            if line.strip() != "...":
                assert " ".join(line.split()) in printed, f"docs/qos.md shows {line!r}, which status/explain do not print"


def _doc_blocks(path: str, heading: str) -> List[List[str]]:
    """The lines of each plain fenced block under ``heading`` (up to the next heading)."""
    with open(path) as f:
        text = f.read()
    section = text.split(heading, 1)[1].split("\n#", 1)[0]
    blocks = section.split("```")
    return [b.strip("\n").splitlines() for i, b in enumerate(blocks) if i % 2 == 1 and not b.split("\n", 1)[0].strip()]


def test_a_tree_with_neither_family_writes_nothing_and_says_so(tmp_path, sockdir):
    with daemon_on("mainline", 1, str(tmp_path), sockdir) as (node, _):
        before = cgroup_files(node.kernel)
        node.kubelet.run_started("job", kube_class="besteffort")
        after = cgroup_files(node.kernel)
        assert {p: after[p] for p in before} == before and written(node) == []
        s = node.ctl_json("status")["knobs"]
        assert s["family"] == "none" and s["writes"]["levels"]["BE"] == {"pod": [], "container": []}
        code, out, _ = node.ctl("status")
        assert "kernel family:      none: neither Alibaba Cloud Linux / Anolis nor openEuler files" in out
        [e] = node.ctl_json("explain", "batch/job")
        assert e["qos"]["level"] == "BE" and e["qos"]["knobs"]["set"] == []
        assert {"cpu.bvt_warp_ns", "cpu.qos_level", "memory.qos_level"} <= set(e["qos"]["knobs"]["unsupported"])
        assert e["calls"][0]["decisions"]["qos"].startswith("BE: nothing written (not on this kernel: cpu.bvt_warp_ns, ")


@pytest.mark.parametrize("version", [1, 2])
def test_online_offline_online_through_the_cri_path(version, tmp_path, sockdir):
    with daemon_on("openeuler", version, str(tmp_path), sockdir) as (node, seen):
        fk, kubelet = node.kernel, node.kubelet
        uid = str(uuid.uuid4())
        rel = None
        for attempt, (value, want) in enumerate((("false", 0), ("true", -1), ("false", -1))):
            pod = kubelet.run_pod("flip", uid=uid, annotations={RUBIK: value}, make_cgroup=attempt == 0)
            kubelet.create(pod)
            kubelet.start(pod)
            rel = fk.layout.parse(pod.parent).rel
            crel = fk.layout.parse(pod.parent).container_rel(pod.containers["app"])
            assert seen.at_start[pod.containers["app"]]["cpu.qos_level"] == str(want), attempt
            assert {fk.cgroup.read(r, "cpu.qos_level") for r in (rel, crel)} == {str(want)}, attempt
            assert {fk.cgroup.read(r, "memory.qos_level") for r in (rel, crel)} == {str(want)}, attempt
            if attempt < 2:   # the kubelet stops a pod's sandbox before it makes the next one
                kubelet.call("StopPodSandbox", pb.StopPodSandboxRequest(pod_sandbox_id=pod.sandbox_id),
                             pb.StopPodSandboxResponse)
        node.settle()
        refused = [e for e in node.proxy.log_lines() if e.get("message") == "qos level refused: an offline pod is "
                   "not turned online"]
        assert len(refused) == 1 and (refused[0]["wanted"], refused[0]["qos_level"]) == ("LS", "BE")
        [e] = [x for x in node.ctl_json("explain", uid) if pod.sandbox_id in x["pod"]["sandbox_ids"]]
        assert e["qos"]["level"] == "BE" and e["qos"]["refused"].startswith("LS refused, kept at BE: ")
        assert not [x for x in node.proxy.log_lines() if x.get("message") in ("knob write refused", "hook failed")]
