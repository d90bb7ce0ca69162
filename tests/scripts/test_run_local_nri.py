"""scripts/run-local.sh --nri: the daemon in NRI mode on a private containerd >= 1.7, and the
demo's account of it (two pods on the two nodes of the tests' fake topology, each pod's QoS
on every kernel family and on this kernel, the commands with this run's paths); and what
it refuses before it starts anything."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest
from test_run_local import (DEMO, DEMO_WIDTH, PRIVATE, SCRIPT, _processes_mentioning, containerd_pid, ctl_shown,
                            kill_if_running, unwrapped)

from anolisnuma.ctl.client import ask
from anolisnuma.testing.containerd import cgroup_hierarchies, oom_score_adj_restricted, release_of_version
from anolisnuma.testing.containerd_builds import build_named
from anolisnuma.testing.daemon_probes import wait_until
from anolisnuma.testing.doc_walkthrough import cut_sample_differs
from anolisnuma.testing.proxy import REPO_ROOT

BUILDS = [build_named(name) for name in ("1.7", "2.2")]   # NRI v0.8.0 and v0.11.0
DOC = os.path.join(REPO_ROOT, "docs", "nri.md")
# what differs between the document's run and this one, beyond the pids and containerd's IDs
# doc_walkthrough reads past
DOC_VOLATILE = [re.compile(p) for p in (
    r"(?<=--nri runs containerd ).*",             # the containerd: its version and directory
    r"(?<=with containerd )v\d+\.\d+\.\d+\b",      # its version, as it names itself to the plugin
    r"(?<=\(Linux )[^,]+",                         # the kernel's release
    r"\b[0-9a-f]{8}(?= \d+ [A-Z]+ )")]             # a pod's UID in `pods` (its first 8 digits)


def docs_sample() -> str:
    """docs/nri.md's sample of ``run-local.sh --nri --demo``: the "Try it" section's output."""
    with open(DOC) as f:
        section = f.read().split("\n## Try it\n", 1)[1].split("\n## ", 1)[0]
    (block,) = [text for language, text in re.findall(r"^```(\w*)\n(.*?)^```$", section, re.S | re.M) if not language]
    return block


def as_in_the_docs(text: str, swaps: dict) -> str:
    for ours in sorted(swaps, key=len, reverse=True):
        text = text.replace(ours, swaps[ours])
    return text


def kernel_cpus(parent: str, cid: str) -> str:
    mnt = next(m for m, ctrls in cgroup_hierarchies() if "cpuset" in ctrls)
    with open(os.path.join(mnt + parent, cid, "cpuset.cpus")) as f:
        return f.read().strip()


@pytest.mark.skipif(os.geteuid() != 0, reason="run-local.sh starts containerd: needs root")
@pytest.mark.parametrize("build", BUILDS, ids=[b.name for b in BUILDS])
def test_nri_demo_places_the_pods_on_two_fake_nodes_and_ctrl_c_says_what_it_stopped(sockdir, tmp_path, build):
    """Also that docs/nri.md's sample of it ("Try it") is what it printed, but for the lines
    the sample cuts (``…``; doc_walkthrough.cut_sample_differs): both texts unwrapped (the
    demo wraps at 100 columns, and this run's paths are not the defaults' length), this run's
    paths shown as the defaults the document's run had (``/run/anolisnuma``,
    ``/run/anolisnuma-containerd-nri``, ``/tmp/anolisnuma-containerd-nri``,
    ``/var/log/anolisnuma.log``, ``anolisnuma-ctl`` by name), and read past in both what is
    another at every run or on every machine: pids, containerd's IDs (hex), the pods' UIDs,
    containerd's version and directory (the sample is of 2.2.7; 1.7.34 prints the same
    lines), the kernel's release. Compared only on a machine like the document's (one NUMA
    node, asserted; no CAP_SYS_RESOURCE; a kernel of neither QoS family), as CI's are: on
    another the demo rightly prints other lines (none on restrict_oom_score_adj; what a QoS
    kernel let each pod write)."""
    if build.missing() is not None:
        pytest.skip(build.missing())
    runtime = f"containerd {build.version()}"   # as containerd names itself to the plugin
    # every path about as long as its default, so that the lines are as a user sees them
    base, run, run_dir, log = f"{sockdir}/ctd", f"{sockdir}/ctd-run", f"{sockdir}/run", f"{sockdir}/log"
    env = dict(os.environ, ANOLISNUMA_LISTEN=f"{sockdir}/local.sock", ANOLISNUMA_RUN_DIR=run_dir,
               ANOLISNUMA_BIN_DIR=str(tmp_path / "bin"), ANOLISNUMA_LOG_FILE=log,
               ANOLISNUMA_PRIVATE_CONTAINERD_BASE=base, ANOLISNUMA_PRIVATE_CONTAINERD_RUN=run,
               ANOLISNUMA_CONTAINERD_DIR=build.bin_dir)
    out = tmp_path / "out"
    with open(out, "w") as sink:
        script = subprocess.Popen(["bash", SCRIPT, "--nri", "--demo"], env=env, stdin=subprocess.DEVNULL,
                                  stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(lambda: "stay until this script ends" in out.read_text() or script.poll() is not None,
                   "the demo to finish", timeout=180)
        text = out.read_text()
        assert script.poll() is None, text
        said = unwrapped(text)
        status = ask(f"{run_dir}/admin.sock", "status", timeout=10)
        fe = status["front_end"]
        # the daemon in NRI mode on the private containerd's own NRI socket, registered
        assert (fe["mode"], fe["connected"], fe["socket"], fe["runtime"]) == (
            "nri", True, f"{run}/nri.sock", runtime)
        assert status["runtime_endpoint"] == f"{run}/containerd.sock"
        assert (f"demo: anolisnuma (pid {status['pid']}) runs in NRI mode, registered with {runtime} as "
                f"plugin 50-anolisnuma on {run}/nri.sock; the pods are made on containerd's socket "
                f"{run}/containerd.sock") in said, text
        restrict = "restrict_oom_score_adj = true" in open(f"{base}/config.toml").read()
        assert restrict == oom_score_adj_restricted()
        assert ("run-local: runs with restrict_oom_score_adj = true" in text) == restrict
        # two pods, each on a node of its own of the fake topology (said to be fake), as the
        # daemon tells it and as the kernel's cgroups read
        assert ("It is FAKE: this machine has one node, so placement reads the e2e tests' topology 2n-2c-e2e "
                f"from {run_dir}/demo-sys ([paths] sys_root)") in said, text
        nodes = {}
        for name in ("batch", "web"):
            pod = ask(f"{run_dir}/admin.sock", "explain", {"pod": f"anolisnuma-demo/{name}"}, timeout=10)[-1]
            (node,) = pod["numa"]["nodes"]
            (container,) = pod["pod"]["containers"]
            assert kernel_cpus(pod["pod"]["cgroup_parent"], container["id"]) == str(node)   # node N = CPU N
            assert (f"  NUMA  node {node}: cpus {node}, memory not pinned (balance (namespace)); its container's "
                    f"cgroup reads cpuset.cpus = {node}") in said, text
            nodes[name] = node
        assert sorted(nodes.values()) == [0, 1]
        assert fe["events"] > 0 and fe["events_failed"] == 0
        # each pod's QoS: its level, what it writes on each family, and what this kernel let it write
        for line in ("  QoS   BE (annotation anolisbox.sh/qoslevel=BE); what BE writes on each kernel family:",
                     "        openEuler: cpu.qos_level=-1, memory.qos_level=-1",
                     "        Alibaba Cloud Linux / Anolis: cpu.bvt_warp_ns=-1, memory.priority=0, "
                     "memory.use_priority_oom=1, memory.wmark_ratio=95, memory.wmark_scale_factor=20, "
                     "memory.wmark_min_adj=50",
                     "  QoS   LS (kube QoS class burstable maps to LS); what LS writes on each kernel family:",
                     "        openEuler: cpu.qos_level=0, memory.qos_level=0",
                     "        Alibaba Cloud Linux / Anolis: cpu.bvt_warp_ns=1, memory.priority=10, "
                     "memory.use_priority_oom=1, memory.wmark_ratio=95, memory.wmark_scale_factor=20, "
                     "memory.wmark_min_adj=-25"):
            assert line in said.splitlines(), f"{line!r} not in:\n{said}"
        family = status["knobs"]["family"]
        if family == "none":   # a mainline kernel, as these machines run
            here = f"        this kernel (Linux {os.uname().release}, neither family's files): nothing written"
            assert said.splitlines().count(here) == 2, text
        # the commands printed are this run's: its admin socket, containerd's socket; never a default path
        assert f"\n$ {ctl_shown()} --admin-socket {run_dir}/admin.sock pods\n" in text, text
        assert f"(all of it: {ctl_shown()} --admin-socket {run_dir}/admin.sock explain anolisnuma-demo/NAME)" in said
        assert f"demo.py --remove --socket {run}/containerd.sock" in said, text
        assert f"run-local: for a kubelet or crictl: unix://{run}/containerd.sock" in text
        for default in ("/run/anolisnuma/", "/var/run/anolisnuma", "/run/anolisnuma-containerd", "/var/run/nri"):
            assert default not in text, default
        assert max(len(line) for line in text.splitlines()) <= DEMO_WIDTH, text
        daemon, ctd = status["pid"], containerd_pid(base)
        os.killpg(script.pid, signal.SIGINT)  # Ctrl-C reaches the whole foreground group
        assert script.wait(timeout=60) == 130
    finally:
        kill_if_running(script, base, run)
    text = out.read_text()
    closing = text[text.index("run-local: the demo's pods stay"):].splitlines()[1:]
    assert closing == ["demo: anolisnuma-demo/batch removed", "demo: anolisnuma-demo/web removed",
                       "run-local: the demo's pods removed", f"run-local: anolisnuma (pid {daemon}) stopped",
                       f"run-local: the private containerd (pid {ctd}) stopped", f"run-local: removed {base} and {run}",
                       f"run-local: kept: {run_dir} (local.toml, local-state, demo-sys), {log}",
                       "run-local: ended (Ctrl-C)"], text
    assert max(len(line) for line in text.splitlines()) <= DEMO_WIDTH, text
    wait_until(lambda: not _processes_mentioning(f"{run_dir}/local.toml"), "the daemon to end with run-local.sh")
    assert not _processes_mentioning(base) and not _processes_mentioning(run)
    assert not os.path.exists(base) and not os.path.exists(run)
    if restrict and family == "none":
        printed = as_in_the_docs(unwrapped(text), {
            run_dir: "/run/anolisnuma", run: "/run/anolisnuma-containerd-nri", base: "/tmp/anolisnuma-containerd-nri",
            log: "/var/log/anolisnuma.log", ctl_shown(): "anolisnuma-ctl"})
        differs = cut_sample_differs(unwrapped(docs_sample()), printed, DOC_VOLATILE)
        assert differs is None, f"docs/nri.md's sample of the demo, against this run's:\n{differs}"


# ---------------------------------------------------------------- no containerd >= 1.7

def fake_containerd(directory, version_line: str, binaries=("containerd", "ctr", "containerd-shim-runc-v2")) -> str:
    """A directory whose binaries print ``version_line`` for --version (what a hostile or
    wrong ANOLISNUMA_CONTAINERD_DIR may hold)."""
    os.makedirs(directory, exist_ok=True)
    for name in binaries:
        path = os.path.join(directory, name)
        with open(path, "w") as f:
            f.write(f"#!/bin/sh\necho '{version_line}'\n")
        os.chmod(path, 0o755)
    return str(directory)


@pytest.mark.parametrize("given, said", [
    ({"version_line": "containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1"},
     "is 1.6.20~ds1: NRI needs 1.7 or later"),
    ({"version_line": "\x1b]0;owned\x07 garbage"}, "NRI needs 1.7 or later"),
    ({"version_line": "containerd x v2.2.7 y", "binaries": ("containerd", "ctr")},
     "containerd-shim-runc-v2 not found in"),
])
def test_check_nri_refuses_what_is_not_a_containerd_of_1_7_or_later(tmp_path, given, said):
    d = fake_containerd(tmp_path / "ctd-bin", **given)
    r = subprocess.run([sys.executable, PRIVATE, "check-nri"], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, ANOLISNUMA_CONTAINERD_DIR=d))
    assert r.returncode == 1 and said in r.stderr, r.stderr
    assert "https://github.com/containerd/containerd/releases" in r.stderr   # where to get one
    assert "\x1b" not in r.stderr and "\x07" not in r.stderr   # what it printed, escaped


def test_check_nri_names_the_containerd_it_would_run(tmp_path):
    d = fake_containerd(tmp_path / "ctd-bin", "containerd github.com/containerd/containerd v1.7.34 fb9028b9")
    r = subprocess.run([sys.executable, PRIVATE, "check-nri"], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, ANOLISNUMA_CONTAINERD_DIR=d))
    assert (r.returncode, r.stdout) == (0, f"private-containerd: --nri runs containerd v1.7.34 of {d}\n")


@pytest.mark.skipif(os.geteuid() != 0, reason="run-local.sh runs as root")
def test_nri_without_a_containerd_of_1_7_stops_before_it_starts_anything(sockdir, tmp_path):
    d = fake_containerd(tmp_path / "ctd-bin", "containerd github.com/containerd/containerd 1.6.20~ds1 x")
    base, run = str(tmp_path / "ctd"), f"{sockdir}/ctd-run"
    env = dict(os.environ, ANOLISNUMA_LISTEN=f"{sockdir}/local.sock", ANOLISNUMA_RUN_DIR=f"{sockdir}/run",
               ANOLISNUMA_BIN_DIR=str(tmp_path / "bin"), ANOLISNUMA_LOG_FILE=str(tmp_path / "local.log"),
               ANOLISNUMA_PRIVATE_CONTAINERD_BASE=base, ANOLISNUMA_PRIVATE_CONTAINERD_RUN=run,
               ANOLISNUMA_CONTAINERD_DIR=d)
    r = subprocess.run(["bash", SCRIPT, "--nri", "--demo"], env=env, stdin=subprocess.DEVNULL, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    assert f"the containerd of $ANOLISNUMA_CONTAINERD_DIR ({d}) is 1.6.20~ds1: NRI needs 1.7 or later" in r.stderr
    assert r.stderr.endswith("run-local: nothing was started\n")
    assert not os.path.exists(base) and not os.path.exists(run) and not os.path.exists(f"{sockdir}/run")
    assert not os.path.exists(tmp_path / "bin")


# ---------------------------------------------------------------- the pieces, pure

@pytest.mark.parametrize("bnd, eff, restricted", [
    ("000001fffeffffff", "000001fffeffffff", True),    # these VMs: bit 24 (CAP_SYS_RESOURCE) missing
    ("000001ffffffffff", "000001ffffffffff", False),
    ("000001ffffffffff", "0000000000000000", True),    # not effective: runc inherits none
    ("zz", "zz", True),                                # unreadable: the setting that works everywhere
])
def test_oom_score_adj_restriction_is_read_from_the_capabilities(tmp_path, bnd, eff, restricted):
    status = tmp_path / "status"
    status.write_text(f"Name:\tpython\nCapInh:\t0000000000000000\nCapEff:\t{eff}\nCapBnd:\t{bnd}\n")
    assert oom_score_adj_restricted(str(status)) is restricted
    assert oom_score_adj_restricted(str(tmp_path / "absent")) is True


def test_release_reads_build_names_and_version_words():
    assert [release_of_version(v) for v in ("1.7", "v2.2.7", "1.6.20~ds1", "garbage", "")] == [
        (1, 7), (2, 2), (1, 6), (0, 0), (0, 0)]


# ---------------------------------------------------------------- the demo's NRI checks

def demo_module(monkeypatch, statuses):
    """scripts/demo.py as a module whose admin socket answers ``statuses`` in turn."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("demo", DEMO)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    answers = iter(statuses)
    monkeypatch.setattr(module, "ask", lambda path, command, args=None, timeout=20.0: next(answers))
    monkeypatch.setattr(module.time, "sleep", lambda seconds: None)
    return module


def nri_status(**front_end):
    fe = {"mode": "nri", "socket": "/r/nri.sock", "connected": True, "runtime": "containerd v2.2.7",
          "registrations": 1, "synchronizes": 1, "last_disconnect": None}
    fe.update(front_end)
    return {"pid": 42, "listen": "/r/anolisnuma.sock", "runtime_endpoint": "/r/containerd.sock", "front_end": fe}


def demo_args(socket="/r/containerd.sock"):
    import argparse
    return argparse.Namespace(socket=socket, admin_socket="/r/admin.sock", daemon_pid=42)


def test_the_demo_makes_no_pod_for_a_daemon_on_another_containerds_nri(monkeypatch):
    demo = demo_module(monkeypatch, [nri_status()])
    why, _ = demo.not_our_daemon(demo_args(socket="/other/containerd.sock"))
    assert why == ("the daemon on /r/admin.sock (pid 42) takes its pods from the NRI of the containerd on "
                   "/r/containerd.sock, not /other/containerd.sock: it would not hear of the demo's pods")


def test_the_demo_waits_for_the_registration_not_the_connection(monkeypatch):
    # connected, then configured (containerd named), then synchronized: only then the pods
    statuses = [nri_status(runtime=None, registrations=0, synchronizes=0), nri_status(synchronizes=0),
                nri_status(), nri_status(events=7)]
    demo = demo_module(monkeypatch, statuses)
    why, status = demo.not_our_daemon(demo_args())
    assert why is None and status == statuses[2]


def test_the_demo_gives_up_on_a_plugin_never_registered_and_says_why(monkeypatch):
    demo = demo_module(monkeypatch, [nri_status(connected=False, last_disconnect="refused\x1b[2J")] * 3)
    monkeypatch.setattr(demo, "ADMIN_WAIT_SECONDS", 0.0)
    why, _ = demo.not_our_daemon(demo_args())
    assert why == ("the daemon (pid 42) is not registered with containerd's NRI on /r/nri.sock within 0s "
                   "(refused\x1b[2J)")   # (printed escaped, as every refusal of main())
