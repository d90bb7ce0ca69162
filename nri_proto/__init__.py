"""containerd NRI (Node Resource Interface) messages and the ttrpc envelope, as protobuf.

``api.proto`` is NRI's ``pkg/api/api.proto`` at tag v0.11.0, verbatim (package
``nri.pkg.api.v1alpha1``: ``PodSandbox``, ``Container``, ``ConfigureRequest``, ...).
``ttrpc.proto`` declares ttrpc v1.2.7's ``Request``/``Response``/``KeyValue`` and a
wire-compatible ``google.rpc.Status`` in the package ``anolisnuma.nri.ttrpc``.
``api_pb2`` and ``ttrpc_pb2`` (.py/.pyi) are generated; do not edit them. Sources,
commits and how to regenerate (``scripts/gen-proto.sh``): ``nri_proto/README.md``.
"""
