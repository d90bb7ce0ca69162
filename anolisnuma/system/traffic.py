"""Which managed pods talk to each other, and how much: pod-pair TCP byte rates.

:class:`TrafficObserver` asks a :class:`TrafficSource` for one sample per interval (the
sample types are in :mod:`anolisnuma.system.traffic_sample`). The source here is
:class:`SockDiagSource` (socket diagnostics, every Linux); another one (openEuler's
``/dev/relationship_ctrl``) would implement the same one-method interface.

How :class:`SockDiagSource` samples (the kernel calls are in
:mod:`anolisnuma.system.sockdiag`):

1. **Namespaces.** Each managed pod is given as one of its PIDs. The PID must be in the
   pod's cgroup (``/proc/<pid>/cgroup`` names ``pod<uid>``), else the pod is skipped this
   time (the process ended and the PID may be someone else's). Pods whose PIDs share a
   network namespace (host-network pods) are read once.
2. **Sockets.** A namespace is dumped in full (TCP, IPv4 and IPv6, data-carrying states)
   the first time, whenever its TCP open counters moved since the last look (a connection
   was made there: ``ActiveOpens + PassiveOpens``), and every ``full_dump_every`` samples.
   Otherwise only the sockets already followed are looked up, one exact lookup each: a
   dump walks the host's whole established-connection hash table, a lookup does not.
   A namespace that holds one pod (the usual pod sandbox) is that pod's: all its sockets
   are the pod's, and connections inside it (loopback, filtered by the kernel, or both
   ends present) are not followed. In a namespace several pods share (the host's),
   sockets go to pods by their inode: ``/proc/<pid>/fd`` of the processes whose cgroup
   is one of those pods; the rest belong to no managed pod.
3. **Counters.** ``tcpi_bytes_acked`` (sent) and ``tcpi_bytes_received`` per socket,
   followed by socket cookie: the difference since the previous sample; the whole count
   for a socket born since then (one not there at the previous look of a namespace seen
   before); nothing for sockets seen for the first time in a namespace seen for the first
   time (their bytes could be from any time). A socket that closed between two samples
   loses its last bytes; a counter that went down starts again from the new value.
4. **Matching.** A connection's two sockets mirror each other: one's local endpoint is
   the other's remote. Failing that (the client dialled a Service virtual IP: DNAT; or
   the server sees a translated source: SNAT), the conntrack entry of the socket's
   connection, looked up in the socket's namespace and then the host's, says what the
   other end sees. Failing that, the server's view: an unmatched socket whose remote
   endpoint is this socket's local endpoint, if there is exactly one. Anything
   ambiguous is left out and counted.
5. **Rates.** Bytes of a connection = sent one way + sent the other way (when it is
   matched, each the larger of the two ends' counts); a pod pair's rate = the sum over
   its connections / seconds since the previous sample.
6. **Afterwards** only one end of a matched connection is read (its two counters are the
   two directions); the other end is left alone, and a namespace left with nothing to
   read and no new connection is not entered at all. Sockets not matched (their other
   end is no managed pod's) are read every sample, so that they can still be matched.

Cost: see ``docs/numa.md`` ("Traffic observation") and ``scripts/bench_observer.py``.
"""

from __future__ import annotations

import errno
import time
from typing import Callable, Dict, List, Mapping, Optional, Set, Tuple

from anolisnuma.system import conntrack, netns, procfs, sockdiag
from anolisnuma.system.netns import NetnsKey
from anolisnuma.system.pod_cgroups import POD_UID_RE, KubeletCgroupLayout
from anolisnuma.system.sockdiag import TcpSocket, is_loopback
# The sample types are re-exported: importers of the observer find them here as before.
from anolisnuma.system.traffic_sample import (PodPair, PodProcess, SampleStats, TrafficSample,  # noqa: F401
                                              TrafficSource, pod_pair)


_MAX_ERRORS_KEPT = 20


# --------------------------------------------------------------------- sock_diag source

class _End:
    """A pod socket in one sample that still has to be matched."""

    __slots__ = ("sock", "uid", "ns", "shared", "sent", "received", "matched")

    def __init__(self, sock: TcpSocket, uid: str, ns: NetnsKey, shared: bool,
                 sent: Optional[int], received: Optional[int]) -> None:
        self.sock = sock
        self.uid = uid
        self.ns = ns
        self.shared = shared
        self.sent = sent              # bytes since the previous sample, None if unknown
        self.received = received
        self.matched = False


class _Follow:
    """A socket read every sample: one not matched yet (``peer`` None), or the end of a
    pod-to-pod connection whose counters stand for both directions (``peer``: the pod at
    the other end, whose socket is then left alone)."""

    __slots__ = ("sock", "uid", "peer")

    def __init__(self, sock: TcpSocket, uid: str, peer: Optional[str]) -> None:
        self.sock = sock
        self.uid = uid
        self.peer = peer


class _NsState:
    """What is remembered of a namespace between samples."""

    __slots__ = ("opens", "since_dump", "shared", "uids", "tracked", "quiet", "unowned", "seen")

    def __init__(self, opens: Optional[int], shared: bool, uids: frozenset) -> None:
        self.opens = opens
        self.since_dump = 0
        self.shared = shared
        self.uids = uids
        self.tracked: Dict[bytes, _Follow] = {}                  # cookie -> followed socket
        # cookie -> (namespace, cookie) of the followed other end; None: both ends in one pod
        self.quiet: Dict[bytes, Optional[Tuple[NetnsKey, bytes]]] = {}
        self.unowned: Set[bytes] = set()       # shared namespace: sockets of no managed pod
        self.seen: Set[bytes] = set()          # every cookie of the last full dump


class _Group:
    """The managed pods of one namespace, this sample."""

    __slots__ = ("key", "pid", "uids", "host_network", "shared", "opens", "full")

    def __init__(self, key: NetnsKey, pid: int) -> None:
        self.key = key
        self.pid = pid
        self.uids: Dict[str, str] = {}      # lower-case UID -> UID as the caller spells it
        self.host_network = False
        self.shared = False
        self.opens: Optional[int] = None
        self.full = True


def _key(local: bytes, remote: bytes, ns: NetnsKey) -> tuple:
    # Loopback addresses only mean something inside one namespace.
    return (local, remote, ns if is_loopback(local) else None)


def _larger(a: Optional[int], b: Optional[int]) -> Optional[int]:
    if a is None:
        return b
    if b is None:
        return a
    return a if a >= b else b


def _deltas(s: TcpSocket, old: Optional[TcpSocket]) -> Tuple[Optional[int], Optional[int]]:
    if old is None or s.bytes_acked < old.bytes_acked or s.bytes_received < old.bytes_received:
        return None, None
    return s.bytes_acked - old.bytes_acked, s.bytes_received - old.bytes_received


class SockDiagSource(TrafficSource):
    """Pod-pair rates from socket diagnostics (see the module docstring).

    ``proc_root``: the host's /proc. ``host_pid``: a PID in the host's network namespace
    (its conntrack table sees Service DNAT done by kube-proxy). ``conntrack``: look up
    conntrack entries for sockets left unmatched. ``full_dump_every``: dump a namespace in
    full at least every this many samples even if no connection was made there.
    ``max_nat_lookups``: conntrack lookups per sample at most (the rest wait; each
    connection is looked up once in its life).
    """

    name = "sock_diag"

    def __init__(self, proc_root: str = "/proc", *, host_pid: int = 1, conntrack: bool = True,
                 full_dump_every: int = 30, max_nat_lookups: int = 256, timeout: float = 30.0,
                 socket_timeout: float = 2.0, clock: Callable[[], float] = time.monotonic,
                 layout: Optional[KubeletCgroupLayout] = None) -> None:
        if full_dump_every < 1:
            raise ValueError("full_dump_every must be at least 1")
        self.proc_root = proc_root
        self.host_pid = int(host_pid)
        self.conntrack = conntrack
        self.full_dump_every = full_dump_every
        self.max_nat_lookups = max_nat_lookups
        self.timeout = timeout
        self.socket_timeout = socket_timeout
        self.clock = clock
        self.layout = layout   # the kubelet's cgroup layout: which cgroup paths are pods'
        self._ns: Dict[NetnsKey, _NsState] = {}
        self._nat: Dict[Tuple[NetnsKey, bytes], Optional[conntrack.Flow]] = {}
        self._verified: Dict[int, Tuple[NetnsKey, str]] = {}    # PID -> (namespace, its pod)
        self._last_at: Optional[float] = None

    def close(self) -> None:
        self._ns.clear()
        self._nat.clear()
        self._verified.clear()

    # ------------------------------------------------------------------ one sample

    def sample(self, pods: Mapping[str, PodProcess]) -> TrafficSample:
        started = self.clock()
        stats = SampleStats(pods=len(pods))
        errors: List[str] = []

        def fail(what: str) -> None:
            stats.errors += 1
            if len(errors) < _MAX_ERRORS_KEPT:
                errors.append(what)

        groups = self._groups(pods, stats)
        stats.namespaces = len(groups)
        managed = {uid for g in groups.values() for uid in g.uids.values()}
        try:
            host_ns: Optional[NetnsKey] = netns.netns_key(self.proc_root, self.host_pid)
        except OSError:
            host_ns = None
        for g in groups.values():
            g.shared = g.host_network or len(g.uids) > 1 or g.key == host_ns
            prev = self._ns.get(g.key)
            try:
                g.opens = procfs.tcp_opens(self.proc_root, g.pid)
            except OSError:
                g.opens = None
            g.full = (prev is None or g.opens is None or prev.opens != g.opens
                      or prev.shared != g.shared or prev.since_dump + 1 >= self.full_dump_every)

        # Read the namespaces: a dump, or exact lookups of what we follow, or nothing.
        todo = [g for g in groups.values() if g.full or self._ns[g.key].tracked]
        stats.idle = len(groups) - len(todo)
        by_pid = {g.pid: g for g in todo}
        read_keys = {g.key for g in todo}

        def read(pid: int, key: NetnsKey) -> object:
            g = by_pid[pid]
            if key != g.key:
                raise sockdiag.SockDiagError(errno.ESRCH, "PID changed namespace")
            with sockdiag.DiagChannel(self.socket_timeout) as ch:
                if g.full:
                    return ch.dump(skip_loopback=not g.shared)
                return ch.refresh([f.sock for f in self._ns[g.key].tracked.values()])

        results: Dict[NetnsKey, object] = {}
        if todo:
            try:
                for r in netns.run_in_netns(self.proc_root, [g.pid for g in todo], read,
                                               self.timeout):
                    g = by_pid[r.pid]
                    if r.error is not None:
                        fail(f"pod {sorted(g.uids.values())[0]}: {r.error}")
                    else:
                        results[g.key] = r.value
            except OSError as e:
                fail(f"namespace helper: {e}")
        now = self.clock()

        # Counters. Followed ends of known pod-to-pod connections are done here; the other
        # sockets (new, or never matched) go on to matching.
        settled: List[Tuple[str, str, int]] = []        # (pod, other pod, bytes)
        candidates: List[_End] = []
        states: Dict[NetnsKey, _NsState] = {}
        for g in groups.values():
            prev = self._ns.get(g.key)
            if g.key in read_keys and g.key not in results:
                continue                       # failed: a fresh start next time
            uids = frozenset(g.uids)
            st = _NsState(g.opens, g.shared, uids)
            states[g.key] = st
            if prev is not None:
                st.since_dump = prev.since_dump + 1
                st.seen = prev.seen
                st.quiet = prev.quiet
                if prev.uids == uids:
                    st.unowned = prev.unowned
            if g.key not in read_keys:
                continue                       # idle: nothing followed, nothing new
            known = prev.tracked if prev is not None else {}
            if g.full:
                stats.full_dumps += 1
                socks: List[TcpSocket] = results[g.key]          # type: ignore[assignment]
                st.since_dump = 0
                st.seen = {s.diag_id[40:48] for s in socks}
                st.quiet = {c: ref for c, ref in st.quiet.items() if c in st.seen}
                st.unowned = {c for c in st.unowned if c in st.seen}
                owned = self._attribute(g, socks, st, known)
            else:
                stats.refreshed += 1
                owned = [(s, f.uid) for s, f in zip(results[g.key], known.values())  # type: ignore[call-overload]
                         if s is not None and s.bytes_acked >= 0]
            for s, uid in owned:
                cookie = s.diag_id[40:48]
                old = known.get(cookie)
                if old is not None:
                    sent, received = _deltas(s, old.sock)
                elif prev is not None and cookie not in prev.seen:
                    sent, received = s.bytes_acked, s.bytes_received    # born since the last look
                else:
                    sent = received = None
                if old is not None and old.peer is not None and old.peer in managed:
                    old.sock = s
                    st.tracked[cookie] = old
                    if sent is not None:
                        settled.append((uid, old.peer, sent + received))  # type: ignore[operator]
                else:
                    candidates.append(_End(s, uid, g.key, g.shared, sent, received))
        stats.sockets = len(settled) + len(candidates)
        self._ns = states

        matches = self._match(candidates, groups, host_ns, stats, fail)
        fresh: List[Tuple[str, str, int]] = []
        for a, b in matches:
            if a.uid == b.uid:                 # two sockets of one pod
                states[a.ns].quiet[a.sock.cookie] = None
                states[b.ns].quiet[b.sock.cookie] = None
                continue
            # follow one end from now on: one in a shared namespace (read anyway), else
            # either, the same way every time
            if a.shared != b.shared:
                p, q = (a, b) if a.shared else (b, a)
            else:
                p, q = (a, b) if (a.ns, a.sock.diag_id) <= (b.ns, b.sock.diag_id) else (b, a)
            states[p.ns].tracked[p.sock.cookie] = _Follow(p.sock, p.uid, q.uid)
            states[q.ns].quiet[q.sock.cookie] = (p.ns, p.sock.cookie)
            one = _larger(a.sent, b.received)
            other = _larger(a.received, b.sent)
            if one is not None or other is not None:
                fresh.append((a.uid, b.uid, (one or 0) + (other or 0)))
        for e in candidates:
            if not e.matched:
                states[e.ns].tracked[e.sock.cookie] = _Follow(e.sock, e.uid, None)
        # A quiet end whose followed end went away is looked at again at its next dump.
        for st in states.values():
            stale = [c for c, ref in st.quiet.items() if ref is not None and not (
                ref[0] in states and ref[1] in states[ref[0]].tracked
                and states[ref[0]].tracked[ref[1]].peer is not None)]
            for c in stale:
                del st.quiet[c]
        stats.connections = sum(1 for st in states.values() for f in st.tracked.values()
                                if f.peer is not None)
        self._nat = {k: v for k, v in self._nat.items()
                     if k[0] in states and k[1] in states[k[0]].tracked}
        alive = set(pods)
        self._verified = {pid: v for pid, v in self._verified.items()
                          if v[1] in alive or v[1].lower() in alive}

        interval = None if self._last_at is None else now - self._last_at
        self._last_at = now
        rates: Dict[PodPair, float] = {}
        if interval is not None and interval > 0:
            for a_uid, b_uid, moved in settled + fresh:
                if moved > 0:
                    pair = pod_pair(a_uid, b_uid)
                    rates[pair] = rates.get(pair, 0.0) + moved / interval
        stats.seconds = self.clock() - started
        return TrafficSample(now, interval, rates, stats, errors)

    # ------------------------------------------------------------------ the steps

    def _groups(self, pods: Mapping[str, PodProcess], stats: SampleStats) -> Dict[NetnsKey, _Group]:
        """Pods by namespace. A PID counts for its pod once its cgroup said so; that is
        asked again when the PID shows up in another namespace (a PID reused in the same
        namespace is another process of the same pod sandbox, or of the host's namespace,
        where sockets go to pods by their own processes' cgroups anyway)."""
        groups: Dict[NetnsKey, _Group] = {}
        for uid, proc in pods.items():
            pid = proc.pid
            if (not isinstance(uid, str) or not POD_UID_RE.fullmatch(uid)
                    or not isinstance(pid, int) or pid <= 0):
                stats.pods_skipped += 1
                continue
            try:
                key = netns.netns_key(self.proc_root, pid)
                cached = self._verified.get(pid)
                if cached is not None and cached[0] == key:
                    owner: Optional[str] = cached[1]
                else:
                    owner = procfs.pod_uid_of(self.proc_root, pid, self.layout)
                    if owner is not None:
                        self._verified[pid] = (key, owner)
            except OSError:
                stats.pods_skipped += 1
                continue
            if owner is None or owner.lower() != uid.lower():
                self._verified.pop(pid, None)
                stats.pods_skipped += 1
                continue
            g = groups.get(key)
            if g is None:
                g = groups[key] = _Group(key, pid)
            g.uids[uid.lower()] = uid
            g.host_network = g.host_network or bool(proc.host_network)
        return groups

    def _attribute(self, g: _Group, socks: List[TcpSocket], st: _NsState,
                   known: Dict[bytes, _Follow]) -> List[Tuple[TcpSocket, str]]:
        """The sockets of a fresh dump to read, with their pod; marks those not worth
        reading (``st.quiet``, ``st.unowned``)."""
        out: List[Tuple[TcpSocket, str]] = []
        if not g.shared:
            uid = next(iter(g.uids.values()))
            here = {s.local for s in socks}
            for s in socks:
                cookie = s.diag_id[40:48]
                if cookie in st.quiet or s.bytes_acked < 0:
                    continue
                if s.remote in here:           # both ends here: a connection inside the pod
                    st.quiet[cookie] = None
                    continue
                out.append((s, uid))
            return out
        todo = [s for s in socks if s.bytes_acked >= 0 and s.diag_id[40:48] not in st.quiet
                and s.diag_id[40:48] not in st.unowned]
        owners: Dict[int, str] = {}
        if any(s.diag_id[40:48] not in known for s in todo):
            for pid in procfs.list_pids(self.proc_root):
                try:
                    owner = procfs.pod_uid_of(self.proc_root, pid, self.layout)
                    if owner is None or owner.lower() not in g.uids:
                        continue
                    if netns.netns_key(self.proc_root, pid) != g.key:
                        continue
                except OSError:
                    continue
                uid = g.uids[owner.lower()]
                for inode in procfs.socket_inodes(self.proc_root, pid):
                    owners.setdefault(inode, uid)
        for s in todo:
            cookie = s.diag_id[40:48]
            f = known.get(cookie)
            uid = f.uid if f is not None else owners.get(s.inode) if s.inode else None
            if uid is None:
                st.unowned.add(cookie)         # no managed pod's (the host's, say)
            else:
                out.append((s, uid))
        return out

    def _match(self, ends: List[_End], groups: Dict[NetnsKey, _Group], host_ns: Optional[NetnsKey],
               stats: SampleStats, fail: Callable[[str], None]) -> List[Tuple[_End, _End]]:
        """Pairs of ends that are one connection (see the module docstring, step 4)."""
        by_tuple: Dict[tuple, List[_End]] = {}
        for e in ends:
            by_tuple.setdefault(_key(e.sock.local, e.sock.remote, e.ns), []).append(e)
        matches: List[Tuple[_End, _End]] = []

        def pair(a: _End, b: _End) -> None:
            a.matched = b.matched = True
            matches.append((a, b))

        def only(cands: List[_End], e: _End, other_pod: bool = False) -> Optional[_End]:
            found = [c for c in cands if c is not e and not c.matched
                     and not (other_pod and c.uid == e.uid)]
            if len(found) > 1:
                stats.ambiguous += 1
            return found[0] if len(found) == 1 else None

        # 1. mirror images
        for e in ends:
            if not e.matched:
                c = only(by_tuple.get(_key(e.sock.remote, e.sock.local, e.ns), []), e)
                if c is not None:
                    pair(e, c)

        # 2. conntrack: what the other end sees
        if self.conntrack:
            self._lookup_nat([e for e in ends if not e.matched and not is_loopback(e.sock.remote)],
                             groups, host_ns, stats, fail)
            for e in ends:
                if e.matched:
                    continue
                flow = self._nat.get((e.ns, e.sock.cookie))
                if flow is None:
                    continue
                c = only(by_tuple.get(_key(flow[0], flow[1], e.ns), []), e, other_pod=True)
                if c is not None:
                    pair(e, c)
                    stats.via_conntrack += 1

        # 3. the server's view: someone whose remote is my local endpoint
        by_remote: Dict[tuple, List[_End]] = {}
        for e in ends:
            if not e.matched:
                by_remote.setdefault(_key(e.sock.remote, b"", e.ns), []).append(e)
        for e in ends:
            if e.matched:
                continue
            c = only(by_remote.get(_key(e.sock.local, b"", e.ns), []), e, other_pod=True)
            if c is not None:
                pair(e, c)
                stats.via_server_view += 1
        return matches

    def _lookup_nat(self, ends: List[_End], groups: Dict[NetnsKey, _Group], host_ns: Optional[NetnsKey],
                    stats: SampleStats, fail: Callable[[str], None]) -> None:
        """Conntrack lookups for sockets never looked up before: in their own namespace,
        then (if not found) in the host's."""
        pending = [e for e in ends if (e.ns, e.sock.cookie) not in self._nat][:self.max_nat_lookups]
        if not pending:
            return
        found: Dict[Tuple[NetnsKey, bytes], Optional[conntrack.Flow]] = {}
        rounds: List[Tuple[Dict[NetnsKey, int], Callable[[_End], NetnsKey]]] = [
            ({g.key: g.pid for g in groups.values()}, lambda e: e.ns)]
        if host_ns is not None:
            rounds.append(({host_ns: self.host_pid}, lambda e: host_ns))   # type: ignore[misc]
        for pids, where in rounds:
            todo: Dict[NetnsKey, List[_End]] = {}
            for e in pending:
                if (found.get((e.ns, e.sock.cookie)) is None and where(e) in pids
                        and (where(e) == e.ns or e.ns != host_ns)):
                    todo.setdefault(where(e), []).append(e)
            if not todo:
                continue
            keyed = {pids[k]: k for k in todo}

            def look(pid: int, key: NetnsKey) -> Dict[bytes, Optional[conntrack.Flow]]:
                out: Dict[bytes, Optional[conntrack.Flow]] = {}
                with conntrack.ConntrackChannel(self.socket_timeout) as ct:
                    for e in todo[keyed[pid]]:
                        stats.nat_lookups += 1
                        flows = ct.lookup(e.sock.local, e.sock.remote)
                        out[e.sock.cookie] = (None if flows is None else
                                              conntrack.peer_flow(e.sock.local, e.sock.remote, *flows))
                return out
            try:
                results = netns.run_in_netns(self.proc_root, list(keyed), look, self.timeout)
            except OSError as e:
                fail(f"conntrack helper: {e}")
                continue
            for r in results:
                key = keyed[r.pid]
                if r.error is not None or r.netns != key:
                    fail(f"conntrack in namespace of PID {r.pid}: {r.error or 'namespace changed'}")
                    continue
                for e in todo[key]:
                    flow = r.value.get(e.sock.cookie)          # type: ignore[union-attr]
                    # A flow equal to the socket's own view is no news.
                    if flow is not None and flow != (e.sock.remote, e.sock.local):
                        found[(e.ns, e.sock.cookie)] = flow
        for e in pending:
            self._nat[(e.ns, e.sock.cookie)] = found.get((e.ns, e.sock.cookie))


# ------------------------------------------------------------------------- observer

class TrafficObserver:
    """Samples a :class:`TrafficSource` (socket diagnostics unless given): raw pod-pair
    rates per sample. Smoothing is the affinity graph's (``policies/numa/affinity.py``),
    done once, there."""

    def __init__(self, source: Optional[TrafficSource] = None, *, proc_root: str = "/proc",
                 layout: Optional[KubeletCgroupLayout] = None) -> None:
        self.source = source if source is not None else SockDiagSource(proc_root, layout=layout)
        self.last: Optional[TrafficSample] = None

    def sample(self, pods: Mapping[str, PodProcess]) -> TrafficSample:
        self.last = self.source.sample(pods)
        return self.last

    def rates(self) -> Dict[PodPair, float]:
        """The last sample's rates (bytes/s)."""
        return dict(self.last.rates) if self.last is not None else {}

    def close(self) -> None:
        self.source.close()
