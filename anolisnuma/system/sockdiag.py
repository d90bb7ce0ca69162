"""TCP sockets of a network namespace, from the kernel's socket diagnostics.

The traffic observer reads, from integer PIDs only (never from a string a pod supplied),
through four small rooms of ``anolisnuma.system``:

- here: the kernel's socket diagnostics (``NETLINK_SOCK_DIAG``, inet_diag) inside a
  namespace: TCP sockets (IPv4 and IPv6) with their 4-tuple, inode, cookie and the byte
  counters of ``tcp_info`` (``tcpi_bytes_acked``, ``tcpi_bytes_received``)
  (:class:`DiagChannel`), and the endpoint keys every room uses;
- :mod:`~anolisnuma.system.conntrack`: conntrack entries inside a namespace, to see through
  DNAT/SNAT;
- :mod:`~anolisnuma.system.netns`: entering a process's network namespace on a short-lived
  helper thread (the daemon's other threads never change namespace);
- :mod:`~anolisnuma.system.procfs`: what ``/proc/<pid>`` tells (TCP open counters, socket
  inodes, the pod a process is in).

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

import errno
import os
import socket
import struct
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from anolisnuma.system import pyroute2_lean

pyroute2_lean.install()     # before the first pyroute2 import: its message modules only

from pyroute2.netlink import (
    NETLINK_SOCK_DIAG,
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
NLMSG_HDR = struct.Struct("=IHHII")
_MSG = struct.Struct("=IHHIIBBxx48s16xI")
_REQ_BODY = struct.Struct("=BBBBI")       # inet_diag_req_v2 without its sockid
_ATTR = struct.Struct("=HH")
NLMSG_ERRNO = struct.Struct("=i")
_U64X2 = struct.Struct("=QQ")
_TCPI_BYTES_ACKED = 120                  # offset of tcpi_bytes_acked in struct tcp_info
_TCPI_MIN_LEN = 136                      # ... and the end of tcpi_bytes_received (Linux >= 4.1)
V4MAPPED = b"\0" * 10 + b"\xff\xff"
_V4_LOOPBACK_PREFIX = V4MAPPED + b"\x7f"
_V6_LOOPBACK = b"\0" * 15 + b"\x01"

_RECV_BYTES = 1 << 16
_REFRESH_CHUNK = 32                      # exact lookups per sendmsg (their replies must fit the socket buffer)


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
        raw = V4MAPPED + socket.inet_pton(socket.AF_INET, ip)
    return struct.pack(">H", port) + raw


def endpoint_ip(ep: bytes) -> str:
    addr = ep[2:]
    if addr.startswith(V4MAPPED):
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
        return TcpSocket(sid[0:2] + V4MAPPED + sid[4:8], sid[2:4] + V4MAPPED + sid[20:24],
                         state, inode, family, sid, acked, received)
    return TcpSocket(sid[0:2] + sid[4:20], sid[2:4] + sid[20:36],
                     state, inode, family, sid, acked, received)


def _decode(data: bytes, out: List[TcpSocket]) -> bool:
    """Decode a datagram of a dump into ``out``; True once NLMSG_DONE is seen. Raises
    :class:`SockDiagError` for an error message."""
    off = 0
    end = len(data)
    while off + 16 <= end:
        length, mtype = NLMSG_HDR.unpack_from(data, off)[:2]
        if length < 16 or off + length > end:
            raise SockDiagError(errno.EBADMSG, "truncated netlink message")
        if mtype == SOCK_DIAG_BY_FAMILY and length >= _MSG.size:
            out.append(_socket_at(data, off, length))
        elif mtype == NLMSG_DONE:
            return True
        elif mtype == NLMSG_ERROR:
            code = -NLMSG_ERRNO.unpack_from(data, off + 16)[0] if length >= 20 else errno.EBADMSG
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
    return NLMSG_HDR.pack(16 + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + body


def netlink_socket(protocol: int, timeout: float) -> socket.socket:
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


def recv_reply(sock: socket.socket, what: str) -> bytes:
    try:
        return sock.recv(_RECV_BYTES)
    except (BlockingIOError, socket.timeout):
        raise SockDiagError(errno.ETIMEDOUT, f"{what}: no answer from the kernel") from None


class DiagChannel:
    """A sock_diag netlink socket of the namespace the calling thread is in when it is
    made. Usable from any thread afterwards; close it (or use ``with``)."""

    def __init__(self, timeout: float = 2.0) -> None:
        self.sock = netlink_socket(NETLINK_SOCK_DIAG, timeout)
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
                NLMSG_HDR.pack(72, SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, base + i, 0)
                + body(s.family, socket.IPPROTO_TCP, _EXT_INFO, 0, DATA_STATES) + s.diag_id
                for i, s in enumerate(part)))
            # One answer per request, each its own datagram: the socket, or an error.
            got: List[Optional[TcpSocket]] = [None] * len(part)
            pending = len(part)
            while pending:
                data = self._recv()
                off = 0
                while off + 16 <= len(data):
                    length, mtype, _, seq, _ = NLMSG_HDR.unpack_from(data, off)
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
                            code = -NLMSG_ERRNO.unpack_from(data, off + 16)[0] if length >= 20 else errno.EBADMSG
                            if code not in (errno.ENOENT, errno.ESTALE):
                                raise SockDiagError(code or errno.EBADMSG,
                                                    f"sock_diag lookup: {os.strerror(code or errno.EBADMSG)}")
                            pending -= 1
                    off += (length + 3) & ~3
            result += got
        return result

    def _recv(self) -> bytes:
        return recv_reply(self.sock, "sock_diag")
