"""Flow control and the memory budget: what the splice may send, and what it may hold.

What the relay holds it has received on the kubelet's behalf, so it credits the kubelet at
once (connection and stream WINDOW_UPDATE) and charges the bytes to a memory budget
(:mod:`~anolisnuma.transport.budget`); a held call never blocks the other calls of its
connection, whatever its size. Bytes the relay sends itself (held bodies, edits) are metered
within containerd's connection and stream windows, which the relay follows; the credit
containerd later returns for them is kept from the kubelet (``conn_debt``), since the
kubelet had it already. When a budget is spent, the newest held calls are refused with
RESOURCE_EXHAUSTED, never stalled and never passed unpoliced.

Frames of our own go out only at a frame boundary of the direction they join
(``_inject_up``/``_inject_down``); everything written in one read goes out in one write at
its end (``_flush``).
"""

from __future__ import annotations

import itertools
from typing import Any

from anolisnuma.transport import h2
from anolisnuma.transport.splice.intercepted import InterceptedStream

# Bytes waiting for containerd's connection window past which the kubelet is not read
# until they drain to half of it (frames without flow control, e.g. HEADERS, queue too).
QUEUE_PAUSE_BYTES = 1 << 20
# Bytes written to the kubelet and not yet taken by it past which the kubelet is not read:
# what it sends makes us write (credits, refusals), so a client that never reads cannot
# make the relay buffer without end.
DOWN_BACKLOG_PAUSE_BYTES = 4 << 20


class FlowControl:
    """Sending, windows, credit and the budget of :class:`~anolisnuma.transport.splice.Splice`
    (a part of it: the state is the splice's, see ``Splice.__init__``)."""

    def _send_up(self, data: Any, flow: int = 0, charge: int = 0, ours: bool = False,
                 ordered: bool = True) -> None:
        """Send ``data`` to containerd, or queue it until containerd's connection window
        takes ``flow`` bytes. ``charge``: budget bytes the frame carries (given back when it
        goes out); ``ours``: a frame of ours whose credit the kubelet already had. Frames
        that carry no ordering with DATA (``ordered=False``) never wait."""
        if (ordered and self.up_queue) or flow > self.up_window:
            if isinstance(data, memoryview):  # of the read buffer, which the next read overwrites
                data = bytes(data)
            if not charge:  # pass-through bytes: bounded by flow control, counted anyway
                charge = len(data)
                self.budget.take(charge)
            self.up_queue.append((data, flow, charge, ours))
            self.up_queue_bytes += len(data)
            if self.up_queue_bytes > QUEUE_PAUSE_BYTES:
                self.pause_kubelet("queue")
            return
        if flow:
            self._spend_up_window(flow, ours)
        self.up_out.append(data)
        if charge:
            self.budget.give(charge)

    def _spend_up_window(self, flow: int, ours: bool) -> None:
        self.up_window -= flow
        if ours:
            self.conn_debt += flow

    def _drain_up(self) -> None:
        q = self.up_queue
        while q and q[0][1] <= self.up_window:
            data, flow, charge, ours = q.popleft()
            self.up_queue_bytes -= len(data)
            self._spend_up_window(flow, ours)
            self.up_out.append(data)
            if charge:
                self.budget.give(charge)
        if self.up_queue_bytes <= QUEUE_PAUSE_BYTES // 2:
            self.resume_kubelet("queue")

    def _send_down(self, data: Any, flow: int = 0) -> None:
        self.down_out.append(data)

    def _flush(self) -> None:
        if self.closed:
            return
        if self.down_credit or self.down_stream_credit:
            self._give_credit()
        if self.up_out and self.up is not None:
            self.up.write(self.up_out[0] if len(self.up_out) == 1 else b"".join(self.up_out))
            self.up_out.clear()
        if self.down_out:
            self.down.write(self.down_out[0] if len(self.down_out) == 1 else b"".join(self.down_out))
            self.down_out.clear()
            if self.down.get_write_buffer_size() > DOWN_BACKLOG_PAUSE_BYTES:
                self.pause_kubelet("kubelet not reading")

    def _inject_up(self, data: bytes, flow: int = 0, charge: int = 0, ours: bool = False) -> None:
        """Send a frame of our own to containerd at the next frame boundary."""
        r = self.k2c
        if r.at_boundary and not r.pending:
            self._send_up(data, flow, charge, ours)
        else:
            r.pending.append((data, flow, charge, ours))

    def _inject_down(self, data: bytes) -> None:
        """Send a frame of our own to the kubelet at the next frame boundary."""
        r = self.c2k
        if r.at_boundary and not r.pending:
            self._send_down(data)
        else:
            r.pending.append((data,))

    def _credit_kubelet(self, sid: int, flow: int, stream_too: bool) -> None:
        """The kubelet's ``flow`` bytes were taken off its hands: give the window back (at
        the next flush, one WINDOW_UPDATE per connection and stream)."""
        if not flow:
            return
        self.down_credit += flow
        if stream_too:
            self.down_stream_credit[sid] = self.down_stream_credit.get(sid, 0) + flow

    def _give_credit(self) -> None:
        if self.down_credit:
            self._inject_down(h2.window_update(0, self.down_credit))
            self.down_window += self.down_credit
            self.down_credit = 0
        if self.down_stream_credit:
            for sid, n in self.down_stream_credit.items():
                if sid in self.streams:
                    self._inject_down(h2.window_update(sid, n))
            self.down_stream_credit.clear()

    def pause_kubelet(self, why: str) -> None:
        if not self.paused and not self.closed:
            self.down.pause_reading()
        self.paused.add(why)

    def resume_kubelet(self, why: str) -> None:
        if why not in self.paused:
            return
        self.paused.discard(why)
        if not self.paused and not self.closed and self.up is not None:
            self.down.resume_reading()

    def _keep(self, st: InterceptedStream, content: bytes, held: bool) -> bool:
        """Charge ``content`` of an intercepted request to the budget. When it does not fit,
        newer held calls of this connection are refused to make room (the older ones are
        closer to done); failing that, this call is. False: the call was refused."""
        size = (st.held_len if held else st.copy_len) + len(content)
        if size > self.max_message_bytes:
            self._refuse(st, f"request of more than {self.max_message_bytes} bytes "
                             f"(server.max_message_bytes)")
            return False
        n = len(content)
        if self.budget.try_take(n):
            st.charged += n
            return True
        # Streams are added in the order of their ids, which only grow: newest last.
        for victim in list(itertools.takewhile(lambda s: s.sid > st.sid, reversed(self.streams.values()))):
            if not victim.holding:
                continue
            self._refuse(victim, self._budget_message(n))
            if self.budget.try_take(n):
                st.charged += n
                return True
        self._refuse(st, self._budget_message(n))
        return False

    def _budget_message(self, wanted: int) -> str:
        """Which budget had no room for ``wanted`` more bytes, for the caller and the log."""
        if self.budget.used + wanted > self.budget.limit:
            which = f"this connection's relay buffer budget ({self.budget.limit} bytes)"
        else:
            which = f"the relay's buffer budget ({self.owner.budget.limit} bytes)"
        return f"anolisnuma: {which} is spent; retry"

    def _release(self, st: InterceptedStream, n: int) -> None:
        st.charged -= n
        self.budget.give(n)

    def _window_update_from_containerd(self, sid: int, inc: int, raw: bytes) -> None:
        if sid == 0:
            self.up_window += inc
            taken = min(inc, self.conn_debt)
            self.conn_debt -= taken
            if inc - taken:
                self._send_down(raw if not taken else h2.window_update(0, inc - taken))
                self.down_window += inc - taken
            self._drain_up()
            return
        st = self.streams.get(sid)
        if st is not None and st.sends_own_body:
            # The kubelet was credited for this stream when we held its bytes.
            st.up_window += inc
            if st.outbox:
                self._send_outbox(st)
            return
        self._send_down(raw)
