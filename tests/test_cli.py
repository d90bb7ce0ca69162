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
