"""EventSummary: the first event of each kind at once, the rest counted and summarised."""

from __future__ import annotations

import asyncio

import pytest
import structlog
from structlog.testing import capture_logs

from anolisnuma import logsummary
from anolisnuma.logsummary import EventSummary


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def summary(clock, **kw) -> EventSummary:
    return EventSummary(structlog.get_logger("anolisnuma.test"), "call ended without a reply",
                        interval_seconds=10.0, clock=clock, **kw)


def test_first_event_is_logged_at_once_with_its_fields(clock):
    s = summary(clock)
    with capture_logs() as logs:
        s.note(("CreateContainer", "reset"), method="CreateContainer", reason="reset", pod_name="web-0")
    assert logs == [{"event": "call ended without a reply", "log_level": "warning",
                     "method": "CreateContainer", "reason": "reset", "pod_name": "web-0"}]


def test_a_burst_gives_one_line_per_key_and_one_summary(clock):
    s = summary(clock)
    with capture_logs() as logs:
        for i in range(1000):
            s.note(("CreateContainer", "reset"), n=i)
            s.note(("StartContainer", "reset"), n=i)
            clock.now += 0.001
        s.note(("CreateContainer", "connection closed"), n=0)
        assert [l["n"] for l in logs] == [0, 0, 0]
        assert s.pending == 1998
        clock.now += 10.0
        s.note(("CreateContainer", "reset"), n=5000)  # a later event closes the interval first
    assert len(logs) == 5
    line = logs[3]
    assert line["event"] == "call ended without a reply: 1998 more in 10s"
    assert line["log_level"] == "warning"
    assert line["suppressed"] == 1998
    assert line["counts"] == {"CreateContainer/reset": 999, "StartContainer/reset": 999}
    assert line["interval_seconds"] == 10.0
    # ...and the event that found the interval over opens the next one, logged at once
    assert logs[4]["n"] == 5000 and s.pending == 0


def test_nothing_counted_means_no_summary_line(clock):
    s = summary(clock)
    with capture_logs() as logs:
        s.note("a")
        clock.now += 11
        s.note("a")
        s.flush()
    assert [l["event"] for l in logs] == ["call ended without a reply"] * 2


def test_interval_is_measured_from_its_first_event(clock):
    s = summary(clock)
    with capture_logs() as logs:
        s.note("k")
        clock.now += 9.999
        s.note("k")          # counted: still inside the interval
        assert len(logs) == 1
        clock.now += 0.001
        s.note("k")          # 10 s after the first: summary, then a new first event
    assert [l.get("suppressed") for l in logs] == [None, 1, None]


def test_flush_reports_what_is_pending(clock):
    s = summary(clock)
    with capture_logs() as logs:
        for _ in range(5):
            s.note("k", x=1)
        s.flush()
        s.flush()  # nothing left: no second line
    assert [l["event"] for l in logs] == ["call ended without a reply",
                                          "call ended without a reply: 4 more in 10s"]
    assert logs[1]["counts"] == {"k": 4}


def test_level_is_configurable(clock):
    s = summary(clock, level="info")
    with capture_logs() as logs:
        s.note("k")
        s.note("k")
        s.flush()
    assert [l["log_level"] for l in logs] == ["info", "info"]


def test_keys_beyond_the_cap_are_counted_together(clock, monkeypatch):
    monkeypatch.setattr(logsummary, "MAX_KEYS", 3)
    s = summary(clock)
    with capture_logs() as logs:
        for k in range(10):
            s.note(f"peer-{k}")
        s.flush()
    assert len(logs) == 4  # three keys at once, then the summary
    assert logs[-1]["counts"] == {"other": 7}


def test_the_loop_timer_reports_the_tail_of_a_burst():
    """On an event loop, the summary comes when the interval ends even if no event
    follows. The loop's clock is real: a short interval, and the test waits on the line."""

    async def scenario():
        s = EventSummary(structlog.get_logger("anolisnuma.test"), "refused", interval_seconds=0.05)
        for _ in range(3):
            s.note("k")
        assert s._timer is not None
        while s.pending:            # the timer closes the interval (bounded by the timeout)
            await asyncio.sleep(0.01)
        return s

    with capture_logs() as logs:
        s = asyncio.run(asyncio.wait_for(scenario(), timeout=5))
    assert [l["event"] for l in logs] == ["refused", "refused: 2 more in 0.05s"]
    assert s._timer is None


def test_a_stale_timer_does_not_close_the_next_interval(clock):
    """The summary was already written by a note(); the old interval's timer must leave the
    new interval alone."""

    async def scenario():
        s = summary(clock)
        s.note("k")
        s.note("k")
        first_generation = s._generation
        clock.now += 10
        s.note("k")         # closes interval 1 (summary), opens interval 2
        s.note("k")         # counted in interval 2
        s._on_timer(first_generation)
        return s

    with capture_logs() as logs:
        s = asyncio.run(scenario())
    assert s.pending == 1
    assert [l.get("suppressed") for l in logs] == [None, 1, None]


def test_bad_interval_is_refused():
    with pytest.raises(ValueError):
        EventSummary(structlog.get_logger(), "x", interval_seconds=0)


def test_interceptor_summarises_aborted_calls(clock):
    """A client resetting intercepted streams in a loop gets one line per method and
    reason, then counts (it used to be one warning per reset: 47 MB for 200k)."""
    from concurrent.futures import ThreadPoolExecutor

    from anolisnuma.config import HooksConfig
    from anolisnuma.cri import methods
    from anolisnuma.pipeline.interceptor import Interceptor, PipelineCall
    from anolisnuma.state.store import Store

    with ThreadPoolExecutor(1) as pool:
        icp = Interceptor([], HooksConfig(), Store(), pool)
        icp.aborts.clock = clock
        create = methods.INTERCEPTED["CreateContainer"]
        start = methods.INTERCEPTED["StartContainer"]
        with capture_logs() as logs:
            for _ in range(10_000):
                icp.on_abort(PipelineCall(create), "stream reset by the client")
            icp.on_abort(PipelineCall(start), "connection closed")
            icp.aborts.flush()
    first, other, summary_line = logs
    assert first["event"] == "intercepted call ended without a reply"
    assert (first["method"], first["reason"]) == ("CreateContainer", "stream reset by the client")
    assert isinstance(first["latency_ms"], float)
    assert (other["method"], other["reason"]) == ("StartContainer", "connection closed")
    assert summary_line["counts"] == {"CreateContainer/stream reset by the client": 9999}


# ---------------------------------------------------------------- FirstTime

def test_first_time_is_true_once_per_key_until_its_owner_is_forgotten():
    from anolisnuma.logsummary import FirstTime

    seen = FirstTime()
    assert seen.first(("pod-a", "cgroup_parent")) is True
    assert [seen.first(("pod-a", "cgroup_parent")) for _ in range(5)] == [False] * 5
    assert seen.first(("pod-a", "annotation")) is True      # another condition of the same pod
    assert seen.first(("pod-b", "cgroup_parent")) is True
    seen.forget("pod-a")
    assert seen.first(("pod-a", "cgroup_parent")) is True
    assert seen.first(("pod-b", "cgroup_parent")) is False


def test_first_time_stays_bounded():
    from anolisnuma.logsummary import FirstTime

    seen = FirstTime(max_keys=3)
    for i in range(10):
        assert seen.first((f"pod-{i}", "x"))
    assert len(seen._seen) == 3
    assert not seen.first(("pod-9", "x"))        # the most recent are kept
    assert seen.first(("pod-0", "x"))            # the oldest went first
