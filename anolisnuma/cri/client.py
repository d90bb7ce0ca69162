"""``CriClient``: the daemon's own synchronous CRI client for containerd.

Used by the resync and the background loops, from worker threads (thread-safe: calls on
one client are serialized; one client can be shared). It speaks
``runtime.v1.RuntimeService`` with the ``cri_proto`` messages over
:class:`~anolisnuma.cri.unary.UnaryChannel` (HTTP/2 by the ``h2`` library, not grpcio: see
there why); fields that ``cri_proto`` does not declare are kept as unknown fields and are
simply not visible here.

Every call may raise :class:`~anolisnuma.cri.unary.CallError` (``code()`` / ``details()``,
``code().name`` as in gRPC), for example ``UNAVAILABLE`` when containerd is down or
restarting, ``DEADLINE_EXCEEDED`` when the call takes longer than ``timeout_seconds``,
``NOT_FOUND`` for an unknown sandbox or container ID, and ``RESOURCE_EXHAUSTED`` when a
reply exceeds ``max_message_bytes``. Calls fail fast (no wait-for-ready): the caller
decides whether to retry.
"""

import json
from typing import Any, Dict, List, Mapping, Optional, Tuple, Type

from google.protobuf.message import DecodeError, Message

from anolisnuma.cri.unary import CallError, StatusCode, UnaryChannel
from cri_proto import api_pb2

#: Default cap for messages in both directions: what the kubelet and containerd allow.
DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024

RUNTIME_SERVICE_PATH = "/runtime.v1.RuntimeService/"

_UNIX_PREFIX = "unix://"


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


class CriClient:
    """Synchronous client for ``runtime.v1.RuntimeService`` on a unix socket.

    ``endpoint`` is the socket path (a ``unix://`` prefix is accepted and stripped).
    ``max_message_bytes`` caps sent and received messages (default 16 MiB, not gRPC's
    4 MiB). ``timeout_seconds`` is the deadline of each call.

    Constructing the client does not connect; the channel connects on first use and
    again after a connection failed (containerd restarted).
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
        self._channel = UnaryChannel(endpoint, max_message_bytes)

    # -- plumbing --------------------------------------------------------------------

    def _call(self, method: str, request: Message, reply_class: Type[Message]) -> Any:
        data = self._channel.call(RUNTIME_SERVICE_PATH + method, request.SerializeToString(), self.timeout_seconds)
        try:
            return reply_class.FromString(data)
        except DecodeError as e:
            raise CallError(StatusCode.INTERNAL, f"cannot read the {method} reply: {e}") from None

    def close(self) -> None:
        """Close the channel; calls in flight are cancelled. Safe to call twice."""
        self._channel.close()

    def __enter__(self) -> "CriClient":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- calls -----------------------------------------------------------------------

    def version(self, api_version: str = "v1") -> api_pb2.VersionResponse:
        """``Version``: runtime name, version and CRI API version.

        Raises CallError.
        """
        return self._call(
            "Version", api_pb2.VersionRequest(version=api_version), api_pb2.VersionResponse
        )

    def list_pod_sandboxes(
        self, filter: Optional[api_pb2.PodSandboxFilter] = None
    ) -> List[api_pb2.PodSandbox]:
        """``ListPodSandbox``: all sandboxes (ready and not ready) unless filtered.

        Raises CallError.
        """
        request = api_pb2.ListPodSandboxRequest()
        if filter is not None:
            request.filter.CopyFrom(filter)
        reply = self._call("ListPodSandbox", request, api_pb2.ListPodSandboxResponse)
        return list(reply.items)

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
            "PodSandboxStatus",
            api_pb2.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id, verbose=verbose),
            api_pb2.PodSandboxStatusResponse,
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
        reply = self._call("ListContainers", request, api_pb2.ListContainersResponse)
        return list(reply.containers)

    def container_status(
        self, container_id: str, verbose: bool = True
    ) -> Tuple[api_pb2.ContainerStatus, Dict[str, Any]]:
        """``ContainerStatus``: the status and the parsed verbose info.

        The info dict is the JSON object in ``info["info"]`` (e.g. ``pid``,
        ``sandboxID``, ``runtimeSpec``), or ``{}``. Raises CallError (``NOT_FOUND``
        for an unknown ID).
        """
        reply = self._call(
            "ContainerStatus",
            api_pb2.ContainerStatusRequest(container_id=container_id, verbose=verbose),
            api_pb2.ContainerStatusResponse,
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
        self._call(
            "UpdateContainerResources", request, api_pb2.UpdateContainerResourcesResponse
        )


__all__ = ["CriClient", "DEFAULT_MAX_MESSAGE_BYTES", "RUNTIME_SERVICE_PATH"]
