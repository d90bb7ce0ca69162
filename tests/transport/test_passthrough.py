"""Pass-through calls: what the caller sends reaches the backend unchanged, and what the
backend answers comes back unchanged, exactly as with no proxy in between.

Each story runs through the proxy and, where a comparison says more, directly against the
fake backend too."""

from __future__ import annotations

import os
import random
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from anolisnuma.testing.fake_cri import RUNTIME_V1ALPHA2, runtime_path
from anolisnuma.testing.waiting import wait_until

cri_v1 = pytest.importorskip("cri_api.v1.api_pb2")
cri_v1_grpc = pytest.importorskip("cri_api.v1.api_pb2_grpc")
cri_v1alpha2 = pytest.importorskip("cri_api.v1alpha2.api_pb2")
cri_v1alpha2_grpc = pytest.importorskip("cri_api.v1alpha2.api_pb2_grpc")

MIB = 1 << 20
UNKNOWN_METHOD = "/runtime.v1.RuntimeService/NoSuchMethodYet"
MADE_UP_SERVICE = "/example.festival.v3.LanternService/Light"


def raw_unary(channel: grpc.Channel, path: str):
    return channel.unary_unary(path, request_serializer=None, response_deserializer=None)


@pytest.fixture(params=["direct", "proxy"])
def target(request, fake, proxy):
    """The address a caller uses: the backend itself or the proxy in front of it."""
    return fake.address if request.param == "direct" else proxy.address


# ---------------------------------------------------------------- known methods

def test_version_v1_passes(proxy, fake, open_channel):
    stub = cri_v1_grpc.RuntimeServiceStub(open_channel(proxy.address))
    reply = stub.Version(cri_v1.VersionRequest(version="v1"), timeout=5)
    assert reply.runtime_name == "fake-cri"
    assert reply.runtime_api_version == "v1"
    assert fake.last(runtime_path("Version")).request == cri_v1.VersionRequest(version="v1").SerializeToString()


def test_version_v1alpha2_passes(proxy, fake, open_channel):
    stub = cri_v1alpha2_grpc.RuntimeServiceStub(open_channel(proxy.address))
    reply = stub.Version(cri_v1alpha2.VersionRequest(version="v1alpha2"), timeout=5)
    assert reply.runtime_api_version == "v1alpha2"
    assert fake.calls(runtime_path("Version", RUNTIME_V1ALPHA2)) == 1
    assert fake.calls(runtime_path("Version")) == 0


def test_list_containers_and_sandboxes_pass(proxy, fake, open_channel):
    stub = cri_v1_grpc.RuntimeServiceStub(open_channel(proxy.address))
    assert [c.id for c in stub.ListContainers(cri_v1.ListContainersRequest(), timeout=5).containers] \
        == fake.container_ids()
    assert [s.id for s in stub.ListPodSandbox(cri_v1.ListPodSandboxRequest(), timeout=5).items] \
        == fake.sandbox_ids()
    status = stub.Status(cri_v1.StatusRequest(), timeout=5)
    assert {c.type for c in status.status.conditions} == {"RuntimeReady", "NetworkReady"}


# ---------------------------------------------------------------- methods the proxy never heard of

@pytest.mark.parametrize("path", [UNKNOWN_METHOD, MADE_UP_SERVICE])
def test_unknown_method_reaches_backend_and_reply_returns(path, proxy, fake, open_channel):
    fake.set_reply(path, lambda req, ctx: b"reply to " + req)
    got = raw_unary(open_channel(proxy.address), path)(b"\x0a\x03abc", timeout=5)
    assert got == b"reply to \x0a\x03abc"
    assert fake.last(path).request == b"\x0a\x03abc"


def test_unknown_method_without_reply_is_unimplemented_as_from_backend(target, fake, open_channel):
    with pytest.raises(grpc.RpcError) as e:
        raw_unary(open_channel(target), UNKNOWN_METHOD)(b"", timeout=5)
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert UNKNOWN_METHOD in e.value.details()


# ---------------------------------------------------------------- status, details, metadata

@pytest.mark.parametrize("path", [runtime_path("ContainerStatus"), runtime_path("StartContainer"), UNKNOWN_METHOD])
@pytest.mark.parametrize("code,details", [
    (grpc.StatusCode.NOT_FOUND, "container \"abc\" not found: not found"),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, "too many pods; très occupé ✓ 100%"),
    (grpc.StatusCode.FAILED_PRECONDITION, ""),
])
def test_status_details_and_trailers_propagate(path, code, details, target, fake, open_channel):
    fake.set_error(path, code, details, trailing_metadata=[("x-reason", "because"), ("x-blob-bin", b"\x00\xff\x01")])
    with pytest.raises(grpc.RpcError) as e:
        raw_unary(open_channel(target), path)(b"", timeout=5)
    assert e.value.code() == code
    assert e.value.details() == details
    trailers = dict(e.value.trailing_metadata())
    assert trailers["x-reason"] == "because"
    assert trailers["x-blob-bin"] == b"\x00\xff\x01"


def test_request_metadata_reaches_backend_unchanged(proxy, fake, open_channel):
    md = [("x-custom", "value 1"), ("x-custom", "value 2"), ("x-trace-bin", bytes(range(256))),
          ("authorization", "Bearer not-a-secret")]
    direct = raw_unary(open_channel(fake.address), UNKNOWN_METHOD)
    relayed = raw_unary(open_channel(proxy.address), UNKNOWN_METHOD)
    fake.set_reply(UNKNOWN_METHOD, b"ok")
    direct(b"x", metadata=md, timeout=5)
    seen_direct = fake.last(UNKNOWN_METHOD).metadata
    relayed(b"x", metadata=md, timeout=5)
    seen_relayed = fake.last(UNKNOWN_METHOD).metadata
    assert [kv for kv in seen_relayed if kv[0].startswith("x-") or kv[0] == "authorization"] == md
    assert seen_relayed == seen_direct


def test_caller_deadline_reaches_backend(proxy, fake, open_channel):
    stub = raw_unary(open_channel(proxy.address), UNKNOWN_METHOD)
    fake.set_reply(UNKNOWN_METHOD, b"ok")
    # (the client rounds grpc-timeout up to its coarse units, hence the + 1.1 s slack)
    stub(b"", timeout=7.0)
    remaining = fake.last(UNKNOWN_METHOD).time_remaining
    assert remaining is not None and 6.0 < remaining <= 7.0 + 1.1
    stub(b"", timeout=240.0)  # RunPodSandbox's kubelet deadline: never shortened
    assert 239.0 < fake.last(UNKNOWN_METHOD).time_remaining <= 240.0 + 1.1


def test_no_deadline_means_none_at_backend(proxy, fake, open_channel):
    fake.set_reply(UNKNOWN_METHOD, b"ok")
    raw_unary(open_channel(proxy.address), UNKNOWN_METHOD)(b"")
    assert fake.last(UNKNOWN_METHOD).time_remaining is None
    stub = cri_v1_grpc.RuntimeServiceStub(open_channel(proxy.address))
    stub.StartContainer(cri_v1.StartContainerRequest(container_id="c" * 64))  # intercepted
    assert fake.last(runtime_path("StartContainer")).time_remaining is None


def test_deadline_exceeded_at_backend_is_the_callers(proxy, fake, open_channel):
    fake.set_reply(UNKNOWN_METHOD, b"ok")
    fake.set_delay(UNKNOWN_METHOD, 6.0)
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as e:
        raw_unary(open_channel(proxy.address), UNKNOWN_METHOD)(b"", timeout=0.3)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - started < 4.0       # the caller's 0.3 s, not the backend's 6 s


# ---------------------------------------------------------------- message sizes

@pytest.mark.parametrize("size_mib", [6, 15])
def test_large_reply_passes(size_mib, proxy, fake, open_channel):
    body = os.urandom(1024) * (size_mib * 1024)
    fake.set_reply(UNKNOWN_METHOD, body)
    got = raw_unary(open_channel(proxy.address), UNKNOWN_METHOD)(b"", timeout=20)
    assert len(got) == len(body) and got == body


def test_large_list_containers_reply_passes(proxy, fake, open_channel):
    pb = cri_v1
    reply = pb.ListContainersResponse(containers=[
        pb.Container(id=f"{i:064x}", pod_sandbox_id=f"{i // 4:064x}",
                     metadata=pb.ContainerMetadata(name=f"c{i}"),
                     annotations={f"note-{k}": "y" * 200 for k in range(5)})
        for i in range(6000)])
    raw = reply.SerializeToString()
    assert len(raw) > 6 * MIB
    fake.set_reply(runtime_path("ListContainers"), raw)
    stub = cri_v1_grpc.RuntimeServiceStub(open_channel(proxy.address))
    got = stub.ListContainers(pb.ListContainersRequest(), timeout=20)
    assert got == reply


def test_large_request_passes(proxy, fake, open_channel):
    body = os.urandom(6 * MIB)
    fake.set_reply(UNKNOWN_METHOD, lambda req, ctx: len(req).to_bytes(8, "big"))
    got = raw_unary(open_channel(proxy.address), UNKNOWN_METHOD)(body, timeout=20)
    assert int.from_bytes(got, "big") == len(body)
    assert fake.last(UNKNOWN_METHOD).request == body


# ---------------------------------------------------------------- streams

def test_container_events_stream_in_order(proxy, fake, open_channel):
    path = runtime_path("GetContainerEvents")
    events = [fake.container_event(i) for i in range(200)]
    fake.set_stream(path, events, interval=0.0)
    stub = cri_v1_grpc.RuntimeServiceStub(open_channel(proxy.address))
    got = [e.SerializeToString() for e in stub.GetContainerEvents(cri_v1.GetEventsRequest(), timeout=10)]
    assert got == events


def test_default_events_stream(proxy, fake, open_channel):
    stub = cri_v1_grpc.RuntimeServiceStub(open_channel(proxy.address))
    got = list(stub.GetContainerEvents(cri_v1.GetEventsRequest(), timeout=10))
    assert [e.created_at for e in got] == [1000 + i for i in range(fake.n_events)]


def test_long_stream_cancelled_by_client(proxy, fake, open_channel):
    path = runtime_path("GetContainerEvents")
    fake.set_stream(path, [fake.container_event(i) for i in range(5)], interval=0.01, hold_open=True)
    channel = open_channel(proxy.address)
    stub = cri_v1_grpc.RuntimeServiceStub(channel)
    call = stub.GetContainerEvents(cri_v1.GetEventsRequest())
    got = [next(call).created_at for _ in range(5)]
    assert got == [1000 + i for i in range(5)]
    call.cancel()
    with pytest.raises(grpc.RpcError) as e:
        next(call)
    assert e.value.code() == grpc.StatusCode.CANCELLED
    wait_until(lambda: fake.stream_outcomes, "the backend to see the stream end")
    assert fake.stream_outcomes[-1].cancelled
    # the connection is still good for other calls
    assert stub.Version(cri_v1.VersionRequest(), timeout=5).runtime_name == "fake-cri"


def test_made_up_streaming_method_relays_as_stream(proxy, fake, open_channel):
    path = "/runtime.v1.RuntimeService/StreamContainers"
    fake.set_stream(path, [b"one", b"two", b"three"])
    call = open_channel(proxy.address).unary_stream(path)
    assert list(call(b"", timeout=5)) == [b"one", b"two", b"three"]


# ---------------------------------------------------------------- concurrency and HPACK state

def test_sixteen_concurrent_callers(proxy, fake, open_channel):
    fake.set_reply(UNKNOWN_METHOD, lambda req, ctx: b"echo:" + req)
    fake.set_delay(UNKNOWN_METHOD, 0.05)
    errors = []

    def caller(n: int) -> None:
        # half share one channel (many streams on one connection), half have their own
        ch = shared if n % 2 else open_channel(proxy.address)
        stub = raw_unary(ch, UNKNOWN_METHOD)
        for i in range(10):
            payload = f"{n}-{i}".encode() * (1 + n * 50)
            try:
                assert stub(payload, timeout=10) == b"echo:" + payload
            except BaseException as e:  # collected for the main thread
                errors.append(e)

    shared = open_channel(proxy.address)
    started = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(caller, range(16)))
    assert not errors, errors[:3]
    assert fake.calls(UNKNOWN_METHOD) == 160
    # 160 calls of 50 ms each take 8 s one after another, whatever the load: they overlapped
    assert time.monotonic() - started < 6.0


def test_many_sequential_calls_with_churning_metadata(proxy, fake, open_channel):
    """2,000 calls on one connection; request and reply metadata values change every call,
    so both HPACK dynamic tables churn; the proxy follows both and every call arrives with
    exactly its own metadata, intercepted ones included."""
    rng = random.Random(7)

    def reply(req: bytes, ctx) -> bytes:
        md = dict(ctx.invocation_metadata())
        ctx.set_trailing_metadata((("x-echo", md.get("x-seq", "")), ("x-pad", "p" * rng.randrange(1, 300))))
        return req

    fake.set_reply(UNKNOWN_METHOD, reply)
    channel = open_channel(proxy.address)
    stub = raw_unary(channel, UNKNOWN_METHOD)
    start_ctr = cri_v1_grpc.RuntimeServiceStub(channel).StartContainer
    n = 2000
    for i in range(n):
        md = (("x-seq", str(i)), ("x-rand", "%x" % rng.getrandbits(rng.randrange(8, 400))),
              ("x-const", "same every time"))
        if i % 100 == 99:
            start_ctr(cri_v1.StartContainerRequest(container_id=f"{i:064x}"), metadata=md, timeout=5)
            assert fake.last(runtime_path("StartContainer")).metadata_dict["x-seq"] == str(i)
            continue
        got, call = stub.with_call(str(i).encode(), metadata=md, timeout=5)
        assert got == str(i).encode()
        assert dict(call.trailing_metadata())["x-echo"] == str(i)
        seen = fake.last(UNKNOWN_METHOD).metadata_dict
        assert (seen["x-seq"], seen["x-rand"]) == (md[0][1], md[1][1])
    assert fake.calls(UNKNOWN_METHOD) == n - n // 100
