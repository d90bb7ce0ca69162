"""The plugin's side of one NRI connection, owned by the daemon's event loop.

**Who runs what.** The daemon's event loop, the pipeline's: it reads the socket (an
:class:`asyncio.BufferedProtocol`), decodes the frames, runs each admitted request as a task
(the handler is a coroutine; an event's hooks leave the loop once, for their executor) and
writes the answer. Calls to the runtime (``RegisterPlugin``, ``UpdateContainers``) are
futures the loop's reader resolves: :meth:`NriSession.acall` on the loop,
:meth:`NriSession.call` from another thread, with a timeout.

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
   waits for that reply (this session does: its reader never waits on a call);
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
raises are answered INTERNAL, that request alone, in one log line. Data messages, requests
on the client connection and responses on the server connection are ignored and counted:
no NRI method streams, and an error answer to a stream nobody opened would only give a
hostile peer an amplifier. A response to no pending call (one that timed
out, or a made-up stream id) is ignored and counted.

**Bounds.** Memory: one partial mux frame and one partial ttrpc message per connection
(:mod:`anolisnuma.nri.frames`), and at most ``max_inflight`` requests accepted and not yet
answered (more are answered RESOURCE_EXHAUSTED without running the handler). No thread of
its own. Writes go to the transport's buffer; once it is above its high-water mark
(``pause_writing``) the session stops reading the peer too, so that a peer that does not
read our answers cannot make us queue more of them, and a write that makes no progress for
``write_timeout`` seconds (a peer that stopped reading) closes the session; no handler or
caller ever waits on the socket.
"""

from __future__ import annotations

import asyncio
import inspect
import socket
import threading
from typing import Any, Awaitable, Callable, Dict, Optional, Set, Type, Union

import structlog
from google.protobuf.message import DecodeError, Message

from anolisnuma.cri.grpcwire import STATUS_CODES
from anolisnuma.nri import frames as fr
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

WRITE_TIMEOUT = 10.0
# one read's buffer, reused (asyncio's own reads allocate 256 KiB each: a fresh mmap per event)
READ_BYTES = 64 * 1024
# how long a thread waits for the loop to take the socket (start) before it gives up
ATTACH_TIMEOUT = 5.0
# how much longer than its timeout a thread waits for a call the loop did not time out
CALL_GRACE = 1.0
# Strings from the peer that go into an answer or a log line are cut to this length.
_ECHO = 120
_MAX_STREAM_ID = 0xFFFFFFFF

# (method, payload) -> the serialized answer, or an awaitable of it (run on the loop)
Handler = Callable[[str, bytes], Union[bytes, Awaitable[bytes]]]

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
    return next((name for name, number in STATUS_CODES.items() if number == code), f"code {code}")


class NriSession(asyncio.BufferedProtocol):
    """One plugin connection, served on ``loop``. ``handler(method, payload)`` answers the
    runtime's calls of ``nri.pkg.api.v1alpha1.Plugin`` on the loop (method: one of
    :data:`PLUGIN_METHODS`; payload: the method's serialized request; result: its
    serialized response, or a coroutine of it; :class:`NriRequestError` for an error
    status); a handler must not block the loop (what may block goes to an executor, as the
    pipeline's hooks do). ``log`` is a structlog-style logger (key-value arguments);
    ``on_failure()`` is called for each request that failed here rather than in the handler
    (one that could not even be read, or a handler that raised): answered INTERNAL, the
    session goes on. Nothing is read before :meth:`start`."""

    def __init__(self, sock: socket.socket, handler: Handler, *, loop: asyncio.AbstractEventLoop, log: Any = None,
                 max_message: int = fr.MAX_MESSAGE, max_inflight: int = 64, write_timeout: float = WRITE_TIMEOUT,
                 on_failure: Optional[Callable[[], None]] = None) -> None:
        self._sock = sock
        self._loop = loop
        self._handler = handler
        self._log = log if log is not None else _LOG
        self._on_failure = on_failure
        self.max_message = max_message
        self.max_inflight = max_inflight
        self.write_timeout = write_timeout
        self._mux = fr.MuxDecoder()
        self._requests = fr.TtrpcDecoder(max_message)    # connection 1: we serve
        self._responses = fr.TtrpcDecoder(max_message)   # connection 2: we call
        self._transport: Optional[asyncio.Transport] = None
        self._rbuf = memoryview(bytearray(READ_BYTES))
        # Everything below is the loop's; only start and close look at _started from a
        # thread, under this lock, before the loop has the socket.
        self._state_lock = threading.Lock()
        self._started = False
        self._attaching = False
        self._calls: Dict[int, "asyncio.Future[Any]"] = {}
        self._tasks: Set["asyncio.Task[None]"] = set()   # requests being served (kept referenced)
        self._next_stream = 1
        self._last_request = 0
        self._inflight = 0
        self._counters = dict.fromkeys(COUNTERS, 0)
        self._written = 0                         # bytes handed to the transport, ever
        self._stall: Optional[asyncio.TimerHandle] = None
        self._stall_sent = 0
        self._closed = threading.Event()
        self._finished = threading.Event()        # the loop has let go of the socket
        self._waiters: Set[threading.Event] = set()   # threads in call(), woken when the session ends
        self.reason = ""

    @classmethod
    def connect(cls, path: str, handler: Handler, *, timeout: float = 5.0, **kw: Any) -> "NriSession":
        """A session on a new connection to the runtime's socket at ``path`` (not started;
        ``loop`` and the options as for the constructor)."""
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
        """Hand the socket to the loop (once). From a thread, returns once the loop reads
        it (SessionClosed if the loop cannot take it within ``ATTACH_TIMEOUT``, or is
        closed); on the loop's thread, the loop takes it on its next turn."""
        with self._state_lock:
            if self._started or self._closed.is_set():
                return
            self._started = True
        if self._on_loop():
            self._loop.create_task(self._attach())
            return
        try:
            self._from_thread(self._attach(), ATTACH_TIMEOUT)
        except TimeoutError:   # the loop is stuck: it reads the socket when it can, or not at all
            self.close()
            raise SessionClosed(f"the event loop did not take the socket in {ATTACH_TIMEOUT:g}s") from None

    async def _attach(self) -> None:
        if self._closed.is_set():
            return
        self._attaching = True   # (the socket is the loop's to close from here on)
        try:
            await self._loop.create_unix_connection(lambda: self, sock=self._sock)
        except Exception as e:
            self._attaching = False
            self._shutdown(f"cannot serve the connection: {e or type(e).__name__}")
            if self._transport is None:   # (closed while the loop was taking it)
                self._sock.close()
            return
        self._attaching = False

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def wait_closed(self, timeout: Optional[float] = None) -> bool:
        """Whether the session closed (and the loop let go of the socket) within ``timeout``."""
        return self._finished.wait(timeout)

    def close(self) -> None:
        """End the session; pending and later calls raise SessionClosed. Idempotent, from
        any thread: off the loop it returns once the loop has done it (or after
        ``ATTACH_TIMEOUT`` when the loop is stuck: then it is done when the loop next runs)."""
        if self._on_loop():
            self._shutdown("closed by us")
            return
        with self._state_lock:
            started = self._started
        if started:
            try:
                self._loop.call_soon_threadsafe(self._shutdown, "closed by us")
            except RuntimeError:   # the loop is closed: nothing on it uses the socket any more
                self._shutdown("closed by us")
                return
            self._finished.wait(ATTACH_TIMEOUT)
            return
        self._shutdown("closed by us")

    @property
    def counters(self) -> Dict[str, int]:
        return dict(self._counters)

    def _on_loop(self) -> bool:
        return asyncio._get_running_loop() is self._loop   # (None off any loop's thread)

    def _shutdown(self, reason: str) -> None:
        """On the loop (or before it ever had the socket): end the session for ``reason``."""
        with self._state_lock:
            if self._closed.is_set():
                return
            self.reason = reason
            self._closed.set()
            waiters = list(self._waiters)
        for waiter in waiters:   # (a thread in call() must not wait for the loop to tell it)
            waiter.set()
        pending = list(self._calls.values())
        self._calls.clear()
        for call in pending:
            if not call.done():
                call.set_exception(SessionClosed(reason))
        if reason == "closed by us":
            self._log.info("nri session closed", reason=reason)
        else:
            self._log.warning("nri session closed", reason=reason)
        if self._stall is not None:
            self._stall.cancel()
        # Requests being served run on (a pipeline call is not cut in the middle); their
        # answers find the session closed. abort() takes the socket off the loop's reading
        # and writing now and closes it on the loop's next turn.
        if self._transport is not None:
            self._transport.abort()
        elif not self._attaching:   # (else connection_made aborts it, or _attach closes it)
            self._sock.close()
        self._finished.set()

    # ---- the transport's callbacks (on the loop) ---------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        if self._closed.is_set():   # closed while the loop was taking it
            transport.abort()  # type: ignore[attr-defined]

    def connection_lost(self, exc: Optional[Exception]) -> None:
        # (asyncio tells a failed read and a failed write alike: the error names which)
        self._shutdown(f"connection failed: {exc}" if exc is not None else "peer closed")

    def eof_received(self) -> Optional[bool]:
        buffered = self._mux.buffered or self._requests.buffered or self._responses.buffered
        self._shutdown("peer closed mid-frame" if buffered else "peer closed")
        return None

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._rbuf

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(bytes(self._rbuf[:nbytes]))

    def data_received(self, data: bytes) -> None:
        if self._closed.is_set():
            return
        try:
            try:
                batch = self._mux.feed(data)
            except fr.FrameError as e:
                self._shutdown(f"frame error: {e}")
                return
            self._counters["frames"] += len(batch)
            for conn_id, payload in batch:
                if self._closed.is_set():   # (ended by a frame of this batch: nothing more is run)
                    return
                if conn_id == fr.PLUGIN_SERVICE_CONN:
                    for item in self._requests.feed(payload):
                        self._on_request(item)
                else:
                    for item in self._responses.feed(payload):
                        self._on_response(item)
        except Exception as e:   # a bug here must end the session, not leave it hanging
            self._log.exception("nri reader failed")
            self._shutdown(f"internal error: {type(e).__name__}")

    def pause_writing(self) -> None:
        # The peer does not take our answers as fast as we make them: read no more of its
        # requests until it does, and give it write_timeout to make progress.
        if self._transport is not None and self._transport.is_reading():
            self._transport.pause_reading()
        self._arm_stall()

    def resume_writing(self) -> None:
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None
        if self._transport is not None and not self._closed.is_set() and not self._transport.is_reading():
            self._transport.resume_reading()

    def _sent(self) -> int:
        return self._written - (self._transport.get_write_buffer_size() if self._transport else 0)

    def _arm_stall(self) -> None:
        self._stall_sent = self._sent()
        self._stall = self._loop.call_later(self.write_timeout, self._check_stall)

    def _check_stall(self) -> None:
        self._stall = None
        if self._closed.is_set():
            return
        if self._sent() > self._stall_sent:   # it reads, slowly: another write_timeout
            self._arm_stall()
            return
        self._shutdown(f"write failed: no progress for {self.write_timeout:g}s (the peer stopped reading)")

    # ---- reading -----------------------------------------------------------------------

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
        self._counters[counter] += 1
        try:   # counted before the answer (whoever reads the answer sees the count), but
            if self._on_failure is not None:   # out of memory this may fail: the answer must not
                self._on_failure()
        except Exception:
            pass
        self._answer(sid, INTERNAL, f"plugin failed to {'handle ' + method if method else 'read the request'} "
                                    f"({error})")
        # answered first, logged after: out of memory, the line may fail too
        try:
            self._log.error(what, method=method or None, stream_id=sid, error=error)
        except Exception:
            pass

    def _take_request(self, item: Any) -> None:
        if isinstance(item, fr.Oversized):
            self._counters["oversized"] += 1
            self._answer(item.stream_id, RESOURCE_EXHAUSTED,
                         f"message length {item.length} exceeds maximum message size of {self.max_message}")
            return
        if item.type != fr.REQUEST:
            self._counters["ignored"] += 1
            return
        sid = item.stream_id
        self._counters["requests"] += 1
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
        if self._inflight >= self.max_inflight:
            self._counters["rejected_inflight"] += 1
            self._answer(sid, RESOURCE_EXHAUSTED, f"more than {self.max_inflight} requests in flight")
            return
        self._inflight += 1
        try:
            task = self._loop.create_task(self._serve(sid, request.method, request.payload))
        except BaseException:
            self._inflight -= 1
            raise
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _on_response(self, item: Any) -> None:
        if not isinstance(item, fr.Oversized) and item.type != fr.RESPONSE:
            self._counters["ignored"] += 1
            return
        call = self._calls.pop(item.stream_id, None)
        if call is None or call.done():
            self._counters["unknown_stream"] += 1
            return
        if isinstance(item, fr.Oversized):
            self._counters["oversized"] += 1
            call.set_exception(NriRequestError(RESOURCE_EXHAUSTED, f"response of {item.length} bytes "
                                                                   f"exceeds {self.max_message}"))
        else:
            call.set_result(item.payload)

    # ---- serving -----------------------------------------------------------------------

    async def _serve(self, sid: int, method: str, payload: bytes) -> None:
        try:
            failed = ""
            try:
                out = self._handler(method, payload)
                if inspect.isawaitable(out):
                    out = await out
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
                self._counters["served"] += 1
        finally:
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
            self._counters["errors_sent"] += 1
        return self._write(fr.message_frames(fr.PLUGIN_SERVICE_CONN, sid, fr.RESPONSE, 0, data))

    def _write(self, frames: bytes) -> bool:
        """Hand ``frames`` to the transport (never blocks); False when the session is closed."""
        if self._closed.is_set() or self._transport is None:
            return False
        self._written += len(frames)
        self._transport.write(frames)
        return True

    # ---- calling -----------------------------------------------------------------------

    async def acall(self, method: str, request: Message, response_cls: Type[Message], timeout: float) -> Message:
        """On the loop: call ``nri.pkg.api.v1alpha1.Runtime``'s ``method`` (RegisterPlugin,
        UpdateContainers) and return its parsed response. Raises NriRequestError for an
        error status (RESOURCE_EXHAUSTED for a request over 4 MiB, which is not sent;
        INTERNAL for a response that does not parse), SessionClosed when the session ends
        first, TimeoutError after ``timeout`` seconds (a late answer is counted and ignored)."""
        envelope = ttrpc_pb2.Request(service=RUNTIME_SERVICE, method=method, payload=request.SerializeToString(),
                                     timeout_nano=int(timeout * 1e9))
        data = envelope.SerializeToString()
        if len(data) > fr.MAX_MESSAGE:
            raise NriRequestError(RESOURCE_EXHAUSTED, f"request of {len(data)} bytes exceeds {fr.MAX_MESSAGE}")
        if self._closed.is_set() or self._transport is None or self._next_stream > _MAX_STREAM_ID:
            raise SessionClosed(self.reason or ("not started" if self._transport is None else "stream ids exhausted"))
        sid = self._next_stream
        # (the loop is one thread: ids are allocated and written in increasing order)
        self._next_stream += 2
        call: "asyncio.Future[Any]" = self._loop.create_future()
        # (its SessionClosed may find no waiter, one cancelled meanwhile: read, never reported
        # at collection, where asyncio's report would format a traceback inside any code)
        call.add_done_callback(_retrieve)
        self._calls[sid] = call
        self._counters["calls"] += 1
        self._write(fr.message_frames(fr.RUNTIME_SERVICE_CONN, sid, fr.REQUEST, 0, data))
        try:
            answer = await asyncio.wait_for(call, timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f"{method}: no response within {timeout:g}s") from None
        finally:
            if self._calls.get(sid) is call:
                del self._calls[sid]
        return self._parse_response(method, answer, response_cls)

    def call(self, method: str, request: Message, response_cls: Type[Message], timeout: float) -> Message:
        """:meth:`acall` from a thread other than the loop's, waiting at most ``timeout``
        seconds; the same errors (SessionClosed too when the loop is closed). On the loop's
        thread it raises RuntimeError at once: waiting there would stop the very reader
        that resolves the call."""
        if self._on_loop():
            raise RuntimeError("NriSession.call on the event loop's thread would block it: await acall")
        # acall times out first, on the loop, where it also forgets the stream (a late
        # answer is then counted as one); this wait only outlasts a loop that is starved
        try:
            return self._from_thread(self.acall(method, request, response_cls, timeout), timeout + CALL_GRACE)
        except TimeoutError:
            raise TimeoutError(f"{method}: no response within {timeout:g}s") from None

    def _from_thread(self, coro: Any, timeout: float) -> Any:
        """What ``coro`` returns (or raises), run on the loop and waited for from another
        thread: SessionClosed as soon as the session ends (even while the loop is busy, as
        in the daemon's stop, which closes the session and then waits for our thread) or
        when the loop is closed; TimeoutError after ``timeout`` seconds."""
        done = threading.Event()
        with self._state_lock:
            if self._closed.is_set():
                coro.close()
                raise SessionClosed(self.reason)
            self._waiters.add(done)
        try:
            try:
                fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
            except RuntimeError as e:   # the loop is closed
                coro.close()
                raise SessionClosed(f"the event loop is closed ({e})") from None
            fut.add_done_callback(lambda _f: done.set())
            done.wait(timeout)
            if fut.done():
                return fut.result()
            if self._closed.is_set():   # (the loop has not run since: it may be waiting for us;
                raise SessionClosed(self.reason)   # the call ends there with SessionClosed too)
            fut.cancel()
            raise TimeoutError(f"no answer within {timeout:g}s")
        finally:
            with self._state_lock:
                self._waiters.discard(done)

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


def _retrieve(fut: "asyncio.Future[Any]") -> None:
    if not fut.cancelled():
        fut.exception()


__all__ = ["Handler", "NriRequestError", "NriSession", "PLUGIN_METHODS", "PLUGIN_SERVICE", "RUNTIME_SERVICE",
           "SessionClosed"]
