"""Socket activation (LISTEN_FDS): what the daemon takes over, in a child process started
the way systemd starts it (the socket as descriptor 3, LISTEN_PID = the child's pid)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys

import grpc

from anolisnuma.testing.fake_cri import runtime_path
from anolisnuma.testing.proxy import config_dict, read_log, write_config
from anolisnuma.testing.socket_supervisor import BASH, SocketSupervisor

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
