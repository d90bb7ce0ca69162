"""Structured JSON logs: one JSON object per line, to the log file and to stderr (journald)."""

from __future__ import annotations

import logging
import os
import sys
from typing import List, Optional

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure(level: str = "info", file: Optional[str] = None, stderr: bool = True) -> None:
    """Route every structlog logger of the process to JSON lines at ``level``.

    The file is opened in append mode (logrotate's ``copytruncate`` or a SIGHUP-free
    ``create`` rotation both work: the handler reopens when the file was moved away).
    """
    handlers: List[logging.Handler] = []
    if file:
        os.makedirs(os.path.dirname(file) or ".", exist_ok=True)
        from logging.handlers import WatchedFileHandler

        handlers.append(WatchedFileHandler(file))
    if stderr or not handlers:
        handlers.append(logging.StreamHandler(sys.stderr))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in handlers:
        h.setFormatter(logging.Formatter("%(message)s"))
        root.addHandler(h)
    numeric = _LEVELS[level]
    root.setLevel(numeric)
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
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=False,
    )


def _drop_none(_logger, _name, event_dict):
    """Fields a caller set to None are left out, so optional context stays optional."""
    return {k: v for k, v in event_dict.items() if v is not None}
