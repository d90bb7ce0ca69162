"""``ClusterSync``: the ``cluster-rules`` loop, Oenuma CRs turned into placement.

Woken by the watcher when a CR naming this node changed, and every ``interval`` seconds
(so that the status follows pods that came, went or were re-pinned), one pass:

1. when the CRs changed: their rules (``RuleBook``, one CR at a time; a malformed CR is
   logged once and skipped) go to the placement service, and the CRs are persisted in the
   state dir (the rules used at the next start when the API server cannot be reached);
2. the placement service re-pins the running pods whose rules changed (its live move:
   memory following, rolled back when a re-pin fails), and the re-pinner is woken;
3. this node's status entry is written to each CR whose entry changed, and an event is
   recorded on each pod a CR re-pinned or could not (``events.py``), and on a CR skipped
   as malformed.

Passes are at least ``MIN_SPACING`` apart, and ``FLOOD_SPACING`` while changes keep coming
(the CRs changed within ``FLOOD_WINDOW`` of the last change): a watch flooding changes
costs a rules pass per spacing, not one per event, and a change after a quiet spell is
taken at once. While re-pins are pending, the next pass comes after
``PENDING_INTERVAL``, so that a status saying "Pending" is soon followed by the outcome.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict, List, Optional

import structlog

from anolisnuma.cluster.events import Event, EventRecorder, oenuma_regarding
from anolisnuma.cluster.oenumas import CrRules, OenumaSet, RuleBook, RulesFile
from anolisnuma.cluster.report import StatusReporter
from anolisnuma.controller import Controller

log = structlog.get_logger("anolisnuma.cluster")

MIN_SPACING = 0.05
FLOOD_SPACING = 0.2
FLOOD_WINDOW = 0.5
PENDING_INTERVAL = 0.2


class ClusterSync(Controller):
    """``ClusterSync(placement, crs, book, rules_file, wake_repin, reporter=None)``."""

    name = "cluster-rules"

    def __init__(self, placement: Any, crs: OenumaSet, book: RuleBook, rules_file: RulesFile,
                 wake_repin: Callable[[], None], reporter: Optional[StatusReporter] = None,
                 interval_seconds: float = 10.0, events: Optional[EventRecorder] = None) -> None:
        super().__init__()
        self.events = events
        self.placement = placement
        self.crs = crs
        self.book = book
        self.rules_file = rules_file
        self.wake_repin = wake_repin
        self.reporter = reporter
        self.interval = self.every = interval_seconds
        self.current: List[CrRules] = []
        self._version: Optional[int] = None
        self._persisted: Optional[int] = None
        self._lock = threading.Lock()
        self._last_pass = 0.0
        self._last_change = 0.0
        self.rule_changes = 0
        self.repins = 0
        self.skipped_crs = 0
        self.save_failures = 0

    def use_rules(self, persist: bool = True) -> bool:
        """Give the placement service the rules of the CRs naming this node, when they
        changed; True when they did. ``persist=False`` for the CRs loaded from the state
        file at start."""
        with self._lock:
            version, objects = self.crs.mine()
            if version == self._version:
                return False
            old = {cr.key: cr for cr in self.current}
            crs = self.book.rules_of(objects)
            for cr in crs:
                if cr.error and old.get(cr.key) is not cr:
                    log.error("Oenuma CR skipped: malformed", cr=cr.ref, generation=cr.generation, error=cr.error)
                    if self.events is not None:
                        self.events.record(Event(oenuma_regarding(cr.key[0], cr.key[1], cr.uid), "Warning",
                                                 "OenumaMalformed", "Skip",
                                                 f"{self.crs.node_name}: skipped: {cr.error}"))
                for problem in cr.problems if old.get(cr.key) is not cr else ():
                    log.warning("Oenuma CR entry ignored", cr=cr.ref, problem=problem)
            self.skipped_crs = sum(1 for cr in crs if cr.error)
            self.current = crs
            self._version = version
            changed = self.placement.set_cluster_rules([r for cr in crs for r in cr.rules])
            if changed:
                self.rule_changes += 1
                log.info("NUMA placement rules from Oenuma CRs", crs=[cr.ref for cr in crs],
                         rules=[r.describe() for cr in crs for r in cr.rules], skipped=self.skipped_crs or None)
            if persist and (changed or self._persisted is None):
                # (a spec change that leaves the rules as they were needs no fsync: a flood of
                # such changes would cost one per pass)
                self._save(version, objects)
            else:
                self._persisted = version   # (they were read from the file)
            return changed

    def _save(self, version: int, objects: List[Dict[str, Any]]) -> None:
        if version == self._persisted:
            return
        try:
            self.rules_file.save(self.crs.node_name, objects)
        except OSError as e:
            self.save_failures += 1
            log.error("cannot save the Oenuma rules; they still apply", path=self.rules_file.path, error=str(e))
            return
        self._persisted = version

    def run_once(self) -> int:
        now = time.monotonic()
        spacing = FLOOD_SPACING if now - self._last_change < FLOOD_WINDOW else MIN_SPACING
        wait = self._last_pass + spacing - now
        if wait > 0:
            time.sleep(wait)   # a rate limit: the wake-ups of a flood are folded into one pass
        self._last_pass = time.monotonic()
        if self.crs.version != self._version:
            self._last_change = self._last_pass
        self.use_rules()
        moved = self.placement.reconcile_rules()
        if moved:
            self.repins += moved
            self.wake_repin()
        if self.reporter is not None:
            self.reporter.report(self.current, self.placement, interrupted=self._wake.is_set)
        self.interval = PENDING_INTERVAL if self.placement.pending_pods() else self.every
        return moved

    def counts(self) -> Dict[str, int]:
        out = {"rule_changes": self.rule_changes, "repins": self.repins, "skipped_crs": self.skipped_crs,
               "save_failures": self.save_failures}
        if self.reporter is not None:
            out.update(self.reporter.counts())
        return out
