"""One side of a splice on a raw non-blocking unix socket, driven by the event loop.

Why not asyncio's transports: a pass-through call is two wake-ups of the relay, and at
that rate the protocol machinery is a measurable share of it (issue 10: a bare byte relay
on asyncio protocols cost ~74 µs of CPU per Version call, the same relay on the loop's
reader callbacks ~67 µs). Here a wake-up is one ``recv_into`` into a buffer the relay
reuses for every read (no 256 KiB bytes object allocated and shrunk per read) and, in the
usual case, one ``send`` straight from that buffer.

The buffer is shared by every connection of the relay and valid only during the
``data_received`` call: a receiver must copy whatever it keeps (the splice copies frames
it hands on, and ``write`` copies what the socket did not take at once).

The interface is the part of ``asyncio.Transport`` the splice uses (``write``,
``pause_reading``/``resume_reading``, ``get_write_buffer_size``, ``close``, ``abort``),
with the same flow-control callbacks to the owner: ``pause_writing`` above
:data:`HIGH_WATER` bytes unsent, ``resume_writing`` back at :data:`LOW_WATER`, then
``eof_received`` and ``connection_lost``.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any, Callable, Optional

# asyncio's default write-buffer limits, which the relay's flow control was built on.
HIGH_WATER = 64 * 1024
LOW_WATER = 16 * 1024
READ_BYTES = 256 * 1024   # as asyncio reads
# The kernel's send buffer of each side (the default, net.core.wmem_default, is ~208 KiB):
# a 0.76 MiB list reply then goes out in one send per read instead of a partial send, a
# copy into ``out`` and a wake-up per 208 KiB (issue 10: -15 % proxy CPU per list and
# -0.05 ms at p50). It is kernel memory, taken only while a peer does not read, and the
# relay's own flow control and budgets still start where it ends.
SEND_BUFFER_BYTES = 1 << 20
_SO_SNDBUFFORCE = getattr(socket, "SO_SNDBUFFORCE", 32)   # past net.core.wmem_max (root)


class ReadBuffer:
    """The buffer every connection of one relay (one event loop) reads into."""

    __slots__ = ("buf", "view")

    def __init__(self, size: int = READ_BYTES) -> None:
        self.buf = bytearray(size)
        self.view = memoryview(self.buf)


class Conn:
    """A connected non-blocking socket relayed on ``loop``; events go to ``owner``."""

    __slots__ = ("loop", "sock", "fd", "owner", "on_data", "rb", "out", "reading", "closing", "closed",
                 "writing_paused", "__weakref__")

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, owner: Any, rb: ReadBuffer,
                 on_data: Optional[Callable[[memoryview], None]] = None) -> None:
        sock.setblocking(False)
        try:
            sock.setsockopt(socket.SOL_SOCKET, _SO_SNDBUFFORCE, SEND_BUFFER_BYTES)
        except OSError:  # not root: as far as net.core.wmem_max allows
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
            except OSError:
                pass
        self.loop = loop
        self.sock = sock
        self.fd = sock.fileno()
        self.owner = owner
        # what gets the bytes read: owner.data_received unless given (one call less per read)
        self.on_data = on_data or owner.data_received
        self.rb = rb
        self.out = bytearray()   # what the socket has not taken yet
        self.reading = False
        self.closing = False     # close() called: ends once ``out`` is written
        self.closed = False
        self.writing_paused = False

    # ------------------------------------------------------------------ reading
    def resume_reading(self) -> None:
        if not self.reading and not self.closing and not self.closed:
            self.reading = True
            self.loop.add_reader(self.fd, self._read_ready)

    def pause_reading(self) -> None:
        if self.reading:
            self.reading = False
            self.loop.remove_reader(self.fd)

    def is_reading(self) -> bool:
        return self.reading

    def _read_ready(self) -> None:
        rb = self.rb
        try:
            n = self.sock.recv_into(rb.buf)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._close_now(e)
            return
        if not n:
            self.pause_reading()
            self.owner.eof_received()
            return
        try:
            self.on_data(rb.view[:n])
        except Exception as e:
            # As asyncio's transports do: a receiver that failed mid-read may have lost
            # its place in the byte stream, so the connection ends rather than going on.
            self.loop.call_exception_handler({"message": "relay: reading a connection failed",
                                              "exception": e, "transport": self})
            self._close_now(e)

    # ------------------------------------------------------------------ writing
    def write(self, data: Any) -> None:
        if self.closed or not data:
            return
        if not self.out:
            try:
                n = self.sock.send(data)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError as e:
                self._close_now(e)
                return
            if n == len(data):
                return
            self.out += data[n:]   # a copy: ``data`` may be a view of the read buffer
            self.loop.add_writer(self.fd, self._write_ready)
        else:
            self.out += data
        if not self.writing_paused and len(self.out) > HIGH_WATER:
            self.writing_paused = True
            self.owner.pause_writing()

    def _write_ready(self) -> None:
        try:
            n = self.sock.send(self.out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._close_now(e)
            return
        del self.out[:n]
        if not self.out:
            self.loop.remove_writer(self.fd)
            if self.closing:
                self._close_now(None)
                return
        if self.writing_paused and len(self.out) <= LOW_WATER:
            self.writing_paused = False
            self.owner.resume_writing()

    def get_write_buffer_size(self) -> int:
        return len(self.out)

    # ------------------------------------------------------------------ ending
    def close(self) -> None:
        """Stop reading; end the connection once what was written went out."""
        if self.closing or self.closed:
            return
        self.closing = True
        self.pause_reading()
        if not self.out:
            self._close_now(None)

    def abort(self) -> None:
        self._close_now(None)

    def _close_now(self, exc: Optional[BaseException]) -> None:
        if self.closed:
            return
        self.closed = True
        self.pause_reading()
        if self.out:
            self.loop.remove_writer(self.fd)
            self.out = bytearray()
        self.sock.close()
        # like asyncio: the owner hears of it from the loop, never inside its own call
        self.loop.call_soon(self.owner.connection_lost, exc)
