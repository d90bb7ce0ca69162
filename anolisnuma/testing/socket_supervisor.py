"""systemd's part in a restart, for machines that do not run systemd as PID 1.

:class:`SocketSupervisor` does what ``anolisnuma.socket`` + ``anolisnuma.service`` make
systemd do: it binds and holds the listening unix socket (so connections made while the
daemon is down wait in its backlog), starts the daemon with the socket as descriptor 3 and
``LISTEN_FDS=1``/``LISTEN_PID=<the daemon's pid>``, reads the daemon's sd_notify messages
(``READY=1``) on a ``NOTIFY_SOCKET`` of its own, and restarts it: on request (SIGTERM, wait,
start: ``systemctl restart``), after ``kill -9`` (``Restart=always``, ``RestartSec``), or
from another tree (an upgrade: :func:`export_tree` makes one from a git commit).

``LISTEN_PID`` must be the daemon's own pid, known only after the fork: the daemon is
started through ``bash -c 'exec 3<&N N<&-; LISTEN_PID=$$ exec "$@"'`` (``exec`` keeps the
shell's pid). Debian's ``systemd-socket-activate`` does not fit: it execs the command in
its own place on the first connection and the socket dies with it, so there is nothing to
restart into.

    sup = SocketSupervisor(sock_path, [sys.executable, "-m", "anolisnuma", "-c", cfg], log_path=log)
    sup.start()              # bound, daemon started, READY=1 seen
    sup.restart()            # SIGTERM; the next one gets the same socket
    sup.kill9()              # SIGKILL; started again after restart_sec
    sup.restart(env={"PYTHONPATH": other_tree})   # an upgrade
    sup.close()
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import struct
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from typing import Dict, List, Optional, Sequence

_UCRED = struct.Struct("3i")
BASH = "/bin/bash"
# bash, not sh: dash takes only one-digit descriptors in redirections.
_WRAPPER = 'exec 3<&{fd} {fd}<&-; LISTEN_PID=$$; export LISTEN_PID; exec "$@"'


class SupervisorError(RuntimeError):
    pass


class SocketSupervisor:
    def __init__(self, listen: str, argv: Sequence[str], *, env: Optional[Dict[str, str]] = None,
                 cwd: Optional[str] = None, log_path: Optional[str] = None, mode: int = 0o660,
                 backlog: int = 4096, restart_sec: float = 1.0, ready_timeout: float = 60.0) -> None:
        self.listen = listen
        self.argv = list(argv)
        self.env = dict(os.environ if env is None else env)
        self.cwd = cwd
        self.log_path = log_path
        self.mode = mode
        self.backlog = backlog
        self.restart_sec = restart_sec
        self.ready_timeout = ready_timeout
        self.sock: Optional[socket.socket] = None
        self.proc: Optional[subprocess.Popen] = None
        self.exits: List[int] = []          # exit codes of the daemons that ended, in order
        self.starts = 0
        self._notify_dir = tempfile.mkdtemp(prefix="an-notify-")
        self._notify_path = os.path.join(self._notify_dir, "notify")
        self._notify: Optional[socket.socket] = None
        self._messages: Dict[int, List[str]] = {}   # pid -> sd_notify fields received
        self._cond = threading.Condition()
        self._reader: Optional[threading.Thread] = None
        self._closing = False

    # ------------------------------------------------------------------ socket and notify
    def bind(self) -> None:
        """Bind and listen (what systemd does when it starts the socket unit)."""
        if self.sock is not None:
            return
        os.makedirs(os.path.dirname(self.listen) or ".", exist_ok=True)
        if os.path.lexists(self.listen):
            os.unlink(self.listen)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o777 & ~self.mode)
        try:
            s.bind(self.listen)
        finally:
            os.umask(old)
        s.listen(self.backlog)
        self.sock = s
        n = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        n.bind(self._notify_path)
        n.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self._notify = n
        self._reader = threading.Thread(target=self._read_notify, name="sd-notify", daemon=True)
        self._reader.start()

    def _read_notify(self) -> None:
        n = self._notify
        assert n is not None
        while not self._closing:
            try:
                data, anc, _, _ = n.recvmsg(4096, socket.CMSG_SPACE(_UCRED.size))
            except OSError:
                return
            pid = 0
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    pid = _UCRED.unpack(payload[:_UCRED.size])[0]
            with self._cond:
                self._messages.setdefault(pid, []).extend(data.decode("utf-8", "replace").split("\n"))
                self._cond.notify_all()

    def messages(self, pid: int) -> List[str]:
        with self._cond:
            return list(self._messages.get(pid, []))

    # ------------------------------------------------------------------ the daemon
    def start(self, argv: Optional[Sequence[str]] = None, env: Optional[Dict[str, str]] = None,
              cwd: Optional[str] = None, wait_ready: bool = True) -> subprocess.Popen:
        """Start the daemon on the held socket (binding it first if needed); ``argv``,
        ``env`` (merged over the supervisor's), ``cwd``: for this and later starts (an
        upgrade). Waits for its READY=1 unless told not to."""
        self.bind()
        if self.proc is not None and self.proc.poll() is None:
            raise SupervisorError(f"the daemon (pid {self.proc.pid}) still runs")
        if argv is not None:
            self.argv = list(argv)
        if env:
            self.env.update(env)
        if cwd is not None:
            self.cwd = cwd
        assert self.sock is not None
        fd = self.sock.fileno()
        child_env = dict(self.env, LISTEN_FDS="1", NOTIFY_SOCKET=self._notify_path)
        for k in ("LISTEN_PID", "LISTEN_FDNAMES"):
            child_env.pop(k, None)
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        try:
            wrapper = _WRAPPER.format(fd=fd) if fd != 3 else _WRAPPER[_WRAPPER.index(";") + 2:]
            self.proc = subprocess.Popen([BASH, "-c", wrapper, "bash", *self.argv], env=child_env, cwd=self.cwd,
                                         pass_fds=(fd,), stdin=subprocess.DEVNULL, stdout=out, stderr=out)
        finally:
            if out is not subprocess.DEVNULL:
                out.close()  # type: ignore[union-attr]
        self.starts += 1
        if wait_ready:
            self.wait_ready()
        return self.proc

    def wait_ready(self, timeout: Optional[float] = None) -> float:
        """Seconds until the current daemon sent READY=1; raises SupervisorError when it
        exited first or took longer than ``timeout``."""
        proc = self.proc
        if proc is None:
            raise SupervisorError("no daemon started")
        started = time.monotonic()
        deadline = started + (timeout if timeout is not None else self.ready_timeout)
        with self._cond:
            while "READY=1" not in self._messages.get(proc.pid, []):
                if proc.poll() is not None:
                    raise SupervisorError(f"the daemon exited with {proc.returncode} before READY=1"
                                          f"{self._log_hint()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SupervisorError(f"no READY=1 from pid {proc.pid} in time{self._log_hint()}")
                self._cond.wait(min(left, 0.2))   # (also looks at the process now and then)
        return time.monotonic() - started

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> Optional[int]:
        """Signal the daemon and reap it; its exit code (negative: the signal that ended it)."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return None if proc is None else self._reaped(proc)
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()   # what systemd does after TimeoutStopSec
            proc.wait()
        return self._reaped(proc)

    def _reaped(self, proc: subprocess.Popen) -> int:
        if proc is self.proc:
            self.exits.append(proc.returncode)
            self.proc = None
        return proc.returncode

    def restart(self, argv: Optional[Sequence[str]] = None, env: Optional[Dict[str, str]] = None,
                cwd: Optional[str] = None, wait_ready: bool = True) -> int:
        """``systemctl restart``: SIGTERM, wait for the exit, start again (maybe another
        tree); the old daemon's exit code."""
        code = self.stop(signal.SIGTERM)
        self.start(argv, env, cwd, wait_ready=wait_ready)
        return -999 if code is None else code

    def kill9(self, wait_ready: bool = True) -> None:
        """A crash: SIGKILL, then what ``Restart=always`` and ``RestartSec`` do."""
        self.stop(signal.SIGKILL)
        time.sleep(self.restart_sec)   # RestartSec: the delay systemd keeps, not a wait for a condition
        self.start(wait_ready=wait_ready)

    def reload(self) -> None:
        """``systemctl reload`` (ExecReload=kill -HUP $MAINPID)."""
        if self.proc is None:
            raise SupervisorError("no daemon running")
        self.proc.send_signal(signal.SIGHUP)

    def close(self) -> None:
        """Stop the daemon, close and remove the socket (stopping the socket unit)."""
        self.stop(signal.SIGTERM)
        self._closing = True
        for s in (self.sock, self._notify):
            if s is not None:
                s.close()
        self.sock = self._notify = None
        for path in (self.listen, self._notify_path):
            try:
                os.unlink(path)
            except OSError:
                pass
        try:
            os.rmdir(self._notify_dir)
        except OSError:
            pass

    def _log_hint(self) -> str:
        if not self.log_path:
            return ""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, os.path.getsize(self.log_path) - 3000))
                return ":\n" + f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def __enter__(self) -> "SocketSupervisor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def export_tree(repo: str, dest: str, commit: str = "HEAD", version_suffix: str = "") -> str:
    """``git archive <commit>`` of ``repo`` unpacked in ``dest`` (a tree to run with
    ``PYTHONPATH=dest``: an upgrade to other files); ``version_suffix`` is appended to its
    ``__version__`` so that the two trees tell apart in the log. Returns ``dest``."""
    os.makedirs(dest, exist_ok=True)
    archive = subprocess.run(["git", "-C", repo, "archive", "--format=tar", commit, "anolisnuma", "cri_proto"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=True, timeout=120)
    with tempfile.TemporaryFile() as f:
        f.write(archive.stdout)
        f.seek(0)
        with tarfile.open(fileobj=f) as tar:
            tar.extractall(dest)
    if version_suffix:
        init = os.path.join(dest, "anolisnuma", "__init__.py")
        with open(init) as f:
            text = f.read()
        marker = '__version__ = "'
        start = text.index(marker) + len(marker)
        end = text.index('"', start)
        with open(init, "w") as f:
            f.write(text[:end] + version_suffix + text[end:])
    return dest


def _main(argv: Optional[List[str]] = None) -> int:
    """Hold a socket and run a daemon on it: SIGHUP is passed on, SIGUSR2 restarts it,
    a daemon that dies is started again after --restart-sec; SIGTERM/SIGINT stop all."""
    p = argparse.ArgumentParser(prog="python -m anolisnuma.testing.socket_supervisor", description=_main.__doc__)
    p.add_argument("--listen", required=True, help="the unix socket to hold")
    p.add_argument("--restart-sec", type=float, default=1.0)
    p.add_argument("--log", help="append the daemon's output here")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- the daemon's command line")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("no command given")
    sup = SocketSupervisor(args.listen, command, log_path=args.log, restart_sec=args.restart_sec)
    wanted: List[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR2):
        signal.signal(sig, lambda s, _f: wanted.append(s))
    sup.start(wait_ready=False)
    while True:
        if wanted:
            sig = wanted.pop(0)
            if sig in (signal.SIGTERM, signal.SIGINT):
                sup.close()
                return 0
            if sig == signal.SIGHUP:
                sup.reload()
            else:
                sup.restart(wait_ready=False)
        proc = sup.proc
        if proc is not None and proc.poll() is not None:
            sup._reaped(proc)
            print(f"socket_supervisor: the daemon exited with {proc.returncode}; starting it again in "
                  f"{args.restart_sec:g}s", file=sys.stderr)
            time.sleep(args.restart_sec)
            sup.start(wait_ready=False)
        time.sleep(0.2)   # a poll of the signals noted and the daemon's state


if __name__ == "__main__":
    sys.exit(_main())

__all__ = ["SocketSupervisor", "SupervisorError", "export_tree"]
