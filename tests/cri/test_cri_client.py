"""CriClient (grpcio, through the generated stub) against a tiny in-process grpcio server
that speaks raw bytes, so what crosses the wire is checked byte for byte. The client
against the fake CRI backend's fault injection and against the real containerd:
test_cri_client_faults.py and tests/e2e/test_cri_client_e2e.py."""

import json
import os
import shutil
import tempfile
import threading
from concurrent import futures

import grpc
import pytest

from anolisnuma.cri.client import DEFAULT_MAX_MESSAGE_BYTES, CallError, CriClient
from cri_proto import api_pb2

CID = "c" * 64
SID = "5" * 64
# A field number no CRI version uses: must reach the client's parser unharmed.
FUTURE_FIELD = bytes([0xC2, 0x3E, 0x03]) + b"new"


def _big_list_reply(total_bytes):
    reply = api_pb2.ListContainersResponse()
    blob = "x" * 4096
    i = 0
    while reply.ByteSize() < total_bytes:
        c = reply.containers.add(id="%064x" % i, pod_sandbox_id=SID)
        c.metadata.name = "c%d" % i
        c.state = api_pb2.CONTAINER_RUNNING
        for k in range(16):
            c.annotations["k%d" % k] = blob
        i += 1
    return reply


class Backend:
    """Records raw requests; replies with canned raw bytes."""

    def __init__(self):
        self.requests = []
        self.list_reply = b""
        self.delay = 0.0
        self.released = threading.Event()

    def handler(self):
        def unary(name, reply):
            def fn(request, context):
                self.requests.append((name, request))
                return reply(request, context)

            return grpc.unary_unary_rpc_method_handler(fn)

        def version(request, context):
            if self.delay:
                self.released.wait(self.delay)
            return api_pb2.VersionResponse(
                version="0.1.0", runtime_name="containerd", runtime_api_version="v1"
            ).SerializeToString()

        def list_containers(request, context):
            return self.list_reply

        def list_sandboxes(request, context):
            reply = api_pb2.ListPodSandboxResponse()
            reply.items.add(id=SID, state=api_pb2.SANDBOX_READY).metadata.uid = "u"
            return reply.SerializeToString() + FUTURE_FIELD

        def container_status(request, context):
            req = api_pb2.ContainerStatusRequest.FromString(request)
            if req.container_id != CID:
                context.abort(grpc.StatusCode.NOT_FOUND, "no such container")
            reply = api_pb2.ContainerStatusResponse()
            reply.status.id = CID
            reply.status.resources.linux.cpuset_cpus = "0-3"
            if req.verbose:
                reply.info["info"] = json.dumps({"pid": 42, "sandboxID": SID})
            return reply.SerializeToString()

        def sandbox_status(request, context):
            reply = api_pb2.PodSandboxStatusResponse()
            reply.status.id = SID
            reply.info["info"] = "not json"
            return reply.SerializeToString()

        def update(request, context):
            return b""

        return grpc.method_handlers_generic_handler(
            "runtime.v1.RuntimeService",
            {
                "Version": unary("Version", version),
                "ListContainers": unary("ListContainers", list_containers),
                "ListPodSandbox": unary("ListPodSandbox", list_sandboxes),
                "ContainerStatus": unary("ContainerStatus", container_status),
                "PodSandboxStatus": unary("PodSandboxStatus", sandbox_status),
                "UpdateContainerResources": unary("UpdateContainerResources", update),
            },
        )


@pytest.fixture
def backend():
    tmp = tempfile.mkdtemp(prefix="anolisnuma-cri-", dir="/tmp")
    sock = os.path.join(tmp, "containerd.sock")
    state = Backend()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((state.handler(),))
    server.add_insecure_port("unix://" + sock)
    server.start()
    state.socket = sock
    try:
        yield state
    finally:
        server.stop(None)
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def client(backend):
    c = CriClient("unix://" + backend.socket, timeout_seconds=5.0)
    try:
        yield c
    finally:
        c.close()


def test_version_serializes_request(client, backend):
    reply = client.version()
    assert reply.runtime_name == "containerd"
    name, raw = backend.requests[-1]
    assert name == "Version"
    assert api_pb2.VersionRequest.FromString(raw).version == "v1"


def test_list_containers_larger_than_grpc_default(client, backend):
    expected = _big_list_reply(6 * 1024 * 1024)
    backend.list_reply = expected.SerializeToString()
    assert len(backend.list_reply) > 6 * 1024 * 1024
    got = client.list_containers()
    assert len(got) == len(expected.containers)
    assert got[0] == expected.containers[0]
    assert got[-1].annotations == expected.containers[-1].annotations


def test_reply_over_the_limit_fails(backend):
    backend.list_reply = _big_list_reply(2 * 1024 * 1024).SerializeToString()
    with CriClient(backend.socket, max_message_bytes=1024 * 1024, timeout_seconds=5.0) as c:
        with pytest.raises(CallError) as err:
            c.list_containers()
        assert err.value.code().name == "RESOURCE_EXHAUSTED"
        assert c.version().runtime_name == "containerd"     # the connection is still usable


def test_a_long_lived_client_keeps_one_connection(backend):
    """A loop's client serves it for days: its calls share one channel, and neither a
    reply over the limit nor an error from containerd makes it open another."""
    backend.list_reply = _big_list_reply(2 * 1024 * 1024).SerializeToString()
    with CriClient(backend.socket, max_message_bytes=1024 * 1024, timeout_seconds=5.0) as c:
        c.version()
        link = c._link
        for _ in range(300):
            c.version()
        with pytest.raises(CallError):
            c.list_containers()            # over the limit
        with pytest.raises(CallError):
            c.container_status("d" * 64)   # NOT_FOUND
        for _ in range(3):
            assert c.version().runtime_name == "containerd"
        assert c._link is link and link.users == 0


def test_list_with_filter(client, backend):
    backend.list_reply = b""
    flt = api_pb2.ContainerFilter(pod_sandbox_id=SID)
    assert client.list_containers(flt) == []
    name, raw = backend.requests[-1]
    assert api_pb2.ListContainersRequest.FromString(raw).filter.pod_sandbox_id == SID


def test_list_pod_sandboxes_tolerates_unknown_fields(client):
    items = client.list_pod_sandboxes()
    assert [s.id for s in items] == [SID]
    assert items[0].metadata.uid == "u"


def test_container_status_parses_info(client, backend):
    status, info = client.container_status(CID)
    assert status.id == CID
    assert status.resources.linux.cpuset_cpus == "0-3"
    assert info == {"pid": 42, "sandboxID": SID}
    assert api_pb2.ContainerStatusRequest.FromString(backend.requests[-1][1]).verbose
    status, info = client.container_status(CID, verbose=False)
    assert info == {}


def test_container_status_not_found(client):
    with pytest.raises(CallError) as err:
        client.container_status("d" * 64)
    assert err.value.code().name == "NOT_FOUND" and err.value.details() == "no such container"


def test_pod_sandbox_status_bad_info_is_empty(client):
    status, info = client.pod_sandbox_status(SID)
    assert status.id == SID
    assert info == {}


def test_update_container_resources(client, backend):
    res = api_pb2.LinuxContainerResources(cpuset_cpus="4-7", cpuset_mems="1", cpu_shares=512)
    assert client.update_container_resources(CID, res, {"a": "b"}) is None
    name, raw = backend.requests[-1]
    assert name == "UpdateContainerResources"
    req = api_pb2.UpdateContainerResourcesRequest.FromString(raw)
    assert req.container_id == CID
    assert req.linux == res
    assert dict(req.annotations) == {"a": "b"}


def test_unavailable_backend_fails_fast():
    tmp = tempfile.mkdtemp(prefix="anolisnuma-cri-", dir="/tmp")
    try:
        with CriClient(os.path.join(tmp, "absent.sock"), timeout_seconds=5.0) as c:
            with pytest.raises(CallError) as err:
                c.version()
        assert err.value.code().name == "UNAVAILABLE"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_constructor_validation():
    assert DEFAULT_MAX_MESSAGE_BYTES == 16 * 1024 * 1024
    with pytest.raises(ValueError):
        CriClient("")
    with pytest.raises(ValueError):
        CriClient("unix://")
    with pytest.raises(ValueError):
        CriClient("/x.sock", max_message_bytes=0)
    with pytest.raises(ValueError):
        CriClient("/x.sock", timeout_seconds=0)
    c = CriClient("unix:///run/x.sock")
    assert c.endpoint == "/run/x.sock"
    c.close()
    c.close()


def test_a_deadline_fails_the_call_and_the_next_call_works(client, backend):
    slow = CriClient(backend.socket, timeout_seconds=0.2)
    backend.delay = 10.0
    try:
        with pytest.raises(CallError) as err:
            slow.version()
        assert err.value.code().name == "DEADLINE_EXCEEDED"
    finally:
        backend.delay = 0.0
        backend.released.set()
    assert slow.version().runtime_name == "containerd"
    slow.close()


def test_one_client_shared_by_threads(client, backend):
    backend.list_reply = _big_list_reply(200 * 1024).SerializeToString()
    errors = []

    def work():
        try:
            for _ in range(20):
                assert client.version().runtime_name == "containerd"
                assert len(client.list_containers()) > 1
        except Exception as e:   # reported below: an assertion in a thread is not seen by pytest
            errors.append(repr(e))

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == [] and not any(t.is_alive() for t in threads)


def test_the_client_follows_containerd_restarts():
    """containerd down: calls fail UNAVAILABLE at once; back: the next call works; restarted
    between two calls: the idle connection it closed is noticed, the call does not fail."""
    tmp = tempfile.mkdtemp(prefix="anolisnuma-cri-", dir="/tmp")
    sock = os.path.join(tmp, "containerd.sock")

    def serve():
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        server.add_generic_rpc_handlers((Backend().handler(),))
        server.add_insecure_port("unix://" + sock)
        server.start()
        return server

    server = serve()
    try:
        with CriClient(sock, timeout_seconds=5.0) as c:
            assert c.version().runtime_name == "containerd"
            server.stop(None).wait()
            with pytest.raises(CallError) as err:
                c.version()
            assert err.value.code().name == "UNAVAILABLE"
            server = serve()
            assert c.version().runtime_name == "containerd"
            server.stop(None).wait()
            server = serve()                       # restarted while the client was idle
            assert c.version().runtime_name == "containerd"
    finally:
        server.stop(None)
        shutil.rmtree(tmp, ignore_errors=True)
