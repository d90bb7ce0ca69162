"""A small TCP peer for traffic tests, run inside a test network namespace:

    python -m anolisnuma.testing.tcp_peer sink ADDR PORT
    python -m anolisnuma.testing.tcp_peer stream HOST PORT --rate BYTES_PER_S [--bind ADDR]
    python -m anolisnuma.testing.tcp_peer idle HOST PORT [--bind ADDR]
    python -m anolisnuma.testing.tcp_peer send HOST PORT --bytes N [--bind ADDR]
    python -m anolisnuma.testing.tcp_peer hold

``sink`` accepts any number of connections and reads and discards what they send; it
prints ``ready`` once listening. ``stream`` connects, prints ``connected IP PORT`` (its
local endpoint) and sends ``--rate`` bytes per second in 10 ms steps, paced on the
monotonic clock. ``idle`` connects, prints the same line and sends nothing; ``send``
also sends ``--bytes`` bytes once, then prints ``sent N`` and stays idle. ``hold``
prints ``ready`` and waits. Every role ends when its standard input closes (the test
went away) or after ``--deadline`` seconds (60 by default), whichever comes first.
"""

from __future__ import annotations

import argparse
import os
import selectors
import socket
import sys
import time

_STEP = 0.01


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _stdin_closed(sel: selectors.BaseSelector, events: list) -> bool:
    for key, _ in events:
        if key.data == "stdin" and not os.read(sys.stdin.fileno(), 4096):
            return True
    return False


def _connect(host: str, port: int, bind: str) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    if bind:
        s.bind((bind, 0))
    s.settimeout(5)
    s.connect((host, port))
    s.settimeout(None)
    ip, lport = s.getsockname()[:2]
    _say(f"connected {ip} {lport}")
    return s


def main(argv: list = None) -> int:
    ap = argparse.ArgumentParser(prog="tcp_peer")
    ap.add_argument("role", choices=("sink", "stream", "idle", "send", "hold"))
    ap.add_argument("host", nargs="?", default="")
    ap.add_argument("port", nargs="?", type=int, default=0)
    ap.add_argument("--rate", type=int, default=0)
    ap.add_argument("--bytes", type=int, default=0)
    ap.add_argument("--bind", default="")
    ap.add_argument("--deadline", type=float, default=60.0)
    a = ap.parse_args(argv)
    end = time.monotonic() + a.deadline
    sel = selectors.DefaultSelector()
    sel.register(sys.stdin.fileno(), selectors.EVENT_READ, "stdin")

    if a.role == "hold":
        _say("ready")
        while time.monotonic() < end:
            if _stdin_closed(sel, sel.select(end - time.monotonic())):
                break
        return 0

    if a.role == "sink":
        family = socket.AF_INET6 if ":" in a.host else socket.AF_INET
        ls = socket.socket(family, socket.SOCK_STREAM)
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            ls.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        ls.bind((a.host, a.port))
        ls.listen(64)
        ls.setblocking(False)
        sel.register(ls, selectors.EVENT_READ, "listen")
        _say("ready")
        while time.monotonic() < end:
            events = sel.select(max(0.0, end - time.monotonic()))
            if _stdin_closed(sel, events):
                break
            for key, _ in events:
                if key.data == "listen":
                    try:
                        c, _ = ls.accept()
                    except BlockingIOError:
                        continue
                    c.setblocking(False)
                    sel.register(c, selectors.EVENT_READ, "conn")
                elif key.data == "conn":
                    try:
                        data = key.fileobj.recv(1 << 16)
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError:
                        data = b""
                    if not data:
                        sel.unregister(key.fileobj)
                        key.fileobj.close()
        return 0

    s = _connect(a.host, a.port, a.bind)
    if a.role in ("idle", "send"):
        if a.role == "send":
            s.sendall(b"y" * a.bytes)
            _say(f"sent {a.bytes}")
        while time.monotonic() < end:
            if _stdin_closed(sel, sel.select(end - time.monotonic())):
                break
        return 0

    # stream: a.rate bytes per second, in steps of _STEP seconds
    per_step = max(1, int(a.rate * _STEP))
    chunk = b"x" * per_step
    start = time.monotonic()
    k = 0
    while True:
        now = time.monotonic()
        if now >= end:
            break
        due = start + k * _STEP
        if now < due:
            if _stdin_closed(sel, sel.select(due - now)):
                break
            continue
        try:
            s.sendall(chunk)
        except OSError:
            break
        k += 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
