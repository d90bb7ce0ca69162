"""The splice gets its bytes as views of one read buffer that the next read overwrites
(transport/conn.py): nothing it keeps past a call may point into that buffer.

The property tests of test_splice_properties run again here with every chunk handed to
the splice as a view of a shared buffer that is scribbled over as soon as the splice
returns; a byte kept by reference (a held request, a copied reply, a frame queued for
containerd's window, a partial frame) would then reach a peer or a hook as garbage, which
the h2 peers and the fake interceptor of the harness detect.
"""

from __future__ import annotations

from typing import Iterator

import pytest

from anolisnuma.transport.splice import Splice

from test_splice_properties import (  # noqa: F401  (collected again under the fixture below)
    test_a_mix_of_large_calls_on_one_connection,
    test_calls_arrive_as_decided_and_every_window_is_credited,
    test_large_bodies_follow_containerds_settings_and_windows,
    test_over_the_budget_each_call_completes_or_is_refused,
    test_relay_answer_after_containerds_headers_is_trailers,
    test_the_relays_answer_is_the_last_frame_of_its_stream,
)

_BUFFER = bytearray(1 << 20)


def _through_shared_buffer(original):
    def deliver(self: Splice, data) -> None:
        n = len(data)
        if n > len(_BUFFER):
            _BUFFER.extend(bytes(n - len(_BUFFER)))
        _BUFFER[:n] = data
        view = memoryview(_BUFFER)[:n]
        try:
            original(self, view)
        finally:
            view.release()
            _BUFFER[:n] = b"\xa5" * n   # the next read
    return deliver


@pytest.fixture(autouse=True, scope="module")
def shared_read_buffer() -> Iterator[None]:
    mp = pytest.MonkeyPatch()
    mp.setattr(Splice, "from_kubelet", _through_shared_buffer(Splice.from_kubelet))
    mp.setattr(Splice, "from_containerd", _through_shared_buffer(Splice.from_containerd))
    yield
    mp.undo()
