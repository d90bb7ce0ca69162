"""The command line: ``--version``, ``--check-config``, and start-up errors, run as the real
``python -m anolisnuma`` process."""

from __future__ import annotations

import os

import pytest

from anolisnuma import __version__
from anolisnuma.testing.proxy import config_dict, run_cli, write_config


def test_version():
    r = run_cli(["--version"])
    assert r.returncode == 0
    assert r.stdout.strip() == f"anolisnuma {__version__}"


def test_help_mentions_the_options():
    r = run_cli(["--help"])
    assert r.returncode == 0
    assert "--check-config" in r.stdout and "-c" in r.stdout


def test_check_config_valid(tmp_path):
    path = write_config(str(tmp_path / "ok.toml"), config_dict(str(tmp_path), "/run/containerd/containerd.sock"))
    r = run_cli(["-c", path, "--check-config"])
    assert r.returncode == 0, r.stderr
    assert "valid" in r.stdout


def bad_config(tmp_path, text: str) -> str:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("text,key", [
    ("[server]\nsocket_mode = 660\n", "server.socket_mode"),            # wrong type
    ("[server]\nsocket_mode = '0888'\n", "server.socket_mode"),         # bad value
    ("[runtime]\nendpoint = 'containerd.sock'\n", "runtime.endpoint"),  # relative path
    ("[runtime]\nendpoint = 42\n", "runtime.endpoint"),                 # wrong type
    ("[log]\nlevel = 'chatty'\n", "log.level"),                         # not a level
    ("[log]\nlevl = 'info'\n", "log.levl"),                             # unknown key
    ("[paths]\nstate_dir = 'var/lib'\n", "paths.state_dir"),
    ("[hooks.numa]\nfailure_policy = 'explode'\n", "hooks.numa.failure_policy"),
    ("[nonsense]\n", "nonsense"),                                       # unknown section
])
def test_check_config_names_the_bad_key(tmp_path, text, key):
    r = run_cli(["-c", bad_config(tmp_path, text), "--check-config"])
    assert r.returncode != 0
    assert key in r.stderr, r.stderr
    assert "invalid configuration" in r.stderr
    assert "Traceback" not in r.stderr


def test_check_config_syntax_error(tmp_path):
    r = run_cli(["-c", bad_config(tmp_path, "[server\nlisten = '/run/a.sock'\n"), "--check-config"])
    assert r.returncode != 0
    assert "not valid TOML" in r.stderr
    assert "Traceback" not in r.stderr


def test_missing_config_file(tmp_path):
    r = run_cli(["-c", str(tmp_path / "nope.toml"), "--check-config"])
    assert r.returncode != 0
    assert "nope.toml" in r.stderr and "Traceback" not in r.stderr


def test_running_with_a_bad_config_fails_before_listening(tmp_path):
    """Without --check-config the daemon also refuses an invalid file, naming the key."""
    r = run_cli(["-c", bad_config(tmp_path, "[server]\nlisten = 'relative.sock'\n")])
    assert r.returncode != 0
    assert "server.listen" in r.stderr


@pytest.mark.parametrize("text,key", [
    ("[runtime]\nconnect_timeout_seconds = nan\n", "runtime.connect_timeout_seconds"),
    ("[server]\nshutdown_grace_seconds = inf\n", "server.shutdown_grace_seconds"),
])
def test_numbers_that_are_not_finite_are_refused(tmp_path, text, key):
    r = run_cli(["--check-config", "-c", bad_config(tmp_path, text)])
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and key in r.stderr


def test_a_file_that_is_not_utf8_is_one_clean_line(tmp_path):
    path = tmp_path / "latin1.toml"
    path.write_bytes(b"[log]\nlevel = \"d\xe9bug\"\n")
    r = run_cli(["--check-config", "-c", str(path)])
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "not UTF-8" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("key", ["log.file", "server.listen", "paths.state_dir"])
def test_a_path_that_cannot_be_created_is_one_line_naming_its_key(tmp_path, key):
    from anolisnuma.testing.proxy import config_dict, write_config

    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    data = config_dict(str(tmp_path), str(tmp_path / "nobody.sock"))
    section, name = key.split(".")
    data[section][name] = str(blocker / "sub" / ("x.log" if name == "file" else "x.sock" if name == "listen" else "d"))
    r = run_cli(["-c", write_config(str(tmp_path / "c.toml"), data)], timeout=30)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and key in r.stderr and "Traceback" not in r.stderr


def test_a_socket_mode_open_to_everyone_is_warned_about(sockdir):
    from anolisnuma.testing.daemon_probes import wait_until
    from anolisnuma.testing.fake_cri import FakeCri
    from anolisnuma.testing.proxy import SubprocessProxy, config_dict, read_log

    with FakeCri(f"{sockdir}/cri.sock", containers=0, sandboxes=0) as fake:
        cfg = config_dict(sockdir, fake.socket_path, extra={"server": {"socket_mode": "0666"}})
        def warnings():
            return [line for line in read_log(cfg["log"]["file"]) if line.get("socket_mode") == "0o666"]

        # The socket answers (the proxy's start) a moment before the line is written.
        with SubprocessProxy(cfg, sockdir):
            found = wait_until(warnings, "the socket_mode warning in the log", timeout=30)
        assert found[0]["level"] == "warning"


def test_the_daemon_runs_on_uvloop_and_on_asyncio_without_it(monkeypatch):
    import asyncio
    import sys

    from anolisnuma import cli

    async def which_loop():
        return type(asyncio.get_running_loop()).__module__

    assert cli._run(which_loop()).startswith("uvloop")
    monkeypatch.setitem(sys.modules, "uvloop", None)      # a platform uvloop has no build for
    assert cli._run(which_loop()).startswith("asyncio")


def test_check_config_warns_when_the_runtime_endpoint_is_no_socket(tmp_path):
    """Valid (exit 0: containerd may start later), but said: missing, a file, a directory;
    a listening socket gives no warning."""
    import socket

    cases = {"missing": str(tmp_path / "nope.sock"), "a regular file": str(tmp_path / "file.sock"),
             "a directory": str(tmp_path / "dir.sock")}
    (tmp_path / "file.sock").write_text("")
    (tmp_path / "dir.sock").mkdir()
    for what, endpoint in cases.items():
        path = write_config(str(tmp_path / f"{what}.toml"), config_dict(str(tmp_path), endpoint))
        r = run_cli(["-c", path, "--check-config"])
        assert r.returncode == 0 and "valid" in r.stdout, r.stderr
        assert r.stderr.startswith(f"anolisnuma: warning: runtime.endpoint: {endpoint} "), (what, r.stderr)
        assert ("does not exist" if what == "missing" else f"is {what}, not a unix socket") in r.stderr
    sock_path = str(tmp_path / "ok.sock")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(sock_path)
        path = write_config(str(tmp_path / "ok.toml"), config_dict(str(tmp_path), sock_path))
        r = run_cli(["-c", path, "--check-config"])
    assert r.returncode == 0 and r.stderr == "", r.stderr


def kubeconfig_config(tmp_path) -> "tuple[str, str]":
    """(configuration file, kubeconfig): the kubeconfig holds its token inline, 0600, root's."""
    from anolisnuma.cluster.kubeconfig import render_kubeconfig

    kube = tmp_path / "kube"
    kube.mkdir()
    kubeconfig = kube / "kubeconfig"
    kubeconfig.write_text(render_kubeconfig("https://10.0.0.1:6443", "-----BEGIN CERTIFICATE-----\nMIIB\n"
                                            "-----END CERTIFICATE-----\n", token="a-token"))
    os.chmod(kubeconfig, 0o600)
    data = config_dict(str(tmp_path), "/run/containerd/containerd.sock",
                       extra={"kubernetes": {"kubeconfig": str(kubeconfig)}})
    return write_config(str(tmp_path / "c.toml"), data), str(kubeconfig)


def about_kubernetes(stderr: str) -> str:
    """The lines of ``stderr`` about ``[kubernetes]`` (the runtime endpoint's is not there)."""
    return "".join(line for line in stderr.splitlines(keepends=True) if "kubernetes." in line)


def test_check_config_warns_of_a_credential_others_may_read_as_the_daemon_does(tmp_path):
    # given a kubeconfig the daemon would use, and one it would use with a warning
    config, kubeconfig = kubeconfig_config(tmp_path)
    r = run_cli(["-c", config, "--check-config"])
    assert r.returncode == 0 and about_kubernetes(r.stderr) == "", r.stderr
    os.chmod(kubeconfig, 0o644)
    # when the configuration is checked
    r = run_cli(["-c", config, "--check-config"])
    # then it is valid, with the daemon's own warning
    assert r.returncode == 0 and "valid" in r.stdout, r.stderr
    assert about_kubernetes(r.stderr) == (
        f"anolisnuma: warning: kubernetes.kubeconfig: {kubeconfig} holds a credential and is readable by every user "
        f"(mode 0644): whoever reads it may act as this node on the API server; fix: chmod go-r {kubeconfig} (and "
        f"remove the ACL entry, if one grants it)\n")


def test_check_config_refuses_a_kubeconfig_the_daemon_refuses_at_start(tmp_path):
    """The repro of the issue: another user's kubeconfig, mode 0666, passed --check-config;
    the daemon then starts without the API server link."""
    # given a kubeconfig another user owns, that every user may write
    config, kubeconfig = kubeconfig_config(tmp_path)
    os.chown(kubeconfig, 65534, 65534)
    os.chmod(kubeconfig, 0o666)
    # when the configuration is checked
    r = run_cli(["-c", config, "--check-config"])
    # then it fails, naming the key, the file and the fix, in one line
    assert r.returncode == 2, r.stdout
    said = about_kubernetes(r.stderr)
    assert said.startswith(f"anolisnuma: invalid configuration: kubernetes.kubeconfig: unusable, the daemon would "
                           f"run without the API server link: {kubeconfig} is not safe to trust: {kubeconfig} is "
                           f"owned by uid 65534, not root")
    assert f"fix: chown root {kubeconfig}" in said and said.count("\n") == 1 and "Traceback" not in r.stderr
    assert "valid" not in r.stdout
