"""A status entry written while a re-pin was pending is followed by the outcome within
``PENDING_INTERVAL``, even when the re-pinner finished while the entries were being
written (it runs on a thread of its own): the walk-through of docs/cluster.md waited 10 s
for "Pinned" after every CR before this."""

from __future__ import annotations

from typing import Any

from test_sync_incremental import cr, make

from anolisnuma.cluster.sync import PENDING_INTERVAL


def test_the_next_pass_comes_soon_when_a_repin_was_pending_as_the_status_was_written(tmp_path: Any) -> None:
    crs, sync, _, applies = make(tmp_path)
    pending = {"pod-uid"}
    sync.placement.pending_pods = lambda: set(pending)
    written = sync.reporter.report

    def report(*args: Any, **kw: Any) -> int:
        done = written(*args, **kw)
        pending.clear()       # the re-pinner is done a moment after the "Pending" entry went
        return done
    sync.reporter.report = report
    crs.replace([cr(1)])
    sync.run_once()
    assert applies.made and sync.interval == PENDING_INTERVAL
    sync.run_once()           # the outcome written: back to the usual interval
    assert sync.interval == sync.every
