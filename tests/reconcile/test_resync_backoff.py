"""The resync with containerd while containerd does not answer: each failed listing is
counted, its retry backs off (2 s doubling to 30 s, never past the interval), the health
line says why, and one listing that works again puts everything back."""

from __future__ import annotations

import pytest

from anolisnuma.pipeline.recent import RecentCalls
from anolisnuma.reconcile.resync import RetryBackoff, RuntimeResync
from anolisnuma.state.store import Store


class Down(Exception):
    pass


class FakeClient:
    def list_pod_sandboxes(self):
        return []

    def list_containers(self):
        return []

    def close(self):
        pass


def test_backoff_doubles_up_to_its_cap_and_resets():
    b = RetryBackoff(first=2.0, cap=30.0)
    assert [b.next() for _ in range(6)] == [2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    b.reset()
    assert b.next() == 2.0


def test_a_failing_resync_backs_off_says_why_and_recovers(tmp_path):
    up = {"now": False}

    def connect():
        if not up["now"]:
            raise Down("UNAVAILABLE: connection refused")
        return FakeClient()

    resync = RuntimeResync(connect, Store(str(tmp_path)), [], RecentCalls(), interval_seconds=60.0)
    assert resync.wait_seconds() == 60.0 and resync.health() is None
    waits = []
    for _ in range(5):
        with pytest.raises(Down):
            resync.listing()
        waits.append(resync.wait_seconds())
    assert waits == [2.0, 4.0, 8.0, 16.0, 30.0]
    assert resync.counts()["consecutive_failures"] == 5
    health = resync.health()
    assert health.startswith("cannot list containerd: 5 failed passes in a row for ")
    assert "UNAVAILABLE: connection refused" in health and "next try in 30s" in health
    # the loop's pass (Controller.step) counts the error and the loop waits the backed-off delay
    assert resync.step() is None and resync.errors == 1 and resync.wait_seconds() == 30.0

    up["now"] = True
    assert resync.step() == (0, 0)
    assert resync.health() is None and resync.wait_seconds() == 60.0 and resync.consecutive_failures == 0
    assert resync.backoff.failures == 0


def test_the_backoff_never_waits_past_the_interval(tmp_path):
    def connect():
        raise Down("down")

    resync = RuntimeResync(connect, Store(str(tmp_path)), [], RecentCalls(), interval_seconds=5.0)
    for _ in range(4):
        with pytest.raises(Down):
            resync.listing()
    assert resync.wait_seconds() == 5.0
