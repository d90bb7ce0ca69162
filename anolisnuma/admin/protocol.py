"""The admin socket's wire format, shared by the daemon and ``anolisnuma-ctl``.

One request per connection: a JSON object on one line, ``{"command": "status"}`` or
``{"command": "explain", "args": {"pod": "default/web-0"}}``; one reply, a JSON object on one
line: ``{"ok": true, "result": ...}`` or ``{"ok": false, "error": "..."}``; then the daemon
closes the connection.
"""

from __future__ import annotations

import json
from typing import Any, Dict, Optional, Tuple

MAX_REQUEST_BYTES = 64 * 1024      # a request names a command and a pod: far below this
MAX_REPLY_BYTES = 64 * 1024 * 1024  # what a client reads at most (pods of a full node: ~1 MB)


class ProtocolError(ValueError):
    """A request or reply that does not follow the format; the message says how."""


def encode_request(command: str, args: Optional[Dict[str, Any]] = None) -> bytes:
    body: Dict[str, Any] = {"command": command}
    if args:
        body["args"] = args
    return json.dumps(body, separators=(",", ":")).encode() + b"\n"


def decode_request(line: bytes) -> Tuple[str, Dict[str, Any]]:
    """``(command, args)`` of a request line; ProtocolError when it is not one."""
    try:
        body = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ProtocolError("the request is not a JSON object on one line") from None
    except RecursionError:   # json's C parser recurses once per level of nesting
        raise ProtocolError("the request is nested too deeply") from None
    if not isinstance(body, dict) or not isinstance(body.get("command"), str):
        raise ProtocolError('the request must be a JSON object with a "command" string')
    args = body.get("args", {})
    if not isinstance(args, dict):
        raise ProtocolError('"args" must be a JSON object')
    return body["command"], args


def encode_result(result: Any) -> bytes:
    return json.dumps({"ok": True, "result": result}, separators=(",", ":"), default=str).encode() + b"\n"


def encode_error(message: str) -> bytes:
    return json.dumps({"ok": False, "error": message}, separators=(",", ":")).encode() + b"\n"


def decode_reply(data: bytes) -> Tuple[bool, Any]:
    """``(True, result)`` or ``(False, error message)``; ProtocolError for anything else."""
    try:
        body = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ProtocolError("the daemon's reply is not JSON") from None
    if not isinstance(body, dict) or not isinstance(body.get("ok"), bool):
        raise ProtocolError("the daemon's reply has no \"ok\" field")
    if body["ok"]:
        return True, body.get("result")
    return False, str(body.get("error", "unknown error"))
