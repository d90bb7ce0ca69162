"""The plugin's side of one NRI connection: blocking socket, a reader thread, a worker pool.

**The protocol** (containerd/nri v0.11.0 ``pkg/stub/stub.go``, ``pkg/adaptation/plugin.go``;
containerd v2.2.7 vendors it, with ttrpc v1.2.7). The plugin connects to the runtime's
socket (``/var/run/nri/nri.sock``) and multiplexes it (:mod:`anolisnuma.nri.frames`): on
connection 1 it serves ttrpc service ``nri.pkg.api.v1alpha1.Plugin``, on connection 2 it
calls ``nri.pkg.api.v1alpha1.Runtime``. Then:

1. the plugin calls ``Runtime.RegisterPlugin`` (plugin name and a two-digit index), answered
   with ``Empty``; the runtime holds its reading of the socket until it is ready for this
   call and gives up on a plugin that has not registered within its registration timeout
   (5 s by default);
2. the runtime calls ``Plugin.Configure`` (config, runtime name and version, its timeouts);
   the reply's ``events`` is the subscription, a bit mask with bit ``event - 1`` set per
   ``Event`` value. The runtime signals the registration before returning its reply, so
   Configure can arrive before the reply to RegisterPlugin: the plugin must serve while it
   waits for that reply (this session does: the reader thread never waits on a call);
3. the runtime calls ``Plugin.Synchronize`` with the existing pods and containers, split
   over several calls with ``more`` set when they do not fit in one 4 MiB message (the
   reply to a partial one must echo ``more`` and carry no updates, or the runtime drops
   the plugin);
4. then events, each within the runtime's request timeout (2 s by default; a timeout, like
   a broken connection, makes it drop the plugin). ``CreateContainer``,
   ``UpdateContainer``, ``StopContainer``, ``UpdatePodSandbox`` and
   ``ValidateContainerAdjustment`` are methods of their own; every other event
   (RunPodSandbox, StopPodSandbox, RemovePodSandbox, PostUpdatePodSandbox,
   PostCreateContainer, StartContainer, PostStartContainer, PostUpdateContainer,
   RemoveContainer) arrives as ``StateChange`` with its ``Event`` value, answered with
   ``Empty``. ``Shutdown`` tells the plugin the runtime is going down.

Unsolicited changes go the other way, ``Runtime.UpdateContainers``, at any time after
registration. All calls are unary: a request has flags 0, odd stream ids that increase;
the answer is a ttrpc ``Response`` on the same stream id.

**Who writes this input.** The socket is root-only and created by containerd; the peer is
containerd itself. A bug there, or an impostor at that path, must not crash or bloat the
daemon: a broken mux layer (unknown connection id, frame above NRI's bound) closes the
session; ttrpc-level faults are answered per stream, as ttrpc does (an oversized message:
RESOURCE_EXHAUSTED; an unparseable Request, an even or reused stream id:
INVALID_ARGUMENT; another service, or a method not in :data:`PLUGIN_METHODS`:
UNIMPLEMENTED, without calling the handler) and the session carries on; a request that
cannot be read for another reason (out of memory, nested too deep) and a handler that
raises are answered INTERNAL, that request alone, in one log line. Data
messages, requests on the client connection and responses on the server connection are
ignored and counted: no NRI method streams, and an error answer to a stream nobody opened
would only give a hostile peer an amplifier. A response to no pending call (one that timed
out, or a made-up stream id) is ignored and counted.

**Bounds.** Memory: one partial mux frame and one partial ttrpc message per connection
(:mod:`anolisnuma.nri.frames`), and at most ``max_inflight`` requests accepted and not yet
answered (more are answered RESOURCE_EXHAUSTED without running the handler). Threads: the
reader and ``workers`` handler threads, all started up front. A write that makes no
progress for ``write_timeout`` seconds (a peer that stopped reading) closes the session,
so no handler or caller waits on the socket longer than that.
"""

from __future__ import annotations

import socket
import threading
from typing import Any, Callable, Dict, Optional, Type

import structlog
from google.protobuf.message import DecodeError, Message

from anolisnuma.cri.grpcwire import STATUS_CODES
from anolisnuma.nri import frames as fr
from anolisnuma.workers import WorkerPool
from nri_proto import ttrpc_pb2

_LOG = structlog.get_logger("anolisnuma.nri")

PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
# The methods of service Plugin in NRI v0.11.0's api.proto. Others are answered
# UNIMPLEMENTED here, as ttrpc answers them, so a handler only ever sees these names.
PLUGIN_METHODS = frozenset({
    "Configure", "Synchronize", "Shutdown", "CreateContainer", "UpdateContainer", "StopContainer",
    "UpdatePodSandbox", "StateChange", "ValidateContainerAdjustment",
})

OK = STATUS_CODES["OK"]
INVALID_ARGUMENT = STATUS_CODES["INVALID_ARGUMENT"]
RESOURCE_EXHAUSTED = STATUS_CODES["RESOURCE_EXHAUSTED"]
UNIMPLEMENTED = STATUS_CODES["UNIMPLEMENTED"]
INTERNAL = STATUS_CODES["INTERNAL"]

READ_BYTES = 64 * 1024
WRITE_TIMEOUT = 10.0
# Strings from the peer that go into an answer or a log line are cut to this length.
_ECHO = 120
_MAX_STREAM_ID = 0xFFFFFFFF

Handler = Callable[[str, bytes], bytes]

COUNTERS = ("frames", "requests", "served", "errors_sent", "handler_failures", "request_failures", "oversized",
            "rejected_inflight", "unknown_stream", "ignored", "calls")


class NriRequestError(Exception):
    """A call answered with an error status; raised by a handler, its status is the answer."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{_status_name(code)}: {message}")
        self.code = code
        self.message = message


class SessionClosed(Exception):
    """The session has ended (the message is why); no call can be made or answered."""


def _status_name(code: int) -> str:
    for name, number in STATUS_CODES.items():
        if number == code:
            return name
    return f"code {code}"


class _Pending:
    __slots__ = ("done", "response", "error")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.response: Optional[Any] = None
        self.error: Optional[BaseException] = None


class NriSession:
    """One plugin connection. ``handler(method, payload)`` answers the runtime's calls of
    ``nri.pkg.api.v1alpha1.Plugin`` on a worker thread (method: one of
    :data:`PLUGIN_METHODS`; payload: the method's serialized request; result: its
    serialized response; :class:`NriRequestError` for an error status). ``log`` is a
    structlog-style logger (key-value arguments); ``on_failure()`` is called for each
    request that failed here rather than in the handler (one that could not even be read,
    or a handler that raised): answered INTERNAL, the session goes on. Nothing is read
    before :meth:`start`."""

    def __init__(self, sock: socket.socket, handler: Handler, *, log: Any = None,
                 max_message: int = fr.MAX_MESSAGE, workers: int = 4, max_inflight: int = 64,
                 write_timeout: float = WRITE_TIMEOUT, on_failure: Optional[Callable[[], None]] = None) -> None:
        self._sock = sock
        self._handler = handler
        self._log = log if log is not None else _LOG
        self._on_failure = on_failure
        self.max_message = max_message
        self.max_inflight = max_inflight
        # One timeout for both directions: a read that times out is simply retried, a
        # write that does ends the session (its frame is half written).
        sock.settimeout(write_timeout)
        self._mux = fr.MuxDecoder()
        self._requests = fr.TtrpcDecoder(max_message)    # connection 1: we serve
        self._responses = fr.TtrpcDecoder(max_message)   # connection 2: we call
        self._pool = WorkerPool(workers, "nri_handler")
        self._write_lock = threading.Lock()
        self._lock = threading.Lock()            # state below
        self._calls: Dict[int, _Pending] = {}
        self._next_stream = 1
        self._last_request = 0
        self._inflight = 0
        self._counters = dict.fromkeys(COUNTERS, 0)
        self._closed = threading.Event()
        self._finished = threading.Event()       # the reader has let go of the socket
        self._reader: Optional[threading.Thread] = None
        self.reason = ""

    @classmethod
    def connect(cls, path: str, handler: Handler, *, timeout: float = 5.0, **kw: Any) -> "NriSession":
        """A session on a new connection to the runtime's socket at ``path`` (not started)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect(path)
            return cls(sock, handler, **kw)
        except BaseException:
            sock.close()
            raise

    # ---- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Start the reader thread (once)."""
        with self._lock:
            if self._reader is not None or self._closed.is_set():
                return
            self._reader = threading.Thread(target=self._read_loop, name="nri_reader", daemon=True)
        self._reader.start()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def wait_closed(self, timeout: Optional[float] = None) -> bool:
        """Whether the session closed (and its reader let go of the socket) within ``timeout``."""
        return self._finished.wait(timeout)

    def close(self) -> None:
        """End the session; pending and later calls raise SessionClosed. Idempotent."""
        self._shutdown("closed by us")

    @property
    def counters(self) -> Dict[str, int]:
        with self._lock:
            return dict(self._counters)

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counters[name] += n

    def _shutdown(self, reason: str) -> None:
        with self._lock:
            if self._closed.is_set():
                return
            self.reason = reason
            self._closed.set()
            pending = list(self._calls.values())
            self._calls.clear()
            reader = self._reader
        for call in pending:
            call.error = SessionClosed(reason)
            call.done.set()
        if reason == "closed by us":
            self._log.info("nri session closed", reason=reason)
        else:
            self._log.warning("nri session closed", reason=reason)
        try:
            # Wakes the reader (recv returns b"") and any blocked sendall; the reader
            # closes the descriptor, so that no thread is in a call on it when it goes.
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._pool.shutdown(wait=False, cancel_futures=True)
        if reader is None:   # else the reader does, on its way out
            self._release_socket()

    def _release_socket(self) -> None:
        with self._write_lock:
            self._sock.close()
        self._finished.set()

    # ---- reading -----------------------------------------------------------------------

    def _read_loop(self) -> None:
        reason = "peer closed"
        try:
            while not self._closed.is_set():
                try:
                    data = self._sock.recv(READ_BYTES)
                except socket.timeout:
                    continue
                except OSError as e:
                    reason = f"read failed: {e}"
                    break
                if not data:
                    if self._mux.buffered or self._requests.buffered or self._responses.buffered:
                        reason = "peer closed mid-frame"
                    break
                try:
                    batch = self._mux.feed(data)
                except fr.FrameError as e:
                    reason = f"frame error: {e}"
                    break
                self._count("frames", len(batch))
                for conn_id, payload in batch:
                    if conn_id == fr.PLUGIN_SERVICE_CONN:
                        for item in self._requests.feed(payload):
                            self._on_request(item)
                    else:
                        for item in self._responses.feed(payload):
                            self._on_response(item)
        except Exception as e:   # a bug here must end the session, not leave it hanging
            self._log.exception("nri reader failed")
            reason = f"internal error: {type(e).__name__}"
        finally:
            self._shutdown(reason)
            self._release_socket()

    def _on_request(self, item: Any) -> None:
        """One request as it arrives: whatever reading it raises (out of memory, too deep,
        a bug) is that request's failure, answered INTERNAL, not the session's end."""
        failed = ""
        try:
            self._take_request(item)
            return
        except Exception as e:
            failed = type(e).__name__
        # (out of the except clause: what the failed read had allocated is let go first)
        self._failure("request_failures", "nri request could not be read; answered INTERNAL, the session goes on",
                      item.stream_id, failed)

    def _failure(self, counter: str, what: str, sid: int, error: str, method: str = "") -> None:
        """Count ``counter`` and answer stream ``sid`` INTERNAL for a request that failed
        here (``error``: the exception's type), then log one line and call ``on_failure``."""
        self._count(counter)
        self._answer(sid, INTERNAL, f"plugin failed to {'handle ' + method if method else 'read the request'} "
                                    f"({error})")
        # answered first, logged and counted after: out of memory, these may fail too
        try:
            self._log.error(what, method=method or None, stream_id=sid, error=error)
            if self._on_failure is not None:
                self._on_failure()
        except Exception:
            pass

    def _take_request(self, item: Any) -> None:
        if isinstance(item, fr.Oversized):
            self._count("oversized")
            self._answer(item.stream_id, RESOURCE_EXHAUSTED,
                         f"message length {item.length} exceeds maximum message size of {self.max_message}")
            return
        if item.type != fr.REQUEST:
            self._count("ignored")
            return
        sid = item.stream_id
        self._count("requests")
        if sid % 2 != 1 or sid <= self._last_request:
            self._answer(sid, INVALID_ARGUMENT, "StreamID must be odd, increasing and not re-used")
            return
        self._last_request = sid
        request = ttrpc_pb2.Request()
        try:
            request.ParseFromString(item.payload)
        except DecodeError:
            self._answer(sid, INVALID_ARGUMENT, "unmarshal request error")
            return
        if request.service != PLUGIN_SERVICE:
            self._answer(sid, UNIMPLEMENTED, f"service {request.service[:_ECHO]}")
            return
        if request.method not in PLUGIN_METHODS:
            self._answer(sid, UNIMPLEMENTED, f"method {request.method[:_ECHO]}")
            return
        with self._lock:
            admitted = self._inflight < self.max_inflight
            if admitted:
                self._inflight += 1
            else:
                self._counters["rejected_inflight"] += 1
        if not admitted:
            self._answer(sid, RESOURCE_EXHAUSTED, f"more than {self.max_inflight} requests in flight")
            return
        try:
            self._pool.submit(self._serve, sid, request.method, request.payload)
        except BaseException:
            self._done_serving()
            if self._closed.is_set():   # the pool is shut down: the session is closing
                return
            raise

    def _on_response(self, item: Any) -> None:
        if not isinstance(item, fr.Oversized) and item.type != fr.RESPONSE:
            self._count("ignored")
            return
        with self._lock:
            call = self._calls.pop(item.stream_id, None)
            if call is None:
                self._counters["unknown_stream"] += 1
                return
        if isinstance(item, fr.Oversized):
            self._count("oversized")
            call.error = NriRequestError(RESOURCE_EXHAUSTED, f"response of {item.length} bytes "
                                                             f"exceeds {self.max_message}")
        else:
            call.response = item.payload
        call.done.set()

    # ---- serving -----------------------------------------------------------------------

    def _serve(self, sid: int, method: str, payload: bytes) -> None:
        try:
            failed = ""
            try:
                out = self._handler(method, payload)
                if not isinstance(out, (bytes, bytearray)):
                    raise TypeError(f"handler returned {type(out).__name__}, not bytes")
            except NriRequestError as e:
                self._answer(sid, e.code, e.message)
                return
            except Exception as e:
                failed = type(e).__name__
            if failed:   # (out of the except clause, as in _on_request)
                self._failure("handler_failures", "nri handler failed; answered INTERNAL, the session goes on", sid,
                              failed, method[:_ECHO])
                return
            if self._answer(sid, OK, "", bytes(out)):
                self._count("served")
        finally:
            self._done_serving()

    def _done_serving(self) -> None:
        with self._lock:
            self._inflight -= 1

    def _answer(self, sid: int, code: int, message: str, payload: bytes = b"") -> bool:
        """Send the Response for stream ``sid``; False when the session is closed."""
        response = ttrpc_pb2.Response(payload=payload)
        response.status.code = code   # present even when OK, as ttrpc sends it
        response.status.message = message
        data = response.SerializeToString()
        if len(data) > fr.MAX_MESSAGE:
            # ttrpc's server would fail to send it and drop the connection; the runtime
            # is better served by an error for this one call.
            code = RESOURCE_EXHAUSTED
            data = ttrpc_pb2.Response(status=ttrpc_pb2.Status(
                code=code, message=f"response of {len(data)} bytes exceeds {fr.MAX_MESSAGE}")).SerializeToString()
        if code != OK:
            self._count("errors_sent")
        try:
            self._send(fr.message_frames(fr.PLUGIN_SERVICE_CONN, sid, fr.RESPONSE, 0, data))
        except SessionClosed:
            return False
        return True

    def _send(self, frames: bytes) -> None:
        with self._write_lock:
            if self._closed.is_set():
                raise SessionClosed(self.reason)
            try:
                self._sock.sendall(frames)
                return
            except OSError as e:   # socket.timeout too: the frame is half written
                failure = f"write failed: {e or type(e).__name__}"
        self._shutdown(failure)
        raise SessionClosed(self.reason)

    # ---- calling -----------------------------------------------------------------------

    def call(self, method: str, request: Message, response_cls: Type[Message], timeout: float) -> Message:
        """Call ``nri.pkg.api.v1alpha1.Runtime``'s ``method`` (RegisterPlugin,
        UpdateContainers) and return its parsed response. Raises NriRequestError for an
        error status (RESOURCE_EXHAUSTED for a request over 4 MiB, which is not sent;
        INTERNAL for a response that does not parse), SessionClosed when the session ends
        first, TimeoutError after ``timeout`` seconds."""
        envelope = ttrpc_pb2.Request(service=RUNTIME_SERVICE, method=method, payload=request.SerializeToString(),
                                     timeout_nano=int(timeout * 1e9))
        data = envelope.SerializeToString()
        if len(data) > fr.MAX_MESSAGE:
            raise NriRequestError(RESOURCE_EXHAUSTED, f"request of {len(data)} bytes exceeds {fr.MAX_MESSAGE}")
        call = _Pending()
        # Stream ids must go out in increasing order: allocate and send under one lock.
        with self._write_lock:
            with self._lock:
                if self._closed.is_set():
                    raise SessionClosed(self.reason)
                sid = self._next_stream
                if sid > _MAX_STREAM_ID:
                    raise SessionClosed("stream ids exhausted")
                self._next_stream += 2
                self._calls[sid] = call
                self._counters["calls"] += 1
            try:
                self._sock.sendall(fr.message_frames(fr.RUNTIME_SERVICE_CONN, sid, fr.REQUEST, 0, data))
                failure = ""
            except OSError as e:
                failure = f"write failed: {e or type(e).__name__}"
        if failure:
            self._shutdown(failure)
        if not call.done.wait(timeout):
            with self._lock:
                self._calls.pop(sid, None)
            if not call.done.is_set():
                raise TimeoutError(f"{method}: no response within {timeout:g}s")
        if call.error is not None:
            raise call.error
        return self._parse_response(method, call.response, response_cls)

    @staticmethod
    def _parse_response(method: str, data: bytes, response_cls: Type[Message]) -> Message:
        response = ttrpc_pb2.Response()
        try:
            response.ParseFromString(data)
        except DecodeError:
            raise NriRequestError(INTERNAL, f"{method}: unparseable ttrpc response") from None
        if response.status.code != OK:
            raise NriRequestError(response.status.code, response.status.message[:1024])
        out = response_cls()
        try:
            out.ParseFromString(response.payload)
        except DecodeError:
            raise NriRequestError(INTERNAL, f"{method}: unparseable {response_cls.__name__}") from None
        return out


__all__ = ["Handler", "NriRequestError", "NriSession", "PLUGIN_METHODS", "PLUGIN_SERVICE", "RUNTIME_SERVICE",
           "SessionClosed"]
