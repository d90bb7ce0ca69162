"""``UnaryChannel``: blocking gRPC unary calls over HTTP/2 on a unix socket, for the daemon's
own few calls to containerd (resync, re-pins, PIDs, the status probe).

Why not grpcio here: the daemon's RSS budget. grpcio's C core costs ~8.5 MB of resident
memory and threads of its own in a process that makes a call a minute; the relay already
speaks HTTP/2, and the protocol state machine (framing, HPACK, flow control) is the ``h2``
library's. What is ours is small: one call at a time per connection, a deadline per call,
the gRPC message framing and status.

A call that fails raises :class:`CallError` (``code()`` with a ``.name`` such as
``UNAVAILABLE``, ``DEADLINE_EXCEEDED``, ``NOT_FOUND``, ``RESOURCE_EXHAUSTED``;
``details()``). A connection that fails is dropped and made again by the next call.

A connection lives as long as the loop that owns it (the re-pinner's, for days), one
stream per call: its protocol state must not grow with the calls. h2 remembers how each
closed stream ended, to answer frames still in flight for it, up to 65,536 streams (about
8 MB); with one call at a time only the last few can still see such frames, so
:class:`_Connection` keeps :data:`CLOSED_STREAMS_KEPT`.
"""

from __future__ import annotations

import enum
import select
import socket
import threading
import time
from typing import List, Optional, Tuple
from urllib.parse import unquote

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings

from anolisnuma.cri import grpcwire

StatusCode = enum.IntEnum("StatusCode", [(name, code) for name, code in sorted(grpcwire.STATUS_CODES.items(),
                                                                               key=lambda kv: kv[1])])

# Large windows: a 16 MiB reply needs no round trip per 64 KiB (the defaults).
_WINDOW = 16 << 20
_READ = 256 << 10
# Closed streams whose end h2 remembers: frames containerd sent before it saw our reset
# (a reply over the size limit) arrive within the next call or two.
CLOSED_STREAMS_KEPT = 16


class _Connection(h2.connection.H2Connection):
    """h2's client connection with a short memory of closed streams (see the module
    docstring); h2 sizes that history by this class attribute."""

    MAX_CLOSED_STREAMS = CLOSED_STREAMS_KEPT


class CallError(Exception):
    """A failed call, like grpc.RpcError: ``code()`` and ``details()``."""

    def __init__(self, code: StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code = code
        self._details = details

    def code(self) -> StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class UnaryChannel:
    """``UnaryChannel(path, max_message_bytes)``; thread-safe (calls are serialized)."""

    def __init__(self, path: str, max_message_bytes: int) -> None:
        self.path = path
        self.max_message_bytes = max_message_bytes
        self._lock = threading.Lock()
        self._sock: Optional[socket.socket] = None
        self._conn: Optional[h2.connection.H2Connection] = None
        self._closed = False

    def call(self, path: str, request: bytes, timeout: float) -> bytes:
        """The reply message of the unary call ``path`` with the serialized ``request``."""
        if len(request) > self.max_message_bytes:
            raise CallError(StatusCode.RESOURCE_EXHAUSTED,
                            f"request of {len(request)} bytes over the limit of {self.max_message_bytes}")
        deadline = time.monotonic() + timeout
        with self._lock:
            if self._closed:
                raise CallError(StatusCode.CANCELLED, "channel closed")
            try:
                return self._call(path, request, timeout, deadline)
            except CallError:
                raise
            except socket.timeout:
                self._drop()
                raise CallError(StatusCode.DEADLINE_EXCEEDED, f"no reply within {timeout:g} s") from None
            except (OSError, h2.exceptions.ProtocolError) as e:
                self._drop()
                raise CallError(StatusCode.UNAVAILABLE, f"{self.path}: {e}") from None

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._drop()

    # ------------------------------------------------------------------ one call
    def _call(self, path: str, request: bytes, timeout: float, deadline: float) -> bytes:
        conn, sock = self._connected(deadline)
        sid = conn.get_next_available_stream_id()
        conn.send_headers(sid, [
            (":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "localhost"),
            ("content-type", "application/grpc"), ("te", "trailers"),
            ("grpc-timeout", f"{max(int(timeout * 1000), 1)}m"),
        ])
        events = self._send_body(conn, sock, sid, grpcwire.frame_message(request), deadline)
        body = bytearray()
        headers: List[Tuple[str, str]] = []
        while True:
            for event in events or self._receive(conn, sock, deadline):
                if isinstance(event, h2.events.ResponseReceived) and event.stream_id == sid:
                    headers += _text(event.headers)
                elif isinstance(event, h2.events.DataReceived) and event.stream_id == sid:
                    conn.acknowledge_received_data(event.flow_controlled_length, sid)
                    body += event.data
                    if len(body) > self.max_message_bytes + 5:
                        conn.reset_stream(sid)
                        sock.sendall(conn.data_to_send())
                        raise CallError(StatusCode.RESOURCE_EXHAUSTED,
                                        f"reply larger than {self.max_message_bytes} bytes")
                elif isinstance(event, h2.events.TrailersReceived) and event.stream_id == sid:
                    headers += _text(event.headers)
                elif isinstance(event, h2.events.StreamReset) and event.stream_id == sid:
                    raise CallError(StatusCode.UNAVAILABLE if event.error_code == 7 else StatusCode.INTERNAL,
                                    f"stream reset by containerd (HTTP/2 error {event.error_code})")
                elif isinstance(event, h2.events.ConnectionTerminated):
                    self._drop()
                    raise CallError(StatusCode.UNAVAILABLE, f"containerd ended the connection ({event.error_code})")
                elif isinstance(event, h2.events.StreamEnded) and event.stream_id == sid:
                    sock.sendall(conn.data_to_send())
                    return _reply(dict(headers), bytes(body))
            events = []
            sock.sendall(conn.data_to_send())

    def _connected(self, deadline: float) -> Tuple[h2.connection.H2Connection, socket.socket]:
        if self._conn is not None and self._sock is not None and self._still_open(self._conn, self._sock):
            return self._conn, self._sock
        self._drop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(_left(deadline))
            sock.connect(self.path)
            conn = _Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
            conn.local_settings = h2.settings.Settings(client=True, initial_values={
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: _WINDOW,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: 1 << 20,
                h2.settings.SettingCodes.ENABLE_PUSH: 0})
            conn.initiate_connection()
            conn.increment_flow_control_window(_WINDOW - 65535)
            sock.sendall(conn.data_to_send())
        except BaseException:
            sock.close()
            raise
        self._sock, self._conn = sock, conn
        return conn, sock

    def _still_open(self, conn: h2.connection.H2Connection, sock: socket.socket) -> bool:
        """Whether an idle connection is still usable: containerd may have restarted or
        sent GOAWAY since the last call (what it sent meanwhile is read now)."""
        try:
            while select.select([sock], [], [], 0)[0]:
                data = sock.recv(_READ)
                if not data:
                    return False
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.ConnectionTerminated):
                        return False
                sock.sendall(conn.data_to_send())
        except (OSError, h2.exceptions.ProtocolError):
            return False
        return True

    def _send_body(self, conn: h2.connection.H2Connection, sock: socket.socket, sid: int, data: bytes,
                   deadline: float) -> list:
        """Send ``data`` within containerd's windows; the events received meanwhile."""
        view = memoryview(data)
        events: list = []
        while True:
            room = min(conn.local_flow_control_window(sid), conn.max_outbound_frame_size, len(view))
            end = room == len(view)
            if room > 0 or end:
                conn.send_data(sid, bytes(view[:room]), end_stream=end)
                view = view[room:]
            sock.sendall(conn.data_to_send())
            if end:
                return events
            events += self._receive(conn, sock, deadline)   # containerd's window updates

    def _receive(self, conn: h2.connection.H2Connection, sock: socket.socket, deadline: float) -> list:
        sock.settimeout(_left(deadline))
        data = sock.recv(_READ)
        if not data:
            self._drop()
            raise CallError(StatusCode.UNAVAILABLE, "containerd closed the connection")
        return conn.receive_data(data)

    def _drop(self) -> None:
        sock, self._sock, self._conn = self._sock, None, None
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise socket.timeout()
    return left


def _text(headers: list) -> List[Tuple[str, str]]:
    return [(k.decode("latin-1") if isinstance(k, bytes) else k, v.decode("latin-1") if isinstance(v, bytes) else v)
            for k, v in headers]


def _reply(headers: dict, body: bytes) -> bytes:
    status = headers.get("grpc-status")
    if headers.get(":status", "200") != "200":
        raise CallError(StatusCode.UNAVAILABLE, f"HTTP status {headers.get(':status')}")
    if status is None:
        raise CallError(StatusCode.INTERNAL, "reply without grpc-status")
    try:
        code = StatusCode(int(status))
    except ValueError:
        code = StatusCode.UNKNOWN
    if code != StatusCode.OK:
        raise CallError(code, unquote(headers.get("grpc-message", "")))   # percent-encoded
    messages = grpcwire.split_messages(body)
    if messages is None or len(messages) != 1 or messages[0][0]:
        raise CallError(StatusCode.INTERNAL, "reply is not one uncompressed gRPC message")
    return messages[0][1]

