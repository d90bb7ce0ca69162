"""The HTTP/2 splice: one kubelet connection relayed frame by frame to one containerd connection.

Why a splice and not a gRPC server plus a gRPC client: a Python gRPC server and client pair
adds ~450 µs to every call and imposes its own message limits, deadlines and method
tables. Here the two HTTP/2 connections are joined end to end, so SETTINGS, PING,
deadlines (``grpc-timeout``), metadata, status codes, unknown methods, streams and message
sizes all pass as the peers sent them. The relay:

- decodes every header block (HPACK state must be followed in both directions) to learn
  which method each new stream calls and, for intercepted calls, the reply's status;
- holds the request of an intercepted call whose pre-hooks need it until the pipeline
  decided, then sends the original or the edited body, or answers the call itself with a
  status (trailers-only, coded without touching the peer's HPACK table); an intercepted
  call no pre-hook needs streams through and is copied for the record;
- copies the reply of intercepted calls for the post-hooks while passing it on.

Flow control. What the relay holds it has received on the kubelet's behalf: it credits the
kubelet at once and charges the bytes to a memory budget; bytes it sends itself are
metered within containerd's windows (:mod:`.flow` says how).

No bypass. A connection whose frames or header blocks the relay cannot follow (a bad
frame size, an undecodable or oversized header block, a flow-control overrun, a client
that does not speak HTTP/2) is ended with GOAWAY, never relayed unread: the kubelet
reconnects at once, and every call on the new connection is read again.

When containerd cannot be reached the kubelet's connection is closed at once, which the
kubelet's gRPC client reports as UNAVAILABLE, exactly as if containerd's own socket were
gone; when containerd's connection drops, the kubelet's is closed with it and the kubelet
reconnects (to us, and we to the restarted containerd).

The splice is one class, :class:`~anolisnuma.transport.splice.connection.Splice`, whose
parts live in the modules of this package, one concern each (:mod:`.connection` lists them).
"""

from __future__ import annotations

from anolisnuma.transport.splice.connection import Splice, SpliceOwner

__all__ = ["Splice", "SpliceOwner"]
