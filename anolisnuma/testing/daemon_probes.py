"""Probes of a daemon running as a subprocess, for tests that attack it: its RSS and open
file descriptors, its status over the admin socket, and a watchdog that keeps calling Version on a connection of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any, Dict, Optional

# The tests and scripts that probe a daemon import their wait from here too.
from anolisnuma.testing.waiting import wait_until  # noqa: F401 (re-exported)

MIB = 1 << 20


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


# grpc's core (the daemon's own client to containerd) adds an epoll and an eventfd to its
# event engine's pool as its use grows, and keeps them: bounded by the pool, and no
# connection's. What a flood must give back is the rest.
_ENGINE_FDS = ("anon_inode:[eventpoll]", "anon_inode:[eventfd]")


def fds(pid: int) -> int:
    """The daemon's open descriptors, less grpc's event-engine pollers (see above)."""
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in _ENGINE_FDS:
                continue
        except OSError:   # closed meanwhile
            continue
        count += 1
    return count


def status_when_up(admin_socket: str) -> Optional[Dict[str, Any]]:
    """The daemon's ``status``, or None while its admin socket does not answer (yet): the
    admin socket listens a moment after the CRI socket."""
    from anolisnuma.ctl.client import CtlError, ask

    try:
        return ask(admin_socket, "status", timeout=10)
    except CtlError:
        return None


def assert_recovers(pid: int, rss_before: int, fds_before: int) -> None:
    """The daemon's fds come back to ``fds_before`` and its RSS within 10 MB of ``rss_before``."""
    wait_until(lambda: fds(pid) <= fds_before, f"fds back to {fds_before} (now {fds(pid)})")
    wait_until(lambda: rss_bytes(pid) < rss_before + 10 * MIB,
               f"RSS back within 10 MB of {rss_before >> 20} MiB (now {rss_bytes(pid) >> 20} MiB)", timeout=10)


_WATCHDOG = """
import statistics, sys, time, grpc
from cri_api.v1 import api_pb2 as cri, api_pb2_grpc as cri_grpc
stub = cri_grpc.RuntimeServiceStub(grpc.insecure_channel(sys.argv[1]))
def version():
    started = time.monotonic()
    stub.Version(cri.VersionRequest(), timeout=30)
    return time.monotonic() - started
version()  # the connection
print("baseline", f"{statistics.median(version() for _ in range(20)):.6f}", flush=True)
worst = -1.0
while True:
    took = version()
    if took > worst:
        worst = took
        print(f"{worst:.4f}", flush=True)
"""


class Watchdog:
    """Version over its own connection, again and again, while an attack runs. In a
    process of its own, so that what it measures is the daemon, not the attacker's
    threads competing for this process's interpreter lock.

    The limit is a ratio to the Version time this watchdog measured before the attack,
    with a floor: an attack of tens of thousands of frames is real work for the daemon,
    and on a 2-core machine kept busy by something else a Version queued behind one has
    taken 1.7 s. What this catches is a daemon that stops answering while it is attacked."""

    RATIO = 200.0
    FLOOR_SECONDS = 5.0

    def __init__(self, address: str) -> None:
        self.address = address
        self.worst = 0.0
        self.baseline = 0.0

    @property
    def limit(self) -> float:
        return max(self.FLOOR_SECONDS, self.RATIO * self.baseline)

    def __enter__(self) -> "Watchdog":
        self.proc = subprocess.Popen([sys.executable, "-c", _WATCHDOG, self.address],
                                     stdout=subprocess.PIPE, text=True)
        first = self.proc.stdout.readline().split()
        assert first and first[0] == "baseline", "the watchdog's first Versions failed"
        self.baseline = float(first[1])
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.kill()
        out, _ = self.proc.communicate(timeout=10)
        self.worst = max([float(w) for w in out.split()] + [0.0])
        assert self.worst < self.limit, (
            f"Version took {self.worst:.2f}s during the attack (baseline {self.baseline * 1000:.1f} ms, "
            f"limit {self.limit:.1f}s)")
