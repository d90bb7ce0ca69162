"""Log lines: JSON only, written off the caller's thread, one destination, nothing lost at stop.

Every test waits on conditions (events, flush(), a joined thread with a timeout), never on
sleeps.
"""

from __future__ import annotations

import io
import json
import logging
import os
import sys
import threading
from typing import Dict, Iterator, List

import pytest
import structlog

from anolisnuma import logsetup


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """Each test configures logging itself; afterwards the writer is stopped and the root
    logger handed back as it was (pytest's capture handlers included)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    own_level = logging.getLogger("anolisnuma").level
    yield
    logsetup.shutdown()
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in handlers:
        root.addHandler(h)
    root.setLevel(level)
    logging.getLogger("anolisnuma").setLevel(own_level)


def lines_of(text: str) -> List[Dict]:
    return [json.loads(line) for line in text.splitlines()]


def strict_read(path: str) -> List[Dict]:
    """Every line of the file, each of which must be JSON."""
    with open(path) as f:
        return lines_of(f.read())


class BlockingStream(io.StringIO):
    """A stream whose write waits until released: a full journald pipe, a stuck disk."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def write(self, s: str) -> int:
        self.entered.set()
        self.release.wait(30)
        return super().write(s)


def test_third_party_loggers_write_json_at_warning_only_even_at_debug(tmp_path):
    path = str(tmp_path / "a.log")
    logsetup.configure("debug", path)
    hpack = logging.getLogger("hpack.hpack")
    hpack.debug("Decoding %s", b"\x82\x86")           # ~25 of these per call at debug
    logging.getLogger("asyncio").info("poll took 2 ms")
    hpack.warning("odd header %s", "x-y")
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("some.lib").exception("it failed")
    structlog.get_logger("anolisnuma.test").debug("our debug line", n=1)
    assert logsetup.flush()
    lines = strict_read(path)
    assert [(l["logger"], l["level"], l["message"]) for l in lines] == [
        ("hpack.hpack", "warning", "odd header x-y"),
        ("some.lib", "error", "it failed"),
        ("anolisnuma.test", "debug", "our debug line"),
    ]
    for line in lines:
        assert set(line) >= {"timestamp", "level", "logger", "message"}
        assert line["timestamp"].endswith("Z")
    assert "ValueError: boom" in lines[1]["exception"]
    assert lines[2]["n"] == 1


def test_anolisnuma_debug_lines_only_at_debug(tmp_path):
    path = str(tmp_path / "a.log")
    logsetup.configure("info", path)
    log = structlog.get_logger("anolisnuma.pipeline")
    log.debug("pass-through call", method="/runtime.v1.RuntimeService/Version")
    log.info("run pod sandbox request from kubelet", pod_name="web-0")
    logging.getLogger("anolisnuma.other").debug("stdlib debug of ours")
    assert logsetup.flush()
    assert [l["message"] for l in strict_read(path)] == ["run pod sandbox request from kubelet"]

    logsetup.configure("debug", path)  # appends to the same file
    log.debug("pass-through call", method="/runtime.v1.RuntimeService/Version")
    logging.getLogger("anolisnuma.other").debug("stdlib debug of ours")
    assert logsetup.flush()
    lines = strict_read(path)
    assert [l["message"] for l in lines] == ["run pod sandbox request from kubelet", "pass-through call",
                                             "stdlib debug of ours"]
    assert lines[1]["level"] == "debug" and lines[1]["method"] == "/runtime.v1.RuntimeService/Version"
    assert lines[2]["logger"] == "anolisnuma.other"


def test_file_only_by_default(tmp_path, monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    path = str(tmp_path / "a.log")
    logsetup.configure("info", path)
    structlog.get_logger("anolisnuma.test").info("once")
    logsetup.shutdown()
    assert [l["message"] for l in strict_read(path)] == ["once"]
    assert err.getvalue() == ""


def test_stderr_when_no_file_is_set(tmp_path, monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    logsetup.configure("info", "")
    structlog.get_logger("anolisnuma.test").info("to journald")
    logsetup.shutdown()
    assert [l["message"] for l in lines_of(err.getvalue())] == ["to journald"]


def test_both_only_when_asked(tmp_path, monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    path = str(tmp_path / "a.log")
    logsetup.configure("info", path, stderr=True)
    structlog.get_logger("anolisnuma.test").info("twice")
    logsetup.shutdown()
    assert [l["message"] for l in strict_read(path)] == ["twice"]
    assert [l["message"] for l in lines_of(err.getvalue())] == ["twice"]


def test_the_caller_is_not_blocked_by_a_stuck_writer_and_drops_are_counted(monkeypatch):
    stream = BlockingStream()
    monkeypatch.setattr(sys, "stderr", stream)
    logsetup.configure("info", None, queue_lines=10)
    log = structlog.get_logger("anolisnuma.test")
    try:
        log.info("first")
        assert stream.entered.wait(5)  # the writer thread is now stuck in write()

        def burst() -> None:   # what the event loop would do meanwhile
            for i in range(100):
                log.info("burst", i=i)
            logging.getLogger("hpack").warning("third-party too")

        caller = threading.Thread(target=burst)
        caller.start()
        caller.join(5)
        assert not caller.is_alive(), "logging blocked the caller while the writer was stuck"
        assert logsetup.dropped_total() == 101 - 10  # the queue holds 10 lines; the rest dropped
    finally:
        stream.release.set()
    assert logsetup.flush()  # the writer caught up: the queue has room again
    log.info("after")  # the next line that fits reports the count first
    assert logsetup.flush()
    lines = lines_of(stream.getvalue())
    assert [l.get("i") for l in lines[1:11]] == list(range(10))
    dropped = [l for l in lines if l["message"] == "log lines dropped: the log writer fell behind"]
    assert [(l["dropped"], l["level"], l["logger"]) for l in dropped] == [(91, "warning", "anolisnuma.logsetup")]
    assert lines[-1]["message"] == "after"


def test_every_queued_line_is_written_at_shutdown(tmp_path):
    path = str(tmp_path / "a.log")
    logsetup.configure("info", path)
    log = structlog.get_logger("anolisnuma.test")
    for i in range(2000):
        log.info("line", i=i)
    logsetup.shutdown()  # no flush() first: shutdown alone must write them all
    assert [l["i"] for l in strict_read(path)] == list(range(2000))
    log.info("after shutdown")  # goes nowhere, breaks nothing
    assert len(strict_read(path)) == 2000


def test_drops_still_pending_at_shutdown_are_reported(monkeypatch):
    stream = BlockingStream()
    monkeypatch.setattr(sys, "stderr", stream)
    logsetup.configure("info", None, queue_lines=2)
    log = structlog.get_logger("anolisnuma.test")
    log.info("first")
    assert stream.entered.wait(5)
    for i in range(5):
        log.info("burst", i=i)
    stream.release.set()
    logsetup.shutdown()
    lines = lines_of(stream.getvalue())
    assert [l["message"] for l in lines[:3]] == ["first", "burst", "burst"]
    assert lines[-1]["dropped"] == 3


def test_a_dead_destination_cannot_hold_the_exit(monkeypatch):
    """stderr is a pipe nobody reads any more: shutdown() gives up after its timeout
    instead of keeping the process alive past systemd's stop timeout."""
    stream = BlockingStream()
    monkeypatch.setattr(sys, "stderr", stream)
    logsetup.configure("info", None, queue_lines=4)
    log = structlog.get_logger("anolisnuma.test")
    for i in range(10):
        log.info("stuck", i=i)
    assert stream.entered.wait(5)
    result = []
    stopper = threading.Thread(target=lambda: result.append(logsetup.shutdown(timeout=0.2)))
    try:
        stopper.start()
        stopper.join(5)
        assert not stopper.is_alive(), "shutdown() hung on a destination that takes no lines"
        assert result == [False]
    finally:
        stream.release.set()


def test_rotated_file_is_reopened(tmp_path):
    path = str(tmp_path / "a.log")
    logsetup.configure("info", path)
    log = structlog.get_logger("anolisnuma.test")
    log.info("before rotation")
    assert logsetup.flush()
    os.rename(path, path + ".1")  # logrotate's "create" rotation, no signal
    log.info("after rotation")
    assert logsetup.flush()
    assert [l["message"] for l in strict_read(path + ".1")] == ["before rotation"]
    assert [l["message"] for l in strict_read(path)] == ["after rotation"]


def test_reconfigure_keeps_the_lines_of_the_previous_setup(tmp_path):
    path = str(tmp_path / "a.log")
    logsetup.configure("info", path)
    for i in range(500):
        structlog.get_logger("anolisnuma.test").info("old", i=i)
    logsetup.configure("info", path)
    structlog.get_logger("anolisnuma.test").info("new")
    assert logsetup.flush()
    assert [l["message"] for l in strict_read(path)] == ["old"] * 500 + ["new"]
    assert threading.active_count() < 50  # one writer thread at a time, not one per configure


def test_cli_error_exit_writes_its_lines(sockdir):
    """The daemon listens, then finds that a hook whose failure policy is ``fail`` cannot
    start (no NUMA topology here) and exits at once: its lines are in the file all the
    same, and only there; stderr gets one plain line saying why."""
    from anolisnuma.testing.proxy import config_dict, run_cli, write_config

    data = config_dict(sockdir, os.path.join(sockdir, "nobody.sock"),
                       extra={"numa": {"enabled": True}, "hooks": {"numa": {"failure_policy": "fail"}},
                              "log": {"stderr": False}})
    r = run_cli(["-c", write_config(os.path.join(sockdir, "c.toml"), data)])
    assert r.returncode == 1, r.stderr
    assert r.stderr.startswith("anolisnuma: cannot start: hook numa cannot start")
    assert "{" not in r.stderr  # the JSON lines went to the file only
    messages = [l["message"] for l in strict_read(data["log"]["file"])]
    assert messages[0] == "anolisnuma listening"
    assert "cannot start: a hook whose failure_policy is fail is unavailable" in messages
    assert messages[-1] == "anolisnuma stopped"