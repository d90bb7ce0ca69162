"""TCP sockets of network namespaces, and the processes and pods that own them.

What this module reads, all under the configured ``proc_root`` (``/proc`` on a host), from
integer PIDs only (never from a string a pod supplied):

- ``<pid>/ns/net``: a process's network namespace, entered with ``setns(2)`` by a
  short-lived helper thread (:func:`run_in_netns`); the daemon's other threads never
  change namespace, and the helper closes every descriptor it opened before it ends.
- the kernel's socket diagnostics (``NETLINK_SOCK_DIAG``, inet_diag) inside a namespace:
  TCP sockets (IPv4 and IPv6) with their 4-tuple, inode, cookie and the byte counters of
  ``tcp_info`` (``tcpi_bytes_acked``, ``tcpi_bytes_received``) (:class:`DiagChannel`);
- conntrack entries inside a namespace (``NETLINK_NETFILTER``, ctnetlink, one exact
  lookup per connection) to see through DNAT/SNAT (:class:`ConntrackChannel`);
- ``<pid>/net/snmp``: the namespace's TCP open counters (:func:`tcp_opens`);
- ``<pid>/fd/*``: socket inodes a process holds (:func:`socket_inodes`);
- ``<pid>/cgroup``: the pod a process belongs to (:func:`pod_uid_of`), with the pod cgroup
  shapes and UID validation of :mod:`anolisnuma.system.cgroups`.

Costs worth knowing (measured on Linux 6.18; ``docs/numa.md`` has the figures): a dump
walks the *whole* established-socket hash table of the host (``tcp_ehash_entries``;
namespaces share it unless ``net.ipv4.tcp_child_ehash_entries`` was set before they were
made), about 0.8 ms per family at 262144 buckets, however few sockets the namespace
holds. An exact lookup of one known socket (:meth:`DiagChannel.refresh`) is a hash lookup.
pyroute2's generic message decoder costs about 120 us per socket, so the two hot paths
(dump and refresh replies) are decoded here with precompiled ``struct`` layouts of the
kernel's ``inet_diag_msg``; the tests check them against pyroute2's decoder. Requests and
the rare conntrack messages use pyroute2's message classes.

This module only reads; deciding what the sockets mean is ``anolisnuma.system.traffic``'s.
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import struct
import threading
from typing import Callable, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple, TypeVar

from pyroute2.netlink import (
    NETLINK_NETFILTER,
    NETLINK_SOCK_DIAG,
    NLM_F_ACK,
    NLM_F_DUMP,
    NLM_F_REQUEST,
    NLMSG_DONE,
    NLMSG_ERROR,
)
from pyroute2.netlink.diag import (
    SOCK_DIAG_BY_FAMILY,
    SS_CLOSE_WAIT,
    SS_CLOSING,
    SS_ESTABLISHED,
    SS_FIN_WAIT1,
    SS_FIN_WAIT2,
    SS_LAST_ACK,
    inet_diag_req,
)
from pyroute2.netlink.nfnetlink import NFNL_SUBSYS_CTNETLINK
from pyroute2.netlink.nfnetlink.nfctsocket import IPCTNL_MSG_CT_GET, NFCTAttrTuple, nfct_msg

from anolisnuma.system.pod_cgroups import DEFAULT_LAYOUT, KubeletCgroupLayout

CLONE_NEWNET = 0x40000000

# TCP states that carry data: established and the closing states before TIME_WAIT.
# (LISTEN, SYN_SENT/RECV, TIME_WAIT and CLOSE hold no byte counters worth reading.)
DATA_STATES = 0
for _s in (SS_ESTABLISHED, SS_FIN_WAIT1, SS_FIN_WAIT2, SS_CLOSE_WAIT, SS_LAST_ACK, SS_CLOSING):
    DATA_STATES |= 1 << _s

INET_DIAG_REQ_BYTECODE = 1
INET_DIAG_INFO = 2                       # attribute carrying struct tcp_info
_EXT_INFO = 1 << (INET_DIAG_INFO - 1)    # idiag_ext bit asking for it
_BC_JMP = 1
_BC_S_COND = 7

# nlmsghdr, then inet_diag_msg up to idiag_inode (the 48-byte inet_diag_sockid kept raw:
# sport, dport (big endian), src[16], dst[16], if, cookie[8]).
_HDR = struct.Struct("=IHHII")
_MSG = struct.Struct("=IHHIIBBxx48s16xI")
_REQ_BODY = struct.Struct("=BBBBI")       # inet_diag_req_v2 without its sockid
_ATTR = struct.Struct("=HH")
_ERRNO = struct.Struct("=i")
_U64X2 = struct.Struct("=QQ")
_TCPI_BYTES_ACKED = 120                  # offset of tcpi_bytes_acked in struct tcp_info
_TCPI_MIN_LEN = 136                      # ... and the end of tcpi_bytes_received (Linux >= 4.1)
_V4MAPPED = b"\0" * 10 + b"\xff\xff"
_V4_LOOPBACK_PREFIX = _V4MAPPED + b"\x7f"
_V6_LOOPBACK = b"\0" * 15 + b"\x01"

_RECV_BYTES = 1 << 16
_REFRESH_CHUNK = 32                      # exact lookups per sendmsg (their replies must fit the socket buffer)
_CGROUP_FILE_CAP = 1 << 16

T = TypeVar("T")


class SockDiagError(OSError):
    """The kernel refused a socket-diagnostics or conntrack request, or its answer could not
    be read."""


# ------------------------------------------------------------------------- endpoints

def endpoint(ip: str, port: int) -> bytes:
    """The 18-byte key this module uses for an address and port: the port (2 bytes, network
    order) and the address as 16 bytes, IPv4 as ``::ffff:a.b.c.d`` so that an IPv4 socket
    and a dual-stack IPv6 socket of the same connection give the same key."""
    if ":" in ip:
        raw = socket.inet_pton(socket.AF_INET6, ip)
    else:
        raw = _V4MAPPED + socket.inet_pton(socket.AF_INET, ip)
    return struct.pack(">H", port) + raw


def endpoint_ip(ep: bytes) -> str:
    addr = ep[2:]
    if addr.startswith(_V4MAPPED):
        return socket.inet_ntop(socket.AF_INET, addr[12:])
    return socket.inet_ntop(socket.AF_INET6, addr)


def endpoint_port(ep: bytes) -> int:
    return (ep[0] << 8) | ep[1]


def endpoint_str(ep: bytes) -> str:
    """``10.0.0.1:80`` or ``[fd00::1]:80``."""
    ip = endpoint_ip(ep)
    return f"[{ip}]:{endpoint_port(ep)}" if ":" in ip else f"{ip}:{endpoint_port(ep)}"


def is_loopback(ep: bytes) -> bool:
    addr = ep[2:]
    return addr.startswith(_V4_LOOPBACK_PREFIX) or addr == _V6_LOOPBACK


class TcpSocket(NamedTuple):
    """One TCP socket as the kernel reported it."""

    local: bytes            # endpoint key (see :func:`endpoint`)
    remote: bytes
    state: int              # TCP state (``SS_ESTABLISHED``...)
    inode: int              # 0 for sockets no file refers to any more
    family: int             # AF_INET or AF_INET6 (a dual-stack socket is AF_INET6)
    diag_id: bytes          # the kernel's 48-byte inet_diag_sockid, for exact lookups
    bytes_acked: int        # sent and acknowledged by the peer; -1 if the kernel lacks it
    bytes_received: int     # received; -1 if the kernel lacks it

    @property
    def cookie(self) -> bytes:
        """The kernel's socket cookie: unique per socket (per namespace on old kernels)."""
        return self.diag_id[40:48]

    def describe(self) -> str:
        return f"{endpoint_str(self.local)} -> {endpoint_str(self.remote)}"


# ----------------------------------------------------------------- inet_diag decoding

_info_at: Dict[int, int] = {}     # message length -> offset of INET_DIAG_INFO seen last time


def _counters_at(data: bytes, off: int, length: int) -> Tuple[int, int]:
    """``(bytes_acked, bytes_received)`` of the message at ``off``, -1s if absent."""
    a = _info_at.get(length)
    if a is not None:
        alen, atype = _ATTR.unpack_from(data, off + a)
        if atype == INET_DIAG_INFO and alen >= 4 + _TCPI_MIN_LEN:
            return _U64X2.unpack_from(data, off + a + 4 + _TCPI_BYTES_ACKED)   # type: ignore[return-value]
    return _socket_at(data, off, length)[6:8]    # type: ignore[return-value]


def _socket_at(data: bytes, off: int, length: int) -> TcpSocket:
    """The socket of the SOCK_DIAG_BY_FAMILY message at ``off`` (``length`` bytes)."""
    _, _, _, _, _, family, state, sid, inode = _MSG.unpack_from(data, off)
    acked = received = -1
    # Messages of one length have one layout: try where the counters were last time.
    a = _info_at.get(length)
    if a is not None:
        alen, atype = _ATTR.unpack_from(data, off + a)
        if atype == INET_DIAG_INFO and alen >= 4 + _TCPI_MIN_LEN:
            acked, received = _U64X2.unpack_from(data, off + a + 4 + _TCPI_BYTES_ACKED)
        else:
            a = None
    if a is None:
        a = _MSG.size
        while a + 4 <= length:
            alen, atype = _ATTR.unpack_from(data, off + a)
            if alen < 4:
                break
            if atype == INET_DIAG_INFO and alen >= 4 + _TCPI_MIN_LEN:
                acked, received = _U64X2.unpack_from(data, off + a + 4 + _TCPI_BYTES_ACKED)
                if len(_info_at) < 64:
                    _info_at[length] = a
                break
            a += (alen + 3) & ~3
    if family == socket.AF_INET:
        return TcpSocket(sid[0:2] + _V4MAPPED + sid[4:8], sid[2:4] + _V4MAPPED + sid[20:24],
                         state, inode, family, sid, acked, received)
    return TcpSocket(sid[0:2] + sid[4:20], sid[2:4] + sid[20:36],
                     state, inode, family, sid, acked, received)


def _decode(data: bytes, out: List[TcpSocket]) -> bool:
    """Decode a datagram of a dump into ``out``; True once NLMSG_DONE is seen. Raises
    :class:`SockDiagError` for an error message."""
    off = 0
    end = len(data)
    while off + 16 <= end:
        length, mtype = _HDR.unpack_from(data, off)[:2]
        if length < 16 or off + length > end:
            raise SockDiagError(errno.EBADMSG, "truncated netlink message")
        if mtype == SOCK_DIAG_BY_FAMILY and length >= _MSG.size:
            out.append(_socket_at(data, off, length))
        elif mtype == NLMSG_DONE:
            return True
        elif mtype == NLMSG_ERROR:
            code = -_ERRNO.unpack_from(data, off + 16)[0] if length >= 20 else errno.EBADMSG
            if code != 0:
                raise SockDiagError(code, f"sock_diag: {os.strerror(code)}")
        off += (length + 3) & ~3
    return False


def _not_loopback_bytecode() -> bytes:
    """inet_diag filter bytecode: keep sockets whose source is neither 127.0.0.0/8 (also as
    ``::ffff:127.0.0.0/104``) nor ``::1``. Built as ``ss`` builds ``!A && !B``: each
    condition's *yes* falls on a JMP that leaves the program (reject), its *no* skips it."""
    op = struct.Struct("=BBH")
    cond = struct.Struct("=BBxxi")
    a = op.pack(_BC_S_COND, 16, 20) + cond.pack(socket.AF_INET, 8, -1) + b"\x7f\0\0\0"
    b = op.pack(_BC_S_COND, 28, 32) + cond.pack(socket.AF_INET6, 128, -1) + _V6_LOOPBACK
    jmp_a = op.pack(_BC_JMP, 4, 8 + len(b) + 4)     # past the end of the whole program
    jmp_b = op.pack(_BC_JMP, 4, 8)
    return a + jmp_a + b + jmp_b


_NOT_LOOPBACK = _not_loopback_bytecode()


def _dump_request(family: int, seq: int, skip_loopback: bool) -> bytes:
    req = inet_diag_req()
    req["sdiag_family"] = family
    req["sdiag_protocol"] = socket.IPPROTO_TCP
    req["idiag_ext"] = _EXT_INFO
    req["idiag_states"] = DATA_STATES
    req["idiag_src"] = 0
    req["idiag_dst"] = 0
    req["header"]["type"] = SOCK_DIAG_BY_FAMILY
    req["header"]["flags"] = NLM_F_REQUEST | NLM_F_DUMP
    req["header"]["sequence_number"] = seq
    req.encode()
    data = bytes(req.data[:req["header"]["length"]])
    if not skip_loopback:
        return data
    attr = _ATTR.pack(4 + len(_NOT_LOOPBACK), INET_DIAG_REQ_BYTECODE) + _NOT_LOOPBACK
    body = data[16:] + attr
    return _HDR.pack(16 + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + body


def _netlink_socket(protocol: int, timeout: float) -> socket.socket:
    """A blocking netlink socket whose receives give up after ``timeout`` seconds
    (``SO_RCVTIMEO``: one system call per message, where Python's own timeouts add a
    ``poll`` before each). Sending to the kernel does not block; the socket binds itself
    on its first send; the default receive buffer holds the answers of one
    :data:`_REFRESH_CHUNK` of lookups (about 2.5 KiB of buffer each)."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, protocol)
    try:
        sec = int(timeout)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO,
                        struct.pack("@ll", sec, int((timeout - sec) * 1e6)))
    except BaseException:
        sock.close()
        raise
    return sock


def _recv(sock: socket.socket, what: str) -> bytes:
    try:
        return sock.recv(_RECV_BYTES)
    except (BlockingIOError, socket.timeout):
        raise SockDiagError(errno.ETIMEDOUT, f"{what}: no answer from the kernel") from None


class DiagChannel:
    """A sock_diag netlink socket of the namespace the calling thread is in when it is
    made. Usable from any thread afterwards; close it (or use ``with``)."""

    def __init__(self, timeout: float = 2.0) -> None:
        self.sock = _netlink_socket(NETLINK_SOCK_DIAG, timeout)
        self._seq = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "DiagChannel":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def dump(self, skip_loopback: bool = False) -> List[TcpSocket]:
        """Every TCP socket of the namespace in a data-carrying state (IPv4, then IPv6).
        ``skip_loopback`` has the kernel leave out sockets on loopback addresses."""
        out: List[TcpSocket] = []
        for family in (socket.AF_INET, socket.AF_INET6):
            self._seq += 1
            self.sock.send(_dump_request(family, self._seq, skip_loopback))
            while not _decode(self._recv(), out):
                pass
        return out

    def refresh(self, sockets: Sequence[TcpSocket]) -> List[Optional[TcpSocket]]:
        """Exact lookups of known sockets (by 4-tuple and cookie): their current state and
        counters, in the same order; ``None`` for a socket that is gone (closed: the kernel
        still finds it in TIME_WAIT, without counters; or its 4-tuple now names a
        different socket)."""
        result: List[Optional[TcpSocket]] = []
        body = _REQ_BODY.pack
        for start in range(0, len(sockets), _REFRESH_CHUNK):
            part = sockets[start:start + _REFRESH_CHUNK]
            base = self._seq + 1
            self._seq += len(part)
            self.sock.send(b"".join(
                _HDR.pack(72, SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, base + i, 0)
                + body(s.family, socket.IPPROTO_TCP, _EXT_INFO, 0, DATA_STATES) + s.diag_id
                for i, s in enumerate(part)))
            # One answer per request, each its own datagram: the socket, or an error.
            got: List[Optional[TcpSocket]] = [None] * len(part)
            pending = len(part)
            while pending:
                data = self._recv()
                off = 0
                while off + 16 <= len(data):
                    length, mtype, _, seq, _ = _HDR.unpack_from(data, off)
                    if length < 16 or off + length > len(data):
                        raise SockDiagError(errno.EBADMSG, "truncated netlink message")
                    i = seq - base
                    if 0 <= i < len(part):
                        if mtype == SOCK_DIAG_BY_FAMILY and length >= _MSG.size:
                            state = data[off + 17]
                            # closed: the kernel still finds it in TIME_WAIT, without counters
                            if (DATA_STATES >> state) & 1:
                                acked, received = _counters_at(data, off, length)
                                old = part[i]
                                got[i] = TcpSocket(old.local, old.remote, state, old.inode,
                                                   old.family, old.diag_id, acked, received)
                            pending -= 1
                        elif mtype == NLMSG_ERROR:
                            code = -_ERRNO.unpack_from(data, off + 16)[0] if length >= 20 else errno.EBADMSG
                            if code not in (errno.ENOENT, errno.ESTALE):
                                raise SockDiagError(code or errno.EBADMSG,
                                                    f"sock_diag lookup: {os.strerror(code or errno.EBADMSG)}")
                            pending -= 1
                    off += (length + 3) & ~3
            result += got
        return result

    def _recv(self) -> bytes:
        return _recv(self.sock, "sock_diag")


# ------------------------------------------------------------------------- conntrack

Flow = Tuple[bytes, bytes]    # (source endpoint, destination endpoint)


class ConntrackChannel:
    """A ctnetlink socket of the namespace the calling thread is in when it is made.

    :meth:`lookup` finds the TCP conntrack entry one end of a connection belongs to and
    returns both of its directions: where the packets really went (after DNAT) and whom
    the other end sees (after SNAT). See :func:`peer_flow`.
    """

    def __init__(self, timeout: float = 2.0) -> None:
        self.sock = _netlink_socket(NETLINK_NETFILTER, timeout)
        self._seq = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "ConntrackChannel":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def lookup(self, local: bytes, remote: bytes) -> Optional[Tuple[Flow, Flow]]:
        """``(original, reply)`` flows of the entry holding the tuple ``local -> remote`` (in
        either direction: the kernel hashes both), or ``None`` when there is none (no
        conntrack in this namespace, or the connection is not tracked here)."""
        v4 = local[2:].startswith(_V4MAPPED) and remote[2:].startswith(_V4MAPPED)
        family = socket.AF_INET if v4 else socket.AF_INET6
        query = NFCTAttrTuple(family=family, saddr=endpoint_ip(local), daddr=endpoint_ip(remote),
                              proto=socket.IPPROTO_TCP, sport=endpoint_port(local),
                              dport=endpoint_port(remote))
        msg = nfct_msg.create_from(tuple_orig=query)
        self._seq += 1
        msg["header"]["type"] = (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_GET
        msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_ACK
        msg["header"]["sequence_number"] = self._seq
        msg["nfgen_family"] = family
        msg.encode()
        self.sock.send(bytes(msg.data[:msg["header"]["length"]]))
        found: Optional[Tuple[Flow, Flow]] = None
        for _ in range(64):          # an answer and an ack; anything else is not ours
            data = _recv(self.sock, "ctnetlink")
            off = 0
            while off + 16 <= len(data):
                length, mtype, _, seq, _ = _HDR.unpack_from(data, off)
                if length < 16:
                    raise SockDiagError(errno.EBADMSG, "truncated netlink message")
                if seq == self._seq:
                    if mtype == NLMSG_ERROR:
                        code = -_ERRNO.unpack_from(data, off + 16)[0]
                        if code == 0:
                            return found
                        if code == errno.ENOENT:
                            return None
                        raise SockDiagError(code, f"ctnetlink: {os.strerror(code)}")
                    reply = nfct_msg(data[off:off + length])
                    reply.decode()
                    found = _flows(family, reply) or found
                off += (length + 3) & ~3
        raise SockDiagError(errno.EBADMSG, "ctnetlink: no end to the answer")


def _flows(family: int, msg: nfct_msg) -> Optional[Tuple[Flow, Flow]]:
    out = []
    for name in ("CTA_TUPLE_ORIG", "CTA_TUPLE_REPLY"):
        nla = msg.get_attr(name)
        if nla is None:
            return None
        t = NFCTAttrTuple.from_netlink(family, nla)
        if not t.saddr or not t.daddr or t.sport is None or t.dport is None:
            return None
        out.append((endpoint(t.saddr, t.sport), endpoint(t.daddr, t.dport)))
    return out[0], out[1]


def peer_flow(local: bytes, remote: bytes, orig: Flow, reply: Flow) -> Optional[Flow]:
    """``(local, remote)`` of the other end's socket, given one end's socket and the
    conntrack entry of their connection: the client (``orig`` is its view) talks to the
    server whose socket is ``reply``; the server (``reply`` is its view) talks to the
    client whose socket is ``orig``. ``None`` if the entry is not this connection's."""
    if (local, remote) == orig:
        return reply
    if (local, remote) == reply:
        return orig
    return None


# --------------------------------------------------------------- entering namespaces

NetnsKey = Tuple[int, int]   # (st_dev, st_ino) of a namespace file: its identity


class NetnsResult(NamedTuple):
    pid: int
    netns: Optional[NetnsKey]     # the namespace actually entered
    value: object                 # what ``fn`` returned
    error: Optional[BaseException]


def _libc_setns() -> Callable[[int, int], None]:
    native = getattr(os, "setns", None)   # Python >= 3.12
    if native is not None:
        return native
    libc = ctypes.CDLL(None, use_errno=True)
    fn = libc.setns
    fn.argtypes = (ctypes.c_int, ctypes.c_int)
    fn.restype = ctypes.c_int

    def setns(fd: int, nstype: int) -> None:
        if fn(fd, nstype) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns: {os.strerror(err)}")
    return setns


_setns = _libc_setns()


def run_in_netns(proc_root: str, pids: Sequence[int], fn: Callable[[int, NetnsKey], T],
                 timeout: float = 30.0) -> List[NetnsResult]:
    """Call ``fn(pid, netns)`` inside the network namespace of each of ``pids``, in order,
    on a helper thread made for this call, which goes back to its own namespace and ends
    before this returns. ``fn`` must close what it opens (its sockets keep the namespace
    they were made in, whatever thread uses them).

    Per-PID failures (process gone, namespace not enterable, ``fn`` raised) are returned in
    the result, not raised. Raises :class:`SockDiagError` if the helper did not finish
    within ``timeout`` (it then finishes on its own; ``fn``'s sockets have timeouts).
    """
    results: List[NetnsResult] = []
    failure: List[BaseException] = []

    def worker() -> None:
        try:
            own = os.open(os.path.join(proc_root, "thread-self/ns/net"), os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            failure.append(e)
            return
        try:
            moved = False
            for pid in pids:
                path = os.path.join(proc_root, str(int(pid)), "ns/net")
                try:
                    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                except OSError as e:
                    results.append(NetnsResult(pid, None, None, e))
                    continue
                try:
                    st = os.fstat(fd)
                    key = (st.st_dev, st.st_ino)
                    _setns(fd, CLONE_NEWNET)
                    moved = True
                except OSError as e:
                    results.append(NetnsResult(pid, None, None, e))
                    continue
                finally:
                    os.close(fd)
                try:
                    results.append(NetnsResult(pid, key, fn(pid, key), None))
                except Exception as e:  # noqa: BLE001 - handed back to the caller per PID
                    results.append(NetnsResult(pid, key, None, e))
            if moved:
                _setns(own, CLONE_NEWNET)
        except BaseException as e:  # noqa: BLE001 - the thread ends either way
            failure.append(e)
        finally:
            os.close(own)

    thread = threading.Thread(target=worker, name="anolisnuma-netns", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise SockDiagError(errno.ETIMEDOUT, f"namespace helper still busy after {timeout:.0f} s")
    if failure:
        e = failure[0]
        if isinstance(e, OSError):
            raise SockDiagError(e.errno or errno.EIO, f"namespace helper: {e}") from e
        raise e
    return results


# ------------------------------------------------------------------------ /proc reads

def netns_key(proc_root: str, pid: int) -> NetnsKey:
    """Identity of ``pid``'s network namespace; raises OSError if the process is gone."""
    st = os.stat(os.path.join(proc_root, str(int(pid)), "ns/net"))
    return (st.st_dev, st.st_ino)


def process_exists(proc_root: str, pid: int) -> bool:
    return os.path.exists(os.path.join(proc_root, str(pid)))


def list_pids(proc_root: str) -> List[int]:
    return [int(name) for name in os.listdir(proc_root) if name.isdigit()]


def _read_bytes(path: str, cap: int = _CGROUP_FILE_CAP) -> bytes:
    """A small proc file made by one ``show`` call (``single_open``: ``cgroup``,
    ``net/snmp``), which one large enough read returns whole; up to ``cap`` bytes."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.read(fd, cap)
        if len(data) >= cap // 2:              # not expected: read on, to EOF or cap
            chunks = [data]
            size = len(data)
            while size < cap:
                chunk = os.read(fd, cap - size)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            data = b"".join(chunks)
    finally:
        os.close(fd)
    return data


def _read_small(path: str, cap: int = _CGROUP_FILE_CAP) -> str:
    return _read_bytes(path, cap).decode("ascii", "replace")


def tcp_opens(proc_root: str, pid: int) -> int:
    """``ActiveOpens + PassiveOpens`` of ``pid``'s network namespace (``net/snmp``): it
    changes whenever a TCP connection is made there, so while it stands still the
    namespace has no socket that was not there before. Raises OSError if unreadable."""
    path = os.path.join(proc_root, str(int(pid)), "net/snmp")
    data = _read_bytes(path)
    head = data.find(b"Tcp: ")
    body = data.find(b"Tcp: ", head + 5) if head >= 0 else -1
    if body >= 0:
        names = data[head:data.find(b"\n", head)].split()
        end = data.find(b"\n", body)
        values = data[body:end if end >= 0 else len(data)].split()
        try:
            return (int(values[names.index(b"ActiveOpens")])
                    + int(values[names.index(b"PassiveOpens")]))
        except (ValueError, IndexError):
            pass
    raise OSError(errno.EBADMSG, f"no TCP open counters in {path}")


def socket_inodes(proc_root: str, pid: int) -> List[int]:
    """Inodes of the sockets ``pid`` holds open (``fd/*`` links ``socket:[N]``). Empty if
    the process is gone; descriptors closed while reading are skipped."""
    base = os.path.join(proc_root, str(int(pid)), "fd")
    try:
        names = os.listdir(base)
    except OSError:
        return []
    out = []
    for name in names:
        try:
            target = os.readlink(os.path.join(base, name))
        except OSError:
            continue
        if target.startswith("socket:[") and target.endswith("]"):
            try:
                out.append(int(target[8:-1]))
            except ValueError:
                continue
    return out


def pod_uid_from_cgroup_path(path: str, layout: Optional[KubeletCgroupLayout] = None) -> Optional[str]:
    """The pod UID in a cgroup path as ``/proc/<pid>/cgroup`` shows it, for the kubelet's
    cgroup layout (``layout``; default: root ``/``, either driver), wherever the pod part
    sits (a node running in a container puts a prefix before it). ``None`` when the path is
    not inside a pod cgroup. The UID is validated by the layout's path rules."""
    return (layout or DEFAULT_LAYOUT).pod_uid_from_cgroup_path(path)


def pod_uid_of(proc_root: str, pid: int, layout: Optional[KubeletCgroupLayout] = None) -> Optional[str]:
    """The UID of the pod whose cgroup ``pid`` is in (first hierarchy that names one), or
    ``None``. Raises OSError if the process is gone."""
    text = _read_small(os.path.join(proc_root, str(int(pid)), "cgroup"))
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        uid = pod_uid_from_cgroup_path(path, layout)
        if uid is not None:
            return uid
    return None


def inode_owners(proc_root: str, pids: Iterable[int]) -> Dict[int, int]:
    """socket inode -> PID, for the sockets ``pids`` hold (a socket shared by several of
    them goes to the first)."""
    owners: Dict[int, int] = {}
    for pid in pids:
        for inode in socket_inodes(proc_root, pid):
            owners.setdefault(inode, pid)
    return owners
