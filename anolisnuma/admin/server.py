"""The admin socket: a unix socket for root only, served on the daemon's event loop.

Hygiene is the CRI socket's (:class:`~anolisnuma.transport.listener.UnixListener`): a lock
file beside it, a stale socket removed, a live one refused; the socket is made with mode
0600 before anyone can connect, and a peer whose uid is neither root nor the daemon's is
refused as well (``SO_PEERCRED``), whatever the file's mode became.

A client cannot hold the daemon: the request must arrive within :data:`READ_TIMEOUT`
seconds and :data:`~anolisnuma.admin.protocol.MAX_REQUEST_BYTES`, a command gets
:data:`COMMAND_TIMEOUT` seconds, the reply must be taken within :data:`WRITE_TIMEOUT`
seconds, and at most :data:`MAX_CLIENTS` connections are served at once (the others are
told the daemon is busy).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, Awaitable, Callable, Dict, Optional, Set, Tuple

import structlog

from anolisnuma.admin import protocol
from anolisnuma.system.peercred import peer_credentials
from anolisnuma.transport.listener import UnixListener

log = structlog.get_logger("anolisnuma.admin")

SOCKET_MODE = 0o600
READ_TIMEOUT = 5.0
COMMAND_TIMEOUT = 15.0
WRITE_TIMEOUT = 5.0
MAX_CLIENTS = 8

Dispatch = Callable[[str, Dict[str, Any]], Awaitable[Any]]


class CommandError(Exception):
    """A command that cannot be carried out; its message goes to the client as is."""


class AdminServer:
    """``AdminServer(path, dispatch)``: ``await start()`` (raises ListenerError with a
    message an operator can act on), ``await close()``. ``dispatch(command, args)`` returns
    the result (anything JSON can carry) or raises :class:`CommandError`."""

    def __init__(self, path: str, dispatch: Dispatch, *, max_clients: int = MAX_CLIENTS,
                 read_timeout: float = READ_TIMEOUT, command_timeout: float = COMMAND_TIMEOUT,
                 write_timeout: float = WRITE_TIMEOUT) -> None:
        self.path = path
        self.dispatch = dispatch
        self.max_clients = max_clients
        self.read_timeout = read_timeout
        self.command_timeout = command_timeout
        self.write_timeout = write_timeout
        self.listener = UnixListener(path, SOCKET_MODE, backlog=64)
        self._server: Optional[asyncio.AbstractServer] = None
        self._clients: Set["asyncio.Task[Any]"] = set()

    async def start(self) -> None:
        sock = self.listener.open()
        self._server = await asyncio.start_unix_server(self._serve, sock=sock,
                                                       limit=protocol.MAX_REQUEST_BYTES)

    async def close(self) -> None:
        """Stop listening, remove the socket, end the connections being served."""
        if self._server is not None:
            self._server.close()
            self._server = None
        self.listener.close()
        clients = list(self._clients)
        for task in clients:
            task.cancel()
        if clients:
            await asyncio.gather(*clients, return_exceptions=True)

    # ---------------------------------------------------------------- one connection
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        busy = len(self._clients) >= self.max_clients
        if task is not None:
            self._clients.add(task)
        try:
            try:
                reply = await self._answer(reader, writer, busy)
            except Exception as e:   # every request gets a reply, whatever it held
                log.error("admin request failed", error=repr(e)[:300])
                reply = protocol.encode_error(f"internal error: {type(e).__name__}")
            writer.write(reply)
            await asyncio.wait_for(writer.drain(), self.write_timeout)
        except (asyncio.TimeoutError, ConnectionError):
            pass  # a client that does not read its reply: dropped
        finally:
            if task is not None:
                self._clients.discard(task)
            if writer.transport.get_write_buffer_size():
                writer.transport.abort()   # never wait on a client that does not read
            else:
                writer.close()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, busy: bool) -> bytes:
        # The request is read (within the read timeout) even when it will be refused, so
        # that the client gets the reason rather than a reset connection.
        try:
            line = await asyncio.wait_for(reader.readuntil(b"\n"), self.read_timeout)
        except asyncio.IncompleteReadError as e:   # closed its side without a newline
            line = e.partial
        except asyncio.LimitOverrunError:
            return protocol.encode_error(f"request larger than {protocol.MAX_REQUEST_BYTES} bytes")
        except asyncio.TimeoutError:
            return protocol.encode_error(f"no complete request within {self.read_timeout:g}s")
        pid, uid = _peer(writer)
        if uid is not None and uid not in (0, os.geteuid()):
            log.warning("admin socket: connection refused", peer_uid=uid, peer_pid=pid)
            return protocol.encode_error("permission denied: the admin socket is for root only")
        if busy:
            return protocol.encode_error(f"busy: {self.max_clients} admin requests are being served; retry")
        try:
            command, args = protocol.decode_request(line)
        except protocol.ProtocolError as e:
            return protocol.encode_error(str(e))
        logger = log.info if command == "reload" else log.debug
        logger("admin command", command=command, peer_pid=pid)
        try:
            result = await asyncio.wait_for(self.dispatch(command, args), self.command_timeout)
        except CommandError as e:
            return protocol.encode_error(str(e))
        except asyncio.TimeoutError:
            return protocol.encode_error(f"{command}: no answer within {self.command_timeout:g}s")
        except Exception as e:  # a bug in a view must not take the daemon down
            log.exception("admin command failed", command=command)
            return protocol.encode_error(f"{command}: internal error: {e!r}")
        return protocol.encode_result(result)


def _peer(writer: asyncio.StreamWriter) -> Tuple[Optional[int], Optional[int]]:
    """(pid, uid) of the connected process, or (None, None) where the kernel does not say."""
    cred = peer_credentials(writer.get_extra_info("socket"))
    return (None, None) if cred is None else (cred.pid, cred.uid)
