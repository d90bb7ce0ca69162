"""A local user attacking an HTTP endpoint of the daemon, for tests and benchmarks.

    python -m anolisnuma.testing.http_flood HOST PORT [--user nobody] [--fds 8192]

Started as root, it raises its own fd limit to ``--fds``, then drops to ``--user`` (uid,
gid, no supplementary groups) before it opens any connection, and says so:
``{"uid": 65534}``. What it needs is imported before that: an unprivileged user may not be
able to read the interpreter's tree. Then it takes one command per line on stdin and
answers each with one JSON line on stdout:

``hold N SECONDS``
    keep N connections with an unfinished request head (``GET /metrics`` and headers, no
    blank line) for SECONDS: one the peer closes, or whose connect has not completed in
    :data:`CONNECT_TIMEOUT` seconds, is replaced. Answered once each of the first N
    attempts has connected or failed: ``{"held": H, "failed": F}``.
``held``
    ``{"open": O, "connecting": C, "opened": N, "closed_by_peer": P, "dropped": D,
    "failed": F}`` (``dropped``: closed by the peer without a byte of answer).
``release``
    stop and close everything; ``{"released": N}``.
``scrape K M``
    K threads, each making M complete ``GET /metrics`` requests one after another (the
    held connections wait meanwhile); ``{"statuses": {"200": n, "503": n}, "errors": E,
    "seconds": S, "bytes": B}`` (``errors``: connections that failed or ended without a
    status line).

It ends when stdin closes. :class:`Flood` runs it from a test or a benchmark.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import pwd
import resource
import select
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Set, Tuple

UNFINISHED = b"GET /metrics HTTP/1.1\r\nHost: anolisnuma\r\nUser-Agent: http_flood\r\n"
SCRAPE = b"GET /metrics HTTP/1.1\r\nHost: anolisnuma\r\nConnection: close\r\n\r\n"
CONNECT_TIMEOUT = 2.0
_TICK = 0.05
_READ = select.POLLIN | select.POLLHUP | select.POLLERR
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def drop_privileges(user: str, fds: int) -> int:
    """Raise the fd limit (hard limit too: still root), then become ``user``; its uid."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (fds, fds))
    entry = pwd.getpwnam(user)
    os.setgroups([])
    os.setgid(entry.pw_gid)
    os.setuid(entry.pw_uid)
    return os.getuid()


class Holder:
    """Connections with an unfinished request: connecting ones, open ones, and counts."""

    def __init__(self, host: str, port: int) -> None:
        self.address = (host, port)
        self.family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.poller = select.poll()
        self.connecting: Dict[int, Tuple[socket.socket, float]] = {}
        self.open: Dict[int, socket.socket] = {}
        self.target = 0            # how many to keep
        self.until = 0.0
        self.answered: Set[int] = set()   # open connections the peer wrote something on
        self.counts = dict.fromkeys(("opened", "closed_by_peer", "dropped", "failed"), 0)

    def keep(self, n: int, seconds: float) -> None:
        self.target, self.until = n, time.monotonic() + seconds

    @property
    def busy(self) -> int:
        return len(self.connecting) + len(self.open)

    def state(self) -> Dict[str, int]:
        return dict(self.counts, open=len(self.open), connecting=len(self.connecting))

    def top_up(self) -> None:
        if time.monotonic() >= self.until:
            self.target = 0
        while self.busy < self.target:
            s = socket.socket(self.family, socket.SOCK_STREAM)
            s.setblocking(False)
            if s.connect_ex(self.address) not in (0, errno.EINPROGRESS):
                s.close()
                self.counts["failed"] += 1
                return   # e.g. out of ephemeral ports: try again next tick
            self.connecting[s.fileno()] = (s, time.monotonic())
            self.poller.register(s.fileno(), select.POLLOUT)

    def on_event(self, fd: int) -> None:
        if fd in self.connecting:
            s, _ = self.connecting.pop(fd)
            self.poller.unregister(fd)
            if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0 and _send(s, UNFINISHED):
                self.open[fd] = s
                self.poller.register(fd, _READ)
                self.counts["opened"] += 1
            else:
                s.close()
                self.counts["failed"] += 1
        elif fd in self.open:
            self._read(fd)

    def _read(self, fd: int) -> None:
        s = self.open[fd]
        try:
            data = s.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if data:   # an answer (503, 431): the close follows
            self.answered.add(fd)
            return
        self._forget(fd, self.open.pop(fd))
        self.counts["closed_by_peer"] += 1
        if fd not in self.answered:
            self.counts["dropped"] += 1
        self.answered.discard(fd)

    def expire(self) -> None:
        """Give up connects that did not complete: the peer's backlog is full."""
        now = time.monotonic()
        for fd, (s, since) in list(self.connecting.items()):
            if now - since >= CONNECT_TIMEOUT:
                del self.connecting[fd]
                self._forget(fd, s)
                self.counts["failed"] += 1

    def release(self) -> int:
        n = self.busy
        for fd, s in list(self.open.items()) + [(fd, s) for fd, (s, _) in self.connecting.items()]:
            self._forget(fd, s)
        self.open.clear()
        self.connecting.clear()
        self.answered.clear()
        self.target = 0
        return n

    def _forget(self, fd: int, s: socket.socket) -> None:
        self.poller.unregister(fd)
        s.close()


def _send(s: socket.socket, data: bytes) -> bool:
    try:
        s.send(data)
        return True
    except OSError:
        return False


def scrape(host: str, port: int, threads: int, each: int) -> Dict[str, Any]:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    statuses: Dict[str, int] = {}
    totals = {"errors": 0, "bytes": 0}
    lock = threading.Lock()

    def one() -> None:
        chunks: List[bytes] = []
        try:
            # not create_connection: getaddrinfo would import the idna codec, unreadable now
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.settimeout(60)
                s.connect((host, port))
                s.sendall(SCRAPE)
                while True:
                    chunk = s.recv(1 << 16)
                    if not chunk:
                        break
                    chunks.append(chunk)
        except OSError:
            pass
        data = b"".join(chunks)
        with lock:
            if data.startswith(b"HTTP/1."):
                code = data.split(b" ", 2)[1].decode()
                statuses[code] = statuses.get(code, 0) + 1
                totals["bytes"] += len(data)
            else:
                totals["errors"] += 1

    def worker() -> None:
        for _ in range(each):
            one()

    started = time.monotonic()
    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return {"statuses": statuses, "errors": totals["errors"], "bytes": totals["bytes"],
            "seconds": round(time.monotonic() - started, 3)}


class _Session:
    """The command loop: stdin and every held socket on one poller."""

    def __init__(self, holder: Holder, host: str, port: int) -> None:
        self.holder = holder
        self.host, self.port = host, port
        self.pending = b""
        self.waiting: Optional[Dict[str, Any]] = None   # a hold not answered yet

    def run(self) -> None:
        stdin = sys.stdin.fileno()
        self.holder.poller.register(stdin, select.POLLIN)
        while True:
            for fd, _ in self.holder.poller.poll(int(_TICK * 1000)):
                if fd == stdin:
                    data = os.read(stdin, 4096)
                    if not data:
                        return
                    self.pending += data
                else:
                    self.holder.on_event(fd)
            self.holder.expire()
            self.holder.top_up()
            while b"\n" in self.pending and self.waiting is None:
                line, self.pending = self.pending.split(b"\n", 1)
                self.command(line.decode().split())
            self.answer_waiting()

    def command(self, words: List[str]) -> None:
        if not words:
            return
        command, args = words[0], words[1:]
        h = self.holder
        if command == "hold":
            start = dict(h.counts)
            h.keep(int(args[0]), float(args[1]))
            self.waiting = {"n": int(args[0]), "start": start}
        elif command == "held":
            _say(h.state())
        elif command == "release":
            _say({"released": h.release()})
        elif command == "scrape":
            _say(scrape(self.host, self.port, int(args[0]), int(args[1])))
        else:
            _say({"error": f"unknown command {command!r}"})

    def answer_waiting(self) -> None:
        w, h = self.waiting, self.holder
        if w is None:
            return
        held = h.counts["opened"] - w["start"]["opened"]
        failed = h.counts["failed"] - w["start"]["failed"]
        if held + failed >= w["n"] or h.target == 0:
            _say({"held": held, "failed": failed})
            self.waiting = None


def _say(obj: Dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


class Flood:
    """The attacker as a child process: ``Flood(host, port).ask("hold 400 30")``. The
    child runs this tree's code with this interpreter, started as root (to raise its fd
    limit) and dropping to ``user`` at once."""

    def __init__(self, host: str, port: int, user: str = "nobody", fds: int = 8192) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
        self.proc = subprocess.Popen([sys.executable, "-m", "anolisnuma.testing.http_flood", host, str(port),
                                      "--user", user, "--fds", str(fds)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, bufsize=0)
        self.uid = self.reply()["uid"]

    def send(self, command: str) -> None:
        """Give a command without waiting for its answer (see :meth:`answered`)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(command.encode() + b"\n")

    def answered(self, timeout: float = 0.0) -> bool:
        assert self.proc.stdout is not None
        return bool(select.select([self.proc.stdout], [], [], timeout)[0])

    def reply(self) -> Dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"http_flood exited with {self.proc.wait()}")
        return json.loads(line)

    def ask(self, command: str) -> Dict[str, Any]:
        self.send(command)
        return self.reply()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def __enter__(self) -> "Flood":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def main(argv: Any = None) -> int:
    ap = argparse.ArgumentParser(prog="http_flood")
    ap.add_argument("host")
    ap.add_argument("port", type=int)
    ap.add_argument("--user", default="nobody")
    ap.add_argument("--fds", type=int, default=8192)
    a = ap.parse_args(argv)
    _say({"uid": drop_privileges(a.user, a.fds)})
    _Session(Holder(a.host, a.port), a.host, a.port).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
