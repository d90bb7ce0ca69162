"""Traffic affinity on the real containerd with REAL traffic: nothing is scripted.

Three managed pods, each in its own pod network namespace on the private CNI bridge, on the
fake 2-node topology over this machine's CPUs (memory pinning off, as in test_numa_e2e.py):
B runs a busybox TCP listener, A streams a throttled ~1.3 MB/s to B's pod IP, C is idle.
The daemon builds its own affinity controller from ``[numa.affinity]`` (the socket
diagnostics observer on the real /proc, containerd's PIDs, the re-pinner), and it has to
find the pair and move A or B next to the other: both allocations and both real
``cpuset.cpus`` agree, the pair's rate the observer measured matches what B's listener
received (its kernel I/O accounting, not tcp_info), C is neither paired nor moved, and a
proxy restart keeps the move while the new daemon sees the pair again and moves nothing.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from cri_client import KubeletLike
from test_numa_e2e import NS, alloc_of, direct, numa_config, real_cpus, res  # noqa: F401 (fixture)

from anolisnuma.config import Config
from anolisnuma.daemon import build_hooks
from anolisnuma.system.traffic import TrafficSample, pod_pair
from anolisnuma.testing.proxy import InProcessProxy
from anolisnuma.testing.waiting import wait_until

CG = "/sys/fs/cgroup"
PORT = 5001
INTERVAL = 0.25                 # seconds between traffic samples
THRESHOLD = 100_000             # bytes/s: far below what A sends, far above an idle pod's 0
BLOCKS = 2                      # 64 KiB blocks per round; a round is ~0.1 s: ~1.3 MB/s

# PID 1 of B. The listener's stdin is a pipe that never delivers anything: busybox nc
# half-closes the connection at stdin EOF (as /dev/null would give at once).
RECEIVER = ["/bin/sh", "-c",
            "trap 'exit 0' TERM; "
            f"while :; do sleep 2147483647 | nc -l -p {PORT} >/dev/null & wait $!; done"]


GATE = "/traffic-may-start"      # A sends nothing until the test creates this file in it


def sender(ip: str) -> List[str]:
    """PID 1 of A: once the test opens the gate, a throttled stream to ``ip``, reconnecting
    if B was not listening yet. ``|| exit`` ends the writer once nc is gone (dd then dies of
    SIGPIPE), so no writer outlives its connection. ``& wait`` lets the TERM trap run at once."""
    return ["/bin/sh", "-c",
            "trap 'exit 0' TERM; "
            f"while [ ! -e {GATE} ]; do sleep 0.05 & wait $!; done; "
            "while :; do "
            f"(while :; do dd if=/dev/zero bs=65536 count={BLOCKS} 2>/dev/null || exit; sleep 0.1; done)"
            f" | nc {ip} {PORT} & wait $!; "
            "sleep 0.2 & wait $!; "
            "done"]


def pod_ip(client: KubeletLike, pod_id: str) -> str:
    ip = client.pod_status(pod_id).status.network.ip
    assert ip and not ip.startswith("127."), f"pod {pod_id[:12]} has no pod IP: {ip!r}"
    return ip


def process_in(client: KubeletLike, cid: str, comm: str) -> Optional[int]:
    """The PID of the container's process named ``comm``, found in its real cgroup."""
    _, info = client.container_status(cid)
    procs = f"{CG}/cpu{info['runtimeSpec']['linux']['cgroupsPath']}/cgroup.procs"
    with open(procs) as f:
        pids = [int(line) for line in f if line.strip()]
    for pid in pids:
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == comm:
                    return pid
        except OSError:
            continue
    return None


def bytes_read(pid: int) -> int:
    """Bytes the process got from read() so far (/proc/<pid>/io ``rchar``): for the listener,
    what it received over TCP (its stdin never delivers)."""
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    raise AssertionError(f"no rchar in /proc/{pid}/io")


def contiguous_samples(ctl: Any, n: int, probe: Callable[[], int],
                       timeout: float) -> Tuple[List[TrafficSample], int]:
    """``n`` consecutive samples of the daemon's observer, each following the one before it
    with nothing missed, and how much ``probe()`` grew between the sample before the first
    and the last. ``probe`` is read as soon as a new sample is seen (polled every 5 ms;
    samples come every INTERVAL), so both measure about the same window. The sample there
    on entry does not open the window: it may be up to an interval old, and its probe late."""
    deadline = time.monotonic() + timeout
    run: List[TrafficSample] = []
    prev: Optional[TrafficSample] = ctl.observer.last
    start: Optional[int] = None
    while True:
        s = ctl.observer.last
        if s is not prev:
            value = probe()
            follows = (start is not None and prev is not None and s.interval is not None
                       and abs((s.at - s.interval) - prev.at) < 1e-6)
            if follows:
                run.append(s)
                if len(run) == n:
                    return run, value - start  # type: ignore[operator]
            else:                      # the first new one, or one was missed: start again
                run, start = [], value
            prev = s
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {n} consecutive traffic samples")
        time.sleep(0.005)


def start_proxy(data: Dict[str, Any]) -> Tuple[InProcessProxy, Any, Any]:
    config = Config.from_dict(data)
    hooks = build_hooks(config)
    proxy = InProcessProxy(config, hooks=hooks).start()
    proxy.wait_resynced()
    ctl = proxy.daemon.controllers.get("numa-affinity")
    assert ctl is not None, "[numa.affinity] enabled, but the daemon has no numa-affinity loop"
    return proxy, hooks[0], ctl


def test_real_traffic_between_two_pods_moves_one_next_to_the_other(containerd, direct, tmp_path):
    data = numa_config(str(tmp_path), containerd.socket, affinity={
        "enabled": True, "interval_seconds": INTERVAL, "threshold_bytes_per_second": THRESHOLD,
        "confirm_samples": 2, "half_life_seconds": 0.5})
    # the observer reads the real network namespaces of the real containers
    data["paths"]["proc_root"] = "/proc"
    proxy, hook, ctl = start_proxy(data)
    kl: Optional[KubeletLike] = None
    try:
        kl = KubeletLike(proxy.socket_path, harness=containerd)
        # B first: A's command needs B's pod IP. Placement by the documented balance rule
        # (most free capacity, then fewer pods, then the lowest node): B 0, A 1, C 0.
        b = kl.run_pod(name="rx-b", namespace=NS, network="pod")
        cb = kl.run_container(b, "main", res(kl, quota=30000, period=100000), command=RECEIVER)
        a = kl.run_pod(name="tx-a", namespace=NS, network="pod")
        ca = kl.run_container(a, "main", res(kl, quota=30000, period=100000), command=sender(pod_ip(direct, b.id)))
        c = kl.run_pod(name="idle-c", namespace=NS, network="pod")
        cc = kl.run_container(c, "main", res(kl, quota=30000, period=100000))
        # one network namespace per pod, so the pair is seen across namespaces
        assert len({pod_ip(direct, p.id) for p in (a, b, c)}) == 3
        before = {p.uid: alloc_of(hook, p.uid).nodes for p in (a, b, c)}
        assert (before[b.uid], before[a.uid], before[c.uid]) == ((0,), (1,), (0,))
        assert (real_cpus(direct, cb), real_cpus(direct, ca), real_cpus(direct, cc)) == ("0", "1", "0")
        # Only now may A talk to B: a move before the placements were read would hide them.
        assert kl.exec_sync(ca, ["touch", GATE]).exit_code == 0

        # The daemon's own loop samples, confirms the pair twice and moves one pod. A move
        # is counted at the end of its pass, once the re-pinner applied it (the ledger
        # changes earlier, in the middle of the pass).
        wait_until(lambda: ctl.counts()["moves"], "an affinity move", timeout=15.0, interval=0.02)
        node = alloc_of(hook, a.uid).nodes
        assert alloc_of(hook, b.uid).nodes == node
        (mover,) = [p for p in (a, b) if alloc_of(hook, p.uid).nodes != before[p.uid]]
        assert alloc_of(hook, mover.uid).source == "affinity"
        counts = ctl.counts()
        assert (counts["moves"], counts["moves_refused"], counts["moves_rolled_back"]) == (1, 0, 0), counts
        # the re-pinner applied it at once, to the real cgroups
        assert hook.placement.pending_updates() == [] and hook.placement.moves_in_flight() == []
        assert real_cpus(direct, ca) == real_cpus(direct, cb) == str(node[0])
        assert alloc_of(hook, c.uid).nodes == before[c.uid] and real_cpus(direct, cc) == "0"

        # What the observer measures (tcp_info of the connection) against what B's listener
        # read (the kernel's I/O accounting of the process), over the same ~2 s.
        nc = wait_until(lambda: process_in(direct, cb, "nc"), "B's listener")
        samples, received = contiguous_samples(ctl, 8, lambda: bytes_read(nc), timeout=10.0)
        assert process_in(direct, cb, "nc") == nc, "the connection was re-made during the measurement"
        pair = pod_pair(a.uid, b.uid)
        seconds = sum(s.interval for s in samples)
        observed = sum(s.rates.get(pair, 0.0) * s.interval for s in samples)
        assert received / seconds > 3 * THRESHOLD, f"A sent only {received / seconds:.0f} B/s"
        assert 0.8 <= observed / received <= 1.2, (observed, received, seconds)
        for s in samples:
            assert set(s.rates) <= {pair}, s.rates             # C is in no pair
            assert (s.stats.pods, s.stats.pods_skipped, s.stats.namespaces) == (3, 0, 3), s.stats
            assert s.errors == [], s.errors
        assert not [k for k in ctl.graph.weights() if c.uid in k]
        assert ctl.counts()["moves"] == 1                      # together: nothing more to do

        # The move is logged with its why.
        def move_lines() -> List[Dict[str, Any]]:
            return [r for r in proxy.log_lines() if r.get("message") == "affinity move"]
        (line,) = wait_until(move_lines, "the 'affinity move' log line")
        assert line["pod_uid"] == mover.uid and line["to_nodes"] == list(node)
        assert line["from_nodes"] == list(before[mover.uid]) and line["bytes_per_second"] >= THRESHOLD

        # Restart: the persisted ledger keeps the move; the new daemon's observer finds the
        # pair again (its PID cache and namespace state start empty) and has nothing to move.
        proxy.stop()
        proxy, hook, ctl = start_proxy(data)
        assert alloc_of(hook, a.uid).nodes == alloc_of(hook, b.uid).nodes == node
        assert alloc_of(hook, mover.uid).source == "affinity"
        assert alloc_of(hook, c.uid).nodes == before[c.uid]
        assert hook.placement.pending_updates() == []
        assert real_cpus(direct, ca) == real_cpus(direct, cb) == str(node[0])
        samples, _ = contiguous_samples(ctl, 3, lambda: 0, timeout=10.0)
        rates = [s.rates for s in samples]
        assert all(set(r) <= {pair} for r in rates) and any(pair in r for r in rates), rates
        assert ctl.counts()["moves"] == 0 and ctl.counts()["moves_refused"] == 0
        assert alloc_of(hook, a.uid).nodes == alloc_of(hook, b.uid).nodes == node
    finally:
        if kl is not None:
            # (the direct fixture then checks that no pod nor pod cgroup is left)
            direct.parents.update(kl._cgroups)  # type: ignore[attr-defined]
            kl.cleanup()
            kl.close()
        proxy.stop()
