"""Structured JSON logs: one JSON object per line, written off the event loop.

- The thread that logs (the relay's event loop, mostly) only renders its line (structlog,
  JSON) and appends it to a bounded queue of lines (:mod:`anolisnuma.logwriter`); a writer
  thread writes what has queued up, in one write per destination. A slow disk or a full
  journald pipe never blocks the caller: when the queue is full the line is dropped and
  counted, and the count is reported in a later line (``"log lines dropped"``, field
  ``dropped``).
- anolisnuma's own lines (structlog) go straight from the renderer to that queue: no stdlib
  ``LogRecord``, no handler lock, no wake-up of the writer per line (it is woken when it
  sleeps, once per burst). That is most of what a line cost on the kubelet's path (issue
  34: 33 µs a line before, see docs/benchmarks.md).
- Only the ``anolisnuma`` loggers follow ``[log] level``. Every other logger (hpack,
  asyncio, grpc...) is held at WARNING, and its lines are JSON lines too, with the same
  keys (``timestamp``, ``level``, ``logger``, ``message``).
- One destination per line: the file when one is set, stderr when none is set or when
  asked (``stderr = true``), so journald and the file do not hold two copies.
- The file is reopened when it was moved away (checked once per batch: logrotate's
  ``create`` rotation works without a signal).
- :func:`shutdown` writes out every queued line and stops the writer (the CLI calls it on
  every exit path; it is also registered with atexit). :func:`flush` waits until the lines
  logged so far are written.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import sys
import threading
from typing import Any, List, Optional

import structlog

from anolisnuma.logwriter import FileOutput, LineQueue, StreamOutput, Writer, iso_utc

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}

# The loggers that follow [log] level; all others stay at OTHERS_LEVEL.
OWN_LOGGER = "anolisnuma"
OTHERS_LEVEL = logging.WARNING
# Lines waiting for the writer at most; past it new lines are dropped (and counted).
QUEUE_LINES = 10000


class _Pipeline:
    """What :func:`configure` set up: the root logger's handler, the queue and its writer."""

    def __init__(self, handler: "_ForeignHandler", lines: LineQueue, writer: Writer) -> None:
        self.handler = handler
        self.lines = lines
        self.writer = writer


_current: Optional[_Pipeline] = None
_lock = threading.Lock()
_atexit_registered = False


def configure(level: str = "info", file: Optional[str] = None, stderr: bool = False,
              queue_lines: int = QUEUE_LINES) -> None:
    """Route every log line of the process, as JSON, through a writer thread.

    ``level`` applies to the ``anolisnuma`` loggers; ``file`` (absolute path, or None/"")
    is the destination, stderr when there is none or when ``stderr`` is true. Calling it
    again replaces the previous set-up (after writing out what it had queued).
    """
    global _current, _atexit_registered
    numeric = _LEVELS[level]
    outputs: List[Any] = []
    if file:
        os.makedirs(os.path.dirname(file) or ".", exist_ok=True)
        outputs.append(FileOutput(file))
    if stderr or not outputs:
        outputs.append(StreamOutput(sys.stderr))
    lines = LineQueue(queue_lines)
    handler = _ForeignHandler(lines)
    writer = Writer(lines, outputs)
    with _lock:
        shutdown()
        root = logging.getLogger()
        for h in list(root.handlers):
            root.removeHandler(h)
        root.addHandler(handler)
        root.setLevel(OTHERS_LEVEL)
        logging.getLogger(OWN_LOGGER).setLevel(numeric)
        structlog.configure(
            processors=[
                structlog.contextvars.merge_contextvars,
                _fields,
                structlog.processors.format_exc_info,
                structlog.processors.JSONRenderer(sort_keys=False),
            ],
            wrapper_class=structlog.make_filtering_bound_logger(numeric),
            logger_factory=_LineLoggerFactory(lines),
            cache_logger_on_first_use=False,
        )
        writer.start()
        _current = _Pipeline(handler, lines, writer)
        if not _atexit_registered:
            atexit.register(shutdown)
            _atexit_registered = True


def flush(timeout: float = 5.0) -> bool:
    """Wait until every line logged before this call is written (False after ``timeout``)."""
    pipeline = _current
    return True if pipeline is None else pipeline.writer.flush(timeout)


def shutdown(timeout: float = 5.0) -> bool:
    """Write out every queued line (and the count of dropped ones), then stop the writer
    and close the destinations. Lines logged afterwards go nowhere until :func:`configure`.

    A destination that does not take lines (a dead journald pipe) cannot hold the exit
    beyond ``timeout``: then the writer is left behind (a daemon thread) and False returned.
    """
    global _current
    pipeline, _current = _current, None
    if pipeline is None:
        return True
    logging.getLogger().removeHandler(pipeline.handler)
    pipeline.lines.close()   # lines logged from here on go nowhere; the drop count is final
    return pipeline.writer.stop_within(timeout)


def reopen() -> None:
    """Reopen the log file (after logrotate moved or truncated it; its ``postrotate``
    sends SIGUSR1). Done by the writer thread, between two batches."""
    pipeline = _current
    if pipeline is not None:
        pipeline.writer.reopen()


def set_level(level: str) -> None:
    """Change the level of anolisnuma's own loggers (a configuration reload)."""
    numeric = _LEVELS[level]
    logging.getLogger(OWN_LOGGER).setLevel(numeric)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(numeric))


def dropped_total() -> int:
    """Lines dropped so far by the current set-up because the writer fell behind."""
    pipeline = _current
    return pipeline.lines.dropped_total if pipeline is not None else 0


# ---------------------------------------------------------------------- the pieces

class _LineLogger:
    """structlog's logger: takes the finished JSON line and queues it, whatever the level
    (the bound logger above it has filtered by level already)."""

    __slots__ = ("name", "_put")

    def __init__(self, lines: LineQueue, name: str) -> None:
        self.name = name
        self._put = lines.put

    def _line(self, line: str, *_args: Any, **_kw: Any) -> None:
        self._put(line)

    msg = debug = info = warning = warn = error = err = critical = fatal = exception = log = _line


class _LineLoggerFactory:
    def __init__(self, lines: LineQueue) -> None:
        self._lines = lines

    def __call__(self, *args: Any) -> _LineLogger:
        return _LineLogger(self._lines, args[0] if args and isinstance(args[0], str) else OWN_LOGGER)


_LEVEL_OF = {"warn": "warning", "err": "error", "fatal": "critical", "exception": "error", "msg": "info"}


def _fields(logger: Any, method_name: str, event_dict: Any) -> Any:
    """The line's fixed keys first, in the order the lines always had (timestamp, level,
    logger, message), then the caller's fields but those set to None: optional context
    stays optional. (One processor instead of structlog's five: add_log_level,
    add_logger_name, TimeStamper, EventRenamer and a filter, each a dict pass.)"""
    out = {"timestamp": iso_utc(), "level": _LEVEL_OF.get(method_name, method_name),
           "logger": getattr(logger, "name", OWN_LOGGER), "message": event_dict.pop("event", "")}
    for k, v in event_dict.items():
        if v is not None:
            out[k] = v
    return out


class _ForeignHandler(logging.Handler):
    """Lines of stdlib loggers (other libraries', and ours that use logging directly), as
    JSON with the keys of ours, onto the same queue."""

    def __init__(self, lines: LineQueue) -> None:
        super().__init__()
        self._lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = {
                "timestamp": iso_utc(record.created),
                "level": record.levelname.lower(),
                "logger": record.name,
                "message": record.getMessage(),
            }
            if record.exc_info:
                line["exception"] = logging.Formatter().formatException(record.exc_info)
            elif record.exc_text:
                line["exception"] = record.exc_text
            if record.stack_info:
                line["stack"] = logging.Formatter().formatStack(record.stack_info)
            self._lines.put(json.dumps(line, default=repr))
        except Exception:
            self.handleError(record)
