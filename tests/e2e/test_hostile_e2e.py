"""A flood of held streams against the daemon in front of the real containerd.

10,000 CreateContainer calls on one connection, each sending 16 KiB of a much longer
request and never finishing, from a client that honours flow control (the relay credits
what it holds, so the client may go on). Each call's HEADERS reaches containerd, which
serves every stream on a goroutine of its own; a fake backend with a thread pool would be
what a watchdog's Version waits for, so this case runs here. The budget caps what is held,
the streams past it are refused with RESOURCE_EXHAUSTED, another connection's Version
answers within 1 s all along, and the daemon's RSS and fds come back to their baseline.
"""

from __future__ import annotations

import subprocess
import sys
import time

from anolisnuma.testing.daemon_probes import MIB, Watchdog, assert_recovers, fds, rss_bytes
from anolisnuma.testing.h2raw import RawH2Client
from anolisnuma.testing.proxy import SubprocessProxy, config_dict
from anolisnuma.transport import h2 as wire

# The proxy's limits under a flood, not the runtime's behaviour: one build is enough.
CONTAINERD_BUILDS = ("1.6",)

CREATE = "/runtime.v1.RuntimeService/CreateContainer"
PER_CONNECTION = 16 * MIB


def test_flood_of_held_streams_stays_within_the_budget(containerd, tmp_path):
    cfg = config_dict(str(tmp_path), containerd.socket, extra={
        "server": {"buffer_bytes_per_connection": PER_CONNECTION, "buffer_bytes_total": 24 * MIB},
        "qos": {"enabled": True},
    }, listen=f"{containerd.run_dir}/hostile.sock")
    with SubprocessProxy(cfg, str(tmp_path)) as daemon:
        pid = daemon.proc.pid
        with RawH2Client(daemon.socket_path) as c:  # warm up, then let the daemon end it
            c.start()
            c.send(c.headers(1, "/runtime.v1.RuntimeService/Version")
                   + c.frame(wire.DATA, wire.FLAG_END_STREAM, 1, b"\x00" * 5))
            c.read(until=lambda f: f.stream == 1 and f.flags & wire.FLAG_END_STREAM)
            c.send(c.frame(wire.PING, 0, 0, b"\x00" * 20000))
            assert c.wait_closed()
        rss0, fds0 = rss_bytes(pid), fds(pid)
        peak = rss0
        with Watchdog(daemon.address):
            flood = subprocess.Popen(
                [sys.executable, "-c", "import sys; from anolisnuma.testing.h2raw import flood_held_streams; "
                 "print(flood_held_streams(sys.argv[1], sys.argv[2], 10_000))", daemon.socket_path, CREATE],
                stdout=subprocess.PIPE, text=True)
            while flood.poll() is None:
                peak = max(peak, rss_bytes(pid))
                time.sleep(0.05)  # sampling RSS while the flood runs; its end is the flood's exit
            refused = int(flood.stdout.read().strip())
        assert flood.returncode == 0
        assert refused > 0
        assert peak - rss0 < PER_CONNECTION + 16 * MIB, f"RSS grew {(peak - rss0) >> 20} MiB"
        assert_recovers(pid, rss0, fds0)


def test_both_peers_code_their_headers_without_a_dynamic_table(containerd, tmp_path):
    """The relay asks containerd and the client (SETTINGS_HEADER_TABLE_SIZE = 0) to code
    header blocks that stand alone: one the kubelet must not see (containerd's answer
    crossing the relay's own) can then be dropped without the kubelet's HPACK decoder
    missing an entry, and a repeated call's headers are a cache look-up. containerd's
    grpc-go and grpcio's C core both honour it: after many calls both tables are empty."""
    import grpc

    from anolisnuma.testing.proxy import InProcessProxy
    from cri_proto import api_pb2

    with InProcessProxy.for_backend(containerd.socket, str(tmp_path)) as proxy, \
            grpc.insecure_channel(proxy.address) as channel:
        for method, request in [("Version", api_pb2.VersionRequest()), ("Status", b""),
                                ("ListContainers", api_pb2.ListContainersRequest())] * 5:
            body = request if isinstance(request, bytes) else request.SerializeToString()
            channel.unary_unary(f"/runtime.v1.RuntimeService/{method}")(body, timeout=10)
        splices = list(proxy.daemon.relay.splices)
        assert splices and all(s.c2k_hpack.stateless and s.k2c_hpack.stateless for s in splices)
