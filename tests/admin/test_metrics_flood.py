"""The metrics endpoint attacked by an unprivileged local user, on a daemon process with a
low fd limit: half-sent requests (more than the daemon has fds) cost it neither threads
nor fds, and the kubelet and anolisnuma-ctl are served throughout; scrapes that arrive
together share one collection and leave CRI calls as fast as they were."""

from __future__ import annotations

import os
import resource
import statistics
import time
import urllib.request
from typing import Any, Dict, Iterator, List, NamedTuple, Optional, Tuple

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from anolisnuma.ctl.client import CtlError, ask
from anolisnuma.testing.daemon_probes import fds
from anolisnuma.testing.fake_cri import FakeCri
from anolisnuma.testing.http_flood import Flood
from anolisnuma.testing.proxy import SubprocessProxy, config_dict, wait_for_socket
from anolisnuma.testing.waiting import wait_until
from cri_proto import api_pb2 as pb

FD_LIMIT = 256
HALF_SENT = 400             # more than FD_LIMIT
THREAD_GROWTH = 2           # what the flood may add to the daemon's threads
FD_GROWTH = 32              # and to its fds (the endpoint serves a few connections at once)
SCRAPERS, SCRAPES_EACH = 12, 5
SLOWDOWN = 3.0              # CRI p50 during the scrape flood, as a multiple of the p50 before
VERSION = "/runtime.v1.RuntimeService/Version"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="drops to nobody and lowers the daemon's fd limit")


class Daemon(NamedTuple):
    proxy: SubprocessProxy
    pid: int
    admin: str
    host: str
    port: int

    def version(self) -> float:
        """A Version call on a connection of its own; seconds it took."""
        with grpc.insecure_channel(self.proxy.address) as channel:
            started = time.perf_counter()
            _call(channel)
            return time.perf_counter() - started

    def scrape(self) -> Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float]:
        with urllib.request.urlopen(f"http://{self.host}:{self.port}/metrics", timeout=30) as r:
            assert r.status == 200
            text = r.read().decode()
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}


def _call(channel: grpc.Channel) -> None:
    channel.unary_unary(VERSION, request_serializer=pb.VersionRequest.SerializeToString,
                        response_deserializer=pb.VersionResponse.FromString)(pb.VersionRequest(), timeout=30)


def status(admin: str) -> Optional[Dict[str, Any]]:
    """``anolisnuma-ctl status``, or None while the admin socket does not answer yet."""
    try:
        return ask(admin, "status")
    except CtlError:
        return None


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


@pytest.fixture
def daemon(tmp_path, sockdir) -> Iterator[Daemon]:
    fake = FakeCri(os.path.join(sockdir, "containerd.sock"), containers=0, sandboxes=0).start()
    admin = os.path.join(sockdir, "admin.sock")
    data = config_dict(str(tmp_path), fake.socket_path, listen=os.path.join(sockdir, "cri.sock"),
                       extra={"admin": {"socket": admin}, "metrics": {"listen": "127.0.0.1:0"},
                              "log": {"stderr": False}})
    proxy = SubprocessProxy(data, str(tmp_path)).start(wait=False)
    try:
        assert proxy.proc is not None
        resource.prlimit(proxy.proc.pid, resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))
        wait_for_socket(proxy.socket_path, 10, alive=lambda: proxy.proc.poll() is None)
        url = wait_until(lambda: (status(admin) or {}).get("metrics_url"), "the metrics endpoint")
        host, port = url[len("http://"):].split("/")[0].rsplit(":", 1)
        yield Daemon(proxy, proxy.proc.pid, admin, host, int(port))
    finally:
        proxy.stop()
        fake.stop(0)


class Peak:
    """The most threads and fds the daemon had at any of the samples taken."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.threads = self.fds = 0

    def sample(self) -> None:
        self.threads = max(self.threads, threads(self.pid))
        self.fds = max(self.fds, fds(self.pid))


def test_half_sent_requests_of_a_local_user_cost_the_daemon_no_thread_and_no_fd(daemon):
    daemon.scrape()   # the collecting worker exists from here on
    threads0, fds0 = threads(daemon.pid), fds(daemon.pid)
    peak = Peak(daemon.pid)
    with Flood(daemon.host, daemon.port) as flood:
        assert flood.uid != 0
        held = flood.ask(f"hold {HALF_SENT} 120")
        assert held["held"] + held["failed"] >= HALF_SENT
        peak.sample()
        assert peak.threads <= threads0 + THREAD_GROWTH, f"{peak.threads} threads, {threads0} before the flood"
        # while the connections are held (and re-opened as the daemon drops them)
        assert daemon.version() > 0                            # the kubelet: a new connection, a call
        peak.sample()
        assert ask(daemon.admin, "status", timeout=30)["ready"] is True   # anolisnuma-ctl
        peak.sample()
        during = flood.ask("held")
        assert during["open"] + during["connecting"] == HALF_SENT, during   # still at full strength
        assert peak.threads <= threads0 + THREAD_GROWTH, f"{peak.threads} threads, {threads0} before the flood"
        assert peak.fds <= fds0 + FD_GROWTH, f"{peak.fds} fds, {fds0} before the flood"
        # the daemon drops what it took of the flood (head timeout) and refuses the rest
        wait_until(lambda: flood.ask("held")["dropped"] >= 16, "the daemon to drop half-sent requests")
        flood.ask("release")
    m = daemon.scrape()
    dropped = m[("anolisnuma_metrics_connections_total", (("outcome", "head_timeout"),))]
    refused = m[("anolisnuma_metrics_connections_total", (("outcome", "busy"),))]
    assert dropped >= 16 and refused >= 1, (dropped, refused)
    wait_until(lambda: fds(daemon.pid) <= fds0, f"fds back to {fds0}")


def p50(seconds: List[float]) -> float:
    return statistics.median(seconds)


def test_scrapes_arriving_together_share_one_collection_and_leave_cri_calls_alone(daemon):
    collections = ("anolisnuma_metrics_collections_total", ())
    before = daemon.scrape()[collections]
    with grpc.insecure_channel(daemon.proxy.address) as channel:
        def call() -> float:
            started = time.perf_counter()
            _call(channel)
            return time.perf_counter() - started

        for _ in range(20):
            call()
        quiet = [call() for _ in range(200)]
        with Flood(daemon.host, daemon.port) as flood:
            started = time.monotonic()
            flood.send(f"scrape {SCRAPERS} {SCRAPES_EACH}")
            busy = []
            while not flood.answered():
                busy.append(call())
            result = flood.reply()
        after = daemon.scrape()[collections]
        elapsed = time.monotonic() - started
    assert result["statuses"] == {"200": SCRAPERS * SCRAPES_EACH} and result["errors"] == 0, result
    # at most once a second, however many scrape (the first and last scrape are ours)
    assert after - before <= elapsed + 2, (after - before, elapsed)
    assert len(busy) >= 30, len(busy)
    assert p50(busy) <= SLOWDOWN * p50(quiet), (p50(quiet), p50(busy))
