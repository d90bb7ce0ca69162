"""scripts/run-local.sh: a local run that leaves nothing behind when it is stopped, and that never
runs, nor shows its demo, through another anolisnuma on the node."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest

from anolisnuma.ctl.client import ask
from anolisnuma.testing.daemon_probes import status_when_up, wait_until
from anolisnuma.testing.fake_cri import FakeCri, runtime_path
from anolisnuma.testing.proxy import REPO_ROOT, SubprocessProxy, config_dict, wait_for_socket
from anolisnuma.transport.listener import occupant

SCRIPT = os.path.join(REPO_ROOT, "scripts", "run-local.sh")
PRIVATE = os.path.join(REPO_ROOT, "scripts", "private-containerd")
DEMO = os.path.join(REPO_ROOT, "scripts", "demo.py")
VENV_CTL = os.path.join(os.environ.get("ANOLISNUMA_VENV", os.path.join(REPO_ROOT, ".venv")), "bin", "anolisnuma-ctl")
DEMO_WIDTH = 100   # the demo's lines (and run-local's, on paths as long as the defaults) at most



def kill_if_running(script: "subprocess.Popen[bytes]", base: str, run: str) -> None:
    """A test's end for a run-local.sh that did not stop (a failed assertion): kill its whole
    group, and stop the private containerd it left behind."""
    if script.poll() is None:
        os.killpg(script.pid, signal.SIGKILL)
        subprocess.run([sys.executable, PRIVATE, "stop", "--base", base, "--run", run], check=False)

def ctl_shown() -> str:
    """How the demo prints the anolisnuma-ctl it runs: by name when PATH's is that one."""
    on_path = shutil.which("anolisnuma-ctl")
    return "anolisnuma-ctl" if on_path and os.path.realpath(on_path) == os.path.realpath(VENV_CTL) else VENV_CTL

def unwrapped(text: str) -> str:
    """The demo's statements as one line each: it wraps them at 100 columns, greedily, so an
    indented line continues the one before exactly when its first word did not fit there."""
    out: list = []
    before = None   # the line above, as printed
    for line in text.split("\n"):
        words = line.split()
        if before is not None and words and line.startswith(" ") and len(before) + 1 + len(words[0]) > DEMO_WIDTH:
            out[-1] += " " + line.strip()
        else:
            out.append(line)
        before = line
    return "\n".join(out)


def containerd_pid(base: str) -> int:
    """The pid of the private containerd in ``base`` (its pidfile)."""
    with open(os.path.join(base, "containerd.pid")) as f:
        return int(f.read())


def _processes_mentioning(text: str):
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if text.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


@pytest.mark.skipif(os.geteuid() != 0, reason="run-local.sh starts containerd: needs root")
def test_sigterm_stops_the_proxy_and_the_private_containerd(sockdir, tmp_path):
    base, run = str(tmp_path / "ctd"), f"{sockdir}/ctd-run"
    env = dict(os.environ, ANOLISNUMA_LISTEN=f"{sockdir}/local.sock", ANOLISNUMA_RUN_DIR=str(tmp_path / "run"),
               ANOLISNUMA_BIN_DIR=str(tmp_path / "bin"), ANOLISNUMA_ENDPOINT=f"{sockdir}/nobody.sock",
               ANOLISNUMA_LOG_FILE=str(tmp_path / "local.log"),
               ANOLISNUMA_PRIVATE_CONTAINERD_BASE=base, ANOLISNUMA_PRIVATE_CONTAINERD_RUN=run)
    # its own process group: if the test fails, everything the script started is killed
    script = subprocess.Popen(["bash", SCRIPT], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_for_socket(f"{sockdir}/local.sock", timeout=120, alive=lambda: script.poll() is None)
        assert os.path.islink(tmp_path / "bin" / "anolisnuma")  # on PATH where asked
        config = str(tmp_path / "run" / "local.toml")
        assert _processes_mentioning(config), "the proxy is not running"
        assert _processes_mentioning(base), "no private containerd was started"
        ctd = containerd_pid(base)
        script.send_signal(signal.SIGTERM)
        assert script.wait(timeout=60) == 143
    finally:
        kill_if_running(script, base, run)
    said = script.stderr.read()
    assert said.endswith(f"run-local: the private containerd (pid {ctd}) stopped\nrun-local: removed {base} and {run}\n"
                         f"run-local: kept: {tmp_path}/run (local.toml, local-state), {tmp_path}/local.log\n"
                         f"run-local: ended (SIGTERM)\n"), said
    # (processes are reaped a moment after the script returned)
    wait_until(lambda: not _processes_mentioning(config), "the proxy to end with run-local.sh")
    wait_until(lambda: not _processes_mentioning(base), "the private containerd to end with run-local.sh")
    assert not os.path.exists(f"{sockdir}/local.sock")
    assert not os.path.exists("/var/lib/anolisnuma/store.json") or os.path.getmtime(
        "/var/lib/anolisnuma/store.json") < time.time() - 600  # the host's state dir untouched


@pytest.mark.skipif(os.geteuid() != 0, reason="run-local.sh starts containerd: needs root")
def test_demo_shows_the_two_pods_and_ctrl_c_removes_them(sockdir, tmp_path):
    """A newcomer's first look: --demo with a configuration file of their own."""
    base, run = str(tmp_path / "ctd"), f"{sockdir}/ctd-run"
    mine = tmp_path / "mine.toml"
    mine.write_text('[numa]\nnode_name = "my-node"\n[[numa.pin]]\nnamespace = "other"\nname = "x-*"\nnodes = [0]\n')
    env = dict(os.environ, ANOLISNUMA_LISTEN=f"{sockdir}/local.sock", ANOLISNUMA_RUN_DIR=str(tmp_path / "run"),
               ANOLISNUMA_BIN_DIR=str(tmp_path / "bin"), ANOLISNUMA_ENDPOINT=f"{sockdir}/nobody.sock",
               ANOLISNUMA_LOG_FILE=str(tmp_path / "local.log"),
               ANOLISNUMA_PRIVATE_CONTAINERD_BASE=base, ANOLISNUMA_PRIVATE_CONTAINERD_RUN=run)
    out = tmp_path / "out"
    with open(out, "w") as sink:
        script = subprocess.Popen(["bash", SCRIPT, "--config", str(mine), "--demo"], env=env,
                                  stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    try:
        wait_until(lambda: "stay until this script ends" in out.read_text() or script.poll() is not None,
                   "the demo to finish", timeout=180)
        text = unwrapped(out.read_text())
        assert script.poll() is None, text
        # both pods were created through the proxy and the daemon tells what it did: each on
        # a node of its own of the fake topology, said to be fake
        assert "anolisnuma-demo  batch" in text and "anolisnuma-demo  web" in text, text
        assert "runs as a proxy; the pods are made through its socket" in text, text
        assert "It is FAKE: this machine has one node" in text, text
        assert "  QoS   BE (annotation anolisbox.sh/qoslevel=BE); what BE writes on each kernel family:" in text
        assert "  NUMA  node 0: cpus 0, memory not pinned (balance (namespace)); its container's cgroup reads" in text
        assert "  NUMA  node 1: cpus 1, memory not pinned (balance (namespace)); its container's cgroup reads" in text
        assert f"$ {ctl_shown()} --admin-socket {tmp_path}/run/admin.sock pods" in text, text
        local = (tmp_path / "run" / "local.toml").read_text()
        assert 'node_name = "my-node"' in local and '"anolisnuma-demo"' in local  # the user's file, and the demo's
        ctd = containerd_pid(base)
        os.killpg(script.pid, signal.SIGINT)  # Ctrl-C reaches the whole foreground group
        assert script.wait(timeout=60) == 130
    finally:
        kill_if_running(script, base, run)
    text = out.read_text()
    assert "batch removed" in text and "web removed" in text
    assert f"run-local: the private containerd (pid {ctd}) stopped\nrun-local: removed {base} and {run}\n" in text
    assert text.endswith(f"run-local: kept: {tmp_path}/run (local.toml, local-state, demo-sys), "
                         f"{tmp_path}/local.log\nrun-local: ended (Ctrl-C)\n"), text
    assert not _processes_mentioning(base), "the private containerd outlived run-local.sh"


@pytest.mark.skipif(os.geteuid() != 0, reason="run-local.sh starts containerd: needs root")
def test_a_private_containerd_already_running_is_used_and_left_to_its_owner(sockdir, tmp_path):
    """Another run's containerd (a second run-local on paths of its own shares it) outlives this run."""
    base, run = str(tmp_path / "ctd"), f"{sockdir}/ctd-run"
    subprocess.run([sys.executable, PRIVATE, "start", "--cni", "--base", base, "--run", run], check=True,
                   stdout=subprocess.DEVNULL, timeout=120)
    env = dict(os.environ, ANOLISNUMA_LISTEN=f"{sockdir}/local.sock", ANOLISNUMA_RUN_DIR=str(tmp_path / "run"),
               ANOLISNUMA_BIN_DIR=str(tmp_path / "bin"), ANOLISNUMA_ENDPOINT=f"{sockdir}/nobody.sock",
               ANOLISNUMA_LOG_FILE=str(tmp_path / "local.log"),
               ANOLISNUMA_PRIVATE_CONTAINERD_BASE=base, ANOLISNUMA_PRIVATE_CONTAINERD_RUN=run)
    script = subprocess.Popen(["bash", SCRIPT], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_for_socket(f"{sockdir}/local.sock", timeout=120, alive=lambda: script.poll() is None)
        containerd = _processes_mentioning(base)
        assert containerd
        script.send_signal(signal.SIGTERM)
        assert script.wait(timeout=60) == 143
        assert "using the private one that already runs in" in script.stderr.read()
        wait_until(lambda: not _processes_mentioning(str(tmp_path / "run" / "local.toml")), "the proxy to end")
        assert set(containerd) <= set(_processes_mentioning(base)), "another run's containerd was stopped"
    finally:
        if script.poll() is None:
            os.killpg(script.pid, signal.SIGKILL)
        subprocess.run([sys.executable, PRIVATE, "stop", "--base", base, "--run", run], check=False)


@pytest.mark.skipif(os.geteuid() != 0, reason="run-local.sh runs as root")
def test_a_missing_config_file_is_one_line(tmp_path):
    r = subprocess.run(["bash", SCRIPT, "--config", str(tmp_path / "absent.toml")], capture_output=True,
                       text=True, timeout=300, env=dict(os.environ, ANOLISNUMA_BIN_DIR=str(tmp_path / "bin")))
    assert r.returncode == 2 and "no configuration file" in r.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="run-local.sh runs as root")
@pytest.mark.parametrize("mode", [[], ["--nri", "--demo"]])
def test_a_bad_config_file_is_judged_by_the_daemon_before_anything_is_started(sockdir, tmp_path, mode):
    # given: a file the daemon refuses (a misspelt key)
    bad = tmp_path / "bad.toml"
    bad.write_text("[numa]\nenabeld = true\n")
    base, run = str(tmp_path / "ctd"), f"{sockdir}/ctd-run"
    env = dict(os.environ, ANOLISNUMA_LISTEN=f"{sockdir}/local.sock", ANOLISNUMA_RUN_DIR=f"{sockdir}/run",
               ANOLISNUMA_BIN_DIR=str(tmp_path / "bin"), ANOLISNUMA_ENDPOINT=f"{sockdir}/nobody.sock",
               ANOLISNUMA_LOG_FILE=str(tmp_path / "local.log"),
               ANOLISNUMA_PRIVATE_CONTAINERD_BASE=base, ANOLISNUMA_PRIVATE_CONTAINERD_RUN=run)
    # when
    r = subprocess.run(["bash", SCRIPT, "--config", str(bad), *mode], env=env, stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=300)
    # then: the daemon's own words, and nothing started, linked or written
    assert r.returncode == 2, r.stderr
    assert "anolisnuma: invalid configuration: numa.enabeld" in r.stderr, r.stderr
    assert r.stderr.endswith(f"run-local: {bad} is not a configuration the daemon can run; nothing was started\n")
    assert not os.path.exists(base) and not os.path.exists(run) and not os.path.exists(f"{sockdir}/run")
    assert not os.path.exists(tmp_path / "bin") and not os.path.exists(tmp_path / "local.log")
    assert not _processes_mentioning(base)


# ---------------------------------------------------------------- another daemon already there

def first_daemon(sockdir, tmp_path, backend, **sockets):
    """Another anolisnuma on this node, serving ``listen`` and its admin socket ``admin``."""
    data = config_dict(str(tmp_path / "first"), backend, listen=sockets.get("listen", f"{sockdir}/first.sock"),
                       extra={"admin": {"socket": sockets["admin"]}, "log": {"stderr": False}})
    first = SubprocessProxy(data, str(tmp_path), name="first").start()
    return first, wait_until(lambda: status_when_up(sockets["admin"]), "the first daemon's admin socket")


@pytest.mark.skipif(os.geteuid() != 0, reason="run-local.sh runs as root")
@pytest.mark.parametrize("held", ["admin socket", "both sockets"])
def test_a_run_on_paths_another_daemon_serves_stops_before_it_starts_anything(sockdir, tmp_path, held):
    # given: another anolisnuma serving the admin socket this run would take (and its CRI socket)
    run_dir, listen = f"{sockdir}/run", f"{sockdir}/local.sock"
    admin = f"{run_dir}/admin.sock"
    base = str(tmp_path / "ctd")
    fake = FakeCri(f"{sockdir}/containerd.sock", containers=0, sandboxes=0).start()
    first, before = first_daemon(sockdir, tmp_path, fake.socket_path, admin=admin,
                                 **({"listen": listen} if held == "both sockets" else {}))
    try:
        env = dict(os.environ, ANOLISNUMA_LISTEN=listen, ANOLISNUMA_RUN_DIR=run_dir,
                   ANOLISNUMA_BIN_DIR=str(tmp_path / "bin"), ANOLISNUMA_ENDPOINT=f"{sockdir}/nobody.sock",
                   ANOLISNUMA_LOG_FILE=str(tmp_path / "local.log"),
                   ANOLISNUMA_PRIVATE_CONTAINERD_BASE=base, ANOLISNUMA_PRIVATE_CONTAINERD_RUN=f"{sockdir}/ctd-run")
        env.pop("SUDO_USER", None)
        # when: a new user tries the demo
        r = subprocess.run(["bash", SCRIPT, "--demo"], env=env, stdin=subprocess.DEVNULL, capture_output=True,
                           text=True, timeout=300)
        # then: it stops, saying who holds what and what that would have cost
        assert r.returncode == 1, r.stderr
        said = [line for line in r.stderr.splitlines() if line.startswith("run-local: ")]
        pid = first.proc.pid
        cri = (f"run-local: this run's CRI socket is taken: another anolisnuma (pid {pid}) serves {listen} (it holds "
               f"{listen}.lock). Started anyway, this run's daemon could not listen, and the calls made to that "
               f"socket (the demo's too) would reach that daemon.")
        own = (f"run-local: this run's admin socket is taken: another anolisnuma (pid {pid}) serves {admin} (it holds "
               f"{admin}.lock). Started anyway, this run's daemon would go without an admin socket, and "
               f"anolisnuma-ctl (the demo's too) would show that daemon's pods.")
        assert said == ([cri] if held == "both sockets" else []) + [
            own, "run-local: nothing was started. Stop that daemon, or run this one on paths of its own:"]
        # and the exact command that runs it on paths of its own, with every override it was given
        command = shlex.split(r.stderr.splitlines()[-1])
        assert command[-2:] == [SCRIPT, "--demo"]
        overrides = dict(word.split("=", 1) for word in command[:-2])
        assert overrides["ANOLISNUMA_RUN_DIR"] == f"{run_dir}-2"
        assert overrides["ANOLISNUMA_LOG_FILE"] == str(tmp_path / "local-2.log")
        assert overrides["ANOLISNUMA_LISTEN"] == (f"{run_dir}-2/anolisnuma.sock" if held == "both sockets" else listen)
        assert overrides["ANOLISNUMA_PRIVATE_CONTAINERD_BASE"] == base
        assert occupant(f"{run_dir}-2/admin.sock") is None and occupant(overrides["ANOLISNUMA_LISTEN"]) is None
        # nothing was started or written, and the other daemon was not talked to
        assert not os.path.exists(f"{run_dir}/local.toml") and not os.path.exists(tmp_path / "bin")
        assert not _processes_mentioning(base)
        after = ask(admin, "status", timeout=10)
        assert after["pid"] == pid and after["pipeline"] == before["pipeline"]   # not one CRI call
        assert ask(admin, "pods", timeout=10) == []
    finally:
        first.stop()
        fake.stop(0)


def test_the_demo_makes_no_pod_when_the_admin_socket_is_another_daemons(sockdir, tmp_path):
    """What a daemon that took the admin socket since run-local's check would cost: nothing."""
    admin = f"{sockdir}/admin.sock"
    fake = FakeCri(f"{sockdir}/containerd.sock", containers=0, sandboxes=0).start()
    first, _ = first_daemon(sockdir, tmp_path, fake.socket_path, admin=admin)
    try:
        ours = SubprocessProxy(config_dict(str(tmp_path / "ours"), fake.socket_path, listen=f"{sockdir}/ours.sock",
                                           extra={"log": {"stderr": False}}), str(tmp_path), name="ours").start()
        try:
            r = subprocess.run([sys.executable, DEMO, "--socket", ours.socket_path, "--admin-socket", admin,
                                "--daemon-pid", str(ours.proc.pid)], capture_output=True, text=True, timeout=60)
        finally:
            ours.stop()
        assert r.returncode == 1 and r.stdout == ""
        assert r.stderr == (f"demo: another anolisnuma (pid {first.proc.pid}, serving {first.socket_path}) answers on "
                            f"{admin}, not the daemon this demo is for (pid {ours.proc.pid}): anolisnuma-ctl would "
                            f"show its pods; no pod was made\n")
        assert fake.calls(runtime_path("RunPodSandbox")) == 0
    finally:
        first.stop()
        fake.stop(0)


# ---------------------------------------------------------------- the configuration it runs

def local_config(monkeypatch, nodes: int, cpus: list):
    """scripts/local_config.py as a module, on a machine of ``nodes`` NUMA nodes and ``cpus``."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("local_config", os.path.join(REPO_ROOT, "scripts", "local_config.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "real_nodes_with_cpus", lambda sys_root="/sys": nodes)
    monkeypatch.setattr(module, "online_cpus", lambda sys_root="/sys": cpus)
    return module


PATHS = ["--endpoint", "/r/containerd.sock", "--listen", "/r/a.sock", "--state", "/r/state", "--log", "/r/log",
         "--admin", "/r/admin.sock"]


def test_the_run_config_is_the_users_file_with_this_runs_paths(monkeypatch, tmp_path):
    import tomllib

    from anolisnuma.testing.fake_sysfs import GIB, FakeTopology
    # given: a file of the user's with [nri] and [numa] keys of their own
    mine = tmp_path / "mine.toml"
    mine.write_text('[nri]\nplugin_index = "60"\n[numa]\nnamespaces = ["x"]\n')
    module = local_config(monkeypatch, nodes=1, cpus=[0, 1])
    sys_root = tmp_path / "demo-sys"
    # when
    assert module.main([str(mine), str(tmp_path / "local.toml"), *PATHS, "--nri", "/r/nri.sock",
                        "--demo", str(sys_root), "--write-topology"]) == 0
    # then: this run's paths, NRI on its socket, NUMA over the fake two nodes, the user's keys kept
    with open(tmp_path / "local.toml", "rb") as f:
        data = tomllib.load(f)
    assert (data["runtime"]["endpoint"], data["server"]["listen"], data["admin"]["socket"]) == (
        "/r/containerd.sock", "/r/a.sock", "/r/admin.sock")
    assert data["nri"] == {"enabled": True, "socket": "/r/nri.sock", "plugin_index": "60"}
    assert data["numa"]["namespaces"] == ["anolisnuma-demo", "x"] and data["numa"]["enabled"] is True
    assert (data["paths"]["sys_root"], data["numa"]["memory_pinning"]) == (str(sys_root), "off")
    # tests/e2e/test_numa_e2e.py's two_node_topology()
    expected = FakeTopology(name="2n-2c-e2e", node_cpus={0: "0", 1: "1"}, distances=[[10, 20], [20, 10]],
                            memory_bytes={0: 2 * GIB, 1: 2 * GIB})
    assert (sys_root / "FAKE").read_text() == f"{expected.name}: node 0 = CPU 0, node 1 = CPU 1\n"
    assert expected.topology(str(tmp_path / "e2e")) == expected.topology(str(sys_root))
    from anolisnuma.config import Config
    Config.load(str(tmp_path / "local.toml"))   # one the daemon runs


@pytest.mark.parametrize("nodes, cpus", [(2, [0, 1, 2, 3]), (1, [0])])
def test_the_demo_reads_the_real_topology_where_it_has_two_nodes_or_one_cpu(monkeypatch, tmp_path, nodes, cpus):
    import tomllib
    module = local_config(monkeypatch, nodes=nodes, cpus=cpus)
    assert module.main([str(os.path.join(REPO_ROOT, "config.toml")), str(tmp_path / "local.toml"), *PATHS,
                        "--demo", str(tmp_path / "demo-sys"), "--write-topology"]) == 0
    with open(tmp_path / "local.toml", "rb") as f:
        data = tomllib.load(f)
    assert data["paths"]["sys_root"] == "/sys" and data["numa"]["memory_pinning"] != "off"
    assert not (tmp_path / "demo-sys").exists()


def test_a_file_that_is_no_toml_is_one_line_and_writes_nothing(monkeypatch, tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text("[numa\n")
    assert local_config(monkeypatch, 1, [0, 1]).main([str(bad), str(tmp_path / "local.toml"), *PATHS]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"run-local: {bad}") and err.count("\n") == 1
    assert not (tmp_path / "local.toml").exists()
