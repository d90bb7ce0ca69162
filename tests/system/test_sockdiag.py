"""Socket diagnostics per network namespace, on real namespaces and real connections
(anolisnuma.testing.netlab: namespaces joined by a bridge in a hub namespace, addresses
only inside them, fake pod cgroups), plus the pure helpers."""

import os
import socket
import threading
import uuid

import pytest

from anolisnuma.system import netns, procfs, sockdiag
from anolisnuma.system.conntrack import ConntrackChannel, peer_flow
from anolisnuma.system.netns import run_in_netns
from anolisnuma.system.procfs import pod_uid_from_cgroup_path
from anolisnuma.system.sockdiag import DiagChannel, endpoint, endpoint_str, is_loopback
from anolisnuma.testing.netlab import lab_usable
from anolisnuma.testing.waiting import wait_until

UID = "0f8fad5b-d9cb-469f-a165-70867728950e"
CID = "a" * 64


needs_lab = pytest.mark.skipif(not lab_usable(), reason="needs root, ip(8) and network namespaces")


def in_ns(pid, fn):
    """fn(DiagChannel) inside pid's namespace; raises what it raised."""
    def call(_pid, _key):
        with DiagChannel() as ch:
            return fn(ch)
    (r,) = run_in_netns("/proc", [pid], call)
    if r.error is not None:
        raise r.error
    return r.value


def dump_of(pid, skip_loopback=False):
    return in_ns(pid, lambda ch: ch.dump(skip_loopback))


def wait_dump(pid, cond, what):
    """The namespace's dump once ``cond(dump)`` holds."""
    return wait_until(lambda: (lambda d: d if cond(d) else None)(dump_of(pid)), what)


# ---------------------------------------------------------------------- pure helpers

def test_endpoints_put_ipv4_and_dual_stack_ipv6_on_one_key():
    v4 = endpoint("198.18.0.1", 80)
    assert len(v4) == 18
    assert v4 == endpoint("::ffff:198.18.0.1", 80)
    assert endpoint_str(v4) == "198.18.0.1:80"
    assert endpoint_str(endpoint("fd00:a1::2", 8080)) == "[fd00:a1::2]:8080"
    assert endpoint("198.18.0.1", 81) != v4
    assert is_loopback(endpoint("127.0.0.1", 1)) and is_loopback(endpoint("127.9.9.9", 1))
    assert is_loopback(endpoint("::1", 1)) and is_loopback(endpoint("::ffff:127.0.0.1", 1))
    assert not is_loopback(endpoint("198.18.0.1", 1)) and not is_loopback(endpoint("::2", 1))


@pytest.mark.parametrize("path,uid", [
    (f"/kubepods/burstable/pod{UID}/{CID}", UID),
    (f"/kubepods/besteffort/pod{UID}", UID),
    (f"/kubepods/pod{UID}/{CID}", UID),
    (f"/anolisnuma-test-abc/kubepods/besteffort/pod{UID}/{CID}", UID),
    (f"/docker/{CID}/kubepods/pod{UID}", UID),
    (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice"
     f"/cri-containerd-{CID}.scope", UID),
    (f"/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice", UID),
    ("/kubepods/besteffort/pod" + "f" * 32, "f" * 32),          # static pod
    ("/", None),
    ("/system.slice/containerd.service", None),
    ("/kubepods/burstable", None),
    ("/kubepods/burstable/podnot-a-uid", None),
    (f"/kubepods/burstable/pod{UID}x", None),
    (f"/kubepods/gold/pod{UID}", None),
    ("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod../x.slice", None),
])
def test_pod_uid_from_cgroup_path(path, uid):
    assert pod_uid_from_cgroup_path(path) == uid


def test_peer_flow_reads_a_conntrack_entry_from_either_end():
    client, vip = endpoint("198.18.0.4", 40000), endpoint("198.19.0.10", 80)
    server, seen = endpoint("198.18.0.2", 8080), endpoint("198.18.0.14", 40000)
    orig, reply = (client, vip), (server, seen)
    assert peer_flow(client, vip, orig, reply) == (server, seen)
    assert peer_flow(server, seen, orig, reply) == (client, vip)
    assert peer_flow(client, server, orig, reply) is None


# ---------------------------------------------------------------- real namespaces

@needs_lab
def test_dump_lists_ipv4_ipv6_and_dual_stack_sockets_with_inodes_and_counters(lab):
    a, b = lab.namespace("a"), lab.namespace("b")
    sink = lab.spawn(b, None, "sink", "::", "9000")
    sink.expect("ready")
    v4 = lab.spawn(a, None, "send", "198.18.0.2", "9000", "--bytes", "100000")
    v6 = lab.spawn(a, None, "send", "fd00:a1::2", "9000", "--bytes", "7000")
    _, ip4, port4 = v4.expect("connected")
    _, ip6, port6 = v6.expect("connected")
    v4.expect("sent")
    v6.expect("sent")
    c4, c6 = endpoint(ip4, int(port4)), endpoint(ip6, int(port6))
    s4, s6 = endpoint("198.18.0.2", 9000), endpoint("fd00:a1::2", 9000)

    def by_tuple(dump):
        return {(s.local, s.remote): s for s in dump}

    def acked(dump):
        socks = by_tuple(dump)
        return all(k in socks for k in ((c4, s4), (c6, s6))) and \
            socks[(c4, s4)].bytes_acked >= 100000 and socks[(c6, s6)].bytes_acked >= 7000
    client = by_tuple(wait_dump(v4.pid, acked, "client counters acked"))
    server = by_tuple(wait_dump(sink.pid, lambda d: len(d) == 2, "server sockets"))

    # the client's IPv4 socket and the server's dual-stack IPv6 one give mirrored keys
    assert client[(c4, s4)].family == socket.AF_INET
    assert server[(s4, c4)].family == socket.AF_INET6
    assert client[(c6, s6)].family == socket.AF_INET6 and (s6, c6) in server
    assert client[(c4, s4)].bytes_acked - 100000 in (0, 1)      # +1: the SYN
    assert server[(s4, c4)].bytes_received == 100000
    assert server[(s6, c6)].bytes_received == 7000
    assert client[(c4, s4)].bytes_received == 0
    assert client[(c4, s4)].state == 1 and client[(c4, s4)].describe() == \
        f"{ip4}:{port4} -> 198.18.0.2:9000"
    # inodes are those of the processes' descriptors
    assert client[(c4, s4)].inode in procfs.socket_inodes("/proc", v4.pid)
    assert client[(c6, s6)].inode in procfs.socket_inodes("/proc", v6.pid)
    owners = procfs.inode_owners("/proc", [v4.pid, v6.pid, sink.pid])
    assert owners[server[(s4, c4)].inode] == sink.pid
    # namespace sees nothing of the other one's sockets
    assert not any(k[0] in (s4, s6) for k in client)


@needs_lab
def test_decoder_agrees_with_pyroute2(lab):
    from pyroute2 import DiagSocket
    from pyroute2.netlink.diag import SS_ALL

    a, b = lab.namespace("a"), lab.namespace("b")
    sink = lab.spawn(b, None, "sink", "::", "9000")
    sink.expect("ready")
    peers = [lab.spawn(a, None, "send", addr, "9000", "--bytes", str(n))
             for addr, n in (("198.18.0.2", 5000), ("fd00:a1::2", 3000), ("198.18.0.2", 0))]
    for p in peers:
        p.expect("connected")
    for p in peers:
        p.expect("sent")
    # (a connection still in the accept queue has no inode yet: the two dumps must not
    # straddle the sink's accept)
    wait_dump(sink.pid, lambda d: sum(s.bytes_received for s in d) == 8000 and all(s.inode for s in d),
              "all bytes received and every connection accepted")

    def both(_pid, _key):
        with DiagChannel() as ch:
            ours = ch.dump()
        theirs = []
        with DiagSocket() as ds:
            ds.bind()
            for family in (socket.AF_INET, socket.AF_INET6):
                theirs += ds.get_sock_stats(family=family, states=SS_ALL & sockdiag.DATA_STATES,
                                            extensions=1 << (sockdiag.INET_DIAG_INFO - 1))
        return ours, theirs
    (r,) = run_in_netns("/proc", [sink.pid], both)
    assert r.error is None, r.error
    ours, theirs = r.value
    mine = {(endpoint_str(s.local), endpoint_str(s.remote), s.inode, s.cookie,
             s.bytes_acked, s.bytes_received) for s in ours}
    ref = set()
    for m in theirs:
        info = m.get_attr("INET_DIAG_INFO")
        src, dst = m["idiag_src"], m["idiag_dst"]
        cookie = m["idiag_cookie"].to_bytes(8, "little")
        ref.add((endpoint_str(endpoint(src, m["idiag_sport"])), endpoint_str(endpoint(dst, m["idiag_dport"])),
                 m["idiag_inode"], cookie, info["tcpi_bytes_acked"], info["tcpi_bytes_received"]))
    assert len(mine) == 3
    assert mine == ref


@needs_lab
def test_loopback_sockets_are_left_out_by_the_kernel_when_asked(lab):
    a = lab.namespace("a")
    lo4 = lab.spawn(a, None, "sink", "127.0.0.1", "9001")
    lo6 = lab.spawn(a, None, "sink", "::1", "9002")
    ext = lab.spawn(a, None, "sink", "198.18.0.1", "9003")
    for s in (lo4, lo6, ext):
        s.expect("ready")
    for host, port in (("127.0.0.1", "9001"), ("::1", "9002"), ("198.18.0.1", "9003")):
        lab.spawn(a, None, "idle", host, port).expect("connected")
    every = wait_dump(ext.pid, lambda d: len(d) == 6, "six sockets")
    assert sum(is_loopback(s.local) for s in every) == 4
    kept = dump_of(ext.pid, skip_loopback=True)
    assert sorted(endpoint_str(s.local) for s in kept) == sorted(
        endpoint_str(s.local) for s in every if not is_loopback(s.local))
    assert len(kept) == 2


@needs_lab
def test_refresh_follows_counters_and_reports_closed_sockets(lab):
    a, b = lab.namespace("a"), lab.namespace("b")
    sink = lab.spawn(b, None, "sink", "198.18.0.2", "9000")
    sink.expect("ready")
    stream = lab.spawn(a, None, "stream", "198.18.0.2", "9000", "--rate", "500000")
    idle = lab.spawn(a, None, "idle", "198.18.0.2", "9000")
    stream.expect("connected")
    idle.expect("connected")
    first = wait_dump(stream.pid, lambda d: len(d) == 2, "two client sockets")
    before = {s.cookie: s for s in first}

    def grown(ch):
        now = ch.refresh(first)
        moving = [s for s in now if s and s.bytes_acked > before[s.cookie].bytes_acked]
        return now if moving else None
    now = wait_until(lambda: in_ns(stream.pid, grown), "the stream's counter to grow")
    assert all(s is not None for s in now)
    assert [s.cookie for s in now] == [s.cookie for s in first]
    # the idle one did not move
    idle_now = [s for s in now if s.bytes_acked == before[s.cookie].bytes_acked]
    assert len(idle_now) == 1

    idle.stop()
    gone = wait_until(lambda: (lambda r: r if None in r else None)(in_ns(stream.pid, lambda ch: ch.refresh(first))),
                      "the closed socket to be reported gone")
    assert sum(s is None for s in gone) == 1
    # many lookups at once (more than one request chunk)
    many = in_ns(stream.pid, lambda ch: ch.refresh([s for s in first if s.cookie != idle_now[0].cookie] * 100))
    assert len(many) == 100 and all(s is not None for s in many)


@needs_lab
def test_run_in_netns_leaves_the_caller_where_it_was_and_closes_everything(lab):
    a = lab.namespace("a")
    holder = lab.spawn(a, None, "hold")
    holder.expect("ready")
    own = os.readlink("/proc/thread-self/ns/net")
    fds = len(os.listdir("/proc/self/fd"))
    threads = threading.active_count()
    seen = []
    for _ in range(30):
        results = run_in_netns("/proc", [holder.pid, 2 ** 22 + 7, holder.pid],
                               lambda pid, key: os.readlink("/proc/thread-self/ns/net"))
        seen.append([r.value for r in results])
        assert isinstance(results[1].error, FileNotFoundError)
    target = os.readlink(f"/proc/{holder.pid}/ns/net")
    assert target != own
    assert all(s == [target, None, target] for s in seen)
    assert os.readlink("/proc/thread-self/ns/net") == own
    assert len(os.listdir("/proc/self/fd")) == fds
    assert threading.active_count() == threads
    assert netns.netns_key("/proc", holder.pid) == results[0].netns

    # fn's own sockets are closed by fn (DiagChannel as a context manager), also when
    # fn fails
    def boom(pid, key):
        with DiagChannel():
            raise ValueError("fn failed")
    for _ in range(30):
        (r,) = run_in_netns("/proc", [holder.pid], lambda pid, key: len(dump_of_here()))
        assert r.error is None and r.value == 0
        (r,) = run_in_netns("/proc", [holder.pid], boom)
        assert isinstance(r.error, ValueError)
    assert len(os.listdir("/proc/self/fd")) == fds
    assert threading.active_count() == threads


def dump_of_here():
    with DiagChannel() as ch:
        return ch.dump()


@needs_lab
def test_tcp_opens_moves_when_a_connection_is_made(lab):
    a, b = lab.namespace("a"), lab.namespace("b")
    sink = lab.spawn(b, None, "sink", "198.18.0.2", "9000")
    sink.expect("ready")
    holder = lab.spawn(a, None, "hold")
    holder.expect("ready")
    before_a = procfs.tcp_opens("/proc", holder.pid)
    before_b = procfs.tcp_opens("/proc", sink.pid)
    assert procfs.tcp_opens("/proc", holder.pid) == before_a
    lab.spawn(a, None, "idle", "198.18.0.2", "9000").expect("connected")
    assert procfs.tcp_opens("/proc", holder.pid) == before_a + 1              # ActiveOpens
    wait_until(lambda: procfs.tcp_opens("/proc", sink.pid) == before_b + 1, "PassiveOpens")


@needs_lab
def test_pod_of_a_process_from_its_real_cgroup(lab):
    uid = lab.pod_cgroup(str(uuid.uuid4()))
    a = lab.namespace("a", attach=False)
    holder = lab.spawn(a, uid, "hold")
    holder.expect("ready")
    stranger = lab.spawn(a, None, "hold")
    stranger.expect("ready")
    assert procfs.pod_uid_of("/proc", holder.pid) == uid
    assert procfs.pod_uid_of("/proc", stranger.pid) is None
    with pytest.raises(OSError):
        procfs.pod_uid_of("/proc", 2 ** 22 + 7)
    assert holder.pid in procfs.list_pids("/proc")


@needs_lab
def test_conntrack_lookup_sees_through_dnat_and_snat(lab):
    a, b = lab.namespace("a"), lab.namespace("b")
    lab.add_address(a, "198.18.0.101/24")
    lab.iptables(a, "-t", "nat", "-A", "OUTPUT", "-d", "198.19.0.10", "-p", "tcp", "--dport", "80",
                 "-j", "DNAT", "--to-destination", "198.18.0.2:9000")
    lab.iptables(a, "-t", "nat", "-A", "POSTROUTING", "-d", "198.18.0.2", "-p", "tcp",
                 "-j", "SNAT", "--to-source", "198.18.0.101")
    sink = lab.spawn(b, None, "sink", "198.18.0.2", "9000")
    sink.expect("ready")
    client = lab.spawn(a, None, "idle", "198.19.0.10", "80")
    _, ip, port = client.expect("connected")
    local, vip = endpoint(ip, int(port)), endpoint("198.19.0.10", 80)
    server_view = wait_dump(sink.pid, lambda d: len(d) == 1, "server socket")[0]
    assert endpoint_str(server_view.remote).startswith("198.18.0.101:")

    def look(_pid, _key):
        with ConntrackChannel() as ct:
            return ct.lookup(local, vip), ct.lookup(server_view.local, server_view.remote), \
                ct.lookup(local, endpoint("198.19.0.11", 80))
    (r,) = run_in_netns("/proc", [client.pid], look)
    assert r.error is None, r.error
    flows, from_reply, none = r.value
    orig, reply = flows
    assert orig == (local, vip)
    assert reply == (server_view.local, server_view.remote)
    assert peer_flow(local, vip, orig, reply) == (server_view.local, server_view.remote)
    assert from_reply == flows          # the reply direction finds the same entry
    assert none is None
    # the server's namespace has no conntrack entry for it
    def look_there(_pid, _key):
        with ConntrackChannel() as ct:
            return ct.lookup(local, vip)
    (r,) = run_in_netns("/proc", [sink.pid], look_there)
    assert r.error is None and r.value is None
