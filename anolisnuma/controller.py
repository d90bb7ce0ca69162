"""One shape for every background loop of the daemon.

A :class:`Controller` makes one pass (:meth:`Controller.run_once`) every ``interval``
seconds on a thread of its own, or when woken (:meth:`Controller.wake`); ``interval`` 0
means "only when woken". A pass that raises is logged and counted and the loop goes on: a
background loop must outlive any single bad read. The daemon registers every controller
in one :class:`Controllers`, which starts them, stops them in reverse order and reports
their counters (``anolisnuma-ctl status``, the metrics endpoint).

Any layer may define a controller (the store's writer, the QoS reconciler, the NUMA
re-pinner, traffic affinity, ...); this module imports nothing of the daemon's.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, Iterator, List, Optional

import structlog

log = structlog.get_logger("anolisnuma.controller")


class Controller:
    """Subclasses set ``name`` and ``interval`` and implement :meth:`run_once`; they may
    add their own counts (:meth:`counts`), report a pass (:meth:`passed`) and release what
    they hold once the loop ended (:meth:`closed`)."""

    name = "controller"
    interval = 0.0
    # The daemon makes a first pass before the loop starts (and before it reports the
    # start-up resync done), so that e.g. placements adopted at start are applied first.
    run_at_start = False
    # Once woken, wait this long for more wake-ups before the pass (0: pass at once): a
    # writer woken by every change of a pod start then writes once for all of them, not
    # once per change with a thread switch each (:meth:`hurry` skips the wait).
    gather_seconds = 0.0

    def __init__(self) -> None:
        self.runs = 0
        self.errors = 0
        self.last_error = ""
        self.last_pass_seconds = 0.0
        self._wake = threading.Event()
        self._hurry = threading.Event()
        self._stopping = False
        self._stopped = False
        self._thread: Optional[threading.Thread] = None

    # ------------------------------------------------------------------ to implement
    def run_once(self) -> Any:
        """One pass; may raise."""
        raise NotImplementedError

    def passed(self, result: Any) -> None:
        """Called after each successful :meth:`step` with what :meth:`run_once` returned."""

    def counts(self) -> Dict[str, int]:
        """The controller's own counters, for status and metrics."""
        return {}

    def closed(self) -> None:
        """Release clients, files, ... once the loop ended (called once by :meth:`stop`)."""

    def wait_seconds(self) -> float:
        """How long the loop waits before the next pass (0: until woken); ``interval``
        unless a subclass backs off after a failure."""
        return self.interval

    # ------------------------------------------------------------------ running
    def step(self) -> Any:
        """One counted pass: an exception is logged and counted, never raised."""
        started = time.monotonic()
        try:
            result = self.run_once()
        except Exception as e:
            self.errors += 1
            self.last_error = _one_line(e)
            log.exception("background pass failed", controller=self.name, error=self.last_error)
            return None
        finally:
            self.last_pass_seconds = time.monotonic() - started
        self.runs += 1
        self.passed(result)
        return result

    def start(self) -> None:
        if self._thread is not None or self._stopping:
            return
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Make a pass now rather than at the end of the interval (after
        ``gather_seconds``, when set)."""
        self._wake.set()

    def hurry(self) -> None:
        """Make a pass now, without the ``gather_seconds`` wait (someone waits for it)."""
        self._hurry.set()
        self._wake.set()

    def stop(self, timeout: float = 5.0) -> None:
        """End the loop (a pass in progress finishes first), then :meth:`closed`. Idempotent."""
        self._stopping = True
        self._hurry.set()
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                # a pass still runs (a call to containerd waiting for its deadline): what it
                # uses is not closed under it; the process is ending anyway
                log.warning("background loop did not stop in time", controller=self.name, timeout_seconds=timeout)
                return
        if not self._stopped:
            self._stopped = True
            try:
                self.closed()
            except Exception as e:
                log.warning("controller did not close cleanly", controller=self.name, error=_one_line(e))

    @property
    def running(self) -> bool:
        t = self._thread
        return t is not None and t.is_alive()

    def status(self) -> Dict[str, Any]:
        return {"interval_seconds": self.interval, "running": self.running, "runs": self.runs,
                "errors": self.errors, "last_error": self.last_error or None,
                "last_pass_ms": round(self.last_pass_seconds * 1000, 2), **self.counts()}

    def _loop(self) -> None:
        while True:
            wait = self.wait_seconds()
            self._wake.wait(wait if wait > 0 else None)
            if self.gather_seconds > 0 and self._wake.is_set():
                self._hurry.wait(self.gather_seconds)
            self._wake.clear()
            self._hurry.clear()
            if self._stopping:
                return
            self.step()


class Controllers:
    """The daemon's background loops, by name, in the order they were added."""

    def __init__(self) -> None:
        self._items: List[Controller] = []

    def add(self, controller: Controller) -> Controller:
        if self.get(controller.name) is not None:
            raise ValueError(f"a controller named {controller.name!r} is registered already")
        self._items.append(controller)
        return controller

    def get(self, name: str) -> Optional[Controller]:
        return next((c for c in self._items if c.name == name), None)

    def __iter__(self) -> Iterator[Controller]:
        return iter(list(self._items))

    def __len__(self) -> int:
        return len(self._items)

    def stop_all(self, timeout: float = 5.0) -> None:
        """Stop every controller, the last added first (later ones use earlier ones)."""
        for c in reversed(list(self._items)):
            c.stop(timeout)

    def status(self) -> Dict[str, Dict[str, Any]]:
        return {c.name: c.status() for c in self._items}


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or repr(e)
    return text[:300]
