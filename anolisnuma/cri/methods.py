"""The CRI surface the proxy knows about, in one table.

The proxy forwards every gRPC call as raw bytes. It only needs to know:

* which calls it intercepts (decodes, lets hooks edit, re-encodes): the sandbox and
  container lifecycle methods of ``runtime.v1.RuntimeService`` listed in
  :data:`INTERCEPTED`, with the ``cri_proto`` message classes of their request and reply;
* which calls are server-streaming and must be relayed as streams
  (:data:`SERVER_STREAMING_METHODS`);
* the CRI service names (:data:`SERVICES`), for logging and diagnostics.

Everything here is built once at import time; the per-call look-ups
(:func:`intercepted`, :func:`method_spec`, :func:`is_server_streaming`) are single dict or
set look-ups on the full method path.
"""

from typing import Dict, FrozenSet, NamedTuple, Optional, Tuple, Type

from google.protobuf.message import Message

from cri_proto import api_pb2

RUNTIME_SERVICE = "runtime.v1.RuntimeService"
IMAGE_SERVICE = "runtime.v1.ImageService"
RUNTIME_SERVICE_V1ALPHA2 = "runtime.v1alpha2.RuntimeService"
IMAGE_SERVICE_V1ALPHA2 = "runtime.v1alpha2.ImageService"

#: Every CRI service name the proxy may see. Other services are forwarded too.
SERVICES: FrozenSet[str] = frozenset(
    {RUNTIME_SERVICE, IMAGE_SERVICE, RUNTIME_SERVICE_V1ALPHA2, IMAGE_SERVICE_V1ALPHA2}
)


class MethodSpec(NamedTuple):
    """One intercepted unary method of ``runtime.v1.RuntimeService``."""

    name: str
    path: str
    request: Type[Message]
    reply: Type[Message]


def _path(service: str, method: str) -> str:
    return "/" + service + "/" + method


_INTERCEPTED_CLASSES: Tuple[Tuple[str, Type[Message], Type[Message]], ...] = (
    ("RunPodSandbox", api_pb2.RunPodSandboxRequest, api_pb2.RunPodSandboxResponse),
    ("StopPodSandbox", api_pb2.StopPodSandboxRequest, api_pb2.StopPodSandboxResponse),
    ("RemovePodSandbox", api_pb2.RemovePodSandboxRequest, api_pb2.RemovePodSandboxResponse),
    ("CreateContainer", api_pb2.CreateContainerRequest, api_pb2.CreateContainerResponse),
    ("StartContainer", api_pb2.StartContainerRequest, api_pb2.StartContainerResponse),
    ("StopContainer", api_pb2.StopContainerRequest, api_pb2.StopContainerResponse),
    ("RemoveContainer", api_pb2.RemoveContainerRequest, api_pb2.RemoveContainerResponse),
    (
        "UpdateContainerResources",
        api_pb2.UpdateContainerResourcesRequest,
        api_pb2.UpdateContainerResourcesResponse,
    ),
)

#: Intercepted methods by method name (all of service ``runtime.v1.RuntimeService``).
INTERCEPTED: Dict[str, MethodSpec] = {
    name: MethodSpec(name, _path(RUNTIME_SERVICE, name), request, reply)
    for name, request, reply in _INTERCEPTED_CLASSES
}

#: The same specs keyed by full gRPC method path, e.g. ``/runtime.v1.RuntimeService/CreateContainer``.
INTERCEPTED_PATHS: Dict[str, MethodSpec] = {spec.path: spec for spec in INTERCEPTED.values()}

#: Server-streaming CRI methods (in any CRI service version): relay them as streams.
#: ``GetContainerEvents`` (since Kubernetes 1.25) and the ``Stream*`` list methods
#: added in Kubernetes 1.36; ``StreamImages`` belongs to the ImageService.
SERVER_STREAMING_METHODS: FrozenSet[str] = frozenset(
    {
        "GetContainerEvents",
        "StreamPodSandboxes",
        "StreamContainers",
        "StreamContainerStats",
        "StreamPodSandboxStats",
        "StreamPodSandboxMetrics",
        "StreamImages",
    }
)


def split_path(path: str) -> Tuple[str, str]:
    """Split ``"/runtime.v1.RuntimeService/Version"`` into ``(service, method)``.

    Returns ``("", "")`` for a malformed path (no leading slash, not exactly two
    non-empty components).
    """
    if not path.startswith("/"):
        return ("", "")
    service, sep, method = path[1:].partition("/")
    if not sep or not service or not method or "/" in method:
        return ("", "")
    return (service, method)


def intercepted(path: str) -> Optional[str]:
    """The method name if ``path`` is an intercepted ``runtime.v1`` method, else None."""
    spec = INTERCEPTED_PATHS.get(path)
    return spec.name if spec is not None else None


def method_spec(path: str) -> Optional[MethodSpec]:
    """The :class:`MethodSpec` of an intercepted method path, else None."""
    return INTERCEPTED_PATHS.get(path)


def is_server_streaming(path: str) -> bool:
    """True if ``path`` names a known server-streaming CRI method (any service version)."""
    return split_path(path)[1] in SERVER_STREAMING_METHODS


__all__ = [
    "IMAGE_SERVICE",
    "IMAGE_SERVICE_V1ALPHA2",
    "INTERCEPTED",
    "INTERCEPTED_PATHS",
    "MethodSpec",
    "RUNTIME_SERVICE",
    "RUNTIME_SERVICE_V1ALPHA2",
    "SERVER_STREAMING_METHODS",
    "SERVICES",
    "intercepted",
    "is_server_streaming",
    "method_spec",
    "split_path",
]
