"""Structured JSON logs: one JSON object per line, written off the event loop.

- The thread that logs (the relay's event loop, mostly) only renders its line (structlog,
  JSON) and puts it on a bounded queue; a writer thread (logging.handlers.QueueListener)
  writes it. A slow disk or a full journald pipe never blocks the caller: when the queue
  is full the line is dropped and counted, and the count is reported in a later line
  (``"log lines dropped"``, field ``dropped``).
- Only the ``anolisnuma`` loggers follow ``[log] level``. Every other logger (hpack,
  asyncio, grpc...) is held at WARNING, and its lines are JSON lines too, with the same
  keys (``timestamp``, ``level``, ``logger``, ``message``).
- One destination per line: the file when one is set, stderr when none is set or when
  asked (``stderr = true``), so journald and the file do not hold two copies.
- The file is reopened when it was moved away (WatchedFileHandler: logrotate's ``create``
  rotation works without a signal).
- :func:`shutdown` writes out every queued line and stops the writer (the CLI calls it on
  every exit path; it is also registered with atexit). :func:`flush` waits until the lines
  logged so far are written.
"""

from __future__ import annotations

import atexit
import datetime
import json
import logging
import os
import queue
import sys
import threading
import time
from logging.handlers import QueueHandler, QueueListener, WatchedFileHandler
from typing import Any, List, Optional

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}

# The loggers that follow [log] level; all others stay at OTHERS_LEVEL.
OWN_LOGGER = "anolisnuma"
OTHERS_LEVEL = logging.WARNING
# Lines waiting for the writer at most; past it new lines are dropped (and counted).
QUEUE_LINES = 10000
# A record whose message is a JSON line rendered by structlog carries this attribute.
_RENDERED = "anolisnuma_rendered"
_RENDERED_EXTRA = {_RENDERED: True}


class _Pipeline:
    """What :func:`configure` set up: the root logger's queue handler and the writer."""

    def __init__(self, handler: "_DroppingQueueHandler", writer: "_Writer", outputs: List[logging.Handler]) -> None:
        self.handler = handler
        self.writer = writer
        self.outputs = outputs


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
    outputs: List[logging.Handler] = []
    if file:
        os.makedirs(os.path.dirname(file) or ".", exist_ok=True)
        outputs.append(WatchedFileHandler(file))
    if stderr or not outputs:
        outputs.append(logging.StreamHandler(sys.stderr))
    for h in outputs:
        h.setFormatter(_LineFormatter())
    lines: "queue.Queue[Any]" = queue.Queue(maxsize=max(1, queue_lines))
    handler = _DroppingQueueHandler(lines)
    handler.setFormatter(_ForeignJsonFormatter())
    writer = _Writer(lines, *outputs)
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
                structlog.processors.add_log_level,
                structlog.stdlib.add_logger_name,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
                _drop_none,
                structlog.processors.format_exc_info,
                structlog.processors.EventRenamer("message"),
                structlog.processors.JSONRenderer(sort_keys=False),
                _as_rendered_record,
            ],
            wrapper_class=structlog.make_filtering_bound_logger(numeric),
            logger_factory=structlog.stdlib.LoggerFactory(),
            cache_logger_on_first_use=False,
        )
        writer.start()
        _current = _Pipeline(handler, writer, outputs)
        if not _atexit_registered:
            atexit.register(shutdown)
            _atexit_registered = True


def flush(timeout: float = 5.0) -> bool:
    """Wait until every line logged before this call is written (False after ``timeout``)."""
    pipeline = _current
    if pipeline is None:
        return True
    token = _FlushToken()
    try:
        pipeline.handler.queue.put(token, timeout=timeout)
    except queue.Full:
        return False
    return token.done.wait(timeout)


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
    with pipeline.handler.lock:  # no enqueue() runs any more: the count is final
        dropped = pipeline.handler.dropped
        pipeline.handler.dropped = 0
    deadline = time.monotonic() + timeout
    try:
        if dropped:
            pipeline.handler.queue.put(_dropped_record(dropped), timeout=timeout)
        stopped = pipeline.writer.stop_within(max(0.0, deadline - time.monotonic()))
    except queue.Full:
        stopped = False
    if stopped:
        for h in pipeline.outputs:
            h.close()
    return stopped


def reopen() -> None:
    """Reopen the log file (after logrotate moved or truncated it; its ``postrotate``
    sends SIGUSR1). Done by the writer thread, between two lines."""
    pipeline = _current
    if pipeline is not None:
        try:
            pipeline.handler.queue.put_nowait(_REOPEN)
        except queue.Full:  # the writer is behind; WatchedFileHandler reopens on its own
            pass


def set_level(level: str) -> None:
    """Change the level of anolisnuma's own loggers (a configuration reload)."""
    numeric = _LEVELS[level]
    logging.getLogger(OWN_LOGGER).setLevel(numeric)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(numeric))


def dropped_total() -> int:
    """Lines dropped so far by the current set-up because the writer fell behind."""
    pipeline = _current
    return pipeline.handler.dropped_total if pipeline is not None else 0


# ---------------------------------------------------------------------- the pieces

class _DroppingQueueHandler(QueueHandler):
    """Puts records on the bounded queue without ever waiting; counts what did not fit.

    ``enqueue`` runs under the handler's lock (Handler.handle), so the counters need no
    lock of their own."""

    def __init__(self, q: "queue.Queue[Any]") -> None:
        super().__init__(q)
        self.dropped = 0        # not yet reported
        self.dropped_total = 0

    def prepare(self, record: logging.LogRecord) -> Any:
        if record.__dict__.get(_RENDERED):
            return record  # already one JSON line, no args, no exc_info: nothing to copy
        return super().prepare(record)  # formats it as a JSON line (_ForeignJsonFormatter)

    def enqueue(self, record: Any) -> None:
        try:
            if self.dropped:
                self.queue.put_nowait(_dropped_record(self.dropped))
                self.dropped = 0
            self.queue.put_nowait(record)
        except queue.Full:
            self.dropped += 1
            self.dropped_total += 1


_REOPEN = object()  # queued by reopen(): the writer reopens its files


class _FlushToken:
    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = threading.Event()


class _Writer(QueueListener):
    """The writer thread: records to the destinations; flush tokens answered in order."""

    def __init__(self, q: "queue.Queue[Any]", *handlers: logging.Handler) -> None:
        super().__init__(q, *handlers, respect_handler_level=False)

    def handle(self, record: Any) -> None:
        if isinstance(record, _FlushToken):
            for h in self.handlers:
                h.flush()
            record.done.set()
            return
        if record is _REOPEN:
            for h in self.handlers:
                if isinstance(h, logging.FileHandler):
                    h.acquire()
                    try:
                        if h.stream is not None:
                            h.stream.close()
                        h.stream = h._open()
                        if isinstance(h, WatchedFileHandler):
                            h._statstream()  # remember the new file, not the moved one
                    finally:
                        h.release()
            return
        super().handle(record)

    def stop_within(self, timeout: float) -> bool:
        """QueueListener.stop() with a bound: the sentinel goes after every queued line
        (waiting for room, the queue is bounded), then the thread is joined."""
        deadline = time.monotonic() + timeout
        self.queue.put(self._sentinel, timeout=timeout)
        thread = self._thread
        if thread is not None:
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                return False
        self._thread = None
        return True


class _LineFormatter(logging.Formatter):
    """The destinations' formatter: every record reaching them is one JSON line already."""

    def format(self, record: logging.LogRecord) -> str:
        msg = record.msg
        return msg if isinstance(msg, str) else record.getMessage()


class _ForeignJsonFormatter(logging.Formatter):
    """Lines of other libraries' stdlib loggers, as JSON with the keys of ours."""

    def format(self, record: logging.LogRecord) -> str:
        if record.__dict__.get(_RENDERED):
            return record.msg
        line = {
            "timestamp": _iso_utc(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, default=repr)


def _iso_utc(created: float) -> str:
    """The timestamp format of structlog's TimeStamper(fmt="iso", utc=True)."""
    when = datetime.datetime.fromtimestamp(created, tz=datetime.timezone.utc)
    return when.isoformat().replace("+00:00", "Z")


def _dropped_record(n: int) -> logging.LogRecord:
    line = json.dumps({"dropped": n, "level": "warning", "logger": "anolisnuma.logsetup",
                       "timestamp": _iso_utc(time.time()),
                       "message": "log lines dropped: the log writer fell behind"})
    record = logging.LogRecord("anolisnuma.logsetup", logging.WARNING, __file__, 0, line, None, None)
    record.__dict__[_RENDERED] = True
    return record


def _as_rendered_record(_logger: Any, _name: str, line: str) -> Any:
    """structlog's last processor: hand the rendered line to the stdlib logger, marked as
    a finished JSON line (``(args, kwargs)`` of the logger call)."""
    return (line,), {"extra": _RENDERED_EXTRA}


def _drop_none(_logger, _name, event_dict):
    """Fields a caller set to None are left out, so optional context stays optional."""
    return {k: v for k, v in event_dict.items() if v is not None}
