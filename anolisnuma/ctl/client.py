"""Asking the daemon over its admin socket (:mod:`anolisnuma.admin.protocol`)."""

from __future__ import annotations

import errno
import socket
from typing import Any, Dict, Optional

from anolisnuma.admin import protocol


class CtlError(Exception):
    """What went wrong, in one line for the operator."""


def ask(path: str, command: str, args: Optional[Dict[str, Any]] = None, timeout: float = 20.0) -> Any:
    """The result of ``command`` from the daemon listening on ``path``; CtlError saying why
    there is none (the daemon is not running, the socket is root only, no answer in time,
    the daemon refused the command)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        try:
            sock.connect(path)
        except FileNotFoundError:
            raise CtlError(f"the daemon is not running: there is no admin socket {path}") from None
        except ConnectionRefusedError:
            raise CtlError(f"the daemon is not running: nothing answers on {path}") from None
        except PermissionError:
            raise CtlError(f"permission denied on {path}: the admin socket is for root only") from None
        except socket.timeout:
            raise CtlError(f"the daemon does not accept connections on {path} (timed out)") from None
        except OSError as e:
            raise CtlError(f"cannot connect to {path}: {e.strerror or e}") from None
        try:
            sock.sendall(protocol.encode_request(command, args))
            data = _read_reply(sock)
        except socket.timeout:
            raise CtlError(f"no answer from the daemon within {timeout:g}s") from None
        except OSError as e:
            if e.errno in (errno.ECONNRESET, errno.EPIPE):
                raise CtlError("the daemon closed the connection without an answer") from None
            raise CtlError(f"talking to the daemon on {path}: {e.strerror or e}") from None
    finally:
        sock.close()
    if not data:
        raise CtlError("the daemon closed the connection without an answer")
    try:
        ok, value = protocol.decode_reply(data)
    except protocol.ProtocolError as e:
        raise CtlError(str(e)) from None
    if not ok:
        raise CtlError(value)
    return value


def _read_reply(sock: socket.socket) -> bytes:
    chunks = []
    size = 0
    while True:
        chunk = sock.recv(1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
        if size > protocol.MAX_REPLY_BYTES:
            raise CtlError(f"the daemon's answer is larger than {protocol.MAX_REPLY_BYTES} bytes")
        if chunk.endswith(b"\n"):
            break
    return b"".join(chunks)
