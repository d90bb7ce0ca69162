"""The unix socket the kubelet connects to, with the hygiene a node daemon needs.

- the parent directory is created;
- a lock file beside the socket (``<socket>.lock``, flock) makes a second instance fail
  at once, even while the first one is still starting; only a regular file of ours is
  used as one (never through a symbolic link, never a FIFO or device);
- a socket file nobody answers on is stale (left by a crash or ``kill -9``) and removed;
  one a live process answers on means another instance: refuse to start;
- the socket mode is set before anyone can connect (bind under a restrictive umask).

Under ``anolisnuma.socket`` the socket is systemd's (socket activation, see
:mod:`~anolisnuma.transport.activation`): it is taken over, never bound, probed as stale
or unlinked, and closing it only closes this process's descriptor, so that connections
made while the daemon restarts wait in the backlog systemd keeps. The lock file still
keeps a second instance started by hand away.

systemd's socket is checked as one the daemon binds would be (whoever may connect to it
reaches containerd's root API): its directory, and every one above, must be changeable by
root alone, as the preflight requires of ``server.listen``'s (else the daemon does not
start, naming the directory and the fix), and so must the socket file (owned by root, no
POSIX ACL letting another user in). A mode wider than ``server.socket_mode`` (a
``SocketMode=0666`` drop-in, say) is narrowed to it, with a warning naming both: the
kubelet (root) keeps its runtime, and no local user gains a way to it that the
configuration does not grant. (Refusing to start would leave the node without a runtime
for a mistake the daemon can undo; warning alone would leave the runtime open.) A group
other than root's that may connect (``SocketGroup=``) is said in a warning.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import stat
from dataclasses import dataclass
from typing import Optional

import structlog

from anolisnuma import posix_acl
from anolisnuma.transport import activation
from anolisnuma.trusted_file import unsafe_along

log = structlog.get_logger("anolisnuma.transport")


class ListenerError(Exception):
    """Why the socket cannot be served, in words an operator can act on. ``taken``: another
    process serves that path (another instance holds its lock, or something answers
    there); ``holder_pid``: the pid that instance wrote into its lock file, when it names
    one."""

    def __init__(self, message: str, taken: bool = False, holder_pid: Optional[int] = None) -> None:
        super().__init__(message)
        self.taken = taken
        self.holder_pid = holder_pid


class UnixListener:
    def __init__(self, path: str, mode: int = 0o660, backlog: int = 1024, activation: bool = False) -> None:
        """``activation``: take the socket systemd passes (LISTEN_FDS) when there is one
        (the kubelet's socket only; the admin socket always binds its own)."""
        self.path = path
        self.activation = activation
        self.mode = mode
        self.backlog = backlog
        self.sock: Optional[socket.socket] = None
        self._inode: Optional[int] = None
        self._lock_fd: Optional[int] = None
        self.inherited = False   # the socket is systemd's (socket activation)

    def open(self) -> socket.socket:
        """Take over the socket systemd passed, else bind and listen; raises ListenerError
        with a message an operator can act on."""
        if self.activation:
            try:
                passed = activation.take_listen_fds()
            except activation.ActivationError as e:
                raise ListenerError(str(e)) from e
            if passed is not None:
                return self._adopt(passed)
        directory = os.path.dirname(self.path) or "."
        try:
            os.makedirs(directory, mode=0o755, exist_ok=True)
        except OSError as e:
            raise ListenerError(f"cannot create the socket directory {directory}: {e.strerror}") from e
        self._take_lock()
        self._clear_stale()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o777 & ~self.mode)
        try:
            sock.bind(self.path)
        except OSError as e:
            sock.close()
            raise ListenerError(f"cannot bind {self.path}: {e.strerror}") from e
        finally:
            os.umask(old_umask)
        os.chmod(self.path, self.mode)
        self._inode = os.stat(self.path).st_ino
        sock.listen(self.backlog)
        sock.setblocking(False)
        self.sock = sock
        return sock

    def _adopt(self, passed: activation.Inherited) -> socket.socket:
        if os.path.realpath(passed.path) != os.path.realpath(self.path):
            log.warning("the socket systemd passed is not at server.listen; systemd's socket is used (the "
                        "kubelet connects where anolisnuma.socket's ListenStream= points): make them agree",
                        systemd_socket=passed.path, server_listen=self.path)
            self.path = passed.path
        for what in passed.ignored:
            log.warning("descriptor passed by systemd not used", descriptor=what)
        try:
            self._check_passed()
            self._take_lock()
        except BaseException:
            passed.sock.close()
            raise
        # asyncio listens again with this backlog: keep the one systemd's Backlog= asked for
        # (the kernel caps both at net.core.somaxconn).
        self.backlog = max(self.backlog, _somaxconn())
        passed.sock.setblocking(False)
        self.inherited = True
        self.sock = passed.sock
        log.info("listening on the socket passed by systemd (socket activation)", listen=self.path)
        return passed.sock

    def _check_passed(self) -> None:
        """systemd's socket, as the module docstring says: ListenerError when someone but
        root may change it or its directories; its mode narrowed to ``self.mode``."""
        path = self.path
        try:
            unsafe = unsafe_along(os.path.dirname(path), creates=True)   # (the lock file is made there)
            st = os.lstat(path)
            grants = posix_acl.named_grants(posix_acl.read_acl(path), posix_acl.WRITE, (0, os.geteuid()))
        except FileNotFoundError:
            log.warning("the socket systemd passed is not at its path any more: nobody can connect to it",
                        systemd_socket=path)
            return
        except OSError as e:
            raise ListenerError(f"cannot check who may reach the socket systemd passed, {path}: {e.strerror}") from e
        if unsafe is not None:
            raise ListenerError(f"the socket systemd passed, {path}: " + unsafe.describe(
                "whoever may write there may swap the kubelet's socket for one of their own"))
        if not stat.S_ISSOCK(st.st_mode):
            raise ListenerError(f"{path}, where systemd's socket is bound, is not a socket any more")
        if st.st_uid not in (0, os.geteuid()):
            raise ListenerError(f"the socket systemd passed, {path}, is owned by uid {st.st_uid}: its owner may "
                                f"open it to anyone; fix: SocketUser=root in anolisnuma.socket")
        if grants:
            raise ListenerError(f"the socket systemd passed, {path}, lets {', '.join(grants)} connect through a "
                                f"POSIX ACL (every connection reaches containerd's root API); fix: setfacl -b {path}")
        mode = stat.S_IMODE(st.st_mode)
        if mode & ~self.mode & 0o777:
            narrowed = mode & self.mode
            os.chmod(path, narrowed)
            log.warning("the socket systemd passed let more users connect than server.socket_mode: narrowed to it "
                        "(every connection reaches containerd's root API); fix SocketMode= in anolisnuma.socket",
                        systemd_socket=path, socket_mode=f"{mode:04o}", narrowed_to=f"{narrowed:04o}",
                        server_socket_mode=f"{self.mode:04o}")
            mode = narrowed
        if mode & 0o020 and st.st_gid not in (0, os.getegid()):
            log.warning("members of the socket's group may connect to the socket systemd passed: through it they "
                        "reach containerd's root API (SocketGroup= of anolisnuma.socket)", systemd_socket=path,
                        gid=st.st_gid)

    def _take_lock(self) -> None:
        """Lock ``<socket>.lock`` and write our pid into it.

        The daemon runs as root: whatever sits at the lock path must be our own regular
        file before it is written. A symbolic link (O_NOFOLLOW), a FIFO or device (opened
        O_NONBLOCK, so a FIFO cannot hang the start; refused after fstat), a hard link to
        some other file or a file of another user is refused, and nothing is truncated.
        """
        lock_path = self.path + ".lock"
        try:  # not even opened when it is plainly something else (a device's open may act)
            if not stat.S_ISREG(os.lstat(lock_path).st_mode):
                raise ListenerError(_not_a_lock_file(lock_path))
        except FileNotFoundError:
            pass
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
        try:
            fd = os.open(lock_path, flags, 0o600)
        except OSError as e:
            if e.errno == errno.ELOOP:  # O_NOFOLLOW: a symbolic link planted since the lstat
                raise ListenerError(_not_a_lock_file(lock_path)) from e
            raise ListenerError(f"cannot open the lock file {lock_path}: {e.strerror}") from e
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ListenerError(_not_a_lock_file(lock_path))
            if st.st_nlink != 1 or st.st_uid != os.geteuid():
                raise ListenerError(f"{lock_path} is not a file of ours (links: {st.st_nlink}, owner uid "
                                    f"{st.st_uid}); refusing to use it as the lock file (remove it)")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    holder = _pid_in(fd)
                    who = f" (pid {holder})" if holder is not None else ""
                    raise ListenerError(f"another anolisnuma instance{who} is running on {self.path} "
                                        f"(it holds {lock_path})", taken=True, holder_pid=holder) from e
                raise ListenerError(f"cannot lock {lock_path}: {e.strerror}") from e
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        except BaseException:
            os.close(fd)
            raise
        self._lock_fd = fd

    def _clear_stale(self) -> None:
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(st.st_mode):
            raise ListenerError(f"{self.path} exists and is not a socket; refusing to replace it")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(0.5)
        try:
            probe.connect(self.path)
        except (ConnectionRefusedError, FileNotFoundError):
            os.unlink(self.path)  # stale: nobody listens
            return
        except OSError as e:
            raise ListenerError(f"cannot tell whether {self.path} is in use: {e.strerror}") from e
        finally:
            probe.close()
        hint = (" (systemd's anolisnuma.socket? then start anolisnuma.service, which takes that socket over)"
                if self.activation else "")
        raise ListenerError(f"another process is listening on {self.path}{hint}", taken=True)

    def close(self) -> None:
        """Stop listening and remove the socket file (only if it is still the one we bound:
        a newer instance may already have replaced it). systemd's socket is only closed
        here: it listens on in systemd, whose backlog keeps new connections for the next
        process."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self._inode is not None:
            try:
                if os.stat(self.path).st_ino == self._inode:
                    os.unlink(self.path)
            except FileNotFoundError:
                pass
            self._inode = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


@dataclass(frozen=True)
class Occupant:
    """Who serves a socket path already, as a second instance would find it."""

    path: str
    locked: bool          # an instance holds ``<path>.lock``
    pid: Optional[int]    # the pid that instance wrote there, when it names one
    answers: bool         # something accepts connections on the path

    def describe(self) -> str:
        if self.locked:
            who = f"another anolisnuma (pid {self.pid})" if self.pid is not None else "another anolisnuma"
            return f"{who} serves {self.path} (it holds {self.path}.lock)"
        return f"another process answers on {self.path}"


def occupant(path: str) -> Optional[Occupant]:
    """Who serves ``path`` now (a tool's question before it starts a daemon there), or None.

    Nothing is written and nothing is followed: the lock file is opened only when it is a
    regular file, read-only and never through a symbolic link; its lock is tried shared
    and let go at once (an instance holding it keeps it exclusive)."""
    locked, pid = False, None
    lock_path = path + ".lock"
    try:
        plain = stat.S_ISREG(os.lstat(lock_path).st_mode)
    except OSError:
        plain = False
    if plain:
        try:
            fd = os.open(lock_path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
        except OSError:
            fd = -1
        if fd >= 0:
            try:
                if stat.S_ISREG(os.fstat(fd).st_mode):
                    try:
                        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    except OSError as e:
                        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                            locked, pid = True, _pid_in(fd)
            finally:
                os.close(fd)   # and with it our shared lock, if we got it
    answers = _answers(path)
    return Occupant(path, locked, pid, answers) if locked or answers else None


def _answers(path: str) -> bool:
    try:
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            return False
    except OSError:
        return False
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(0.5)
    try:
        probe.connect(path)
    except OSError:
        return False
    finally:
        probe.close()
    return True


def _somaxconn() -> int:
    try:
        with open("/proc/sys/net/core/somaxconn") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 4096


def _pid_in(fd: int) -> Optional[int]:
    """The pid the holder of the lock wrote into it, or None. Only ever shown to a person:
    a few bytes read from the file we opened and checked, taken when they are a number
    and nothing else (the holder may be between its truncate and its write)."""
    try:
        text = os.pread(fd, 16, 0).decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() and 0 < int(text) < 1 << 22 else None


def _not_a_lock_file(lock_path: str) -> str:
    return (f"{lock_path} exists and is not a regular file (a symbolic link, FIFO, device...); "
            f"refusing to use it as the lock file (remove it if it is not yours)")
