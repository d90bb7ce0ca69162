"""The admin socket on its own: root-only hygiene, the one-line JSON protocol, and clients
that cannot hold the daemon (stalled, oversized, garbage, too many at once)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat
import time
from typing import Any, Callable, Dict, List

import grpc
import pytest

from anolisnuma.admin import protocol
from anolisnuma.admin.server import AdminServer, CommandError
from anolisnuma.testing.fake_cri import FakeCri
from anolisnuma.testing.proxy import InProcessProxy, make_config
from anolisnuma.testing.waiting import wait_until
from anolisnuma.transport.listener import ListenerError
from cri_proto import api_pb2 as pb


def raw_request(path: str, data: bytes, timeout: float = 5.0, shut: bool = False) -> Dict[str, Any]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(path)
        s.sendall(data)
        if shut:
            s.shutdown(socket.SHUT_WR)
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    finally:
        s.close()
    return json.loads(buf)


async def echo(command: str, args: Dict[str, Any]) -> Any:
    if command == "echo":
        return {"args": args}
    if command == "slow":
        await asyncio.sleep(args.get("seconds", 1))
        return "done"
    if command == "refuse":
        raise CommandError("no, because")
    if command == "crash":
        raise RuntimeError("a bug")
    raise CommandError(f"unknown command {command!r}")


def serve(path: str, client: Callable[..., Any], unhandled: Any = None, with_server: bool = False,
          **kw: Any) -> Any:
    """Run an AdminServer on a fresh loop while ``client()`` (``client(server)`` with
    ``with_server``) runs in a thread; its result. ``unhandled``: a list that gets what
    reached the loop's exception handler."""
    async def main() -> Any:
        if unhandled is not None:
            asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: unhandled.append(ctx))
        server = AdminServer(path, echo, **kw)
        await server.start()
        args = (server,) if with_server else ()
        try:
            return await asyncio.get_running_loop().run_in_executor(None, client, *args)
        finally:
            await server.close()
    return asyncio.run(main())


def test_the_socket_is_root_only_and_removed_at_close(sockdir):
    path = os.path.join(sockdir, "admin.sock")

    def client() -> Any:
        st = os.stat(path)
        return stat.S_IMODE(st.st_mode), st.st_uid, raw_request(path, protocol.encode_request("echo", {"x": 1}))

    mode, uid, reply = serve(path, client)
    assert mode == 0o600
    assert uid == os.geteuid()
    assert reply == {"ok": True, "result": {"args": {"x": 1}}}
    assert not os.path.exists(path)


def test_a_stale_socket_is_replaced_and_a_live_one_refused(sockdir):
    path = os.path.join(sockdir, "admin.sock")
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(path)
    stale.close()   # a socket file nobody listens on: what a crash leaves
    assert serve(path, lambda: raw_request(path, b'{"command":"echo"}\n'))["ok"]

    live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    live.bind(path)
    live.listen(1)
    try:
        with pytest.raises(ListenerError, match="another process is listening"):
            serve(path, lambda: None)
    finally:
        live.close()
        os.unlink(path)


def test_errors_are_one_json_line_and_the_server_goes_on(sockdir):
    path = os.path.join(sockdir, "admin.sock")

    def client() -> List[Dict[str, Any]]:
        return [raw_request(path, b"not json\n"),
                raw_request(path, b'["status"]\n'),
                raw_request(path, b'{"command": "echo", "args": [1]}\n'),
                raw_request(path, protocol.encode_request("nope")),
                raw_request(path, protocol.encode_request("refuse")),
                raw_request(path, protocol.encode_request("crash")),
                raw_request(path, b'{"command": "echo"}', shut=True),     # no newline, then EOF
                raw_request(path, b"x" * (protocol.MAX_REQUEST_BYTES + 10)),
                raw_request(path, protocol.encode_request("echo", {"still": "here"}))]

    replies = serve(path, client)
    assert [r["ok"] for r in replies] == [False, False, False, False, False, False, True, False, True]
    assert "not a JSON object" in replies[0]["error"]
    assert '"command"' in replies[1]["error"]
    assert '"args"' in replies[2]["error"]
    assert "unknown command 'nope'" in replies[3]["error"]
    assert replies[4]["error"] == "no, because"
    assert "internal error" in replies[5]["error"] and "a bug" in replies[5]["error"]
    assert f"larger than {protocol.MAX_REQUEST_BYTES} bytes" in replies[7]["error"]
    assert replies[8]["result"] == {"args": {"still": "here"}}


def test_deeply_nested_json_gets_an_error_reply_not_a_traceback(sockdir):
    path = os.path.join(sockdir, "admin.sock")
    depth = protocol.MAX_REQUEST_BYTES // 2 - 100   # deep enough for json's recursion limit, under the cap
    nested = [b"[" * depth + b"]" * depth,
              b'{"command": "echo", "args": {"a": ' + b"[" * depth + b"]" * depth + b"}}",
              b'{"a":' * (depth // 5) + b"1" + b"}" * (depth // 5)]

    def client() -> List[Dict[str, Any]]:
        return [raw_request(path, n + b"\n") for n in nested] + \
            [raw_request(path, protocol.encode_request("echo", {"still": "here"}))]

    unhandled: List[Any] = []
    replies = serve(path, client, unhandled=unhandled)
    assert [r["ok"] for r in replies] == [False, False, False, True]
    assert all("nested too deeply" in r["error"] for r in replies[:3])
    assert unhandled == []


def test_a_stalled_client_is_dropped_and_does_not_hold_the_others(sockdir):
    path = os.path.join(sockdir, "admin.sock")
    read_timeout = 3.0

    def client() -> Any:
        stalled = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stalled.connect(path)
        stalled.sendall(b'{"command": ')    # and nothing more
        started = time.monotonic()
        other = raw_request(path, protocol.encode_request("echo"))
        # Not held by the stalled one: answered while the stalled one still waits for its drop
        # (a server serving one client at a time would have dropped it first).
        stalled.setblocking(False)
        try:
            early = stalled.recv(65536)
        except BlockingIOError:
            early = None
        stalled.settimeout(read_timeout + 10)
        reply = stalled.recv(65536)
        dropped_after = time.monotonic() - started
        stalled.close()
        return other, early, json.loads(reply), dropped_after

    other, early, stalled_reply, dropped_after = serve(path, client, read_timeout=read_timeout)
    assert other["ok"] and early is None
    assert stalled_reply == {"ok": False, "error": "no complete request within 3s"}
    assert read_timeout - 0.5 < dropped_after < read_timeout + 10


def test_a_slow_command_times_out_and_too_many_clients_are_told_busy(sockdir):
    path = os.path.join(sockdir, "admin.sock")

    def client(server: AdminServer) -> Any:
        timed_out = raw_request(path, protocol.encode_request("slow", {"seconds": 5}))
        holders = []
        for _ in range(2):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(path)
            holders.append(s)
        wait_until(lambda: len(server._clients) == 2, "the server to take both holders")
        busy = raw_request(path, protocol.encode_request("echo"))
        for s in holders:
            s.close()
        return timed_out, busy

    timed_out, busy = serve(path, client, with_server=True, command_timeout=0.3, max_clients=2, read_timeout=2)
    assert timed_out == {"ok": False, "error": "slow: no answer within 0.3s"}
    assert not busy["ok"] and busy["error"].startswith("busy:")


def test_a_peer_that_is_not_root_is_refused_even_if_the_mode_lets_it_in(sockdir):
    if os.geteuid() != 0:
        pytest.skip("needs root to become another user")
    path = os.path.join(sockdir, "admin.sock")
    os.chmod(sockdir, 0o755)

    def client() -> Any:
        os.chmod(path, 0o666)   # someone loosened the mode by hand
        return as_user(65534, lambda: raw_request(path, protocol.encode_request("echo")))

    reply = serve(path, client)
    assert reply == {"ok": False, "error": "permission denied: the admin socket is for root only"}


def as_user(uid: int, fn: Callable[[], Any]) -> Any:
    """``fn()`` in a forked child running as ``uid``; its JSON-able result (or its error)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:   # child: no logging, no threads of its own, just the call
        os.close(r)
        code = 0
        try:
            os.setgid(uid)
            os.setuid(uid)
            out = json.dumps({"result": fn()})
        except BaseException as e:
            out = json.dumps({"error": f"{type(e).__name__}: {e}"})
            code = 1
        os.write(w, out.encode())
        os._exit(code)
    os.close(w)
    chunks = []
    while True:
        chunk = os.read(r, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(r)
    os.waitpid(pid, 0)
    data = json.loads(b"".join(chunks))
    if "error" in data:
        raise AssertionError(data["error"])
    return data["result"]


def test_a_taken_admin_socket_costs_the_daemon_nothing_but_the_socket(sockdir):
    path = os.path.join(sockdir, "admin.sock")
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    other.bind(path)
    other.listen(1)     # another process answers there
    fake = FakeCri(os.path.join(sockdir, "cri-backend.sock"), containers=0, sandboxes=0).start()
    try:
        with InProcessProxy(make_config(sockdir, fake.socket_path, admin_socket=path), hooks=[]) as proxy:
            wait_until(lambda: proxy.daemon.ready, "the daemon to be ready")
            assert proxy.daemon.admin.server is None
            [line] = [x for x in proxy.log_lines() if x.get("message", "").startswith("admin socket unavailable")]
            assert line["level"] == "error" and "another process is listening" in line["error"]
            with grpc.insecure_channel(proxy.address) as ch:    # the kubelet is still served
                version = ch.unary_unary("/runtime.v1.RuntimeService/Version",
                                         request_serializer=pb.VersionRequest.SerializeToString,
                                         response_deserializer=pb.VersionResponse.FromString)
                assert version(pb.VersionRequest(), timeout=5).runtime_name == "fake-cri"
        assert os.path.exists(path)     # the other process's socket is left alone
    finally:
        fake.stop(0)
        other.close()
