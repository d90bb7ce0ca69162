"""A raw HTTP/2 client for tests that must write what no well-behaved client writes.

Hostile-input tests need frames a gRPC library never sends (a 16 MiB HEADERS frame, an
endless CONTINUATION chain, DATA past the window, a header block that does not decode),
and need to see exactly what the proxy answers (which GOAWAY code, whether the connection
closed). :class:`RawH2Client` writes frames as given and reads frames back.

    with RawH2Client(proxy.socket_path) as c:
        c.start()
        c.send(c.headers(1, "/runtime.v1.RuntimeService/Version"))
        assert c.goaway_code() == h2.FRAME_SIZE_ERROR
"""

from __future__ import annotations

import fcntl
import socket
import struct
import termios
import time
from typing import List, NamedTuple, Optional

import hpack

from anolisnuma.transport import h2


class Frame(NamedTuple):
    type: int
    flags: int
    stream: int
    payload: bytes


class RawH2Client:
    def __init__(self, socket_path: str, timeout: float = 5.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(socket_path)
        self.encoder = hpack.Encoder()
        self.frames: List[Frame] = []
        self.eof = False
        self._buf = bytearray()

    def __enter__(self) -> "RawH2Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    # ---------------------------------------------------------------- writing
    def start(self, settings: bytes = b"") -> None:
        """The client preface and a SETTINGS frame."""
        self.send(h2.PREFACE + h2.frame(h2.SETTINGS, 0, 0, settings))

    def send(self, data: bytes) -> bool:
        """Write ``data``; False when the proxy closed the connection meanwhile."""
        try:
            self.sock.sendall(data)
            return True
        except (BrokenPipeError, ConnectionResetError):
            return False

    @staticmethod
    def frame(ftype: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
        return h2.frame(ftype, flags, stream, payload)

    def header_block(self, path: str, extra: Optional[list] = None) -> bytes:
        headers = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "localhost"),
                   ("content-type", "application/grpc"), ("te", "trailers")] + list(extra or [])
        return self.encoder.encode(headers)

    def headers(self, stream: int, path: str, end_stream: bool = False) -> bytes:
        """A HEADERS frame opening a gRPC call of ``path`` on ``stream``."""
        flags = h2.FLAG_END_HEADERS | (h2.FLAG_END_STREAM if end_stream else 0)
        return h2.frame(h2.HEADERS, flags, stream, self.header_block(path))

    # ---------------------------------------------------------------- reading
    def read(self, timeout: float = 5.0, until=None) -> List[Frame]:
        """Read frames until ``until(frame)`` is true for one, the connection closes, or
        ``timeout`` passes; returns the frames read by this call."""
        deadline = time.monotonic() + timeout
        got: List[Frame] = []
        while not self.eof:
            frame = self._next_frame()
            if frame is not None:
                got.append(frame)
                self.frames.append(frame)
                if until is not None and until(frame):
                    break
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(1 << 16)
            except socket.timeout:
                break
            except (ConnectionResetError, BrokenPipeError):
                chunk = b""
            if not chunk:
                self.eof = True
            self._buf += chunk
        return got

    def _next_frame(self) -> Optional[Frame]:
        if len(self._buf) < h2.FRAME_HEADER_LEN:
            return None
        length, ftype, flags, stream = h2.parse_frame_header(self._buf)
        end = h2.FRAME_HEADER_LEN + length
        if len(self._buf) < end:
            return None
        payload = bytes(self._buf[h2.FRAME_HEADER_LEN:end])
        del self._buf[:end]
        return Frame(ftype, flags, stream, payload)

    def unread_bytes(self) -> int:
        """Bytes the proxy wrote that wait in this socket's receive buffer, unread."""
        return struct.unpack("i", fcntl.ioctl(self.sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]

    def goaway_code(self, timeout: float = 5.0) -> Optional[int]:
        """The error code of the GOAWAY the proxy sent (reading until one arrives or the
        connection closes); None if none came."""
        for f in self.frames:
            if f.type == h2.GOAWAY:
                return int.from_bytes(f.payload[4:8], "big")
        for f in self.read(timeout, until=lambda f: f.type == h2.GOAWAY):
            if f.type == h2.GOAWAY:
                return int.from_bytes(f.payload[4:8], "big")
        return None

    def wait_closed(self, timeout: float = 5.0) -> bool:
        """Read (and keep) frames until the proxy closes the connection; True if it did."""
        self.read(timeout)
        return self.eof


def flood_held_streams(socket_path: str, path: str, streams: int, chunk_bytes: int = 16384) -> int:
    """Open ``streams`` calls of ``path`` on one connection, each sending ``chunk_bytes``
    of a (much longer) gRPC message and never finishing, while honouring flow control the
    way a real client does (the ``h2`` library keeps the windows). Returns how many calls
    the proxy answered (refused) meanwhile."""
    from h2.config import H2Configuration
    from h2.connection import H2Connection
    from h2.events import ResponseReceived

    conn = H2Connection(H2Configuration(client_side=True, header_encoding=None))
    conn.initiate_connection()
    headers = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", path.encode()),
               (b":authority", b"localhost"), (b"content-type", b"application/grpc"), (b"te", b"trailers")]
    chunk = b"\x00" + (1 << 20).to_bytes(4, "big") + b"x" * (chunk_bytes - 5)
    answered = 0
    with RawH2Client(socket_path, timeout=10) as c:

        def exchange() -> None:
            nonlocal answered
            c.read(timeout=5, until=lambda f: f.type == h2.WINDOW_UPDATE)
            if c.eof:
                raise RuntimeError("the proxy closed a well-behaved connection")
            raw = b"".join(h2.frame(f.type, f.flags, f.stream, f.payload) for f in c.frames)
            c.frames.clear()
            answered += sum(isinstance(e, ResponseReceived) for e in conn.receive_data(raw))
            c.send(conn.data_to_send())

        c.send(conn.data_to_send())
        for _ in range(streams):
            sid = conn.get_next_available_stream_id()
            conn.send_headers(sid, headers)
            while conn.local_flow_control_window(sid) < len(chunk):
                exchange()
            conn.send_data(sid, chunk)
            c.send(conn.data_to_send())
        c.read(timeout=0.5)
        exchange()
    return answered
