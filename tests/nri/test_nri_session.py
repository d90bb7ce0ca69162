"""NriSession against the fake NRI runtime (and, for the bytes themselves, a socketpair):
serving, error statuses, its bounds, and hostile peers. No test sleeps: each waits on the
condition it checks; time limits are ratios to a baseline measured in the same test."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import threading
import time
from typing import List

import pytest

from anolisnuma.nri import frames as fr
from anolisnuma.nri.session import NriRequestError, NriSession, SessionClosed
from anolisnuma.testing.nri_runtime import FakeNriRuntime
from anolisnuma.testing.waiting import wait_until
from nri_proto import api_pb2, ttrpc_pb2

PLUGIN = "nri.pkg.api.v1alpha1.Plugin"


class Handler:
    """Answers Configure with a subscription, Synchronize with no updates; ``block`` makes
    the named methods wait for ``release`` (off the loop, as a hook waits in its executor);
    ``fail`` maps a method to an exception. A coroutine, as the plugin's handler is."""

    def __init__(self) -> None:
        self.calls: List[str] = []
        self.block = set()
        self.release = threading.Event()
        self.entered = threading.Semaphore(0)
        self.fail = {}

    async def __call__(self, method: str, payload: bytes) -> bytes:
        self.calls.append(method)
        if method in self.block:
            self.entered.release()
            assert await asyncio.get_running_loop().run_in_executor(None, self.release.wait, 60)
        if method in self.fail:
            raise self.fail[method]
        if method == "Configure":
            api_pb2.ConfigureRequest.FromString(payload)
            return api_pb2.ConfigureResponse(events=(1 << 3) | (1 << 0)).SerializeToString()
        if method == "Synchronize":
            return api_pb2.SynchronizeResponse().SerializeToString()
        if method == "CreateContainer":
            req = api_pb2.CreateContainerRequest.FromString(payload)
            rsp = api_pb2.CreateContainerResponse()
            rsp.adjust.linux.resources.cpu.cpus = "0-3"
            rsp.adjust.annotations["note"] = "x" * len(req.container.name)   # sized by the request
            return rsp.SerializeToString()
        return api_pb2.Empty().SerializeToString()


@pytest.fixture
def pair(sockdir, nri_loop):
    """(runtime, session, handler) connected and started; factory for options."""
    made = []

    def make(**kw):
        path = os.path.join(sockdir, f"nri{len(made)}.sock")
        rt = FakeNriRuntime(path).start()
        handler = Handler()
        session = NriSession.connect(path, handler, loop=nri_loop, **kw)
        session.start()
        rt.wait_connected()
        made.append((rt, session))
        return rt, session, handler
    yield make
    for rt, session in made:
        session.close()
        rt.close()
        assert session.wait_closed(30)
        assert rt.violations == [], rt.violations   # containerd could have read every frame


def configure(rt, timeout=30.0):
    return rt.call_plugin("Configure", api_pb2.ConfigureRequest(runtime_name="fake"), api_pb2.ConfigureResponse,
                          timeout)


def raw_request(rt, service=PLUGIN, method="Configure", payload=b"", raw_envelope=None) -> int:
    sid = rt.stream_id()
    envelope = raw_envelope if raw_envelope is not None else \
        ttrpc_pb2.Request(service=service, method=method, payload=payload).SerializeToString()
    rt.send_raw(fr.message_frames(1, sid, fr.REQUEST, 0, envelope))
    return sid


def unmatched_response(rt, sid) -> ttrpc_pb2.Response:
    msg = wait_until(lambda: next((m for m in rt.unmatched if m.stream_id == sid), None), f"response {sid}")
    return ttrpc_pb2.Response.FromString(msg.payload)


# ---- the registration sequence -------------------------------------------------------------

def test_register_configure_synchronize_and_update(pair):
    rt, session, handler = pair()
    got = session.call("RegisterPlugin", api_pb2.RegisterPluginRequest(plugin_name="anolisnuma", plugin_idx="50"),
                       api_pb2.Empty, timeout=30)
    assert isinstance(got, api_pb2.Empty) and rt.registered.is_set()
    assert rt.requests[0][0] == "RegisterPlugin" and rt.requests[0][1].plugin_idx == "50"
    assert configure(rt).events == 0b1001
    sync = rt.call_plugin("Synchronize", api_pb2.SynchronizeRequest(), api_pb2.SynchronizeResponse)
    assert list(sync.update) == []
    update = api_pb2.UpdateContainersRequest()
    update.update.add(container_id="c1").linux.resources.cpu.cpus = "2"
    assert list(session.call("UpdateContainers", update, api_pb2.UpdateContainersResponse, 30).failed) == []
    assert rt.requests[1][1].update[0].linux.resources.cpu.cpus == "2"
    rt.update_error = (9, "not now")
    with pytest.raises(NriRequestError) as e:
        session.call("UpdateContainers", update, api_pb2.UpdateContainersResponse, 30)
    assert (e.value.code, e.value.message) == (9, "not now")
    assert handler.calls == ["Configure", "Synchronize"]
    assert session.counters["served"] == 2 and session.counters["calls"] == 3


def test_configure_served_while_register_waits(pair):
    # The runtime may call Configure before it answers RegisterPlugin.
    rt, session, _ = pair()
    rt.answer_calls = False
    result = {}
    t = threading.Thread(target=lambda: result.update(r=session.call(
        "RegisterPlugin", api_pb2.RegisterPluginRequest(plugin_name="p", plugin_idx="10"), api_pb2.Empty, 30)))
    t.start()
    wait_until(lambda: rt.requests, "RegisterPlugin at the runtime")
    assert configure(rt).events == 0b1001
    sid = 1   # the plugin's first stream id on connection 2
    rt.answer(sid, api_pb2.Empty().SerializeToString())
    t.join(30)
    assert isinstance(result["r"], api_pb2.Empty)


def test_large_response_is_cut_so_containerd_can_read_it(pair):
    rt, _, _ = pair()
    for size in (0, 4000, 4100, 9000, 300_000):
        req = api_pb2.CreateContainerRequest()
        req.container.name = "n" * size
        rsp = rt.call_plugin("CreateContainer", req, api_pb2.CreateContainerResponse)
        assert len(rsp.adjust.annotations["note"]) == size and rsp.adjust.linux.resources.cpu.cpus == "0-3"
    assert rt.violations == []


def test_the_bytes_on_a_socketpair(nri_loop):
    ours, theirs = socket.socketpair()
    session = NriSession(ours, Handler(), loop=nri_loop)
    session.start()
    try:
        envelope = ttrpc_pb2.Request(service=PLUGIN, method="Shutdown").SerializeToString()
        message = struct.pack(">IIBB", len(envelope), 5, 1, 0) + envelope
        theirs.sendall(struct.pack(">II", 1, len(message)) + message)
        head = b""
        while len(head) < 18:
            head += theirs.recv(18 - len(head))
        conn_id, frame_len, length, stream_id, mtype, flags = struct.unpack(">IIIIBB", head)
        assert (conn_id, frame_len, stream_id, mtype, flags) == (1, length + 10, 5, 2, 0)
        body = b""
        while len(body) < length:
            body += theirs.recv(length - len(body))
        response = ttrpc_pb2.Response.FromString(body)
        assert response.HasField("status") and response.status.code == 0 and response.payload == b""
    finally:
        session.close()
        theirs.close()
    assert session.wait_closed(30) and session.reason == "closed by us"


# ---- error answers ------------------------------------------------------------------------

def test_handler_error_status(pair):
    rt, session, handler = pair()
    handler.fail["Synchronize"] = NriRequestError(9, "not ready")
    with pytest.raises(NriRequestError) as e:
        rt.call_plugin("Synchronize", api_pb2.SynchronizeRequest(), api_pb2.SynchronizeResponse)
    assert (e.value.code, e.value.message) == (9, "not ready")
    assert configure(rt).events   # and the session goes on


def test_unknown_service_and_method_are_unimplemented(pair):
    rt, session, handler = pair()
    with pytest.raises(NriRequestError) as e:
        rt.call_plugin("Configure", api_pb2.ConfigureRequest(), api_pb2.ConfigureResponse,
                       service="nri.pkg.api.v1alpha1.Runtime")
    assert e.value.code == 12
    with pytest.raises(NriRequestError) as e:
        rt.call_plugin("Reboot", api_pb2.Empty(), api_pb2.Empty)
    assert e.value.code == 12 and "Reboot" in e.value.message
    assert handler.calls == [] and not session.closed


def test_handler_exception_is_internal_without_details(pair):
    rt, session, handler = pair()
    handler.fail["StateChange"] = ValueError("secret path /etc/shadow")
    with pytest.raises(NriRequestError) as e:
        rt.call_plugin("StateChange", api_pb2.StateChangeEvent(event=1), api_pb2.Empty)
    assert e.value.code == 13 and "secret" not in e.value.message and "Traceback" not in e.value.message
    assert session.counters["handler_failures"] == 1
    assert configure(rt).events


def test_unparseable_request_is_answered_and_the_session_goes_on(pair):
    rt, session, _ = pair()
    sid = raw_request(rt, raw_envelope=b"\x0a\xff\xff\xff")   # a field 1 whose length runs off the end
    assert unmatched_response(rt, sid).status.code == 3
    assert configure(rt).events and not session.closed


class RequestThatRunsOutOfMemory:
    """ttrpc's Request, but reading one for method ``Boom`` raises ``error`` (as a request
    that ran the parser out of memory, or nested past its recursion, would)."""

    error: type = MemoryError

    def __init__(self, **kw) -> None:
        self._request = ttrpc_pb2.Request(**kw)

    def ParseFromString(self, data: bytes) -> None:
        self._request.ParseFromString(data)
        if self._request.method == "Boom":
            raise self.error("from the test")

    def __getattr__(self, name: str):
        return getattr(self._request, name)


@pytest.mark.parametrize("error", [MemoryError, RecursionError])
def test_a_request_whose_reading_raises_is_answered_alone_and_the_session_goes_on(pair, monkeypatch, error):
    # given a session whose reading of one request raises
    failed: List[int] = []
    rt, session, handler = pair(on_failure=lambda: failed.append(1))
    shim = type("Shim", (RequestThatRunsOutOfMemory,), {"error": error})
    monkeypatch.setattr("anolisnuma.nri.session.ttrpc_pb2",
                        type("ttrpc", (), {"Request": shim, "Response": ttrpc_pb2.Response,
                                           "Status": ttrpc_pb2.Status}))
    # when that request arrives
    sid = raw_request(rt, method="Boom")
    # then it alone is answered INTERNAL, counted and told to the plugin; the session goes on
    answer = unmatched_response(rt, sid).status
    assert (answer.code, answer.message) == (13, f"plugin failed to read the request ({error.__name__})")
    assert session.counters["request_failures"] == 1 and failed == [1]
    assert configure(rt).events and not session.closed and handler.calls == ["Configure"]


class LogOutOfMemory:
    """A logger whose error lines fail as they would with no memory left."""

    def _fail(self, *_args, **_kw) -> None:
        raise MemoryError()

    error = warning = exception = _fail

    def info(self, *_args, **_kw) -> None:
        pass

    debug = info


def test_a_failed_request_is_answered_even_when_its_log_line_fails(pair):
    # given a handler that runs out of memory, where even the log line does
    rt, session, handler = pair(log=LogOutOfMemory())
    handler.fail["StateChange"] = MemoryError()
    # when the request arrives, then it is answered all the same, and the session goes on
    with pytest.raises(NriRequestError) as e:
        rt.call_plugin("StateChange", api_pb2.StateChangeEvent(event=1), api_pb2.Empty)
    assert (e.value.code, e.value.message) == (13, "plugin failed to handle StateChange (MemoryError)")
    assert session.counters["handler_failures"] == 1
    assert configure(rt).events and not session.closed


def test_even_or_reused_stream_ids_are_refused(pair):
    rt, session, handler = pair()
    envelope = ttrpc_pb2.Request(service=PLUGIN, method="Shutdown").SerializeToString()
    rt.send_raw(fr.message_frames(1, 2, fr.REQUEST, 0, envelope))
    assert unmatched_response(rt, 2).status.code == 3
    sid = raw_request(rt, method="Shutdown")
    assert unmatched_response(rt, sid).status.code == 0
    rt.send_raw(fr.message_frames(1, sid, fr.REQUEST, 0, envelope))   # re-used
    wait_until(lambda: len([m for m in rt.unmatched if m.stream_id == sid]) == 2, "the second answer")
    assert ttrpc_pb2.Response.FromString(rt.unmatched[-1].payload).status.code == 3
    assert handler.calls == ["Shutdown"]


def test_oversized_request_is_answered_resource_exhausted(pair):
    rt, session, handler = pair()
    sid = rt.stream_id()
    payload = bytes(fr.MAX_MESSAGE + 1)
    header = struct.pack(">IIBB", len(payload), sid, fr.REQUEST, 0)
    # As a Go writer would send it: the first 4 KiB, then the rest.
    rt.send_raw(fr.mux_frame(1, header + payload[:4086]) + fr.mux_frame(1, payload[4086:]))
    assert unmatched_response(rt, sid).status.code == 8
    assert session.counters["oversized"] == 1 and handler.calls == []
    assert configure(rt).events


def test_data_messages_and_stray_responses_are_ignored(pair):
    rt, session, handler = pair()
    rt.send_raw(fr.message_frames(1, 1001, fr.DATA, fr.FLAG_REMOTE_CLOSED, b"d"))
    rt.send_raw(fr.message_frames(1, 1003, fr.RESPONSE, 0, b""))
    rt.send_raw(fr.message_frames(2, 77, fr.RESPONSE, 0, ttrpc_pb2.Response().SerializeToString()))
    rt.send_raw(fr.message_frames(2, 79, 9, 0, b""))
    wait_until(lambda: session.counters["ignored"] == 3 and session.counters["unknown_stream"] == 1, "counts")
    assert configure(rt).events and handler.calls == ["Configure"]


# ---- bounds -------------------------------------------------------------------------------

def test_slow_handler_does_not_block_another_request(pair):
    rt, _, handler = pair()
    handler.block.add("Synchronize")
    slow = {}
    t = threading.Thread(target=lambda: slow.update(r=rt.call_plugin(
        "Synchronize", api_pb2.SynchronizeRequest(), api_pb2.SynchronizeResponse)))
    t.start()
    assert handler.entered.acquire(timeout=30)
    assert configure(rt).events            # answered while Synchronize is still running
    assert "r" not in slow
    handler.release.set()
    t.join(30)
    assert "r" in slow


def test_flood_beyond_max_inflight_is_refused_without_running_the_handler(pair):
    rt, session, handler = pair(max_inflight=2)
    handler.block.add("StateChange")
    sids = [raw_request(rt, method="StateChange") for _ in range(10)]
    refused = wait_until(lambda: [s for s in sids if any(m.stream_id == s for m in rt.unmatched)]
                         if len(rt.unmatched) >= 8 else None, "eight refusals")
    assert refused == sids[2:]
    assert all(ttrpc_pb2.Response.FromString(m.payload).status.code == 8 for m in rt.unmatched)
    handler.release.set()
    wait_until(lambda: len(rt.unmatched) == 10, "the two admitted answers")
    assert handler.calls == ["StateChange", "StateChange"]
    assert session.counters["rejected_inflight"] == 8


def test_call_times_out_and_a_late_answer_is_counted(pair):
    rt, session, _ = pair()
    rt.answer_calls = False
    with pytest.raises(TimeoutError):
        session.call("UpdateContainers", api_pb2.UpdateContainersRequest(), api_pb2.UpdateContainersResponse, 0.05)
    rt.answer(1, api_pb2.UpdateContainersResponse().SerializeToString())
    wait_until(lambda: session.counters["unknown_stream"] == 1, "the late answer counted")
    assert not session.closed


# ---- endings ------------------------------------------------------------------------------

def pending_call(session):
    """A RegisterPlugin call in a thread; its outcome (exception or result) in the dict."""
    out = {}

    def run():
        try:
            out["result"] = session.call("RegisterPlugin", api_pb2.RegisterPluginRequest(plugin_name="p"),
                                         api_pb2.Empty, 60)
        except Exception as e:  # noqa: BLE001 - the test inspects it
            out["error"] = e
    t = threading.Thread(target=run)
    t.start()
    return t, out


def test_peer_closing_mid_frame_ends_the_session_and_its_calls(pair):
    rt, session, _ = pair()
    rt.answer_calls = False
    t, out = pending_call(session)
    wait_until(lambda: rt.requests, "the call at the runtime")
    rt.send_raw(fr.mux_frame(2, b"\x00" * 20)[:15])
    rt.close()
    t.join(30)
    assert isinstance(out["error"], SessionClosed)
    assert session.wait_closed(30) and session.reason == "peer closed mid-frame"
    with pytest.raises(SessionClosed):
        session.call("RegisterPlugin", api_pb2.RegisterPluginRequest(), api_pb2.Empty, 1)


def test_peer_closing_between_frames(pair):
    rt, session, _ = pair()
    rt.close()
    assert session.wait_closed(30) and session.reason == "peer closed"


@pytest.mark.parametrize("header,why", [
    (struct.pack(">II", 1, fr.MAX_MUX_PAYLOAD + 1), "exceeds"),
    (struct.pack(">II", 3, 4), "unknown connection 3"),
    (struct.pack(">II", 0, 0), "unknown connection 0"),
])
def test_broken_mux_layer_closes_the_session(pair, header, why):
    rt, session, _ = pair()
    rt.answer_calls = False
    t, out = pending_call(session)
    wait_until(lambda: rt.requests, "the call at the runtime")
    rt.send_raw(header)
    assert session.wait_closed(30)
    assert session.reason.startswith("frame error") and why in session.reason
    t.join(30)
    assert isinstance(out["error"], SessionClosed)
    wait_until(rt.peer_closed.is_set, "the runtime seeing the plugin go")


def test_close_is_idempotent_and_unblocks_callers(pair):
    rt, session, _ = pair()
    rt.answer_calls = False
    t, out = pending_call(session)
    wait_until(lambda: rt.requests, "the call at the runtime")
    session.close()
    session.close()
    t.join(30)
    assert isinstance(out["error"], SessionClosed) and session.closed and session.reason == "closed by us"
    assert session.wait_closed(30)


def test_a_peer_that_stops_reading_ends_the_session_after_the_write_timeout(pair):
    rt, session, handler = pair(write_timeout=0.3)
    rt.reading.clear()
    req = api_pb2.CreateContainerRequest()
    req.container.name = "n" * 500_000
    envelope = ttrpc_pb2.Request(service=PLUGIN, method="CreateContainer", payload=req.SerializeToString())
    while not session.closed:
        # The answers (~0.5 MB each) fill the socket's buffers; the next write stalls.
        try:
            rt.send_raw(fr.message_frames(1, rt.stream_id(), fr.REQUEST, 0, envelope.SerializeToString()))
        except OSError:   # the session closed between the check and this send, its socket with it
            break
        session.wait_closed(0.05)
    assert session.wait_closed(30) and session.reason.startswith("write failed"), session.reason
    rt.reading.set()


def test_close_before_start(nri_loop):
    a, b = socket.socketpair()
    session = NriSession(a, Handler(), loop=nri_loop)
    session.close()
    assert session.wait_closed(0) and a.fileno() == -1
    session.start()   # no-op on a closed session
    b.close()


# ---- hostile peers, in time relative to a baseline -------------------------------------------

def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def test_hundred_thousand_tiny_frames_cost_time_in_proportion(pair):
    rt, session, handler = pair()
    configure(rt)
    n = 100_000
    wire = fr.mux_frame(1, b"") * n
    # Baseline: decoding the same bytes in this process, plus one call round trip.
    baseline = _timed(lambda: fr.MuxDecoder().feed(wire)) + _timed(lambda: configure(rt))
    before = session.counters["frames"]
    # The reader takes frames in order: once Configure is answered, the flood was read.
    elapsed = _timed(lambda: (rt.send_raw(wire), configure(rt)))
    print(f"tiny frames: {elapsed:.4f}s, baseline {baseline:.4f}s")
    assert session.counters["frames"] == before + n + 1
    assert elapsed < 50 * baseline, (elapsed, baseline)
    assert not session.closed and handler.calls.count("Configure") == 3


def test_a_request_one_byte_per_frame_and_one_byte_per_write(pair):
    rt, session, _ = pair()
    round_trips = sorted(_timed(lambda: configure(rt)) for _ in range(21))
    baseline = round_trips[10]
    sid = rt.stream_id()
    envelope = ttrpc_pb2.Request(service=PLUGIN, method="Configure",
                                 payload=api_pb2.ConfigureRequest(config="c" * 300).SerializeToString())
    message = fr.ttrpc_frame(sid, fr.REQUEST, 0, envelope.SerializeToString())
    wire = b"".join(fr.mux_frame(1, message[i:i + 1]) for i in range(len(message)))

    def dribble():
        for i in range(len(wire)):
            rt.send_raw(wire[i:i + 1])
        unmatched_response(rt, sid)
    elapsed = _timed(dribble)
    print(f"dribble: {elapsed:.4f}s, baseline {baseline:.4f}s")
    assert ttrpc_pb2.Response.FromString(rt.unmatched[-1].payload).status.code == 0
    # Each one-byte write costs a wake-up of the reader and a step of the decoders, less
    # than a whole call (two messages, a thread hand-off, protobuf): never a rescan.
    assert elapsed < len(wire) * baseline, (elapsed, baseline, len(wire))
    assert not session.closed


# ---- who runs what (issue 34: no thread between the socket and the handler) ---------------

def test_requests_are_served_on_the_loop_and_calls_from_it_are_refused_not_deadlocked(pair, nri_loop):
    # given a handler that notes the thread it runs on and tries a blocking call from there
    rt, session, handler = pair()
    seen = {}

    async def ident() -> int:
        return threading.get_ident()
    loop_thread = asyncio.run_coroutine_threadsafe(ident(), nri_loop).result(30)

    async def noting(method: str, payload: bytes) -> bytes:
        seen["thread"] = threading.get_ident()
        try:
            session.call("UpdateContainers", api_pb2.UpdateContainersRequest(), api_pb2.UpdateContainersResponse, 1)
        except RuntimeError as e:
            seen["refused"] = str(e)
        return api_pb2.ConfigureResponse(events=1).SerializeToString()
    session._handler = noting
    # when the runtime calls it
    assert configure(rt).events == 1
    # then it ran on the loop's own thread, and the blocking call was refused at once
    assert seen["thread"] == loop_thread and "await acall" in seen["refused"]
    assert not session.closed and session.counters["calls"] == 0


def test_a_thread_in_call_is_woken_when_the_session_ends_while_the_loop_is_busy(pair, nri_loop):
    # given a thread waiting in call() (the plugin's registration) for a runtime that does not answer
    rt, session, _ = pair()
    rt.answer_calls = False
    t, out = pending_call(session)
    wait_until(lambda: rt.requests, "the call at the runtime")
    # when the loop closes the session and then waits for that thread, as the daemon's stop does
    # (it stops the plugin on the loop: close, then join the plugin's thread)
    joined = {}
    done = threading.Event()

    def stop_as_the_daemon_does() -> None:
        session.close()
        t.join(30)
        joined["alive"] = t.is_alive()
        done.set()
    nri_loop.call_soon_threadsafe(stop_as_the_daemon_does)
    # then the thread is told at once, without the loop's help, and the loop is not held up
    assert done.wait(60)
    assert joined["alive"] is False and isinstance(out["error"], SessionClosed)
