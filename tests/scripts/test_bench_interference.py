"""scripts/bench_interference.py's own parts: the kubelet's layout it builds on the real cgroup
tree and removes, arms that put back every value they change, a short run that prints every
arm and leaves nothing behind, also when interrupted. Its figures and its conclusion are the
benchmark's to print, never asserted here."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time

import pytest

from anolisnuma.testing.proxy import REPO_ROOT

SCRIPT = os.path.join(REPO_ROOT, "scripts", "bench_interference.py")
CPU_V1 = "/sys/fs/cgroup/cpu/cpu.shares"
needs_v1_root = pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists(CPU_V1),
                                   reason="makes cgroups in the real cgroup v1 tree: needs root and cgroup v1")


def _load():
    spec = importlib.util.spec_from_file_location("bench_interference", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


bench = _load()


def _left_by(pid: int):
    """What a run of process ``pid`` could leave: cgroup trees, its work directory, workers."""
    name = bench.NAME_PREFIX + str(pid)
    places = [os.path.join("/sys/fs/cgroup", c, name) for c in bench.CONTROLLERS] + [f"/tmp/{name}"]
    dirs = [p for p in places if os.path.exists(p)]
    workers = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if f"\0--parent\0{pid}\0".encode() in f.read():
                    workers.append(int(entry))
        except (OSError, ValueError):
            pass
    return dirs, workers


def _run(*args: str, **kw) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=REPO_ROOT)
    return subprocess.Popen([sys.executable, SCRIPT, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=REPO_ROOT, **kw)


@needs_v1_root
def test_the_layout_is_the_kubelets_and_every_arm_puts_its_values_back():
    # a name no other run's sweep takes for a killed run's (its suffix is not a pid)
    tree = bench.Tree(f"{bench.NAME_PREFIX}test-{os.getpid()}")
    pods = bench.Pods.new()
    try:
        bench.build_layout(tree, pods, ncpu=2)
        for c in tree.controllers:
            assert os.path.isdir(tree.path(c, pods.be_container)) and os.path.isdir(tree.path(c, pods.ls_container))
        shares = {rel: tree.read("cpu", rel, "cpu.shares")
                  for rel in ("kubepods", "kubepods/burstable", "kubepods/besteffort", pods.ls_pod, pods.be_container)}
        assert shares == {"kubepods": "2048", "kubepods/burstable": "1024", "kubepods/besteffort": "2",
                          pods.ls_pod: "1024", pods.be_container: "2"}
        assert tree.read("cpuset", pods.be_container, "cpuset.cpus") == tree.read("cpuset", "", "cpuset.cpus") != ""

        before = tree.settable()
        for arm in bench.issue_arms(pods, ncpu=2, period_us=100000):
            undo = tree.apply(arm.writes)
            for w in arm.writes:
                assert tree.read(w.controller, w.rel, w.file) == w.value
            tree.apply(undo)
            assert tree.settable() == before, arm.key   # cpu.idle back to 0 gives the class its 2 shares again
    finally:
        assert tree.remove() == []
    assert not any(os.path.exists(tree.path(c)) for c in bench.CONTROLLERS)


def test_a_killed_runs_leftovers_are_swept_and_nothing_else(tmp_path):
    root, tmp = tmp_path / "cgroup", tmp_path / "tmp"
    dead = subprocess.Popen(["true"])
    dead.wait()
    mine = f"{bench.NAME_PREFIX}{dead.pid}"
    for c in ("cpu", "memory"):
        (root / c / mine / "kubepods" / "besteffort").mkdir(parents=True)
        (root / c / "someone-elses").mkdir(parents=True)
    # a run still going (its command line names the script), and a pid now reused by a
    # process that is not the benchmark (this test's own: its run was killed long ago)
    running = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", "bench_interference.py"],
                               stdin=subprocess.PIPE)
    try:
        (root / "cpu" / f"{bench.NAME_PREFIX}{running.pid}").mkdir()
        reused = root / "cpu" / f"{bench.NAME_PREFIX}{os.getpid()}"
        reused.mkdir()
        (tmp / mine).mkdir(parents=True)
        (tmp / mine / "samples").write_bytes(b"x")

        removed = bench.sweep_stale(str(root), str(tmp))
    finally:
        running.communicate(b"", timeout=30)

    assert sorted(removed) == sorted([str(root / "cpu" / mine), str(root / "memory" / mine), str(reused),
                                      str(tmp / mine)])
    assert sorted(os.listdir(root / "cpu")) == sorted(["someone-elses", f"{bench.NAME_PREFIX}{running.pid}"])
    assert os.listdir(tmp) == []


def test_every_arm_runs_once_a_round_in_a_changing_order():
    arms = [bench.Arm(k, k) for k in "abcd"]
    order = list(bench.run_order(arms, 4))
    by_round = [[a.key for r, a in order if r == i] for i in range(4)]
    assert all(sorted(keys) == list("abcd") for keys in by_round)
    assert len({tuple(keys) for keys in by_round}) == 4
    assert len({keys[0] for keys in by_round}) == 4   # no arm always goes first


def test_samples_go_to_the_window_they_were_due_in():
    windows = [bench.Window("b", 0, 200, 300, 0.0), bench.Window("a", 0, 0, 100, 0.0)]
    due = [50, 99, 100, 150, 200, 299, 300]
    late = [1, 2, 3, 4, 5, 6, 7]
    assert bench.values_in(windows, due, late) == [[5, 6], [1, 2]]


@needs_v1_root
def test_a_short_run_prints_every_arm_and_leaves_nothing():
    proc = _run("--rounds", "1", "--seconds", "0.3", "--settle", "0.05", "--rr")
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err
    lines = out.splitlines()
    labels = ("LS alone", "kubelet defaults", "cpu.idle=1 on the BestEffort class", "cpu.idle=1 on the BE pod group",
              "CFS quota 50%", "anolisnuma on this kernel")
    tables = [i for i, line in enumerate(lines) if line.startswith("arm ")]
    assert len(tables) == 4, out   # each probe's figures, then its rounds
    for t in tables:
        assert [lines[t + 1 + i].startswith(label) for i, label in enumerate(labels)] == [True] * len(labels), out
    assert "What anolisnuma (python -m anolisnuma" in out
    assert [line.split(" p99 ")[0] for line in lines[-2:]] == ["LS wake-up", "LS request/response"]
    assert _left_by(proc.pid) == ([], [])


@needs_v1_root
def test_an_interrupted_run_removes_what_it_made():
    proc = _run("--seconds", "60")
    try:
        deadline = time.monotonic() + 60
        while not _left_by(proc.pid)[1] and time.monotonic() < deadline:   # measuring: the workers run
            time.sleep(0.1)
        time.sleep(0.5)
        assert _left_by(proc.pid)[0], "nothing was made"
        proc.send_signal(signal.SIGINT)
        err = proc.communicate(timeout=30)[1]
    finally:
        if proc.poll() is None:   # SIGTERM: the benchmark still removes what it made
            proc.terminate()
            proc.communicate(timeout=30)
    assert proc.returncode == 1 and "interrupted" in err
    assert _left_by(proc.pid) == ([], [])
