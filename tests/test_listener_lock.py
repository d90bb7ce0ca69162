"""The lock file beside the socket: only ever a regular file of ours is opened and written.

The daemon runs as root; whoever can plant a symbolic link, FIFO or hard link at
``<socket>.lock`` must not get it to truncate another file or hang at start.
"""

from __future__ import annotations

import os
import socket
import threading

import pytest

from anolisnuma.transport.listener import ListenerError, Occupant, UnixListener, occupant

VICTIM_TEXT = "root:precious:0:0\n"


@pytest.fixture
def victim(tmp_path) -> str:
    path = str(tmp_path / "victim")
    with open(path, "w") as f:
        f.write(VICTIM_TEXT)
    return path


@pytest.fixture(params=["lstat sees it", "planted after the lstat"])
def race(request, monkeypatch):
    """Run each refusal twice: once caught by the lstat before opening, once as if the
    file was planted between that lstat and the open (then O_NOFOLLOW and fstat catch it)."""
    if request.param == "planted after the lstat":
        real_lstat = os.lstat

        def lstat(path, *a, **kw):
            if str(path).endswith(".lock"):
                raise FileNotFoundError(path)
            return real_lstat(path, *a, **kw)
        monkeypatch.setattr(os, "lstat", lstat)
    return request.param


def open_in_thread(listener: UnixListener, timeout: float = 5.0) -> BaseException:
    """``listener.open()`` in a thread; fails the test if it does not return in time."""
    result = []

    def run() -> None:
        try:
            listener.open()
            result.append(None)
        except BaseException as e:  # noqa: B902 - handed back to the test
            result.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "opening the listener hung"
    return result[0]


def test_symlink_at_the_lock_path_is_refused_and_its_target_untouched(sockdir, victim, race):
    sock = os.path.join(sockdir, "a.sock")
    os.symlink(victim, sock + ".lock")
    before = os.stat(victim)
    listener = UnixListener(sock)
    error = open_in_thread(listener)
    assert isinstance(error, ListenerError)
    assert "not a regular file" in str(error) and sock + ".lock" in str(error)
    with open(victim) as f:
        assert f.read() == VICTIM_TEXT
    after = os.stat(victim)
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    assert not os.path.exists(sock)  # nothing was bound either
    assert os.readlink(sock + ".lock") == victim  # left in place for the operator to see


def test_dangling_symlink_is_refused_and_creates_nothing(sockdir, tmp_path, race):
    sock = os.path.join(sockdir, "a.sock")
    target = str(tmp_path / "would-be-created")
    os.symlink(target, sock + ".lock")
    error = open_in_thread(UnixListener(sock))
    assert isinstance(error, ListenerError)
    assert not os.path.exists(target)


def test_fifo_at_the_lock_path_is_refused_without_hanging(sockdir, race):
    sock = os.path.join(sockdir, "a.sock")
    os.mkfifo(sock + ".lock")
    error = open_in_thread(UnixListener(sock))
    assert isinstance(error, ListenerError)
    assert "not a regular file" in str(error)


def test_directory_at_the_lock_path_is_refused(sockdir):
    sock = os.path.join(sockdir, "a.sock")
    os.mkdir(sock + ".lock")
    error = open_in_thread(UnixListener(sock))
    assert isinstance(error, ListenerError)


def test_hard_link_to_another_file_is_refused_and_left_whole(sockdir, victim):
    sock = os.path.join(sockdir, "a.sock")
    try:
        os.link(victim, sock + ".lock")
    except OSError as e:  # tmp_path and /tmp on different file systems
        pytest.skip(f"cannot hard-link across: {e}")
    error = open_in_thread(UnixListener(sock))
    assert isinstance(error, ListenerError)
    assert "not a file of ours" in str(error)
    with open(victim) as f:
        assert f.read() == VICTIM_TEXT


def test_normal_lock_holds_our_pid_and_refuses_a_second_instance(sockdir):
    sock = os.path.join(sockdir, "a.sock")
    first = UnixListener(sock)
    first.open()
    try:
        with open(sock + ".lock") as f:
            assert f.read() == f"{os.getpid()}\n"
        assert os.stat(sock + ".lock").st_mode & 0o777 == 0o600
        error = open_in_thread(UnixListener(sock))
        assert isinstance(error, ListenerError)
        assert str(error) == (f"another anolisnuma instance (pid {os.getpid()}) is running on {sock} "
                              f"(it holds {sock}.lock)")
        assert error.holder_pid == os.getpid()
    finally:
        first.close()
    # the lock file stays; the next instance takes it over and rewrites it
    assert os.path.isfile(sock + ".lock")
    again = UnixListener(sock)
    again.open()
    again.close()


@pytest.mark.parametrize("content", ["", "../../etc/passwd\n", "12 34\n", "-5\n", "99999999999999\n", "\xb2\n"])
def test_a_held_lock_naming_no_pid_is_refused_without_one(sockdir, content):
    """The holder's pid is only ever read and shown: anything but a plain number is no pid."""
    sock = os.path.join(sockdir, "a.sock")
    first = UnixListener(sock)
    first.open()
    try:
        with open(sock + ".lock", "w") as f:   # what the holder left in its lock file
            f.write(content)
        error = open_in_thread(UnixListener(sock))
        assert isinstance(error, ListenerError) and error.holder_pid is None
        assert str(error) == f"another anolisnuma instance is running on {sock} (it holds {sock}.lock)"
    finally:
        first.close()


def test_our_own_stale_lock_file_is_reused_and_rewritten(sockdir):
    sock = os.path.join(sockdir, "a.sock")
    with open(sock + ".lock", "w") as f:
        f.write("999999999\nleft over by a crash\n")
    listener = UnixListener(sock)
    listener.open()
    try:
        with open(sock + ".lock") as f:
            assert f.read() == f"{os.getpid()}\n"
    finally:
        listener.close()


def test_lock_fd_is_not_inherited(sockdir):
    sock = os.path.join(sockdir, "a.sock")
    listener = UnixListener(sock)
    listener.open()
    try:
        assert listener._lock_fd is not None
        assert not os.get_inheritable(listener._lock_fd)
    finally:
        listener.close()


# ---------------------------------------------------------------- who serves a path (asked by tools)

def test_a_path_served_by_an_instance_names_its_pid_and_is_left_as_it_was(sockdir):
    sock = os.path.join(sockdir, "a.sock")
    assert occupant(sock) is None   # nobody yet
    first = UnixListener(sock)
    first.open()
    try:
        found = occupant(sock)
        assert found == Occupant(sock, locked=True, pid=os.getpid(), answers=True)
        assert found.describe() == f"another anolisnuma (pid {os.getpid()}) serves {sock} (it holds {sock}.lock)"
        assert occupant(sock) == found   # asking took nothing away
        with open(sock + ".lock") as f:
            assert f.read() == f"{os.getpid()}\n"
    finally:
        first.close()
    assert occupant(sock) is None   # what a stopped instance leaves (its lock file) is nobody


def test_a_foreign_listener_answers_without_a_lock(sockdir):
    sock = os.path.join(sockdir, "a.sock")
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    other.bind(sock)
    other.listen(1)
    try:
        assert occupant(sock) == Occupant(sock, locked=False, pid=None, answers=True)
        assert occupant(sock).describe() == f"another process answers on {sock}"
    finally:
        other.close()
    assert occupant(sock) is None   # a stale socket file is nobody


def test_a_symlink_at_the_lock_path_is_not_followed_to_a_held_lock(sockdir):
    held = os.path.join(sockdir, "held.sock")
    first = UnixListener(held)
    first.open()
    try:
        asked = os.path.join(sockdir, "asked.sock")
        os.symlink(held + ".lock", asked + ".lock")
        assert occupant(asked) is None
    finally:
        first.close()
