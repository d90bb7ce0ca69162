"""CRI helpers shared by every layer.

- :mod:`anolisnuma.cri.methods` — the table of the CRI surface the proxy knows: service
  names, the intercepted ``runtime.v1.RuntimeService`` methods with their ``cri_proto``
  request/reply classes, the server-streaming method names, and cheap path look-ups.
- :mod:`anolisnuma.cri.client` — :class:`~anolisnuma.cri.client.CriClient`, the daemon's
  own synchronous client for containerd (start-up resync, reconcilers).

The protobuf messages themselves are in the top-level ``cri_proto`` package (a subset of
CRI v1; undeclared fields survive decode/encode as unknown fields).

Nothing is imported here so that importing the package stays cheap; import the
submodules directly.
"""
