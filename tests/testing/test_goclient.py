"""The grpc-go test client (tests/tools/gocri): built once, then driving the fake CRI
backend directly and through an in-process proxy with concurrent calls on one connection.

The first build compiles grpc-go (about 20 s); later runs reuse the cached binary."""

from __future__ import annotations

from typing import Iterator

import pytest

from anolisnuma.testing.fake_cri import FakeCri, runtime_path
from anolisnuma.testing.goclient import build_gocri, run_gocri
from anolisnuma.testing.proxy import InProcessProxy, make_config
from cri_proto import api_pb2

VERSION = runtime_path("Version")
UNKNOWN_METHOD = runtime_path("NoSuchMethodYet")
OK, DEADLINE_EXCEEDED, UNIMPLEMENTED = 0, 4, 12


@pytest.fixture(scope="module")
def gocri() -> str:
    return build_gocri()


@pytest.fixture
def fake(sockdir: str) -> Iterator[FakeCri]:
    f = FakeCri(f"{sockdir}/cri.sock").start()
    yield f
    f.stop(0)


@pytest.fixture(params=["direct", "proxy"])
def target(request, sockdir: str, fake: FakeCri) -> Iterator[str]:
    """The socket gocri dials: the fake backend itself, or a proxy in front of it."""
    if request.param == "direct":
        yield fake.socket_path
        return
    proxy = InProcessProxy(make_config(sockdir, fake.socket_path)).start()
    try:
        yield proxy.socket_path
    finally:
        proxy.stop()


def test_concurrent_version_calls_come_back_decoded(gocri, target, fake):
    # given 24 Version requests, each with its own body, and a backend that takes 0.3 s
    fake.set_delay(VERSION, 0.3)
    bodies = [api_pb2.VersionRequest(version=f"v1-{i}").SerializeToString() for i in range(24)]
    # when grpc-go sends them all at once on one connection
    results = run_gocri(target, VERSION, bodies, deadline_s=10, binary=gocri)
    # then every call answers the fake's VersionResponse
    assert [r["index"] for r in results] == list(range(24))
    for r in results:
        assert (r["code"], r["message"]) == (OK, "")
        reply = api_pb2.VersionResponse.FromString(r["reply"])
        assert (reply.runtime_name, reply.runtime_api_version, reply.version) == ("fake-cri", "v1", "0.1.0")
    # and the backend got each body once, from grpc-go, with the caller's deadline
    got = fake.requests(VERSION)
    assert sorted(g.request for g in got) == sorted(bodies)
    assert all(g.metadata_dict["user-agent"].startswith("grpc-go/") for g in got)
    assert all(g.time_remaining is not None and 8 < g.time_remaining <= 10 for g in got)
    # and the calls were in flight together, not one after another: one by one, the last
    # would reach the backend 23 x 0.3 s after the first; together, at once (a quarter of
    # that leaves room for a machine whose cores are busy with something else)
    assert max(g.at for g in got) - min(g.at for g in got) < 0.3 * len(bodies) / 4
    assert max(r["elapsed_ms"] for r in results) < 24 * 300 / 2


def test_unknown_method_is_unimplemented_as_the_backend_says(gocri, target, fake):
    [r] = run_gocri(target, UNKNOWN_METHOD, [b"\x0a\x03abc"], deadline_s=5, binary=gocri)
    assert r["code"] == UNIMPLEMENTED
    assert r["message"] == f"fake CRI: unknown method {UNKNOWN_METHOD}"
    assert r["reply"] == b""
    assert fake.last(UNKNOWN_METHOD).request == b"\x0a\x03abc"


def test_deadline_flag_cuts_a_slow_call(gocri, target, fake):
    fake.set_delay(VERSION, 3.0)
    [r] = run_gocri(target, VERSION, [b""], deadline_s=0.3, binary=gocri)
    assert r["code"] == DEADLINE_EXCEEDED
    assert 250 < r["elapsed_ms"] < 2000


def test_serial_repeat_runs_a_latency_loop(gocri, fake):
    results = run_gocri(fake.socket_path, VERSION, [b""], deadline_s=5, repeat=20, serial=True, binary=gocri)
    assert [r["code"] for r in results] == [OK] * 20
    assert fake.calls(VERSION) == 20


def test_no_listener_is_an_error_not_a_result(gocri, sockdir):
    with pytest.raises(RuntimeError, match="dial"):
        run_gocri(f"{sockdir}/nobody.sock", VERSION, [b""], connect_timeout_s=0.3, binary=gocri)
