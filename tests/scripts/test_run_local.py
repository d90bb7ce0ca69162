"""scripts/run-local.sh: a local run that leaves nothing behind when it is stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from anolisnuma.testing.daemon_probes import wait_until
from anolisnuma.testing.proxy import REPO_ROOT, wait_for_socket

SCRIPT = os.path.join(REPO_ROOT, "scripts", "run-local.sh")
PRIVATE = os.path.join(REPO_ROOT, "scripts", "private-containerd")


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


@pytest.mark.skipif(os.geteuid() != 0, reason="run-local.sh runs as root")
def test_a_missing_config_file_is_one_line(tmp_path):
    r = subprocess.run(["bash", SCRIPT, "--config", str(tmp_path / "absent.toml")], capture_output=True,
                       text=True, timeout=300, env=dict(os.environ, ANOLISNUMA_BIN_DIR=str(tmp_path / "bin")))
    assert r.returncode == 2 and "no configuration file" in r.stderr
