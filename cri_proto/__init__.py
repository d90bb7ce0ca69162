"""anolisnuma's subset of the Kubernetes CRI v1 API, as protobuf messages.

``api.proto`` declares only the messages and fields that anolisnuma reads or writes,
with the published CRI v1 (``runtime.v1``) field numbers and types, in the proto package
``anolisnuma.cri.v1``. Fields it does not declare are kept by protobuf as unknown fields
and re-emitted on serialization, so a request can be decoded, edited and re-encoded
without losing anything. ``api_pb2.py`` / ``api_pb2.pyi`` are generated; do not edit
them. Regenerate from the repository root with::

    scripts/gen-proto.sh

which runs (with a pinned grpcio-tools, see the script)::

    python -m grpc_tools.protoc -I cri_proto --python_out=cri_proto \\
        --pyi_out=cri_proto cri_proto/api.proto
"""
