"""transport.conn.Conn on a socket pair: the parts the relay's end-to-end tests reach
only by accident."""

from __future__ import annotations

import asyncio
import socket
from typing import List, Optional

from anolisnuma.transport.conn import HIGH_WATER, LOW_WATER, Conn, ReadBuffer


class Owner:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.data: List[bytes] = []
        self.events: List[str] = []
        self.lost: Optional[asyncio.Future] = None

    def data_received(self, data: memoryview) -> None:
        if self.fail:
            raise RuntimeError("receiver bug")
        self.data.append(bytes(data))

    def eof_received(self) -> None:
        self.events.append("eof")

    def connection_lost(self, exc: Optional[BaseException]) -> None:
        self.events.append(f"lost {type(exc).__name__ if exc else None}")
        if self.lost is not None and not self.lost.done():
            self.lost.set_result(exc)

    def pause_writing(self) -> None:
        self.events.append("pause")

    def resume_writing(self) -> None:
        self.events.append("resume")


async def _until(cond, loop: asyncio.AbstractEventLoop, timeout: float = 10.0) -> None:
    """Let the loop run until ``cond()`` holds; fails after ``timeout`` seconds."""
    deadline = loop.time() + timeout
    while not cond():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0)


def test_a_receiver_that_fails_ends_the_connection():
    async def main() -> None:
        loop = asyncio.get_running_loop()
        errors = []
        loop.set_exception_handler(lambda lp, ctx: errors.append(ctx))
        ours, peer = socket.socketpair()
        owner = Owner(fail=True)
        owner.lost = loop.create_future()
        conn = Conn(loop, ours, owner, ReadBuffer())
        conn.resume_reading()
        peer.sendall(b"frames")
        exc = await asyncio.wait_for(owner.lost, 5)
        assert isinstance(exc, RuntimeError)
        assert conn.closed and errors and errors[0]["exception"] is exc
        peer.setblocking(False)
        await _until(lambda: _peer_sees_eof(peer), loop)
        peer.close()

    asyncio.run(main())


def _peer_sees_eof(peer: socket.socket) -> bool:
    try:
        return peer.recv(1) == b""
    except BlockingIOError:
        return False


def test_unsent_bytes_are_kept_copied_and_flow_control_is_signalled():
    async def main() -> None:
        loop = asyncio.get_running_loop()
        ours, peer = socket.socketpair()
        owner = Owner()
        conn = Conn(loop, ours, owner, ReadBuffer())
        scratch = bytearray(b"x" * (4 << 20))
        conn.write(memoryview(scratch))       # more than the kernel takes at once
        assert conn.get_write_buffer_size() > HIGH_WATER and owner.events == ["pause"]
        scratch[:] = b"y" * len(scratch)      # what the relay's next read would do
        got = bytearray()
        peer.setblocking(False)

        def drained() -> bool:
            try:
                while True:
                    chunk = peer.recv(1 << 20)
                    if not chunk:
                        return True
                    got.extend(chunk)
            except BlockingIOError:
                pass
            return len(got) == 4 << 20

        await _until(drained, loop)
        assert bytes(got) == b"x" * (4 << 20)
        await _until(lambda: conn.get_write_buffer_size() <= LOW_WATER and "resume" in owner.events, loop)
        conn.close()
        await _until(lambda: any(e.startswith("lost") for e in owner.events), loop)
        peer.close()

    asyncio.run(main())
