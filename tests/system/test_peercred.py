"""The peer of a unix socket as the kernel says it: the process that listens, with the uid
it had when it called ``listen`` (not the owner of the socket's file)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from anolisnuma.system.peercred import peer_credentials

NOBODY = 65534

# Binds as root (the socket's file is root's), then listens as nobody.
LISTEN_AS_NOBODY = """
import os, socket, sys
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1])
os.setgid(65534); os.setuid(65534)
s.listen(8)
print("listening", flush=True)
sys.stdin.read()
"""


def test_the_peer_is_the_process_that_listens_with_its_uid(tmp_path):
    # given a socket file root owns, listened on by a process running as nobody
    path = str(tmp_path / "s.sock")
    child = subprocess.Popen([sys.executable, "-c", LISTEN_AS_NOBODY, path], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "listening\n"
        assert os.stat(path).st_uid == 0
        # when we connect to it
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(path)
            cred = peer_credentials(s)
        # then the kernel names the listener: its pid and the uid it listened as
        assert cred is not None and (cred.pid, cred.uid, cred.gid) == (child.pid, NOBODY, NOBODY)
    finally:
        child.stdin.close()
        child.wait(30)


def test_no_socket_or_a_closed_one_is_none_not_an_error():
    # given no socket, and a closed one
    closed = socket.socket(socket.AF_UNIX)
    closed.close()
    # then neither has a peer, and asking does not raise
    assert peer_credentials(None) is None and peer_credentials(closed) is None
