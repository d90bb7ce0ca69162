#!/usr/bin/env python3
"""Traffic observer cost: CPU per sample of SockDiagSource at 50, 200 and 500 synthetic,
socket-heavy pods (root only).

Each pod is a process with a network namespace of its own (``unshare(CLONE_NEWNET)`` in a
forked child) and a fake pod cgroup (``<cgroup root>/cpu/anolisnuma-bench-<tag>/kubepods/
besteffort/pod<uid>``). Populations:

- ``loopback``: every pod holds ``--conns`` established connections over its own
  loopback (both ends in the pod: nothing the observer should follow);
- ``pairs``: pods in pairs joined by a veth pair (``198.18.0.0/15``, a /30 per pair; the
  addresses exist only in those namespaces), one pod of each pair holding ``--conns``
  established connections to the other: every socket is a pod-to-pod connection the
  observer must follow and match. The connections are idle: the work per sample does not
  depend on the bytes moved.

Measured per population, in this process (the pods live in a spawner process of their
own): the first sample (every namespace dumped in full); steady samples (no connection
made since: followed sockets looked up exactly, namespaces with nothing to follow only
checked); and samples with ``full_dump_every=1`` (every namespace dumped every time:
a node where every pod makes new connections all the time). CPU is the process's user +
system time around ``sample()`` (the namespace helper thread included); the median of
``--samples`` samples is printed, with the worst.

``--child-ehash N`` makes the pods' namespaces from a namespace where
``net.ipv4.tcp_child_ehash_entries`` is N (Linux >= 6.1), so each gets an established-
socket hash table of its own instead of sharing the host's (what a full dump walks).

Exit status is 0 whether the target (20 ms per steady sample at 200 pods) is met or not;
the table says. ``--quick``: 50 and 200 pods, fewer samples (under 20 s). The machine
should be otherwise idle for figures worth quoting.
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import json
import os
import secrets
import select
import signal
import socket
import statistics
import struct
import subprocess
import sys
import time
import uuid
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
TARGET_MS = 20.0
TARGET_PODS = 200
SERVER_PORT = 5000
SETUP_TIMEOUT = 120.0


# ------------------------------------------------------------------ the pods (spawner)

def _ifreq_flags(sock: socket.socket, name: bytes, up: bool) -> None:
    SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
    got = fcntl.ioctl(sock, SIOCGIFFLAGS, struct.pack("16sH22x", name, 0))
    flags = struct.unpack_from("16sH", got)[1]
    fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH22x", name, (flags | IFF_UP) if up else flags))


def _ifreq_addr(sock: socket.socket, name: bytes, request: int, addr: str) -> None:
    sin = struct.pack("=H2s4s8x", socket.AF_INET, b"\0\0", socket.inet_aton(addr))
    fcntl.ioctl(sock, request, struct.pack("16s", name) + sin + bytes(8))


def _pod_child(index: int, ctl_r: int, status_w: int, libc: ctypes.CDLL) -> None:
    """One pod: its own namespace, then what the spawner tells it, then wait for EOF."""
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if libc.unshare(CLONE_NEWNET) != 0:
        os.write(status_w, f"err {index} unshare errno {ctypes.get_errno()}\n".encode())
        os._exit(1)
    ioc = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    _ifreq_flags(ioc, b"lo", True)
    os.write(status_w, f"ns {index}\n".encode())
    keep: List[socket.socket] = []
    f = os.fdopen(ctl_r, "r")
    for line in f:
        cmd = line.split()
        try:
            if cmd[0] == "loopback":
                n = int(cmd[1])
                ls = socket.socket()
                ls.bind(("127.0.0.1", 0))
                ls.listen(n + 8)
                keep.append(ls)
                for _ in range(n):
                    c = socket.create_connection(ls.getsockname(), timeout=10)
                    s, _ = ls.accept()
                    keep += [c, s]
            elif cmd[0] == "addr":              # addr MINE (in a /30)
                _ifreq_addr(ioc, b"eth0", 0x8916, cmd[1])          # SIOCSIFADDR
                _ifreq_addr(ioc, b"eth0", 0x891C, "255.255.255.252")  # SIOCSIFNETMASK
                _ifreq_flags(ioc, b"eth0", True)
            elif cmd[0] == "listen":            # listen MINE N
                ls = socket.socket()
                ls.bind((cmd[1], SERVER_PORT))
                ls.listen(int(cmd[2]) + 8)
                keep.append(ls)
            elif cmd[0] == "connect":           # connect PEER N
                for _ in range(int(cmd[2])):
                    keep.append(socket.create_connection((cmd[1], SERVER_PORT), timeout=10))
            elif cmd[0] == "accept":            # accept N
                ls = keep[-1]
                ls.settimeout(10)
                for _ in range(int(cmd[1])):
                    keep.append(ls.accept()[0])
        except OSError as e:
            os.write(status_w, f"err {index} {cmd[0]}: {e}\n".encode())
            os._exit(1)
        os.write(status_w, f"ok {index}\n".encode())
    os._exit(0)


def spawner_main() -> int:
    """Runs as a process of its own: forks the pods on request (JSON lines on stdin and
    stdout); every pod ends when this process ends (pipes close; PDEATHSIG)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    req = json.loads(sys.stdin.readline())
    if req.get("child_ehash"):
        if libc.unshare(CLONE_NEWNET) != 0:
            print(json.dumps({"error": f"unshare errno {ctypes.get_errno()}"}), flush=True)
            return 1
        with open("/proc/sys/net/ipv4/tcp_child_ehash_entries", "w") as f:
            f.write(str(req["child_ehash"]))
    n = req["pods"]
    status_r, status_w = os.pipe()
    ctls: List[int] = []
    pids: List[int] = []
    for i in range(n):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(status_r)
            for fd in ctls:
                os.close(fd)
            os.close(w)
            try:
                _pod_child(i, r, status_w, libc)
            finally:
                os._exit(1)
        os.close(r)
        ctls.append(w)
        pids.append(pid)
    os.close(status_w)
    pending = [b""]

    def wait_all(word: str, count: int) -> Optional[str]:
        """Read ``count`` status lines from the pods (raw reads: lines may arrive together)."""
        end = time.monotonic() + SETUP_TIMEOUT
        got = 0
        while got < count:
            while b"\n" not in pending[0]:
                if not select.select([status_r], [], [], max(0.0, end - time.monotonic()))[0]:
                    return f"timeout waiting for {word} ({got}/{count})"
                chunk = os.read(status_r, 65536)
                if not chunk:
                    return "pods ended"
                pending[0] += chunk
            line, pending[0] = pending[0].split(b"\n", 1)
            if line.startswith(b"err"):
                return line.decode(errors="replace")
            got += 1
        return None

    def say(obj: dict) -> None:
        print(json.dumps(obj), flush=True)

    err = wait_all("ns", n)
    say({"pids": pids, "error": err})
    if err:
        return 1

    def tell(i: int, line: str) -> None:
        os.write(ctls[i], (line + "\n").encode())

    for line in sys.stdin:                       # commands from the benchmark
        cmd = json.loads(line)
        for i, text in cmd["to"]:
            tell(i, text)
        say({"error": wait_all(cmd.get("what", "ok"), len(cmd["to"]))})
    return 0


class Pods:
    """The benchmark's side of a pod population."""

    def __init__(self, n: int, child_ehash: int, cgroup_root: str) -> None:
        self.n = n
        self.tag = secrets.token_hex(3)
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--spawner"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.cgroup_dirs: List[str] = []
        v2 = os.path.exists(os.path.join(cgroup_root, "cgroup.controllers"))
        self.cgroup_base = os.path.join(cgroup_root, "" if v2 else "cpu", f"anolisnuma-bench-{self.tag}")
        self.uids: List[str] = []
        self.pids: List[int] = []
        try:
            reply = self._ask({"pods": n, "child_ehash": child_ehash})
            self.pids = reply["pids"]
            host = os.stat("/proc/self/ns/net").st_ino
            if any(os.stat(f"/proc/{p}/ns/net").st_ino == host for p in self.pids):
                raise RuntimeError("a pod is in the host's network namespace")
            self._cgroups()
        except BaseException:
            self.close()
            raise

    def _ask(self, obj: dict) -> dict:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()
        ready = select.select([self.proc.stdout], [], [], SETUP_TIMEOUT + 10)[0]
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            raise RuntimeError(f"spawner gave no answer (exit code {self.proc.poll()})")
        reply = json.loads(line)
        if reply.get("error"):
            raise RuntimeError(f"spawner: {reply['error']}")
        return reply

    def tell(self, lines: List[tuple]) -> None:
        if lines:
            self._ask({"to": lines})

    def _cgroups(self) -> None:
        base = os.path.join(self.cgroup_base, "kubepods", "besteffort")
        for d in (self.cgroup_base, os.path.dirname(base), base):
            os.mkdir(d)
            self.cgroup_dirs.append(d)
        for pid in self.pids:
            uid = str(uuid.uuid4())
            d = os.path.join(base, f"pod{uid}")
            os.mkdir(d)
            self.cgroup_dirs.append(d)
            with open(os.path.join(d, "cgroup.procs"), "w") as f:
                f.write(str(pid))
            self.uids.append(uid)

    def loopback(self, conns: int) -> None:
        self.tell([(i, f"loopback {conns}") for i in range(self.n)])

    def pairs(self, conns: int) -> None:
        """Pods 2k and 2k+1 joined by a veth pair; 2k connects ``conns`` times to 2k+1."""
        batch = "".join(f"link add eth0 netns {self.pids[2 * k]} type veth peer name eth0 "
                        f"netns {self.pids[2 * k + 1]}\n" for k in range(self.n // 2))
        p = subprocess.run(["ip", "-batch", "-"], input=batch, text=True, capture_output=True,
                           timeout=SETUP_TIMEOUT)
        if p.returncode != 0:
            raise RuntimeError(f"ip -batch: {p.stderr.strip()}")

        def addr(i: int) -> str:
            # pair k: 4k+1 and 4k+2 of 198.18.0.0/15 (never .0 or .255 of a /24, which
            # the kernel's classful default mask would make network or broadcast)
            v = (198 << 24) | (18 << 16) | (4 * (i // 2) + 1 + i % 2)
            return socket.inet_ntoa(struct.pack(">I", v))
        pairs = range(self.n // 2)
        self.tell([(i, f"addr {addr(i)}") for i in range(2 * len(pairs))])
        self.tell([(2 * k + 1, f"listen {addr(2 * k + 1)} {conns}") for k in pairs])
        self.tell([(2 * k, f"connect {addr(2 * k + 1)} {conns}") for k in pairs])
        self.tell([(2 * k + 1, f"accept {conns}") for k in pairs])

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                if self.proc.stdin:
                    self.proc.stdin.close()
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(10)
        if self.proc.stdout:
            self.proc.stdout.close()
        # the pods end with the spawner (their control pipes close; PDEATHSIG)
        for pid in self.pids:
            for _ in range(500):
                if not os.path.exists(f"/proc/{pid}"):
                    break
                time.sleep(0.01)
        for d in reversed(self.cgroup_dirs):
            for _ in range(100):
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)
        self.cgroup_dirs.clear()


# ------------------------------------------------------------------------ measuring

def measure(pods: Pods, samples: int, full_dump_every: int) -> Dict[str, float]:
    from anolisnuma.system.traffic import PodProcess, SockDiagSource
    table = {uid: PodProcess(pid) for uid, pid in zip(pods.uids, pods.pids)}
    src = SockDiagSource(full_dump_every=full_dump_every)

    def one() -> tuple:
        c0, w0 = time.process_time(), time.perf_counter()
        s = src.sample(table)
        return (time.process_time() - c0) * 1000, (time.perf_counter() - w0) * 1000, s
    first_cpu, first_wall, first = one()
    cpu, wall, last = [], [], first
    for _ in range(samples):
        c, w, last = one()
        cpu.append(c)
        wall.append(w)
    src.close()
    st = last.stats
    return {
        "first_cpu": first_cpu, "first_wall": first_wall,
        "cpu": statistics.median(cpu), "cpu_max": max(cpu), "wall": statistics.median(wall),
        "sockets": st.sockets, "connections": st.connections, "full": st.full_dumps,
        "refreshed": st.refreshed, "idle": st.idle, "errors": st.errors + first.stats.errors,
        "skipped": st.pods_skipped,
    }


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", default="50,200,500", help="pod counts (default 50,200,500)")
    ap.add_argument("--conns", type=int, default=20, help="connections per pod (default 20)")
    ap.add_argument("--samples", type=int, default=10, help="samples per measurement (default 10)")
    ap.add_argument("--populations", default="loopback,pairs")
    ap.add_argument("--child-ehash", type=int, default=0,
                    help="also measure pods whose namespaces have their own hash table of N buckets")
    ap.add_argument("--quick", action="store_true",
                    help="50 and 200 pods, 3 steady samples, 1 every-sample-full (< 20 s)")
    ap.add_argument("--cgroup-root", default="/sys/fs/cgroup")
    ap.add_argument("--spawner", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.spawner:
        return spawner_main()
    if os.geteuid() != 0:
        print("bench_observer: needs root (network namespaces, cgroups); skipped")
        return 0
    full_samples = a.samples
    if a.quick:
        a.pods, a.samples, full_samples = "50,200", 3, 1
    counts = [int(x) for x in a.pods.split(",")]
    populations = a.populations.split(",")
    ehash = _read_int("/proc/sys/net/ipv4/tcp_ehash_entries")
    print(f"== traffic observer: CPU per sample (ms, median of {a.samples} steady / {full_samples} full; "
          f"worst in brackets), "
          f"{a.conns} connections per pod; host tcp_ehash_entries={ehash}; {os.cpu_count()} CPUs")
    print("   population       pods  ehash   first   steady          every-sample-full  "
          "sockets  conns  target")
    started = time.monotonic()
    variants = [0] + ([a.child_ehash] if a.child_ehash else [])
    for child_ehash in variants:
        for population in populations:
            for n in counts:
                t0 = time.monotonic()
                pods = Pods(n, child_ehash, a.cgroup_root)
                try:
                    if population == "loopback":
                        pods.loopback(a.conns)
                    else:
                        pods.pairs(a.conns)
                    steady = measure(pods, a.samples, full_dump_every=10 ** 6)
                    full = measure(pods, full_samples, full_dump_every=1)
                finally:
                    pods.close()
                mark = ""
                if n == TARGET_PODS and child_ehash == 0:
                    mark = "met" if steady["cpu"] <= TARGET_MS else f"MISSED (> {TARGET_MS:.0f})"
                eh = str(child_ehash) if child_ehash else "host"
                print(f"   {population:<15} {n:>5}  {eh:>5}  {steady['first_cpu']:6.1f}  "
                      f"{steady['cpu']:6.1f} [{steady['cpu_max']:5.1f}]  "
                      f"{full['cpu']:7.1f} [{full['cpu_max']:6.1f}]    "
                      f"{steady['sockets']:>6}  {steady['connections']:>5}  {mark}"
                      + (f"  errors={steady['errors'] + full['errors']}" if steady["errors"] + full["errors"] else "")
                      + (f"  skipped={steady['skipped']}" if steady["skipped"] else "")
                      + f"  (setup+run {time.monotonic() - t0:.1f} s)")
                sys.stdout.flush()
    print(f"   steady: connections made before the first sample, none since (exact lookups of "
          f"followed sockets);\n   every-sample-full: full_dump_every=1; target: steady <= "
          f"{TARGET_MS:.0f} ms at {TARGET_PODS} pods; total {time.monotonic() - started:.1f} s")
    return 0


def _read_int(path: str) -> Optional[int]:
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


if __name__ == "__main__":
    sys.exit(main())
