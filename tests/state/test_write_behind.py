"""WriteBehind: marks return at once, coalesce into one write of the newest snapshot, a
failed write is reported and retried, and flush/stop leave nothing marked unwritten."""

from __future__ import annotations

import threading
from typing import List

import pytest

from anolisnuma.state import write_behind
from anolisnuma.state.write_behind import WriteBehind
from anolisnuma.testing.waiting import wait_until


class Owner:
    """A state (a counter) under its lock, and a disk whose writes can be held or failed."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.value = 0
        self.disk: List[int] = []          # every value written, in order
        self.gate = threading.Event()      # writes wait for it while it is clear
        self.gate.set()
        self.in_write = threading.Event()
        self.fail = False
        self.writer: WriteBehind[int] = WriteBehind("test-writer", self.lock, lambda: self.value, self.write,
                                                    "/nowhere/state.json", "test state")

    def write(self, value: int) -> None:
        self.in_write.set()
        self.gate.wait(30)
        if self.fail:
            raise OSError(28, "No space left on device")
        self.disk.append(value)

    def change(self, value: int) -> None:
        with self.lock:
            self.value = value
            self.writer.mark()


@pytest.fixture
def owner():
    o = Owner()
    yield o
    o.gate.set()
    o.writer.stop()


def test_without_the_thread_a_mark_is_written_before_it_returns(owner):
    # given a writer whose thread was never started
    # when the state changes
    owner.change(1)
    # then it is on disk already
    assert owner.disk == [1] and not owner.writer.dirty and owner.writer.flush()


def test_marks_return_while_a_write_is_held_and_coalesce_into_the_newest(owner):
    # given a running writer whose first write is held on the disk
    owner.writer.start()
    owner.gate.clear()
    owner.change(1)
    assert owner.in_write.wait(10)
    # when more changes come while it is held
    for v in (2, 3, 4):
        owner.change(v)
    # then they returned without the disk, and once it goes on, one more write has the newest
    assert owner.disk == [] and owner.writer.dirty
    owner.gate.set()
    assert owner.writer.flush(10)
    assert owner.disk == [1, 4]
    assert owner.writer.counts() == {"writes": 2, "write_errors": 0, "dirty": 0}


def test_the_owners_lock_is_not_held_during_the_write(owner):
    # given a running writer held in a write
    owner.writer.start()
    owner.gate.clear()
    owner.change(1)
    assert owner.in_write.wait(10)
    # when another thread takes the owner's lock
    got = owner.lock.acquire(timeout=10)
    # then it gets it while the write waits on the disk
    assert got
    owner.lock.release()
    owner.gate.set()


class Lines:
    """The writer's log lines, recorded whatever level an earlier test left structlog at (a
    filtering logger cached at "warning" drops info lines before capture_logs sees them)."""

    def __init__(self) -> None:
        self.lines: List[tuple] = []

    def error(self, event: str, **kw: object) -> None:
        self.lines.append(("error", event))

    def info(self, event: str, **kw: object) -> None:
        self.lines.append(("info", event))

    def of(self, level: str) -> List[str]:
        return [event for lv, event in list(self.lines) if lv == level]


def test_a_failed_write_is_reported_once_and_retried_until_it_works(owner, monkeypatch):
    # given a running writer on a full disk, retrying at once
    monkeypatch.setattr(write_behind, "RETRY_SECONDS", 0.01)
    lines = Lines()
    monkeypatch.setattr(write_behind, "log", lines)
    owner.fail = True
    owner.writer.start()
    owner.change(1)
    # then flush says it is not on disk, and the error is logged once though retried
    assert owner.writer.flush(10) is False
    wait_until(lambda: owner.writer.write_errors >= 3, "retries")
    assert lines.of("error") == ["cannot save test state; going on in memory"]
    # when the disk has room again, the retry writes it without a new change, and says so
    owner.fail = False
    wait_until(lambda: not owner.writer.dirty, "the retry to write")
    assert owner.disk == [1]
    assert lines.of("info") == ["test state saved again"]


def test_stop_writes_what_is_still_marked_and_later_marks_write_at_once(owner):
    # given a running writer with a change marked and its write held
    owner.writer.start()
    owner.gate.clear()
    owner.change(1)
    assert owner.in_write.wait(10)
    owner.change(2)
    # when it is stopped (the daemon's shutdown) once the disk goes on
    owner.gate.set()
    owner.writer.stop()
    # then the last change is on disk, and a change after the stop is written before it returns
    assert owner.disk[-1] == 2 and not owner.writer.dirty
    owner.change(3)
    assert owner.disk[-1] == 3


def test_flush_waits_for_the_change_made_before_it(owner):
    # given a running writer whose write is held
    owner.writer.start()
    owner.gate.clear()
    owner.change(7)
    assert owner.in_write.wait(10)
    done = threading.Event()
    result: List[bool] = []

    def flush() -> None:
        result.append(owner.writer.flush(10))
        done.set()

    t = threading.Thread(target=flush)
    t.start()
    # when the write goes on
    assert not done.is_set()
    owner.gate.set()
    t.join(10)
    # then flush returned True with the change on disk
    assert result == [True] and owner.disk == [7]
