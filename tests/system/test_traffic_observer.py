"""The traffic observer on real traffic: "pods" are processes in network namespaces of
their own (anolisnuma.testing.netlab: a bridge in a hub namespace, addresses only inside
these namespaces), in fake pod cgroups of the real cgroup tree; they send rate-limited TCP
streams (anolisnuma.testing.tcp_peer) to each other. Only the sampling interval is slept;
everything else waits on a condition."""

import os
import threading
import time

import pytest

from anolisnuma.system.traffic import (
    PodProcess, SockDiagSource, TrafficObserver, pod_pair,
)
from anolisnuma.testing.netlab import lab_usable

needs_lab = pytest.mark.skipif(not lab_usable(), reason="needs root, ip(8) and network namespaces")

INTERVAL = 0.5          # the sampling interval: the one thing these tests sleep
RATE = 2_000_000        # bytes/s of a stream (2 MB/s)
VIP = "198.19.0.10"     # a Service-like virtual IP, DNAT'd inside the client's namespace


def within(rate, expected, tolerance=0.2):
    return abs(rate - expected) <= tolerance * expected


def run(obs, pods, samples):
    """A baseline sample, then ``samples`` more, one sampling interval apart."""
    out = [obs.sample(pods)]
    for _ in range(samples):
        time.sleep(INTERVAL)
        out.append(obs.sample(pods))
    return out


class Cluster:
    """A server pod B listening on 198.18.0.x:8080 (and [::]), and helpers to add client
    pods in namespaces of their own."""

    def __init__(self, lab):
        self.lab = lab
        self.pods = {}
        self.names = {}
        ns = lab.namespace("b")
        self.b = self.pod("B", ns, "sink", "::", "8080")
        self.b_ip = lab.addresses[ns]

    def pod(self, name, ns, *args, host_network=False):
        uid = self.lab.pod_cgroup()
        peer = self.lab.spawn(ns, uid, *args)
        peer.expect("ready" if args[0] in ("sink", "hold") else "connected")
        self.pods[uid] = PodProcess(peer.pid, host_network)
        self.names[uid] = name
        return uid

    def client(self, name, *args, ns=None, setup=None):
        ns = ns or self.lab.namespace(name.lower())
        if setup:
            setup(ns)
        return self.pod(name, ns, *args)

    def named(self, rates):
        return {tuple(sorted((self.names[a], self.names[b]))): r for (a, b), r in rates.items()}


@needs_lab
def test_a_steady_stream_is_paired_at_its_rate_and_an_idle_pod_is_not(lab):
    c = Cluster(lab)
    a = c.client("A", "stream", c.b_ip, "8080", "--rate", str(RATE))
    c.client("C", "idle", c.b_ip, "8080")                    # connected, sends nothing: not paired
    c.client("D", "hold")                                    # no connection at all: not paired
    obs = TrafficObserver()
    first, s1, s2 = run(obs, c.pods, 2)

    assert first.interval is None and first.rates == {}
    assert first.stats.full_dumps == 4 and first.stats.errors == 0, first.errors
    for s in (s1, s2):
        assert s.errors == []
        assert set(s.rates) == {pod_pair(a, c.b)}, c.named(s.rates)
        assert within(s.rates[pod_pair(a, c.b)], RATE), c.named(s.rates)
        assert abs(s.interval - INTERVAL) < INTERVAL / 2
    assert s2.stats.connections == 2                        # A-B and the idle C-B
    assert obs.rates() == s2.rates


@needs_lab
def test_a_pod_talking_to_a_dnat_virtual_ip_is_paired_through_conntrack(lab):
    c = Cluster(lab)

    def dnat(ns):
        lab.iptables(ns, "-t", "nat", "-A", "OUTPUT", "-d", VIP, "-p", "tcp", "--dport", "80",
                     "-j", "DNAT", "--to-destination", f"{c.b_ip}:8080")
    a = c.client("A", "stream", c.b_ip, "8080", "--rate", str(RATE))
    d = c.client("D", "stream", VIP, "80", "--rate", str(RATE // 2), setup=dnat)
    s0, s1, s2 = run(TrafficObserver(), c.pods, 2)
    for s in (s1, s2):
        assert set(s.rates) == {pod_pair(a, c.b), pod_pair(d, c.b)}, c.named(s.rates)
        assert within(s.rates[pod_pair(a, c.b)], RATE), c.named(s.rates)
        assert within(s.rates[pod_pair(d, c.b)], RATE // 2), c.named(s.rates)
        assert s.stats.connections == 2 and s.stats.errors == 0, (s.stats, s.errors)
        assert s.stats.nat_lookups == 0       # matched once, looked up once...
    assert s0.stats.nat_lookups >= 1 and s0.stats.via_conntrack == 1     # ...when first seen


@needs_lab
def test_without_conntrack_the_servers_view_pairs_a_dnat_client(lab):
    c = Cluster(lab)

    def dnat(ns):
        lab.iptables(ns, "-t", "nat", "-A", "OUTPUT", "-d", VIP, "-p", "tcp", "--dport", "80",
                     "-j", "DNAT", "--to-destination", f"{c.b_ip}:8080")
    d = c.client("D", "stream", VIP, "80", "--rate", str(RATE), setup=dnat)
    s0, s1 = run(TrafficObserver(SockDiagSource(conntrack=False)), c.pods, 1)
    assert set(s1.rates) == {pod_pair(d, c.b)}
    assert within(s1.rates[pod_pair(d, c.b)], RATE)
    assert s0.stats.via_server_view == 1 and s0.stats.nat_lookups == 0


@needs_lab
def test_dnat_and_snat_together_need_conntrack(lab):
    c = Cluster(lab)

    def nat(ns):
        lab.add_address(ns, "198.18.0.201/24")
        lab.iptables(ns, "-t", "nat", "-A", "OUTPUT", "-d", VIP, "-p", "tcp", "--dport", "80",
                     "-j", "DNAT", "--to-destination", f"{c.b_ip}:8080")
        lab.iptables(ns, "-t", "nat", "-A", "POSTROUTING", "-d", c.b_ip, "-p", "tcp",
                     "-j", "SNAT", "--to-source", "198.18.0.201")
    d = c.client("D", "stream", VIP, "80", "--rate", str(RATE), setup=nat)
    with_ct = SockDiagSource()
    without = SockDiagSource(conntrack=False)
    assert with_ct.sample(c.pods).stats.via_conntrack == 1
    without.sample(c.pods)
    time.sleep(INTERVAL)
    s1 = with_ct.sample(c.pods)
    s1_without = without.sample(c.pods)
    assert set(s1.rates) == {pod_pair(d, c.b)} and s1.stats.connections == 1
    assert within(s1.rates[pod_pair(d, c.b)], RATE)
    assert s1_without.rates == {} and s1_without.stats.connections == 0


@needs_lab
def test_steady_state_reads_only_followed_sockets_and_new_connections_are_counted(lab):
    c = Cluster(lab)
    a_ns = lab.namespace("a")
    a = c.client("A", "stream", c.b_ip, "8080", "--rate", str(RATE), ns=a_ns)
    obs = TrafficObserver()
    _, s1, s2 = run(obs, c.pods, 2)
    for s in (s1, s2):
        # one end of the connection is read (it has both directions' counters); the other
        # pod's namespace is not even entered
        assert s.stats.full_dumps == 0 and s.stats.refreshed == 1 and s.stats.idle == 1, s.stats
        assert within(s.rates[pod_pair(a, c.b)], RATE)

    # A new connection from pod A's namespace: 600 kB sent at once, then idle. The next
    # sample dumps both namespaces again (their TCP open counters moved) and counts the
    # new socket's bytes in full (it was born since the last look).
    extra = lab.spawn(a_ns, a, "send", c.b_ip, "8080", "--bytes", "600000")
    extra.expect("connected")
    extra.expect("sent")
    t0 = time.monotonic()
    time.sleep(INTERVAL)
    s3 = obs.sample(c.pods)
    assert s3.stats.full_dumps == 2, s3.stats
    assert s3.stats.connections == 2 and s3.stats.sockets == 3     # old followed end + new pair
    expected = RATE + 600000 / s3.interval
    assert within(s3.rates[pod_pair(a, c.b)], expected), (s3.rates, expected, time.monotonic() - t0)
    time.sleep(INTERVAL)
    s4 = obs.sample(c.pods)
    assert s4.stats.full_dumps == 0 and s4.stats.refreshed == 1 and s4.stats.sockets == 2
    assert within(s4.rates[pod_pair(a, c.b)], RATE)


@needs_lab
def test_a_connection_that_closes_between_samples_is_dropped_cleanly(lab):
    c = Cluster(lab)
    a_ns = lab.namespace("a")
    a = c.client("A", "stream", c.b_ip, "8080", "--rate", str(RATE), ns=a_ns)
    obs = TrafficObserver()
    run(obs, c.pods, 1)
    streamer = [p for p in lab.peers if p.pid == c.pods[a].pid][0]
    # a second process of pod A keeps the pod's PID alive once the stream ends
    keeper = lab.spawn(a_ns, a, "hold")
    keeper.expect("ready")
    c.pods[a] = c.pods[a]._replace(pid=keeper.pid)
    streamer.stop()
    time.sleep(INTERVAL)
    s = obs.sample(c.pods)
    assert s.errors == [] and s.stats.pods_skipped == 0
    # bytes between the previous sample and the close are lost; nothing is negative
    assert all(r > 0 for r in s.rates.values())
    assert s.stats.connections == 0
    time.sleep(INTERVAL)
    s = obs.sample(c.pods)
    assert s.rates == {} and s.stats.sockets == 0


@needs_lab
def test_pods_sharing_a_namespace_are_told_apart_by_their_sockets(lab):
    """Host-network pods: one namespace, several pods; sockets go to pods by inode."""
    c = Cluster(lab)
    host = lab.namespace("h")
    h_ip = lab.addresses[host]
    x = c.pod("X", host, "sink", "0.0.0.0", "9000", host_network=True)
    y = c.pod("Y", host, "stream", "127.0.0.1", "9000", "--rate", str(RATE), host_network=True)
    # a process of no pod in the same namespace, also streaming to X: not a pod pair
    lab.spawn(host, None, "stream", "127.0.0.1", "9000", "--rate", str(RATE)).expect("connected")
    # a pod in its own namespace streaming to X through the host's address
    z = c.client("Z", "stream", h_ip, "9000", "--rate", str(RATE // 2))
    y_to_b = c.pod("W", host, "stream", c.b_ip, "8080", "--rate", str(RATE // 4), host_network=True)
    _, s1, s2 = run(TrafficObserver(), c.pods, 2)
    for s in (s1, s2):
        assert s.errors == []
        assert set(s.rates) == {pod_pair(x, y), pod_pair(x, z), pod_pair(y_to_b, c.b)}, c.named(s.rates)
        assert within(s.rates[pod_pair(x, y)], RATE), c.named(s.rates)
        assert within(s.rates[pod_pair(x, z)], RATE // 2), c.named(s.rates)
        assert within(s.rates[pod_pair(y_to_b, c.b)], RATE // 4), c.named(s.rates)
        assert s.stats.namespaces == 3


@needs_lab
def test_a_pid_outside_its_pod_cgroup_is_skipped(lab):
    c = Cluster(lab)
    a_ns = lab.namespace("a")
    a = c.client("A", "stream", c.b_ip, "8080", "--rate", str(RATE), ns=a_ns)
    stranger = lab.spawn(a_ns, None, "hold")
    stranger.expect("ready")
    pods = dict(c.pods)
    pods[a] = PodProcess(stranger.pid)          # a PID that is not the pod's (reused, say)
    pods["not-a-uid"] = PodProcess(1)
    pods["0f8fad5b-d9cb-469f-a165-70867728950e"] = PodProcess(2 ** 22 + 7)   # gone
    _, s1 = run(TrafficObserver(), pods, 1)
    assert s1.stats.pods_skipped == 3
    assert s1.rates == {}


@needs_lab
def test_sampling_leaves_no_descriptor_or_thread_behind(lab):
    c = Cluster(lab)

    def dnat(ns):
        lab.iptables(ns, "-t", "nat", "-A", "OUTPUT", "-d", VIP, "-p", "tcp", "--dport", "80",
                     "-j", "DNAT", "--to-destination", f"{c.b_ip}:8080")
    c.client("A", "stream", VIP, "80", "--rate", str(RATE), setup=dnat)
    own = os.readlink("/proc/thread-self/ns/net")
    src = SockDiagSource(full_dump_every=1)          # dump every time: the heaviest path
    src.sample(c.pods)
    fds = len(os.listdir("/proc/self/fd"))
    threads = threading.active_count()
    for _ in range(20):
        s = src.sample(c.pods)
        assert s.stats.errors == 0 and s.stats.full_dumps == 2
    src.close()
    assert len(os.listdir("/proc/self/fd")) == fds
    assert threading.active_count() == threads
    assert os.readlink("/proc/thread-self/ns/net") == own
