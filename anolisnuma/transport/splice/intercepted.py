"""Intercepted calls: held until the pipeline decided, then sent, edited or answered.

An intercepted call whose pre-hooks need its request is held until the pipeline decided,
then the original or the edited body is sent (within containerd's window for the stream),
or the relay answers the call itself with a status (trailers-only, coded without touching
the peer's HPACK table). An intercepted call no pre-hook needs streams through and is
copied for the record; the reply of every intercepted call is copied for the post-hooks.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any, List, Optional

import structlog

from anolisnuma.cri import grpcwire
from anolisnuma.pipeline.decision import Decision
from anolisnuma.transport import h2

log = structlog.get_logger("anolisnuma.transport")

RESOURCE_EXHAUSTED = grpcwire.STATUS_CODES["RESOURCE_EXHAUSTED"]

# Charged per intercepted stream for its bookkeeping, so that a flood of streams that
# send nothing is bounded by the budget as well.
STREAM_OVERHEAD_BYTES = 1024
# Refused streams whose remaining DATA is still dropped; older ones are forgotten (their
# late DATA then reaches containerd, which ignores data of a cancelled stream).
MAX_REFUSED_REMEMBERED = 4096


class InterceptedStream:
    """Per-stream state of an intercepted call (pass-through streams carry none)."""

    __slots__ = ("sid", "call", "holding", "held", "held_len", "request_done", "copy", "copy_len",
                 "charged", "up_window", "outbox", "outbox_pos", "sends_own_body", "answered", "reply_started",
                 "reply", "reply_len", "reply_overflow", "status", "status_message", "done")

    def __init__(self, sid: int, call: Any, holding: bool, up_window: int) -> None:
        self.sid = sid
        self.call = call
        self.holding = holding        # request DATA kept until the pipeline decided
        self.held: List[bytes] = []
        self.held_len = 0
        self.request_done = False     # the kubelet sent END_STREAM
        self.copy: Optional[List[bytes]] = None if holding else []  # streamed through: copied
        self.copy_len = 0
        self.charged = 0              # bytes of the budget this stream holds
        self.up_window = up_window    # containerd's window for this stream (bodies we send)
        self.outbox = b""             # decided body waiting for containerd's stream window
        self.outbox_pos = 0
        self.sends_own_body = holding  # containerd's stream credit is ours, not the kubelet's
        self.answered = False         # we answered the kubelet ourselves
        self.reply_started = False    # containerd's response headers went to the kubelet
        self.reply: List[bytes] = []
        self.reply_len = 0
        self.reply_overflow = False
        self.status: Optional[int] = None
        self.status_message = ""
        self.done = False



class InterceptedCalls:
    """What :class:`~anolisnuma.transport.splice.Splice` does with intercepted calls (a part
    of it: the state is the splice's, see ``Splice.__init__``)."""

    def _decide(self, st: InterceptedStream) -> None:
        body = b"".join(st.held)
        st.held = []
        try:
            outcome = self.interceptor.on_request(st.call, body)
        except Exception as e:  # a failure above must never lose the kubelet's call
            outcome = self._after_failure(st, body, e)
        if isinstance(outcome, Decision):
            self._apply_decision(st, outcome, body)
        else:
            outcome.add_done_callback(lambda fut, st=st, body=body: self._decided(st, fut, body))

    def _decided(self, st: InterceptedStream, fut: "asyncio.Future[Decision]", body: bytes) -> None:
        try:  # read even when the call is over, so that no failure goes unreported
            decision: Optional[Decision] = fut.result()
            error: Optional[BaseException] = None
        except BaseException as e:
            decision, error = None, e
        if self.closed or st.done or not st.holding:
            if error is not None:
                log.error("interception failed after the call had ended", error=repr(error))
            return
        if decision is None:  # the pipeline never fails a call by accident
            decision = self._after_failure(st, body, error)
        self._apply_decision(st, decision, body)
        self._flush()

    def _after_failure(self, st: InterceptedStream, body: bytes, error: Optional[BaseException]) -> Decision:
        """The pipeline failed on a held request: its failure policy decides (refused or
        forwarded); forwarded when even that cannot be asked."""
        try:
            return self.interceptor.failed(st.call, body, error)
        except Exception as e:
            log.error("interception failed; forwarding the request unchanged", error=repr(error), then=repr(e))
            return Decision.forward(body)

    def _apply_decision(self, st: InterceptedStream, d: Decision, original: bytes) -> None:
        st.holding = False
        if d.status:
            self._answer(st, d.status, d.message)
            self._finish(st)
            return
        body = original if d.body is None else d.body
        # The held bytes become the outbox: same charge, adjusted to the edited size.
        if len(body) > st.held_len:
            self.budget.take(len(body) - st.held_len)
        else:
            self.budget.give(st.held_len - len(body))
        st.charged += len(body) - st.held_len
        st.outbox, st.outbox_pos = body, 0
        self._send_outbox(st)

    def _send_outbox(self, st: InterceptedStream) -> None:
        """Send the decided body within containerd's window for the stream; the rest waits
        for its WINDOW_UPDATE."""
        body = st.outbox
        if not body:
            self._inject_up(h2.frame(h2.DATA, h2.FLAG_END_STREAM, st.sid), ours=True)
            st.outbox = None
            return
        n = len(body)
        while st.outbox_pos < n and st.up_window > 0:
            size = min(self.k2c.max_frame, st.up_window, n - st.outbox_pos)
            start = st.outbox_pos
            st.outbox_pos += size
            last = st.outbox_pos == n
            st.up_window -= size
            st.charged -= size  # the charge moves with the frame
            self._inject_up(h2.frame(h2.DATA, h2.FLAG_END_STREAM if last else 0, st.sid, body[start:start + size]),
                            flow=size, charge=size, ours=True)
        if st.outbox_pos == n:
            st.outbox = None

    def _refuse(self, st: InterceptedStream, message: str) -> None:
        """Answer an intercepted call RESOURCE_EXHAUSTED before containerd ran it."""
        if st.done:
            return
        self.owner.call_refused(self, st.call, message)
        if not st.request_done:
            remember(self.refused, st.sid)
        self._answer(st, RESOURCE_EXHAUSTED, message)
        self._finish(st, aborted=f"refused: {message}")

    def _answer(self, st: InterceptedStream, status: int, message: str) -> None:
        """Answer the call ourselves (trailers-only); containerd, which saw its HEADERS but
        not all of its message, is told to drop it, so its handler never runs."""
        st.holding = False
        self._inject_up(h2.rst_stream(st.sid, h2.CANCEL))
        st.answered = True
        st.status, st.status_message = status, message
        self._inject_down(h2.frame(h2.HEADERS, h2.FLAG_END_HEADERS | h2.FLAG_END_STREAM, st.sid,
                                   h2.trailers_only_block(status, message, st.reply_started)))
        # containerd may have answered already, its frames crossing our RST_STREAM: the
        # kubelet's stream is over, so they are dropped (see _c2k_frame)
        remember(self.silenced, st.sid)
        self.open_streams.pop(st.sid, None)
        self._call_ended()

    def _finish(self, st: InterceptedStream, aborted: str = "") -> None:
        if st.done:
            return
        st.done = True
        self.streams.pop(st.sid, None)
        if st.charged:
            self.budget.give(st.charged)
            st.charged = 0
        st.held = []
        st.outbox = None
        if aborted:
            self.interceptor.on_abort(st.call, aborted)
            return
        # a call we answered ourselves has no reply of containerd's, whatever it began to send
        reply = b"" if st.answered else None if st.reply_overflow else b"".join(st.reply)
        st.reply = []
        # After the reply's bytes went out: bookkeeping must not delay the kubelet. The
        # kubelet's next call needs a round trip, so it is read after this has run.
        asyncio.get_running_loop().call_soon(
            self.interceptor.on_reply, st.call, reply, st.status if st.status is not None else 0,
            st.status_message, st.answered)


def remember(sids: "OrderedDict[int, None]", sid: int) -> None:
    """Add ``sid`` to a bounded set of stream ids, forgetting the oldest past the bound."""
    sids[sid] = None
    if len(sids) > MAX_REFUSED_REMEMBERED:
        sids.popitem(last=False)
