"""The command line: ``--version``, ``--check-config``, and start-up errors, run as the real
``python -m anolisnuma`` process."""

from __future__ import annotations

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
