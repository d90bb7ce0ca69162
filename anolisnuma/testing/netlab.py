"""Network namespaces with fake pods in them, for traffic tests (root only).

A :class:`NetLab` makes, and removes again in :meth:`NetLab.close` (also after a failed
test), everything it needs:

- a hub namespace holding a bridge, and one namespace per "pod", joined to the bridge by a
  veth pair; addresses come from ``198.18.0.0/15`` (RFC 2544, set aside for benchmarks)
  and ``fd00:a1::/64`` and exist only inside these namespaces, so test traffic never
  leaves them;
- fake pod cgroups ``<cgroup root>/cpu/anolisnuma-test-<tag>/kubepods/besteffort/pod<uid>``
  (cgroup v1; on v2 without ``cpu/``), which the peer processes are moved into, so that
  ``/proc/<pid>/cgroup`` names the pod as on a real node;
- peer processes (:mod:`anolisnuma.testing.tcp_peer`) started in those namespaces with
  ``ip netns exec``; they end when the lab closes their standard input, or on their own
  deadline.
"""

from __future__ import annotations

import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import time
import uuid
from typing import Dict, List, Optional, Sequence


class LabError(RuntimeError):
    pass


def lab_usable() -> bool:
    """Whether a lab can be built here: root, ip(8), per-thread namespace files."""
    return (os.geteuid() == 0 and os.path.exists("/proc/thread-self/ns/net")
            and shutil.which("ip", path="/usr/sbin:/sbin:/usr/bin:/bin") is not None)


def _run(args: Sequence[str], timeout: float = 10.0) -> str:
    p = subprocess.run(list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=timeout, check=False)
    if p.returncode != 0:
        raise LabError(f"{' '.join(args)}: exit {p.returncode}: "
                       f"{p.stderr.decode(errors='replace').strip()}")
    return p.stdout.decode(errors="replace")


class Peer:
    """A process in a lab namespace; lines it prints are read with a deadline."""

    def __init__(self, popen: subprocess.Popen, name: str) -> None:
        self.popen = popen
        self.name = name
        self._buf = b""

    @property
    def pid(self) -> int:
        return self.popen.pid

    def readline(self, timeout: float = 10.0) -> str:
        end = time.monotonic() + timeout
        out = self.popen.stdout
        assert out is not None
        with selectors.DefaultSelector() as sel:
            sel.register(out, selectors.EVENT_READ)
            while b"\n" not in self._buf:
                left = end - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise LabError(f"{self.name}: no line within {timeout:.0f} s "
                                   f"(exit code {self.popen.poll()})")
                chunk = os.read(out.fileno(), 4096)
                if not chunk:
                    err = self.popen.stderr.read().decode(errors="replace") if self.popen.stderr else ""
                    raise LabError(f"{self.name}: ended (exit code {self.popen.wait(5)}): {err.strip()}")
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode()

    def expect(self, word: str, timeout: float = 10.0) -> List[str]:
        """Wait for a line starting with ``word``; its fields."""
        fields = self.readline(timeout).split()
        if not fields or fields[0] != word:
            raise LabError(f"{self.name}: expected {word!r}, got {fields!r}")
        return fields

    def stop(self, timeout: float = 5.0) -> None:
        p = self.popen
        if p.poll() is None:
            try:
                if p.stdin:
                    p.stdin.close()
                p.wait(timeout)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.wait(timeout)
        for f in (p.stdin, p.stdout, p.stderr):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass


class NetLab:
    """See the module docstring. ``with NetLab() as lab: ...`` or call :meth:`close`."""

    def __init__(self, cgroup_root: str = "/sys/fs/cgroup") -> None:
        self.tag = secrets.token_hex(3)
        self.namespaces: List[str] = []
        self.peers: List[Peer] = []
        self.cgroups: List[str] = []            # pod cgroup dirs, deepest last
        self.addresses: Dict[str, str] = {}     # namespace -> IPv4 address
        self._next_host = 1
        v2 = os.path.exists(os.path.join(cgroup_root, "cgroup.controllers"))
        self.cgroup_base = os.path.join(cgroup_root, "" if v2 else "cpu", f"anolisnuma-test-{self.tag}")
        try:
            self.hub = self._add_namespace("hub")
            _run(["ip", "-n", self.hub, "link", "add", "br0", "type", "bridge"])
            _run(["ip", "-n", self.hub, "link", "set", "br0", "up"])
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> "NetLab":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -------------------------------------------------------------------- building

    def _add_namespace(self, short: str) -> str:
        name = f"an{self.tag}{short}"
        _run(["ip", "netns", "add", name])
        self.namespaces.append(name)
        _run(["ip", "-n", name, "link", "set", "lo", "up"])
        return name

    def namespace(self, short: str, attach: bool = True) -> str:
        """A new namespace (loopback up); with ``attach``, joined to the hub bridge with the
        next address ``198.18.0.N/24`` (and ``fd00:a1::N/64``) on its ``eth0``, and a
        default route through it."""
        name = self._add_namespace(short)
        if attach:
            n = self._next_host
            self._next_host += 1
            port = f"v{self.tag}{n}"
            _run(["ip", "link", "add", "eth0", "netns", name, "type", "veth",
                  "peer", "name", port, "netns", self.hub])
            _run(["ip", "-n", self.hub, "link", "set", port, "master", "br0", "up"])
            _run(["ip", "-n", name, "addr", "add", f"198.18.0.{n}/24", "dev", "eth0"])
            _run(["ip", "-n", name, "addr", "add", f"fd00:a1::{n}/64", "dev", "eth0", "nodad"])
            _run(["ip", "-n", name, "link", "set", "eth0", "up"])
            _run(["ip", "-n", name, "route", "add", "default", "dev", "eth0"])
            self.addresses[name] = f"198.18.0.{n}"
        return name

    def add_address(self, ns: str, cidr: str) -> None:
        _run(["ip", "-n", ns, "addr", "add", cidr, "dev", "eth0"])

    def iptables(self, ns: str, *args: str) -> None:
        _run(["ip", "netns", "exec", ns, "iptables", *args])

    def pod_cgroup(self, uid: Optional[str] = None) -> str:
        """A fake pod cgroup; returns the UID (a new one unless given)."""
        uid = uid or str(uuid.uuid4())
        path = os.path.join(self.cgroup_base, "kubepods", "besteffort", f"pod{uid}")
        for d in (self.cgroup_base, os.path.dirname(os.path.dirname(path)),
                  os.path.dirname(path), path):
            if not os.path.isdir(d):
                os.mkdir(d)
                self.cgroups.append(d)
        return uid

    def spawn(self, ns: str, uid: Optional[str], *args: str, deadline: float = 60.0) -> Peer:
        """Start ``tcp_peer ARGS`` in ``ns``; move it into pod ``uid``'s cgroup if given."""
        cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", "anolisnuma.testing.tcp_peer",
               *args, "--deadline", str(deadline)]
        p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        peer = Peer(p, f"{ns}:{' '.join(args)}")
        self.peers.append(peer)
        if uid is not None:
            self.move(p.pid, uid)
        return peer

    def move(self, pid: int, uid: str) -> None:
        path = os.path.join(self.cgroup_base, "kubepods", "besteffort", f"pod{uid}", "cgroup.procs")
        with open(path, "w") as f:
            f.write(str(pid))

    # -------------------------------------------------------------------- removing

    def close(self) -> None:
        errors = []
        for peer in self.peers:
            try:
                peer.stop()
            except Exception as e:  # noqa: BLE001 - keep cleaning up
                errors.append(f"{peer.name}: {e}")
        self.peers.clear()
        for d in reversed(self.cgroups):
            for _ in range(50):           # a killed task leaves its cgroup a moment later
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError as e:
                    if e.errno != 16:     # EBUSY
                        errors.append(f"rmdir {d}: {e}")
                        break
                    time.sleep(0.02)
            else:
                errors.append(f"rmdir {d}: still busy")
        self.cgroups.clear()
        for ns in reversed(self.namespaces):
            try:
                _run(["ip", "netns", "del", ns])
            except (LabError, subprocess.TimeoutExpired) as e:
                errors.append(str(e))
        self.namespaces.clear()
        if errors:
            raise LabError("; ".join(errors))
