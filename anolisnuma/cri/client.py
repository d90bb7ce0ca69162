"""``CriClient``: the daemon's own synchronous CRI client for containerd.

Used by the resync and the background loops, from worker threads, never on the event loop
(thread-safe: one client can be shared, its calls run concurrently on one connection). It
calls ``runtime.v1.RuntimeService`` with the ``cri_proto`` messages through grpcio, by the
stub that grpcio-tools generates (``cri_proto/runtime_service_pb2_grpc.py``); fields that
``cri_proto`` does not declare are kept as unknown fields and are simply not visible here.

Every call may raise :class:`CallError` (a ``grpc.RpcError``: ``code()`` is a
``grpc.StatusCode``, ``details()``), for example ``UNAVAILABLE`` when containerd is down or
restarting, ``DEADLINE_EXCEEDED`` when the call takes longer than ``timeout_seconds``,
``NOT_FOUND`` for an unknown sandbox or container ID, and ``RESOURCE_EXHAUSTED`` when a
message exceeds ``max_message_bytes``. Calls fail fast (no wait-for-ready): the caller
decides whether to retry.

grpc's C core in this process: it runs threads of its own (a timer thread, an event-engine
pool, its lifeguard: ``workers.census`` lists them) from the first channel until the last
is closed, and it aborts the whole process when it cannot start them (a pids cgroup that is
full: ``pthread_create failed`` ... ``Failed to start lifeguard thread``, then SIGABRT). So
the first client also opens :data:`_CORE`, an idle channel that is never used nor closed:
the core's threads start with the daemon's first call (the start-up resync) and stay, and a
resync pass or a ``status`` probe that opens and closes a client later starts none. The
daemon never forks after that (it runs no subprocess), so grpc's fork support stays off.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import grpc
from google.protobuf.message import Message

from cri_proto import api_pb2
from cri_proto.runtime_service_pb2_grpc import RuntimeServiceStub

#: Default cap for messages in both directions: what the kubelet and containerd allow.
DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024

RUNTIME_SERVICE_PATH = "/runtime.v1.RuntimeService/"

StatusCode = grpc.StatusCode

_UNIX_PREFIX = "unix://"

# A channel that is down backs off before it connects again (1 s growing to 120 s by
# default), failing every call meanwhile although containerd may be back: a failed channel
# is replaced instead (see CriClient), and these bound the wait of one shared by threads.
_RECONNECT_MS = 1000


class CallError(grpc.RpcError):
    """A failed call: ``code()`` (a ``grpc.StatusCode``; ``code().name`` such as
    ``"UNAVAILABLE"``) and ``details()``."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def channel_options(max_message_bytes: int) -> List[Tuple[str, Any]]:
    """The options of every channel to containerd."""
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.enable_http_proxy", 0),   # a unix socket: no *_proxy variable applies
        # A connection of its own: another client's failure or backoff is not this one's.
        ("grpc.use_local_subchannel_pool", 1),
        ("grpc.initial_reconnect_backoff_ms", _RECONNECT_MS),
        ("grpc.max_reconnect_backoff_ms", _RECONNECT_MS),
        # No keepalive pings (the client default, said here): containerd's grpc-go server
        # ends a connection that pings more often than every 5 minutes (ENHANCE_YOUR_CALM).
        ("grpc.keepalive_time_ms", 2 ** 31 - 1),
    ]


_CORE: Optional[grpc.Channel] = None
_CORE_LOCK = threading.Lock()


def _keep_core_running(target: str) -> None:
    global _CORE
    with _CORE_LOCK:
        if _CORE is None:
            _CORE = grpc.insecure_channel(target, options=[("grpc.enable_http_proxy", 0)])


def _parse_info(info: Mapping[str, str]) -> Dict[str, Any]:
    """The JSON object in ``info["info"]`` of a verbose status reply, or ``{}``.

    containerd puts a JSON document there when ``verbose`` is set. A missing key, text
    that is not JSON, or JSON that is not an object all give ``{}``.
    """
    raw = info.get("info")
    if not raw:
        return {}
    try:
        parsed = json.loads(raw)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


class _Link:
    """One channel and its stub, with the calls in flight on it."""

    __slots__ = ("channel", "stub", "users", "retired")

    def __init__(self, channel: grpc.Channel) -> None:
        self.channel = channel
        self.stub = RuntimeServiceStub(channel)
        self.users = 0
        self.retired = False


class CriClient:
    """Synchronous client for ``runtime.v1.RuntimeService`` on a unix socket.

    ``endpoint`` is the socket path (a ``unix://`` prefix is accepted and stripped).
    ``max_message_bytes`` caps sent and received messages (default 16 MiB, not gRPC's
    4 MiB). ``timeout_seconds`` is the deadline of each call.

    Constructing the client does not connect; the channel connects on first use. A call
    that fails ``UNAVAILABLE`` retires its channel (closed once no call uses it) and the
    next call opens a new one, which connects at once: containerd restarted, the client
    follows without waiting out grpc's reconnect backoff.
    """

    def __init__(
        self,
        endpoint: str,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        timeout_seconds: float = 10.0,
    ) -> None:
        if endpoint.startswith(_UNIX_PREFIX):
            endpoint = endpoint[len(_UNIX_PREFIX):]
        if not endpoint:
            raise ValueError("CRI endpoint must be a unix socket path")
        if max_message_bytes <= 0:
            raise ValueError("max_message_bytes must be positive")
        if timeout_seconds <= 0:
            raise ValueError("timeout_seconds must be positive")
        self.endpoint = endpoint
        self.max_message_bytes = max_message_bytes
        self.timeout_seconds = timeout_seconds
        # "unix:" + a path, absolute or relative ("unix://" would take the path's first
        # part as an authority).
        self._target = "unix:" + endpoint
        self._options = channel_options(max_message_bytes)
        self._lock = threading.Lock()
        self._link: Optional[_Link] = None
        self._closed = False
        _keep_core_running(self._target)

    # -- plumbing --------------------------------------------------------------------

    def _acquire(self) -> _Link:
        with self._lock:
            if self._closed:
                raise CallError(StatusCode.CANCELLED, "client closed")
            link = self._link
            if link is None:
                link = self._link = _Link(grpc.insecure_channel(self._target, options=self._options))
            link.users += 1
            return link

    def _release(self, link: _Link, unavailable: bool) -> None:
        with self._lock:
            link.users -= 1
            if unavailable and self._link is link:
                self._link = None
                link.retired = True
            done = link.retired and link.users == 0
        if done:
            link.channel.close()

    def _call(self, method: str, request: Message) -> Any:
        link = self._acquire()
        unavailable = False
        try:
            fn: Callable[..., Any] = getattr(link.stub, method)
            return fn(request, timeout=self.timeout_seconds)
        except grpc.RpcError as e:
            code = e.code() if callable(getattr(e, "code", None)) else StatusCode.UNKNOWN
            details = (e.details() if callable(getattr(e, "details", None)) else "") or ""
            unavailable = code == StatusCode.UNAVAILABLE
            if unavailable:
                details = f"containerd at {self.endpoint}: {details}"
            elif code == StatusCode.INTERNAL and "deserializ" in details:
                details = f"cannot read the {method} reply: {details}"
            raise CallError(code, details) from None
        except ValueError as e:   # "Cannot invoke RPC on closed channel!": close() raced us
            if not self._closed:
                raise
            raise CallError(StatusCode.CANCELLED, f"client closed: {e}") from None
        finally:
            self._release(link, unavailable)

    def close(self) -> None:
        """Close the channel; calls in flight are cancelled. Safe to call twice."""
        with self._lock:
            self._closed = True
            link, self._link = self._link, None
        if link is not None:
            link.channel.close()

    def __enter__(self) -> "CriClient":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- calls -----------------------------------------------------------------------

    def version(self, api_version: str = "v1") -> api_pb2.VersionResponse:
        """``Version``: runtime name, version and CRI API version.

        Raises CallError.
        """
        return self._call("Version", api_pb2.VersionRequest(version=api_version))

    def list_pod_sandboxes(
        self, filter: Optional[api_pb2.PodSandboxFilter] = None
    ) -> List[api_pb2.PodSandbox]:
        """``ListPodSandbox``: all sandboxes (ready and not ready) unless filtered.

        Raises CallError.
        """
        request = api_pb2.ListPodSandboxRequest()
        if filter is not None:
            request.filter.CopyFrom(filter)
        return list(self._call("ListPodSandbox", request).items)

    def pod_sandbox_status(
        self, sandbox_id: str, verbose: bool = True
    ) -> Tuple[api_pb2.PodSandboxStatus, Dict[str, Any]]:
        """``PodSandboxStatus``: the status and the parsed verbose info.

        The info dict is the JSON object containerd returns in ``info["info"]`` when
        ``verbose`` is set (e.g. ``pid``, ``config``, ``runtimeSpec``), or ``{}`` when it
        is absent or not a JSON object. Raises CallError (``NOT_FOUND`` for an
        unknown ID).
        """
        reply = self._call(
            "PodSandboxStatus", api_pb2.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id, verbose=verbose)
        )
        return reply.status, _parse_info(reply.info)

    def list_containers(
        self, filter: Optional[api_pb2.ContainerFilter] = None
    ) -> List[api_pb2.Container]:
        """``ListContainers``: all containers in every state unless filtered.

        Raises CallError.
        """
        request = api_pb2.ListContainersRequest()
        if filter is not None:
            request.filter.CopyFrom(filter)
        return list(self._call("ListContainers", request).containers)

    def container_status(
        self, container_id: str, verbose: bool = True
    ) -> Tuple[api_pb2.ContainerStatus, Dict[str, Any]]:
        """``ContainerStatus``: the status and the parsed verbose info.

        The info dict is the JSON object in ``info["info"]`` (e.g. ``pid``,
        ``sandboxID``, ``runtimeSpec``), or ``{}``. Raises CallError (``NOT_FOUND``
        for an unknown ID).
        """
        reply = self._call(
            "ContainerStatus", api_pb2.ContainerStatusRequest(container_id=container_id, verbose=verbose)
        )
        return reply.status, _parse_info(reply.info)

    def update_container_resources(
        self,
        container_id: str,
        resources: api_pb2.LinuxContainerResources,
        annotations: Optional[Mapping[str, str]] = None,
    ) -> None:
        """``UpdateContainerResources`` with Linux resources (and optional annotations).

        Note that containerd applies the whole ``LinuxContainerResources``: fields left
        at zero / empty are generally "unchanged", but pass the complete intended set
        (e.g. from the container's current status) when in doubt. Raises CallError
        (``NOT_FOUND`` for an unknown ID, ``UNKNOWN`` / ``INTERNAL`` when the runtime
        cannot apply the values).
        """
        request = api_pb2.UpdateContainerResourcesRequest(container_id=container_id)
        request.linux.CopyFrom(resources)
        if annotations:
            request.annotations.update(annotations)
        self._call("UpdateContainerResources", request)


__all__ = ["CallError", "CriClient", "DEFAULT_MAX_MESSAGE_BYTES", "RUNTIME_SERVICE_PATH", "StatusCode",
           "channel_options"]
