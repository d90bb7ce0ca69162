"""The one shape of every background loop: passes, errors counted, wake, stop, registry."""

import threading

import pytest

from anolisnuma.controller import Controller, Controllers


class Loop(Controller):
    name = "loop"

    def __init__(self, interval=0.0, fail_first=0):
        super().__init__()
        self.interval = interval
        self.fail_first = fail_first
        self.passes = 0
        self.closed_count = 0
        self.reached = threading.Condition()

    def run_once(self):
        with self.reached:
            self.passes += 1
            self.reached.notify_all()
        if self.passes <= self.fail_first:
            raise RuntimeError(f"bad read\n number {self.passes}")
        return self.passes

    def counts(self):
        return {"passes": self.passes}

    def closed(self):
        self.closed_count += 1

    def wait_passes(self, n, timeout=5.0):
        with self.reached:
            return self.reached.wait_for(lambda: self.passes >= n, timeout)


def test_a_failing_pass_is_counted_and_the_loop_goes_on():
    c = Loop(interval=0.01, fail_first=2)
    c.start()
    try:
        assert c.wait_passes(4)
    finally:
        c.stop()
    assert c.errors == 2 and c.runs == c.passes - 2
    assert c.last_error == "bad read number 2"   # one line, whatever the exception held
    assert not c.running and c.closed_count == 1


def test_interval_zero_passes_only_when_woken():
    c = Loop(interval=0.0)
    c.start()
    try:
        assert c.running and c.passes == 0
        c.wake()
        assert c.wait_passes(1)
        c.wake()
        assert c.wait_passes(2)
    finally:
        c.stop()
    assert c.passes == 2   # stopping wakes the loop, but it does not make a pass


def test_step_never_raises_and_passed_sees_the_result():
    seen = []

    class Reporting(Loop):
        def passed(self, result):
            seen.append(result)

    c = Reporting(fail_first=1)
    assert c.step() is None and c.errors == 1
    assert c.step() == 2 and seen == [2] and c.runs == 1


def test_stop_is_idempotent_and_a_stopped_controller_does_not_restart():
    c = Loop(interval=0.01)
    c.start()
    c.stop()
    c.stop()
    c.start()
    assert not c.running and c.closed_count == 1


def test_stop_without_start_still_releases():
    c = Loop()
    c.stop()
    assert c.closed_count == 1


def test_registry_names_are_unique_stops_in_reverse_and_reports():
    order = []

    class Named(Loop):
        def __init__(self, name):
            super().__init__()
            self.name = name

        def closed(self):
            order.append(self.name)

    reg = Controllers()
    a, b = reg.add(Named("a")), reg.add(Named("b"))
    with pytest.raises(ValueError, match="'a'"):
        reg.add(Named("a"))
    assert reg.get("b") is b and reg.get("c") is None and len(reg) == 2
    a.step()
    status = reg.status()
    assert list(status) == ["a", "b"]
    assert status["a"]["runs"] == 1 and status["a"]["passes"] == 1 and status["b"]["runs"] == 0
    assert status["a"]["running"] is False and status["a"]["last_error"] is None
    reg.stop_all()
    assert order == ["b", "a"]
