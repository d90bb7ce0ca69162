"""``anolisnuma-ctl`` without a daemon: which admin socket it asks, its one-line errors and
exit codes, its tables, and that it is installed as a console script."""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import subprocess
import sys
from typing import Tuple

import pytest

from anolisnuma.ctl import main as ctl
from anolisnuma.ctl.render import human_bytes, human_duration
from anolisnuma.ctl.table import fields, printable, table

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(*args: str) -> Tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = ctl.main(list(args))
        except SystemExit as e:
            code = int(e.code or 0)
    return code, out.getvalue(), err.getvalue()


def socket_for(*args: str) -> str:
    return ctl.admin_socket(ctl.build_parser().parse_args(list(args) + ["status"]))


# ---------------------------------------------------------------- which socket

def test_the_admin_socket_comes_from_the_option_then_the_configuration_then_the_default(tmp_path, monkeypatch):
    conf = tmp_path / "config.toml"
    conf.write_text('[admin]\nsocket = "unix:///run/x/admin.sock"\n')
    assert socket_for("-c", str(conf)) == "/run/x/admin.sock"
    assert socket_for("-c", str(conf), "--admin-socket", "/tmp/other.sock") == "/tmp/other.sock"
    conf.write_text("[server]\nlisten = '/run/a.sock'\n")
    assert socket_for("-c", str(conf)) == "/var/run/anolisnuma/admin.sock"
    monkeypatch.setattr(ctl, "DEFAULT_CONFIG", str(tmp_path / "absent.toml"))
    assert socket_for() == "/var/run/anolisnuma/admin.sock"


def test_a_configuration_that_turns_the_socket_off_or_cannot_be_read_is_one_line(tmp_path):
    conf = tmp_path / "config.toml"
    conf.write_text('[admin]\nsocket = ""\n')
    code, out, err = run("-c", str(conf), "status")
    assert (code, out) == (1, "")
    assert err == f'anolisnuma-ctl: the admin socket is turned off in {conf} ([admin] socket = "")\n'
    code, _, err = run("-c", str(tmp_path / "missing.toml"), "pods")
    assert code == 1 and err.startswith("anolisnuma-ctl: cannot read configuration file") and err.count("\n") == 1


def test_a_file_that_is_no_valid_configuration_is_refused_not_read_as_the_default_socket(tmp_path, monkeypatch):
    """The issue's case: `[admin] sockt = ...` (a typo) read as "no socket key", so the
    default socket, which may be another daemon's. Any error the daemon would refuse the
    file for counts: no daemon can have started from it as it is."""
    conf = tmp_path / "config.toml"
    hint = "; pass --admin-socket PATH to ask a daemon anyway\n"
    # given a named file with a typo in [admin]
    conf.write_text('[admin]\nsockt = "/run/x/admin.sock"\n')
    # then it is refused, naming the error and what was meant, before any socket is asked
    code, out, err = run("-c", str(conf), "status")
    assert (code, out) == (1, "")
    assert err == (f"anolisnuma-ctl: {conf} is not a valid configuration, so which daemon it names is not known: "
                   f"admin.sockt: unknown key (did you mean socket?)" + hint)
    # and so is one with errors elsewhere, counted; and the default file when it is invalid
    conf.write_text('[admin]\nsocket = "/run/x/admin.sock"\n[log]\nlevel = "loud"\n[servr]\n')
    monkeypatch.setattr(ctl, "DEFAULT_CONFIG", str(conf))
    code, _, err = run("pods")
    assert code == 1 and err == (f"anolisnuma-ctl: {conf} is not a valid configuration, so which daemon it names is "
                                 f"not known: log.level: must be one of debug, info, warning, error; got 'loud' "
                                 f"(and 1 more; anolisnuma --check-config -c {conf} lists them)" + hint)
    # and --admin-socket still reaches a daemon, whatever the file says
    assert socket_for("-c", str(conf), "--admin-socket", "/run/y.sock") == "/run/y.sock"


def test_a_hostile_configuration_is_one_short_line(tmp_path):
    conf = tmp_path / "config.toml"
    # given a file of 100,000 unknown keys, one with a terminal's escape codes, one that is not UTF-8
    conf.write_text("[admin]\n" + "".join(f"k{i}=1\n" for i in range(100_000)))
    code, _, err = run("-c", str(conf), "status")
    assert code == 1 and err.count("\n") == 1 and "admin.k0: unknown key (and 99999 more;" in err
    conf.write_text('[admin]\n"\\u001b[2J\\u001b]0;x\\u0007" = 1\nsocket = "/run/\\u001b[31m"\n')
    code, _, err = run("-c", str(conf), "status")
    assert code == 1 and err.count("\n") == 1 and "\x1b" not in err and "\x07" not in err
    assert "'admin.\\x1b[2J\\x1b]0;x\\x07': unknown key" in err
    conf.write_bytes(b'[admin]\nsocket = "/run/\xff.sock"\n')
    code, _, err = run("-c", str(conf), "status")
    assert code == 1 and err.count("\n") == 1 and "is not UTF-8 text" in err


def test_the_default_file_absent_or_unreadable_is_the_default_socket_and_a_named_one_is_refused(tmp_path,
                                                                                                 monkeypatch):
    """No default file: the daemon was started from another one or none, and the default
    socket is the packaged daemon's. One this user may not read: not root, and the admin
    socket is root's (asking says so). A file named with -c is what the operator meant:
    missing, it is refused."""
    monkeypatch.setattr(ctl, "DEFAULT_CONFIG", str(tmp_path / "absent.toml"))
    assert socket_for() == "/var/run/anolisnuma/admin.sock"
    code, _, err = run("-c", str(tmp_path / "absent.toml"), "status")
    assert (code, err) == (1, f"anolisnuma-ctl: cannot read configuration file {tmp_path / 'absent.toml'}: "
                              f"No such file or directory; pass --admin-socket PATH to ask a daemon anyway\n")
    if os.geteuid() != 0:
        return
    secret = tmp_path / "root-only.toml"
    secret.write_text('[admin]\nsocket = "/run/x/admin.sock"\n')
    os.chmod(secret, 0o600)
    os.chmod(tmp_path, 0o755)
    monkeypatch.setattr(ctl, "DEFAULT_CONFIG", str(secret))
    assert socket_for() == "/run/x/admin.sock"
    assert _as_nobody(lambda: (0, "", socket_for())) == (0, "/var/run/anolisnuma/admin.sock")


def test_the_process_refuses_an_invalid_file_with_exit_1(tmp_path):
    """The real process (``python -m anolisnuma.ctl.main``): stderr and exit status."""
    conf = tmp_path / "config.toml"
    conf.write_text("admin = 1\n")
    proc = subprocess.run([sys.executable, "-m", "anolisnuma.ctl.main", "-c", str(conf), "numa"], capture_output=True,
                          text=True, cwd=REPO, timeout=30)
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr == (f"anolisnuma-ctl: {conf} is not a valid configuration, so which daemon it names is not "
                           f"known: admin: must be a table, not an integer; pass --admin-socket PATH to ask a daemon "
                           f"anyway\n")


# ---------------------------------------------------------------- errors and exit codes

def test_no_daemon_is_one_line_and_exit_1(sockdir):
    path = os.path.join(sockdir, "admin.sock")
    code, out, err = run("--admin-socket", path, "status")
    assert (code, out, err) == (1, "", f"anolisnuma-ctl: the daemon is not running: there is no admin socket {path}\n")
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(path)    # a socket file left by a killed daemon
    dead.close()
    code, out, err = run("--admin-socket", path, "pods")
    assert (code, err) == (1, f"anolisnuma-ctl: the daemon is not running: nothing answers on {path}\n")


def test_a_user_who_is_not_root_is_told_so(sockdir):
    if os.geteuid() != 0:
        pytest.skip("needs root to become another user")
    path = os.path.join(sockdir, "admin.sock")
    os.chmod(sockdir, 0o755)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    os.chmod(path, 0o600)
    server.listen(1)
    try:
        code, err = _as_nobody(lambda: run("--admin-socket", path, "status"))
    finally:
        server.close()
    assert code == 1
    assert err == f"anolisnuma-ctl: permission denied on {path}: the admin socket is for root only\n"


def _as_nobody(fn):
    """``fn()`` -> (code, out, err) in a forked child running as nobody; (code, err)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            os.setgid(65534)
            os.setuid(65534)
            code, _, err = fn()
            os.write(w, json.dumps([code, err]).encode())
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while True:
        chunk = os.read(r, 65536)
        if not chunk:
            break
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return tuple(json.loads(data))


def test_a_daemon_that_refuses_says_why(sockdir):
    """An answer with ok=false is printed as the error line (exit 1)."""
    import threading

    path = os.path.join(sockdir, "admin.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)

    def answer() -> None:
        conn, _ = server.accept()
        conn.recv(65536)
        conn.sendall(b'{"ok": false, "error": "unknown command \'pods\'"}\n')
        conn.close()

    t = threading.Thread(target=answer)
    t.start()
    try:
        code, out, err = run("--admin-socket", path, "pods")
    finally:
        t.join(5)
        server.close()
    assert (code, out, err) == (1, "", "anolisnuma-ctl: unknown command 'pods'\n")


def test_usage_errors_exit_2():
    assert run()[0] == 2
    assert run("explain")[0] == 2            # POD is required
    assert run("-o", "yaml", "status")[0] == 2


def test_the_kubelet_switch_is_one_of_the_commands():
    code, out, _ = run("kubelet", "--help")
    assert code == 0 and "enable" in out and "disable" in out


# ---------------------------------------------------------------- rendering

def test_tables_align_columns_and_show_missing_values_as_a_dash():
    text = table(["NAME", "CPUS", "WHY"], [["web-0", "0-3", "balance (namespace)"], ["a-much-longer-name", None, ""],
                                          ["x", ["1", "2"], "two\nlines"]])
    assert text.splitlines() == [
        "NAME                CPUS  WHY",
        "web-0               0-3   balance (namespace)",
        "a-much-longer-name  -     -",
        "x                   1,2   two lines",
    ]
    assert fields([("uid", "1234"), ("cgroup parent", None)]).splitlines() == ["uid:            1234",
                                                                                "cgroup parent:  -"]


def test_control_format_and_separator_characters_are_shown_as_escapes():
    assert printable("web-0 \u00e9\u4e2d") == "web-0 \u00e9\u4e2d"          # letters of any script stay
    assert printable("a\x1b[2Kb\x07\x7f\x9b") == "a\\x1b[2Kb\\x07\\x7f\\x9b"
    assert printable("\u202eabc\u200b\u2028\ud800") == "\\u202eabc\\u200b\\u2028\\ud800"
    assert printable("one\ntwo\x1b", keep="\n") == "one\ntwo\\x1b"
    assert table(["A", "B"], [["\x1b]0;x\x07", "y"]]).splitlines()[1] == "\\x1b]0;x\\x07  y"


def test_sizes_and_durations_read_like_a_person_would_write_them():
    assert [human_bytes(n) for n in (0, 1295, 64 << 20, 3 << 30)] == ["0 B", "1.3 KiB", "64.0 MiB", "3.0 GiB"]
    assert [human_duration(s) for s in (5, 65, 3725, 90061)] == ["5s", "1m05s", "1h02m05s", "1d1h01m"]


# ---------------------------------------------------------------- installed

def test_it_is_a_console_script_of_the_package():
    import sys as _sys

    if _sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    assert scripts["anolisnuma-ctl"] == "anolisnuma.ctl.main:main"
    proc = subprocess.run([sys.executable, "-m", "anolisnuma.ctl.main", "--version"], capture_output=True, text=True,
                          cwd=REPO, timeout=30)
    assert proc.returncode == 0 and proc.stdout.startswith("anolisnuma-ctl ")
