"""A fake CRI backend for fast tests and fault injection.

``FakeCri`` is a synchronous ``grpc.server`` on a unix socket that answers *any* method
path with raw bytes (one generic handler, identity serializers), so it stands in for
containerd behind the proxy without knowing the CRI surface. Per method path a test can
set the reply (bytes, a protobuf message, or ``callable(request_bytes, context)``), an
error (status code, details, trailing metadata), a delay, or a server-streaming answer.
Every call is recorded with its raw request bytes, invocation metadata and the deadline
the backend saw (``time_remaining``), so a test can check exactly what crossed the proxy.

Defaults (both ``runtime.v1`` and ``runtime.v1alpha2`` where it matters): ``Version``,
``Status``, ``ListContainers`` / ``ListPodSandbox`` with N synthetic entries,
``GetContainerEvents`` (a short stream), and plausible answers for the eight lifecycle
methods the proxy intercepts (new 64-hex IDs for ``RunPodSandbox``/``CreateContainer``).
Any other path answers ``UNIMPLEMENTED`` like a real server, but is still recorded.

Messages are built with the full CRI stubs (``cri_api``) when they are importable and
with ``cri_proto`` or a few hand-encoded bytes otherwise, so the fake works on Python 3.9.

    with FakeCri(str(tmp_path / "cri.sock"), containers=5) as fake:
        fake.set_error(runtime_path("StartContainer"), grpc.StatusCode.NOT_FOUND, "no such container")
        ...
        assert fake.last(runtime_path("Version")).metadata_dict["x-test"] == "1"
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple, Union

import grpc

from anolisnuma.cri.methods import SERVER_STREAMING_METHODS, split_path

try:  # full CRI stubs: a test dependency (Python >= 3.10)
    from cri_api.v1 import api_pb2 as _full_v1  # type: ignore
except Exception:  # pragma: no cover - Python 3.9 nodes
    _full_v1 = None
from cri_proto import api_pb2 as _subset

RUNTIME_V1 = "runtime.v1.RuntimeService"
IMAGE_V1 = "runtime.v1.ImageService"
RUNTIME_V1ALPHA2 = "runtime.v1alpha2.RuntimeService"
MIB = 1 << 20
NO_DEADLINE = 10 ** 9  # seconds; a larger time_remaining means the caller set none
DEFAULT_MAX_MESSAGE_BYTES = 64 * MIB

Reply = Union[bytes, Any, Callable[[bytes, grpc.ServicerContext], Any]]


def runtime_path(method: str, service: str = RUNTIME_V1) -> str:
    """``"/runtime.v1.RuntimeService/<method>"`` (or another service's path)."""
    return f"/{service}/{method}"


def hex_id(seed: str) -> str:
    """A containerd-style 64-hex ID derived from ``seed`` (stable across runs)."""
    return hashlib.sha256(seed.encode()).hexdigest()


def pod_uid(seed: str) -> str:
    """An RFC 4122 pod UID derived from ``seed``."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, "anolisnuma-fake/" + seed))


class Received(NamedTuple):
    """One call as the backend saw it."""

    path: str
    request: bytes
    metadata: Tuple[Tuple[str, Union[str, bytes]], ...]
    time_remaining: Optional[float]   # None: the caller set no deadline
    at: float                         # time.monotonic() when the handler started

    @property
    def metadata_dict(self) -> Dict[str, Union[str, bytes]]:
        return dict(self.metadata)


class StreamOutcome(NamedTuple):
    path: str
    sent: int
    cancelled: bool


class _Error(NamedTuple):
    code: grpc.StatusCode
    details: str
    trailing_metadata: Tuple[Tuple[str, Union[str, bytes]], ...]


class _Stream(NamedTuple):
    messages: Union[Sequence[Any], Callable[[bytes, grpc.ServicerContext], Iterable[Any]]]
    interval: float
    hold_open: bool


def _encode(message: Any) -> bytes:
    if isinstance(message, (bytes, bytearray, memoryview)):
        return bytes(message)
    return message.SerializeToString()


# -- tiny protobuf writer for the messages cri_proto does not declare (fallback only) -----
def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field_bytes(num: int, value: bytes) -> bytes:
    return _varint(num << 3 | 2) + _varint(len(value)) + value


def _field_varint(num: int, value: int) -> bytes:
    return _varint(num << 3) + _varint(value)


class FakeCri:
    """A raw-bytes gRPC server answering any method path; see the module docstring."""

    def __init__(self, socket_path: str, containers: int = 3, sandboxes: int = 3, events: int = 3,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, max_workers: int = 48,
                 runtime_name: str = "fake-cri", runtime_version: str = "1.0.0",
                 server_options: Sequence[Tuple[str, Any]] = ()) -> None:
        self.socket_path = socket_path
        self.max_message_bytes = max_message_bytes
        self.max_workers = max_workers
        self.runtime_name = runtime_name
        self.runtime_version = runtime_version
        self.n_containers = containers
        self.n_sandboxes = sandboxes
        self.n_events = events
        # extra grpc.server options, e.g. ("grpc.http2.bdp_probe", 0) and
        # ("grpc.http2.lookahead_bytes", 65535) for containerd-like (grpc-go) small windows
        self.server_options = list(server_options)
        self._lock = threading.Lock()
        self._replies: Dict[str, Reply] = {}
        self._errors: Dict[str, _Error] = {}
        self._delays: Dict[str, float] = {}
        self._streams: Dict[str, _Stream] = {}
        self._received: Dict[str, List[Received]] = {}
        self._arrived = threading.Condition(self._lock)
        self.stream_outcomes: List[StreamOutcome] = []
        self._server: Optional[grpc.Server] = None
        self._ids = 0
        self.keep_requests = 10_000   # per path; older ones are dropped

    # ---------------------------------------------------------------- lifecycle
    @property
    def address(self) -> str:
        return "unix://" + self.socket_path

    @property
    def running(self) -> bool:
        return self._server is not None

    def start(self) -> "FakeCri":
        if self._server is not None:
            return self
        os.makedirs(os.path.dirname(self.socket_path) or ".", exist_ok=True)
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)  # left by a kill-like stop
        server = grpc.server(
            ThreadPoolExecutor(max_workers=self.max_workers, thread_name_prefix="fake-cri"),
            handlers=[_Handler(self)],
            options=[
                ("grpc.max_receive_message_length", self.max_message_bytes),
                ("grpc.max_send_message_length", self.max_message_bytes),
            ] + self.server_options,
            maximum_concurrent_rpcs=None,
        )
        if not server.add_insecure_port(self.address):
            raise RuntimeError(f"fake CRI cannot bind {self.socket_path}")
        server.start()
        self._server = server
        return self

    def stop(self, grace: Optional[float] = None) -> None:
        """Stop serving. ``grace=0`` cuts every call and connection at once (like a kill);
        ``None`` waits for calls in flight."""
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace).wait()

    def restart(self, grace: Optional[float] = 0) -> None:
        """Stop and start again on the same socket path (containerd restarting)."""
        self.stop(grace)
        self.start()

    def __enter__(self) -> "FakeCri":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop(0)

    # ---------------------------------------------------------------- configuration
    def set_reply(self, path: str, reply: Reply) -> None:
        """Answer ``path`` with ``reply``: bytes, a protobuf message, or
        ``callable(request_bytes, context)`` returning either (it may ``context.abort``)."""
        with self._lock:
            self._replies[path] = reply
            self._errors.pop(path, None)
            self._streams.pop(path, None)

    def set_error(self, path: str, code: grpc.StatusCode, details: str = "",
                  trailing_metadata: Sequence[Tuple[str, Union[str, bytes]]] = ()) -> None:
        with self._lock:
            self._errors[path] = _Error(code, details, tuple(trailing_metadata))

    def set_delay(self, path: str, seconds: float) -> None:
        """Wait ``seconds`` before answering ``path`` (0 removes the delay)."""
        with self._lock:
            if seconds:
                self._delays[path] = seconds
            else:
                self._delays.pop(path, None)

    def set_stream(self, path: str, messages: Union[Sequence[Any], Callable[[bytes, Any], Iterable[Any]]],
                   interval: float = 0.0, hold_open: bool = False) -> None:
        """Answer ``path`` as a server stream: ``messages`` (or ``callable(request, ctx)``
        returning an iterable) with ``interval`` seconds between them; ``hold_open`` keeps
        the stream open after the last one until the caller cancels."""
        with self._lock:
            self._streams[path] = _Stream(messages, interval, hold_open)
            self._replies.pop(path, None)
            self._errors.pop(path, None)

    def clear(self, path: Optional[str] = None) -> None:
        """Forget configured behaviour (of ``path``, or of every path) and the records."""
        with self._lock:
            for d in (self._replies, self._errors, self._delays, self._streams, self._received):
                if path is None:
                    d.clear()
                else:
                    d.pop(path, None)
            if path is None:
                self.stream_outcomes.clear()

    # ---------------------------------------------------------------- records
    def requests(self, path: str) -> List[Received]:
        with self._lock:
            return list(self._received.get(path, ()))

    def calls(self, path: str) -> int:
        with self._lock:
            return len(self._received.get(path, ()))

    def last(self, path: str) -> Received:
        with self._lock:
            got = self._received.get(path)
            if not got:
                raise AssertionError(f"the fake CRI backend received no call of {path}")
            return got[-1]

    def paths(self) -> List[str]:
        with self._lock:
            return [p for p, v in self._received.items() if v]

    def wait_for_calls(self, path: str, n: int = 1, timeout: float = 5.0) -> List[Received]:
        deadline = time.monotonic() + timeout
        with self._arrived:
            while len(self._received.get(path, ())) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{path}: {len(self._received.get(path, ()))} calls, expected {n}")
                self._arrived.wait(left)
            return list(self._received[path])

    # ---------------------------------------------------------------- serving
    def _record(self, path: str, request: bytes, context: grpc.ServicerContext) -> None:
        md = tuple((m.key, m.value) for m in context.invocation_metadata())
        remaining = context.time_remaining()
        if remaining is not None and remaining > NO_DEADLINE:
            remaining = None  # gRPC reports "no deadline" as ~2**63 ns
        got = Received(path, request, md, remaining, time.monotonic())
        with self._arrived:
            lst = self._received.setdefault(path, [])
            lst.append(got)
            if len(lst) > self.keep_requests:
                del lst[: len(lst) - self.keep_requests]
            self._arrived.notify_all()

    def _is_stream(self, path: str) -> bool:
        with self._lock:
            if path in self._streams:
                return True
        return split_path(path)[1] in SERVER_STREAMING_METHODS

    def _sleep(self, seconds: float, context: grpc.ServicerContext) -> bool:
        """Sleep unless the call is cancelled first; False when it was."""
        end = time.monotonic() + seconds
        while True:
            if not context.is_active():
                return False
            left = end - time.monotonic()
            if left <= 0:
                return True
            time.sleep(min(left, 0.02))

    def _unary(self, path: str, request: bytes, context: grpc.ServicerContext) -> bytes:
        self._record(path, request, context)
        with self._lock:
            delay = self._delays.get(path, 0.0)
            error = self._errors.get(path)
            reply = self._replies.get(path)
        if delay and not self._sleep(delay, context):
            return b""
        if error is not None:
            if error.trailing_metadata:
                context.set_trailing_metadata(error.trailing_metadata)
            context.abort(error.code, error.details)
        if reply is None:
            reply = self._default_reply(path, request)
            if reply is None:
                context.abort(grpc.StatusCode.UNIMPLEMENTED, f"fake CRI: unknown method {path}")
        if callable(reply) and not hasattr(reply, "SerializeToString"):
            reply = reply(request, context)
        return _encode(reply)

    def _stream(self, path: str, request: bytes, context: grpc.ServicerContext) -> Iterable[bytes]:
        self._record(path, request, context)
        with self._lock:
            delay = self._delays.get(path, 0.0)
            error = self._errors.get(path)
            spec = self._streams.get(path)
        sent = 0
        cancelled = False
        try:
            if delay and not self._sleep(delay, context):
                cancelled = True
                return
            if error is not None:
                if error.trailing_metadata:
                    context.set_trailing_metadata(error.trailing_metadata)
                context.abort(error.code, error.details)
            if spec is None:
                spec = _Stream(self._default_stream(path), 0.0, False)
            messages = spec.messages(request, context) if callable(spec.messages) else spec.messages
            for i, m in enumerate(messages):
                if i and spec.interval and not self._sleep(spec.interval, context):
                    cancelled = True
                    return
                if not context.is_active():
                    cancelled = True
                    return
                yield _encode(m)
                sent += 1
            if spec.hold_open:
                while context.is_active():
                    time.sleep(0.02)
                cancelled = True
        finally:
            with self._lock:
                self.stream_outcomes.append(StreamOutcome(path, sent, cancelled or not context.is_active()))

    # ---------------------------------------------------------------- default answers
    def _next_id(self, kind: str) -> str:
        with self._lock:
            self._ids += 1
            n = self._ids
        return hex_id(f"{kind}-{n}-{os.getpid()}-{id(self)}")

    def _default_reply(self, path: str, request: bytes) -> Optional[bytes]:
        service, method = split_path(path)
        pb = _full_v1 or _subset
        if method == "Version" and service.endswith("RuntimeService"):
            api = "v1alpha2" if "v1alpha2" in service else "v1"
            return pb.VersionResponse(version="0.1.0", runtime_name=self.runtime_name,
                                      runtime_version=self.runtime_version,
                                      runtime_api_version=api).SerializeToString()
        if service not in (RUNTIME_V1, RUNTIME_V1ALPHA2, IMAGE_V1):
            return None
        if method == "Status":
            return self.status_reply()
        if method == "ListContainers":
            return self.list_containers_reply()
        if method == "ListPodSandbox":
            return self.list_pod_sandbox_reply()
        if method == "RunPodSandbox":
            return _subset.RunPodSandboxResponse(pod_sandbox_id=self._next_id("sandbox")).SerializeToString()
        if method == "CreateContainer":
            return _subset.CreateContainerResponse(container_id=self._next_id("container")).SerializeToString()
        if method in ("StopPodSandbox", "RemovePodSandbox", "StartContainer", "StopContainer",
                      "RemoveContainer", "UpdateContainerResources", "PodSandboxStatus",
                      "ContainerStatus", "ListImages", "ImageFsInfo", "UpdateRuntimeConfig"):
            return b""   # an empty reply message of the right type
        return None

    def sandbox_ids(self) -> List[str]:
        return [hex_id(f"fake-sandbox-{i}") for i in range(self.n_sandboxes)]

    def container_ids(self) -> List[str]:
        return [hex_id(f"fake-container-{i}") for i in range(self.n_containers)]

    def list_pod_sandbox_reply(self) -> bytes:
        pb = _full_v1 or _subset
        items = []
        for i, sid in enumerate(self.sandbox_ids()):
            items.append(pb.PodSandbox(
                id=sid, state=pb.SANDBOX_READY, created_at=1_700_000_000_000_000_000 + i,
                metadata=pb.PodSandboxMetadata(name=f"pod-{i}", uid=pod_uid(f"pod-{i}"),
                                               namespace="default", attempt=0),
                labels={"app": f"app-{i}"}, annotations={"fake": "true"}))
        return pb.ListPodSandboxResponse(items=items).SerializeToString()

    def list_containers_reply(self) -> bytes:
        pb = _full_v1 or _subset
        sandboxes = self.sandbox_ids() or [hex_id("fake-sandbox-orphan")]
        items = []
        for i, cid in enumerate(self.container_ids()):
            items.append(pb.Container(
                id=cid, pod_sandbox_id=sandboxes[i % len(sandboxes)],
                metadata=pb.ContainerMetadata(name=f"ctr-{i}", attempt=0),
                image=pb.ImageSpec(image="docker.io/library/busybox:latest"),
                image_ref="sha256:" + hex_id(f"image-{i}"), state=pb.CONTAINER_RUNNING,
                created_at=1_700_000_000_000_000_000 + i, labels={"ctr": str(i)},
                annotations={"io.kubernetes.container.name": f"ctr-{i}"}))
        return pb.ListContainersResponse(containers=items).SerializeToString()

    def status_reply(self) -> bytes:
        if _full_v1 is not None:
            return _full_v1.StatusResponse(status=_full_v1.RuntimeStatus(conditions=[
                _full_v1.RuntimeCondition(type="RuntimeReady", status=True),
                _full_v1.RuntimeCondition(type="NetworkReady", status=True),
            ])).SerializeToString()
        conds = b"".join(_field_bytes(1, _field_bytes(1, t.encode()) + _field_varint(2, 1))
                         for t in ("RuntimeReady", "NetworkReady"))
        return _field_bytes(1, conds)

    def container_event(self, i: int, container_id: Optional[str] = None) -> bytes:
        """A ``ContainerEventResponse`` (created event) numbered ``i`` (``created_at = 1000 + i``)."""
        cid = container_id or hex_id(f"fake-event-{i}")
        if _full_v1 is not None:
            return _full_v1.ContainerEventResponse(
                container_id=cid, container_event_type=_full_v1.CONTAINER_CREATED_EVENT,
                created_at=1000 + i).SerializeToString()
        return _field_bytes(1, cid.encode()) + _field_varint(2, 0) + _field_varint(3, 1000 + i)

    def _default_stream(self, path: str) -> List[bytes]:
        if split_path(path)[1] == "GetContainerEvents":
            return [self.container_event(i) for i in range(self.n_events)]
        return []


class _Handler(grpc.GenericRpcHandler):
    """Answers every method path: unary, or server-streaming for the known stream names."""

    def __init__(self, fake: FakeCri) -> None:
        self.fake = fake

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        path = details.method
        fake = self.fake
        if fake._is_stream(path):
            return grpc.unary_stream_rpc_method_handler(lambda req, ctx: fake._stream(path, req, ctx))
        return grpc.unary_unary_rpc_method_handler(lambda req, ctx: fake._unary(path, req, ctx))


__all__ = ["FakeCri", "Received", "StreamOutcome", "hex_id", "pod_uid", "runtime_path",
           "RUNTIME_V1", "RUNTIME_V1ALPHA2", "IMAGE_V1"]
