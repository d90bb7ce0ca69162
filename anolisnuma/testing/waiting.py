"""Waiting on a condition, for tests and benchmark scripts: the one poll-until-deadline.

A test waits on the condition it checks, never on a sleep of a guessed length; the limit is
a deadline that only a broken daemon reaches (generous: the suite must pass on a loaded
2-core machine), so a passing test is never slowed by it.
"""

from __future__ import annotations

import time
from typing import Any, Callable


def wait_until(cond: Callable[[], Any], what: str = "the condition", timeout: float = 30.0,
               interval: float = 0.02) -> Any:
    """The first truthy ``cond()``, polled every ``interval`` seconds; AssertionError naming
    ``what`` and ``timeout`` once ``timeout`` seconds passed without one (a script may
    catch it)."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)
