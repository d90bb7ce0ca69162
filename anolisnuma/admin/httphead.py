"""Just enough HTTP/1.x for the metrics endpoint: read one request head, within limits,
and write one answer.

A scraper sends ``GET /metrics HTTP/1.1`` and a few headers, ~300 bytes. Anything beyond
:data:`MAX_LINE_BYTES` on one line or :data:`MAX_HEAD_BYTES` / :data:`MAX_HEADERS` in all
is answered at once (414 for the request line, 431 for the headers) and never buffered
further, so what a connection can make the daemon hold is bounded before any timeout
applies. A request body is never read: the answer is written and the connection closed.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from http import HTTPStatus
from typing import Dict, Iterable, Tuple

MAX_LINE_BYTES = 4096     # the StreamReader's limit: no line is buffered beyond it
MAX_HEAD_BYTES = 8192
MAX_HEADERS = 64


class HttpError(Exception):
    """A request answered with ``status`` (4xx) and closed; ``headers`` go with it."""

    def __init__(self, status: int, why: str, headers: Iterable[Tuple[str, str]] = ()) -> None:
        super().__init__(why)
        self.status = status
        self.headers = list(headers)

    def answer(self) -> bytes:
        return response(self.status, self.headers, (str(self) + "\n").encode())


class ClientGone(Exception):
    """The client closed (or reset) its side before its request head was complete."""


@dataclass(frozen=True)
class Request:
    method: str
    path: str                  # the target without its query string
    headers: Dict[str, str]    # names in lower case; a repeated header keeps its last value


async def read_request(reader: asyncio.StreamReader) -> Request:
    """The next request head on ``reader``; :class:`HttpError` when it breaks a limit or is
    not HTTP/1.x, :class:`ClientGone` when the client closed first. No timeout of its
    own: the caller bounds the whole head."""
    line = await _line(reader, HTTPStatus.REQUEST_URI_TOO_LONG)
    method, path = _request_line(line)
    size = len(line)
    headers: Dict[str, str] = {}
    while True:
        line = await _line(reader, HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE)
        if line in (b"\r\n", b"\n"):
            return Request(method, path, headers)
        size += len(line)
        if size > MAX_HEAD_BYTES or len(headers) >= MAX_HEADERS:
            raise HttpError(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                            f"request head larger than {MAX_HEAD_BYTES} bytes or {MAX_HEADERS} headers")
        name, sep, value = line.partition(b":")
        if not sep or not name.strip():
            raise HttpError(HTTPStatus.BAD_REQUEST, "malformed header line")
        headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")


async def _line(reader: asyncio.StreamReader, too_long: int) -> bytes:
    try:
        return await reader.readuntil(b"\n")
    except asyncio.LimitOverrunError:
        raise HttpError(too_long, f"a line longer than {MAX_LINE_BYTES} bytes") from None
    except (asyncio.IncompleteReadError, ConnectionError):
        raise ClientGone() from None


def _request_line(line: bytes) -> Tuple[str, str]:
    parts = line.decode("latin-1").split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise HttpError(HTTPStatus.BAD_REQUEST, "not an HTTP/1.x request line")
    method, target, _version = parts
    return method, target.partition("?")[0]


def response(status: int, headers: Iterable[Tuple[str, str]], body: bytes, *, send_body: bool = True) -> bytes:
    """A complete ``HTTP/1.1`` answer that closes the connection; ``Content-Length`` is
    ``len(body)`` even when ``send_body`` is false (HEAD)."""
    phrase = HTTPStatus(status).phrase
    lines = [f"HTTP/1.1 {int(status)} {phrase}"]
    lines += [f"{name}: {value}" for name, value in headers]
    lines += [f"Content-Length: {len(body)}", "Connection: close", "", ""]
    head = "\r\n".join(lines).encode("latin-1")
    return head + body if send_body else head


__all__ = ["ClientGone", "HttpError", "MAX_HEADERS", "MAX_HEAD_BYTES", "MAX_LINE_BYTES", "Request",
           "read_request", "response"]
