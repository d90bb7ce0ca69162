"""Conntrack entries of a network namespace (``NETLINK_NETFILTER``, ctnetlink): one exact
lookup per connection, to see through DNAT/SNAT which socket is a connection's other end.

Requests and answers use pyroute2's message classes (conntrack lookups are rare: a new
connection once); the netlink socket and the reply reading are
:mod:`~anolisnuma.system.sockdiag`'s.
"""

from __future__ import annotations

import errno
import os
import socket
from typing import Optional, Tuple

from anolisnuma.system import pyroute2_lean

pyroute2_lean.install()     # before the first pyroute2 import: its message modules only

from pyroute2.netlink import NETLINK_NETFILTER, NLM_F_ACK, NLM_F_REQUEST, NLMSG_ERROR
from pyroute2.netlink.nfnetlink import NFNL_SUBSYS_CTNETLINK
from pyroute2.netlink.nfnetlink.nfctsocket import IPCTNL_MSG_CT_GET, NFCTAttrTuple, nfct_msg

from anolisnuma.system.sockdiag import (
    NLMSG_ERRNO, NLMSG_HDR, V4MAPPED, SockDiagError, endpoint, endpoint_ip, endpoint_port, netlink_socket,
    recv_reply)

Flow = Tuple[bytes, bytes]    # (source endpoint, destination endpoint)


class ConntrackChannel:
    """A ctnetlink socket of the namespace the calling thread is in when it is made.

    :meth:`lookup` finds the TCP conntrack entry one end of a connection belongs to and
    returns both of its directions: where the packets really went (after DNAT) and whom
    the other end sees (after SNAT). See :func:`peer_flow`.
    """

    def __init__(self, timeout: float = 2.0) -> None:
        self.sock = netlink_socket(NETLINK_NETFILTER, timeout)
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
        v4 = local[2:].startswith(V4MAPPED) and remote[2:].startswith(V4MAPPED)
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
            data = recv_reply(self.sock, "ctnetlink")
            off = 0
            while off + 16 <= len(data):
                length, mtype, _, seq, _ = NLMSG_HDR.unpack_from(data, off)
                if length < 16:
                    raise SockDiagError(errno.EBADMSG, "truncated netlink message")
                if seq == self._seq:
                    if mtype == NLMSG_ERROR:
                        code = -NLMSG_ERRNO.unpack_from(data, off + 16)[0]
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
