"""scripts/run-local.sh: a local run that leaves nothing behind when it is stopped, and that never
runs, nor shows its demo, through another anolisnuma on the node."""

from __future__ import annotations

import os
import shlex
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
        script.send_signal(signal.SIGTERM)
        assert script.wait(timeout=60) == 143
    finally:
        if script.poll() is None:
            os.killpg(script.pid, signal.SIGKILL)
            subprocess.run([sys.executable, PRIVATE, "stop", "--base", base, "--run", run], check=False)
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
        text = out.read_text()
        assert script.poll() is None, text
        # both pods were created through the proxy and the daemon tells what it did
        assert "anolisnuma-demo  be-anolisbox" in text and "anolisnuma-demo  numa-web" in text, text
        assert "qos:             BE (annotation anolisbox.sh/qoslevel=BE)" in text, text
        assert text.count("numa: placed on node 0") == 2, text
        local = (tmp_path / "run" / "local.toml").read_text()
        assert 'node_name = "my-node"' in local and '"anolisnuma-demo"' in local  # the user's file, and the demo's
        os.killpg(script.pid, signal.SIGINT)  # Ctrl-C reaches the whole foreground group
        assert script.wait(timeout=60) == 130
    finally:
        if script.poll() is None:
            os.killpg(script.pid, signal.SIGKILL)
            subprocess.run([sys.executable, PRIVATE, "stop", "--base", base, "--run", run], check=False)
    assert "be-anolisbox removed" in out.read_text() and "numa-web removed" in out.read_text()
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
