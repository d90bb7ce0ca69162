"""The generated gRPC stub (cri_proto/runtime_service_pb2_grpc.py): its service matches CRI
v1's RuntimeService method for method, it is what the source says (no hand edit, the
version the floor allows), and it leaves runtime.v1 out of the descriptor pool."""

from __future__ import annotations

import os
import re
import sys

import pytest
from google.protobuf import descriptor_pool

from cri_proto import api_pb2, runtime_service_pb2_grpc

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROTO = os.path.join(REPO, "cri_proto", "runtime_service.proto")
RPC = re.compile(r"rpc\s+(\w+)\s*\(\s*anolisnuma\.cri\.v1\.(\w+)\s*\)\s*returns\s*\(\s*anolisnuma\.cri\.v1\.(\w+)\s*\)")


def _rpcs():
    with open(PROTO) as f:
        return RPC.findall(f.read())


def test_the_proto_declares_the_daemons_calls():
    names = {name for name, _, _ in _rpcs()}
    assert {"Version", "ListPodSandbox", "PodSandboxStatus", "ListContainers", "ContainerStatus",
            "UpdateContainerResources"} <= names
    for name, request, reply in _rpcs():
        assert hasattr(api_pb2, request) and hasattr(api_pb2, reply), name


@pytest.mark.skipif(sys.version_info < (3, 10), reason="the full CRI stubs need Python >= 3.10")
def test_each_method_has_cri_v1s_request_and_reply():
    from cri_api.v1 import api_pb2 as full

    service = full.DESCRIPTOR.services_by_name["RuntimeService"]
    for name, request, reply in _rpcs():
        method = service.methods_by_name[name]
        assert (method.input_type.name, method.output_type.name) == (request, reply), name
        assert not method.server_streaming and not method.client_streaming, name


def test_the_stub_calls_runtime_v1_paths_with_the_subsets_messages():
    with open(runtime_service_pb2_grpc.__file__) as f:
        text = f.read()
    assert "from cri_proto import api_pb2 as" in text          # not a top-level api_pb2
    assert "DO NOT EDIT" in text
    paths = re.findall(r"'(/runtime\.v1\.RuntimeService/\w+)'", text)
    assert sorted(set(paths)) == sorted(f"/runtime.v1.RuntimeService/{name}" for name, _, _ in _rpcs())


def test_the_stub_needs_no_grpcio_newer_than_the_floor():
    with open(os.path.join(REPO, "pyproject.toml")) as f:
        floor = re.search(r'"grpcio>=([\d.]+)"', f.read()).group(1)
    assert runtime_service_pb2_grpc.GRPC_GENERATED_VERSION == floor


def test_runtime_v1_stays_out_of_the_descriptor_pool():
    """Only the full CRI stubs may register runtime.v1 (the tests load them beside ours)."""
    import anolisnuma.cri.client  # noqa: F401  (the stub is imported)

    pool = descriptor_pool.Default()
    try:
        found = pool.FindServiceByName("runtime.v1.RuntimeService")
    except KeyError:
        return
    assert found.file.name == "v1/api.proto"   # cri_api's, loaded by another test
