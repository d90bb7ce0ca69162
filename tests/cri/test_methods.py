"""The CRI method table and path helpers."""

import pytest

from anolisnuma.cri import methods
from cri_proto import api_pb2

INTERCEPTED_NAMES = {
    "RunPodSandbox",
    "StopPodSandbox",
    "RemovePodSandbox",
    "CreateContainer",
    "StartContainer",
    "StopContainer",
    "RemoveContainer",
    "UpdateContainerResources",
}


@pytest.mark.parametrize(
    "path, expected",
    [
        ("/runtime.v1.RuntimeService/Version", ("runtime.v1.RuntimeService", "Version")),
        ("/runtime.v1.ImageService/PullImage", ("runtime.v1.ImageService", "PullImage")),
        ("/runtime.v1alpha2.RuntimeService/Status", ("runtime.v1alpha2.RuntimeService", "Status")),
        ("/grpc.health.v1.Health/Check", ("grpc.health.v1.Health", "Check")),
        ("", ("", "")),
        ("/", ("", "")),
        ("//", ("", "")),
        ("runtime.v1.RuntimeService/Version", ("", "")),
        ("/runtime.v1.RuntimeService", ("", "")),
        ("/runtime.v1.RuntimeService/", ("", "")),
        ("//Version", ("", "")),
        ("/runtime.v1.RuntimeService/Version/extra", ("", "")),
    ],
)
def test_split_path(path, expected):
    assert methods.split_path(path) == expected


def test_intercepted_table_is_exactly_the_lifecycle_methods():
    assert set(methods.INTERCEPTED) == INTERCEPTED_NAMES
    assert set(methods.INTERCEPTED_PATHS) == {
        "/runtime.v1.RuntimeService/" + name for name in INTERCEPTED_NAMES
    }
    for name, spec in methods.INTERCEPTED.items():
        assert spec.name == name
        assert methods.INTERCEPTED_PATHS[spec.path] is spec
        assert spec.request is getattr(api_pb2, name + "Request")
        assert spec.reply is getattr(api_pb2, name + "Response")
        # The classes are the cri_proto ones, i.e. decodable/encodable.
        assert spec.request.FromString(spec.request().SerializeToString()) == spec.request()


@pytest.mark.parametrize("name", sorted(INTERCEPTED_NAMES))
def test_intercepted_only_for_runtime_v1(name):
    assert methods.intercepted("/runtime.v1.RuntimeService/" + name) == name
    assert methods.method_spec("/runtime.v1.RuntimeService/" + name).name == name
    for other in ("runtime.v1alpha2.RuntimeService", "runtime.v1.ImageService", "x.RuntimeService"):
        assert methods.intercepted("/%s/%s" % (other, name)) is None
        assert methods.method_spec("/%s/%s" % (other, name)) is None


@pytest.mark.parametrize(
    "path",
    [
        "/runtime.v1.RuntimeService/Version",
        "/runtime.v1.RuntimeService/ListContainers",
        "/runtime.v1.RuntimeService/createcontainer",
        "/runtime.v1.RuntimeService/CreateContainer/",
        "runtime.v1.RuntimeService/CreateContainer",
        "/runtime.v1.ImageService/PullImage",
        "",
        "garbage",
    ],
)
def test_not_intercepted(path):
    assert methods.intercepted(path) is None


def test_services():
    assert methods.SERVICES == {
        "runtime.v1.RuntimeService",
        "runtime.v1.ImageService",
        "runtime.v1alpha2.RuntimeService",
        "runtime.v1alpha2.ImageService",
    }
    assert methods.RUNTIME_SERVICE == "runtime.v1.RuntimeService"
    assert methods.IMAGE_SERVICE == "runtime.v1.ImageService"


def test_server_streaming():
    assert methods.SERVER_STREAMING_METHODS == {
        "GetContainerEvents",
        "StreamPodSandboxes",
        "StreamContainers",
        "StreamContainerStats",
        "StreamPodSandboxStats",
        "StreamPodSandboxMetrics",
        "StreamImages",
    }
    assert methods.is_server_streaming("/runtime.v1.RuntimeService/GetContainerEvents")
    assert methods.is_server_streaming("/runtime.v1.ImageService/StreamImages")
    assert methods.is_server_streaming("/runtime.v1.RuntimeService/StreamContainers")
    assert not methods.is_server_streaming("/runtime.v1.RuntimeService/ListContainers")
    assert not methods.is_server_streaming("/runtime.v1.RuntimeService/CreateContainer")
    assert not methods.is_server_streaming("GetContainerEvents")
    assert not methods.is_server_streaming("")
    assert not set(methods.INTERCEPTED) & methods.SERVER_STREAMING_METHODS


def test_streaming_names_agree_with_cri_api():
    """Whatever the full CRI stubs know to be server-streaming is in our table."""
    full = pytest.importorskip("cri_api.v1.api_pb2")
    for service in full.DESCRIPTOR.services_by_name.values():
        assert service.full_name in methods.SERVICES
        for method in service.methods:
            assert not method.client_streaming
            assert method.server_streaming == (method.name in methods.SERVER_STREAMING_METHODS)
            if method.name in methods.INTERCEPTED:
                assert service.full_name == methods.RUNTIME_SERVICE
                spec = methods.INTERCEPTED[method.name]
                assert method.input_type.name == spec.request.DESCRIPTOR.name
                assert method.output_type.name == spec.reply.DESCRIPTOR.name
