"""A small fake NRI runtime, for the plugin's unit tests and fault injection.

The real runtime is containerd 2.2.7 (NRI v0.11.0, ttrpc v1.2.7). This one listens on a
Unix socket, accepts one plugin connection, serves ``nri.pkg.api.v1alpha1.Runtime`` on mux
connection 2 (records RegisterPlugin and UpdateContainers; answers ``Empty`` and an empty
``UpdateContainersResponse`` unless told to fail or to stay silent) and calls the plugin's
services on connection 1 (:meth:`FakeNriRuntime.call_plugin`). :meth:`send_raw` writes any
bytes, for hostile-peer tests.

It also reads as containerd reads: :class:`GoReader` replays how ttrpc's 4 KiB
``bufio.Reader`` pulls NRI's mux frames, and a frame containerd would fail on (ENOMEM in
``conn.Read``, see :mod:`anolisnuma.nri.frames`) is recorded in ``violations`` and ends
the connection, as it would end containerd's.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
from typing import Dict, List, Optional, Tuple, Type

from google.protobuf.message import DecodeError, Message

from anolisnuma.nri import frames as fr
from anolisnuma.nri.session import PLUGIN_SERVICE, RUNTIME_SERVICE, NriRequestError, SessionClosed
from nri_proto import api_pb2, ttrpc_pb2

_LENGTH = struct.Struct(">I")


class GoReader:
    """containerd's reading of one logical connection: ``take(frame)`` is the violation
    this mux frame causes there, or None. A frame is pulled only when bufio's buffer is
    empty; it goes straight into the caller's slice when ttrpc still needs at least 4096
    bytes of a payload (and must then fit that slice), else into the 4 KiB buffer."""

    def __init__(self) -> None:
        self._header = bytearray()
        self._need = 0           # payload bytes still to read; 0: reading a header
        self._discard = False    # an oversized payload: bufio.Discard, through the buffer

    def take(self, frame: bytes) -> Optional[str]:
        n = len(frame)
        if self._need >= fr.GO_BUFIO_SIZE and not self._discard:
            if n > self._need:
                return f"frame of {n} bytes where {self._need} payload bytes were read"
        elif n > fr.GO_BUFIO_SIZE:
            return f"frame of {n} bytes read into ttrpc's {fr.GO_BUFIO_SIZE}-byte buffer"
        pos = 0
        while pos < n:
            if self._need:
                k = min(self._need, n - pos)
                self._need -= k
                pos += k
                continue
            k = min(fr.TTRPC_HEADER_SIZE - len(self._header), n - pos)
            self._header += frame[pos:pos + k]
            pos += k
            if len(self._header) == fr.TTRPC_HEADER_SIZE:
                self._need = _LENGTH.unpack_from(self._header)[0]
                self._discard = self._need > fr.MAX_MESSAGE
                self._header.clear()
        return None


class _Call:
    __slots__ = ("done", "data", "error")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.data = b""
        self.error: Optional[BaseException] = None


class FakeNriRuntime:
    """Listen at ``path``; :meth:`start` accepts one plugin in the background."""

    def __init__(self, path: str, *, go_reader: bool = True) -> None:
        self.path = path
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        os.chmod(path, 0o600)
        self.listener.listen(1)
        self.conn: Optional[socket.socket] = None
        self.connected = threading.Event()
        self.registered = threading.Event()
        self.peer_closed = threading.Event()   # the plugin ended the connection (EOF)
        self.closed = threading.Event()
        # Runtime-service calls as received: (method, parsed request or None if it did not parse).
        self.requests: List[Tuple[str, Optional[Message]]] = []
        self.update_error: Optional[Tuple[int, str]] = None   # UpdateContainers answer
        self.answer_calls = True                               # False: record, never answer
        self.reading = threading.Event()                       # clear: stop reading (a stuck peer)
        self.reading.set()
        self.violations: List[str] = []
        # Responses from the plugin to no call of call_plugin (e.g. to requests sent raw).
        self.unmatched: List[fr.TtrpcMessage] = []
        self.counters: Dict[str, int] = {"frames": 0, "responses": 0, "unknown_stream": 0}
        self._go = {fr.PLUGIN_SERVICE_CONN: GoReader(), fr.RUNTIME_SERVICE_CONN: GoReader()} if go_reader else None
        self._write_lock = threading.Lock()
        self._lock = threading.Lock()
        self._calls: Dict[int, _Call] = {}
        self._next_stream = 1
        self._thread: Optional[threading.Thread] = None

    def start(self) -> "FakeNriRuntime":
        self._thread = threading.Thread(target=self._run, name="fake_nri_runtime", daemon=True)
        self._thread.start()
        return self

    def wait_connected(self, timeout: float = 30.0) -> None:
        if not self.connected.wait(timeout):
            raise AssertionError("no plugin connected")

    def close(self) -> None:
        """Close the connection and the listener (the plugin sees the peer go away)."""
        self.closed.set()
        for s in (self.conn, self.listener):
            if s is not None:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        if self._thread is not None:
            self._thread.join(30)
        if self.conn is not None:
            self.conn.close()
        self.listener.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass

    # ---- writing -----------------------------------------------------------------------

    def stream_id(self) -> int:
        """The next client stream id, for a request sent raw (ids must increase)."""
        with self._lock:
            sid = self._next_stream
            self._next_stream += 2
        return sid

    def send_raw(self, data: bytes) -> None:
        with self._write_lock:
            self.conn.sendall(data)

    def call_plugin(self, method: str, request: Message, response_cls: Type[Message],
                    timeout: float = 30.0, service: str = PLUGIN_SERVICE) -> Message:
        """Call the plugin's ``method``; NriRequestError for an error status, SessionClosed
        when the connection ends first, TimeoutError after ``timeout`` seconds."""
        envelope = ttrpc_pb2.Request(service=service, method=method, payload=request.SerializeToString(),
                                     timeout_nano=int(timeout * 1e9))
        call = _Call()
        with self._write_lock:
            with self._lock:
                sid = self._next_stream
                self._next_stream += 2
                self._calls[sid] = call
            self.conn.sendall(fr.message_frames(fr.PLUGIN_SERVICE_CONN, sid, fr.REQUEST, 0,
                                                envelope.SerializeToString()))
        if not call.done.wait(timeout):
            with self._lock:
                self._calls.pop(sid, None)
            raise TimeoutError(f"{method}: no response within {timeout:g}s")
        if call.error is not None:
            raise call.error
        response = ttrpc_pb2.Response.FromString(call.data)
        if response.status.code:
            raise NriRequestError(response.status.code, response.status.message)
        return response_cls.FromString(response.payload)

    def answer(self, sid: int, payload: bytes = b"", code: int = 0, message: str = "") -> None:
        """Send a Response on stream ``sid`` of connection 2 (e.g. to a call left unanswered)."""
        response = ttrpc_pb2.Response(payload=payload)
        response.status.code = code
        response.status.message = message
        with self._write_lock:
            self.conn.sendall(fr.message_frames(fr.RUNTIME_SERVICE_CONN, sid, fr.RESPONSE, 0,
                                                response.SerializeToString()))

    # ---- reading -----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self.listener.settimeout(None)
            conn, _ = self.listener.accept()
        except OSError:
            return
        self.conn = conn
        self.connected.set()
        mux = fr.MuxDecoder()
        decoders = {fr.PLUGIN_SERVICE_CONN: fr.TtrpcDecoder(), fr.RUNTIME_SERVICE_CONN: fr.TtrpcDecoder()}
        try:
            while not self.closed.is_set():
                while not self.reading.wait(0.05):
                    if self.closed.is_set():
                        return
                data = conn.recv(256 * 1024)
                if not data:
                    self.peer_closed.set()
                    break
                for conn_id, payload in mux.feed(data):
                    self.counters["frames"] += 1
                    if self._go is not None:
                        bad = self._go[conn_id].take(payload)
                        if bad:
                            self.violations.append(f"connection {conn_id}: {bad}")
                            return
                    for item in decoders[conn_id].feed(payload):
                        if conn_id == fr.PLUGIN_SERVICE_CONN:
                            self._on_response(item)
                        else:
                            self._on_request(item)
        except ConnectionResetError:
            # the plugin closed with our requests unread in its socket (the kernel then resets
            # the connection): an end, not something containerd could not read
            self.peer_closed.set()
        except (OSError, fr.FrameError) as e:
            self.violations.append(f"{type(e).__name__}: {e}")
        finally:
            with self._lock:
                calls, self._calls = list(self._calls.values()), {}
            for call in calls:
                call.error = SessionClosed("fake runtime: connection ended")
                call.done.set()
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _on_response(self, item) -> None:
        if isinstance(item, fr.Oversized) or item.type != fr.RESPONSE:
            return
        with self._lock:
            call = self._calls.pop(item.stream_id, None)
        if call is None:
            self.counters["unknown_stream"] += 1
            self.unmatched.append(item)
            return
        self.counters["responses"] += 1
        call.data = item.payload
        call.done.set()

    def _on_request(self, item) -> None:
        if isinstance(item, fr.Oversized):
            self.answer(item.stream_id, code=8, message="message too large")
            return
        if item.type != fr.REQUEST:
            return
        types = {"RegisterPlugin": api_pb2.RegisterPluginRequest, "UpdateContainers": api_pb2.UpdateContainersRequest}
        try:
            envelope = ttrpc_pb2.Request.FromString(item.payload)
        except DecodeError:
            self.answer(item.stream_id, code=3, message="unmarshal request error")
            return
        if envelope.service != RUNTIME_SERVICE or envelope.method not in types:
            self.answer(item.stream_id, code=12, message=f"{envelope.service}/{envelope.method}")
            return
        try:
            request: Optional[Message] = types[envelope.method].FromString(envelope.payload)
        except DecodeError:
            request = None
        self.requests.append((envelope.method, request))
        if not self.answer_calls:
            return
        if request is None:
            self.answer(item.stream_id, code=3, message="unmarshal error")
            return
        if envelope.method == "RegisterPlugin":
            self.registered.set()
            self.answer(item.stream_id, api_pb2.Empty().SerializeToString())
        elif self.update_error is not None:
            self.answer(item.stream_id, code=self.update_error[0], message=self.update_error[1])
        else:
            self.answer(item.stream_id, api_pb2.UpdateContainersResponse().SerializeToString())


__all__ = ["FakeNriRuntime", "GoReader"]
