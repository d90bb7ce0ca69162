"""What the pipeline tells the relay to do with an intercepted request."""

from __future__ import annotations

from typing import Optional


class Decision:
    __slots__ = ("body", "status", "message")

    def __init__(self, body: Optional[bytes] = None, status: int = 0, message: str = "") -> None:
        self.body = body          # the gRPC body to forward (original or edited)
        self.status = status      # non-zero: answer the call with this gRPC status instead
        self.message = message

    @classmethod
    def forward(cls, body: bytes) -> "Decision":
        return cls(body=body)

    @classmethod
    def refuse(cls, status: int, message: str) -> "Decision":
        return cls(status=status, message=message)
