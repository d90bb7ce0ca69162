"""Socket activation (LISTEN_FDS): what the daemon takes over, in a child process started
the way systemd starts it (the socket as descriptor 3, LISTEN_PID = the child's pid)."""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import subprocess
import sys

import grpc
import pytest
from structlog.testing import capture_logs

from anolisnuma.testing.fake_cri import runtime_path
from anolisnuma.testing.proxy import config_dict, read_log, write_config
from anolisnuma.testing.socket_supervisor import BASH, SocketSupervisor
from anolisnuma.transport import activation
from anolisnuma.transport.listener import ListenerError, UnixListener

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROBE = """
import json, os
from anolisnuma.transport.activation import ActivationError, take_listen_fds
try:
    got = take_listen_fds()
    out = {"path": got.path if got else None, "ignored": got.ignored if got else None}
except ActivationError as e:
    out = {"error": str(e)}
out["env_left"] = sorted(k for k in os.environ if k.startswith("LISTEN_"))
print(json.dumps(out))
"""


def probe(sock: socket.socket, pid: str = "$$") -> dict:
    fd = sock.fileno()
    env = dict(os.environ, PYTHONPATH=REPO, LISTEN_FDS="1")
    r = subprocess.run([BASH, "-c", f'exec 3<&{fd} {fd}<&-; LISTEN_PID={pid}; export LISTEN_PID; exec "$@"',
                        "bash", sys.executable, "-c", PROBE], env=env, pass_fds=(fd,), capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_a_listening_unix_stream_socket_is_taken_and_the_variables_unset(tmp_path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(tmp_path / "a.sock"))
    s.listen(8)
    assert probe(s) == {"path": str(tmp_path / "a.sock"), "ignored": [], "env_left": []}


def test_variables_meant_for_another_process_are_ignored(tmp_path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(tmp_path / "a.sock"))
    s.listen(8)
    assert probe(s, pid="1") == {"path": None, "ignored": None, "env_left": []}


def test_a_datagram_or_unbound_socket_is_refused_with_what_it_is(tmp_path):
    d = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    d.bind(str(tmp_path / "d.sock"))
    assert "not a stream socket" in probe(d)["error"]
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(tmp_path / "b.sock"))   # bound, not listening
    assert "not listening" in probe(s)["error"]


def test_the_daemon_takes_the_socket_and_never_removes_it(tmp_path, fake):
    """Under a supervisor, with server.listen naming another path: systemd's socket wins,
    which the log says; restarts keep the same socket file; a second daemon started by hand
    on it is refused (the lock file still works)."""
    held = str(tmp_path / "held" / "an.sock")
    data = config_dict(str(tmp_path), fake.socket_path, extra={"log": {"stderr": False}})
    cfg = write_config(str(tmp_path / "a.toml"), data)
    sup = SocketSupervisor(held, [sys.executable, "-m", "anolisnuma", "-c", cfg],
                           env=dict(os.environ, PYTHONPATH=REPO), log_path=str(tmp_path / "out"))
    try:
        sup.start()
        inode = os.stat(held).st_ino
        log = read_log(data["log"]["file"])
        assert [e for e in log if e.get("message", "").startswith("the socket systemd passed is not at")]
        with grpc.insecure_channel(f"unix://{held}") as ch:
            version = ch.unary_unary(runtime_path("Version"))
            assert version(b"", timeout=10) is not None
            assert sup.restart() == 0
            assert version(b"", timeout=10) is not None   # same channel: reconnected to the new daemon
        assert os.stat(held).st_ino == inode
        assert not os.path.exists(data["server"]["listen"])   # never bound the configured path
        second = subprocess.run([sys.executable, "-m", "anolisnuma", "-c", write_config(
            str(tmp_path / "b.toml"), dict(data, server=dict(data["server"], listen=held)))],
            env=dict(os.environ, PYTHONPATH=REPO), capture_output=True, text=True, timeout=60)
        assert second.returncode != 0
        assert re.search(rf"another anolisnuma instance \(pid \d+\) is running on {re.escape(held)} ", second.stderr)
        stopped = [e for e in read_log(data["log"]["file"]) if e.get("message") == "anolisnuma stopped"]
        assert len(stopped) == 1 and sup.exits == [0]
    finally:
        sup.close()


# ------------------------------------------------------------------ systemd's socket, checked as ours

def test_a_socket_systemd_opened_to_every_user_is_narrowed_to_socket_mode(tmp_path, fake):
    """A ``SocketMode=0666`` drop-in: the daemon still serves the kubelet (root) on systemd's
    socket, says so in a warning naming both modes, and nobody else may connect."""
    held = str(tmp_path / "held" / "an.sock")
    data = config_dict(str(tmp_path), fake.socket_path, listen=held, extra={"log": {"stderr": False}})
    cfg = write_config(str(tmp_path / "a.toml"), data)
    sup = SocketSupervisor(held, [sys.executable, "-m", "anolisnuma", "-c", cfg], mode=0o666,
                           env=dict(os.environ, PYTHONPATH=REPO), log_path=str(tmp_path / "out"))
    try:
        sup.start()
        assert stat.S_IMODE(os.stat(held).st_mode) == 0o660
        (warning,) = [e for e in read_log(data["log"]["file"])
                      if e.get("message", "").startswith("the socket systemd passed let more users connect")]
        assert (warning["socket_mode"], warning["narrowed_to"], warning["systemd_socket"]) == ("0666", "0660", held)
        with grpc.insecure_channel(f"unix://{held}") as ch:
            assert ch.unary_unary(runtime_path("Version"))(b"", timeout=10) is not None
    finally:
        sup.close()


def passed_socket(tmp_path, monkeypatch, mode: int = 0o660) -> str:
    """A listening socket as systemd would pass it (``take_listen_fds`` answered with it)."""
    path = str(tmp_path / "run" / "an.sock")
    os.makedirs(os.path.dirname(path))
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.listen(8)
    os.chmod(path, mode)
    monkeypatch.setattr(activation, "take_listen_fds", lambda: activation.Inherited(s, path, []))
    return path


def test_a_socket_narrower_than_socket_mode_is_left_alone(tmp_path, monkeypatch):
    path = passed_socket(tmp_path, monkeypatch, 0o600)
    listener = UnixListener(path, 0o660, activation=True)
    with capture_logs() as logs:
        listener.open()
    listener.close()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and not [e for e in logs if e["log_level"] == "warning"]


def test_a_socket_of_another_owner_or_in_a_directory_others_may_write_is_refused(tmp_path, monkeypatch):
    path = passed_socket(tmp_path, monkeypatch)
    os.chown(path, 1000, 0)
    with pytest.raises(ListenerError) as e:
        UnixListener(path, 0o660, activation=True).open()
    assert str(e.value) == (f"the socket systemd passed, {path}, is owned by uid 1000: its owner may open it to "
                            f"anyone; fix: SocketUser=root in anolisnuma.socket")
    os.chown(path, 0, 0)
    run = os.path.dirname(path)
    os.chmod(run, 0o777)
    with pytest.raises(ListenerError) as e:
        UnixListener(path, 0o660, activation=True).open()
    assert str(e.value).startswith(f"the socket systemd passed, {path}: {run} is writable by every user (mode "
                                   "0777): whoever may write there may swap the kubelet's socket for one of their own")
    assert not os.path.exists(path + ".lock")   # refused before anything was made there


def test_a_socket_whose_acl_lets_another_user_connect_is_refused(tmp_path, monkeypatch):
    import struct

    path = passed_socket(tmp_path, monkeypatch)
    acl = [(1, 6, 0xFFFFFFFF), (2, 6, 1000), (4, 6, 0xFFFFFFFF), (0x10, 6, 0xFFFFFFFF), (0x20, 0, 0xFFFFFFFF)]
    try:
        os.setxattr(path, "system.posix_acl_access", struct.pack("<I", 2) + b"".join(
            struct.pack("<HHI", *e) for e in acl))
    except OSError as e:
        pytest.skip(f"no POSIX ACLs here: {e.strerror}")
    with pytest.raises(ListenerError) as e:
        UnixListener(path, 0o660, activation=True).open()
    assert "lets uid 1000 connect through a POSIX ACL" in str(e.value) and f"setfacl -b {path}" in str(e.value)
