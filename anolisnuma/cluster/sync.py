"""``ClusterSync``: the ``cluster-rules`` loop, Oenuma CRs turned into placement.

Woken by the watcher when a CR naming this node changed, and every ``interval`` seconds
(so that the status follows pods that came, went or were re-pinned), one pass:

1. when the CRs changed: their rules (``RuleBook``, one CR at a time; a malformed CR is
   logged once and skipped; a CR over a bound, or past the node's caps (``node_caps.py``),
   is refused whole; parts of a CR the node's trust refuses are dropped; each told by a
   Warning event on the CR) go to the placement service, and the CRs whose rules are in
   force are persisted in the state dir (the rules used at the next start when the API
   server cannot be reached);
2. the placement service re-pins the running pods whose rules changed (its live move:
   memory following, rolled back when a re-pin fails), and the re-pinner is woken;
3. this node's status entry is written to each CR whose entry changed, and an event is
   recorded on each pod a CR re-pinned or could not (``events.py``), and on a CR skipped
   as malformed or refused, whole or in part.

Passes are at least ``MIN_SPACING`` apart, and ``FLOOD_SPACING`` while changes keep coming
(the CRs changed within ``FLOOD_WINDOW`` of the last change): a watch flooding changes
costs a rules pass per spacing, not one per event, and a change after a quiet spell is
taken at once. While re-pins are pending, the next pass comes after
``PENDING_INTERVAL``, so that a status saying "Pending" is soon followed by the outcome.
"""

from __future__ import annotations

import bisect
import dataclasses
import threading
import time
from typing import Any, Callable, Dict, List, Optional

import structlog

from anolisnuma.cluster.events import Event, EventRecorder, oenuma_regarding
from anolisnuma.cluster.node_caps import over_caps
from anolisnuma.cluster.oenumas import CrRules, Key, OenumaSet, RuleBook, RulesFile, key_of
from anolisnuma.cluster.report import StatusReporter
from anolisnuma.controller import Controller
from anolisnuma.policies.numa.rules import PinRule

log = structlog.get_logger("anolisnuma.cluster")

MIN_SPACING = 0.05
FLOOD_SPACING = 0.2
FLOOD_WINDOW = 0.5
PENDING_INTERVAL = 0.2
LOGGED = 50


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
        self.current: List[CrRules] = []       # the CRs naming this node, in namespace/name order
        self._by_key: Dict[Key, CrRules] = {}   # what each CR means now (refused when past the caps)
        self._parsed: Dict[Key, CrRules] = {}   # what each CR's parse made of it
        self._capped: Dict[Key, CrRules] = {}   # the refusal of each CR past the caps
        self._order: List[Key] = []           # the keys of current, in its order
        self._unreported: Dict[Key, Optional[CrRules]] = {}   # changed since the last report (None: gone)
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
        file at start.

        Only the CRs that changed since the last call are parsed again (``OenumaSet.changes``);
        the others keep their :class:`CrRules` object, which the status reporter takes as
        "nothing new"; and the rules go to the placement service only when some CR's rules
        differ: a CR whose spec changed and whose rules did not (a field the rules do not
        read, another node's entry) costs its parse and its status entry, nothing more.
        The node's caps are computed from the CRs parsed, at every pass that changed one
        (``node_caps.py``): nothing is counted as CRs come and go, so nothing drifts."""
        with self._lock:
            if self.crs.version == self._version:
                return False
            version, changed = self.crs.changes()
            self._version = version
            if not changed:
                return False
            for key, obj in changed.items():
                self._take_alone(key, obj)
                # (a CR at the bounds takes a few ms to parse: the relay, waiting for the
                # interpreter lock meanwhile, gets it between two rather than after many)
                time.sleep(0)
            over = over_caps(self._parsed.values(), self.book.trusted)
            rules_changed = members_changed = False
            touched = []
            for key in set(changed) | set(self._capped) | set(over):
                was, cr = self._by_key.get(key), self._effective(key, over.get(key))
                if cr is was:
                    continue
                touched.append(key)
                if cr is None:
                    self._by_key.pop(key, None)
                else:
                    self._by_key[key] = cr
                if (was is None) != (cr is None):
                    members_changed = True
                if (was.rules if was is not None else []) != (cr.rules if cr is not None else []):
                    rules_changed = True
                self.skipped_crs += (cr is not None and bool(cr.error)) - (was is not None and bool(was.error))
                if self.reporter is not None:
                    self._unreported[key] = cr
            if members_changed:
                self._order = sorted(self._by_key)
                self.current = [self._by_key[k] for k in self._order]
            else:   # (the same CRs, some of them changed: each in its place, a copy of the list)
                crs = list(self.current)
                for key in touched:
                    if key in self._by_key:   # (not one that named this node neither before nor now)
                        crs[bisect.bisect_left(self._order, key)] = self._by_key[key]
                self.current = crs
            crs = self.current
            rules = self.rules_in_order() if rules_changed else []
            changed_rules = rules_changed and self.placement.set_cluster_rules(rules)
            if changed_rules:
                self.rule_changes += 1
                # (the first ones: at the node's caps the whole list would be a line of 100s of kB)
                log.info("NUMA placement rules from Oenuma CRs", crs=[cr.ref for cr in crs[:LOGGED]],
                         crs_total=len(crs), rules=[r.describe() for r in rules[:LOGGED]], rules_total=len(rules),
                         skipped=self.skipped_crs or None)
            if persist and (changed_rules or self._persisted is None):
                # (a spec change that leaves the rules as they were needs no fsync: a flood of
                # such changes would cost one per pass)
                self._save(*self.crs.mine())
            elif not persist:
                self._persisted = version   # (they were read from the file)
            return changed_rules

    def rules_in_order(self) -> List[PinRule]:
        """The rules of the CRs in force, those of trusted namespaces first (the first rule
        naming a pod wins: a tenant's CR never overrides an administrator's, whatever the
        names of their namespaces), each group in namespace/name order."""
        trusted = self.book.trusted
        first = [r for cr in self.current if cr.key[0] in trusted for r in cr.rules]
        return first + [r for cr in self.current if cr.key[0] not in trusted for r in cr.rules]

    def _take_alone(self, key: Key, obj: Optional[Dict[str, Any]]) -> None:
        """:meth:`_take`, and whatever goes wrong in it stays this CR's: it is marked
        malformed, and the pass goes on with the others."""
        try:
            self._take(key, obj, self._parsed.get(key))
        except Exception as e:  # noqa: BLE001 - one CR's failure is its own (issue 33, H2)
            log.error("Oenuma CR skipped: it could not be taken", cr=f"{key[0]}/{key[1]}", error_type=type(e).__name__,
                      error=str(e)[:300])
            if obj is None:
                self._parsed.pop(key, None)
            else:
                self._parsed[key] = CrRules(key=key, generation=0, uid="", error=f"could not be read ({type(e).__name__})")

    def _effective(self, key: Key, over: Optional[str]) -> Optional[CrRules]:
        """What the CR of ``key`` means now: its parse, or its refusal when ``over`` says why
        it is past the node's caps (the same object while nothing changed: the reporter and
        the events go by it)."""
        parsed = self._parsed.get(key)
        if parsed is None or over is None:
            self._capped.pop(key, None)
            return parsed
        capped = self._capped.get(key)
        error = f"refused: {over}"
        if capped is None or capped.error != error or capped.generation != parsed.generation \
                or capped.uid != parsed.uid:
            capped = self._capped[key] = dataclasses.replace(parsed, rules=[], problems=[], refusals=[], error=error,
                                                             refused=True)
            self._tell_refused(capped, error)
        return capped

    def _take(self, key: Key, obj: Optional[Dict[str, Any]], was: Optional[CrRules]) -> Optional[CrRules]:
        """The CR of ``key`` parsed again (None: it no longer names this node), told when
        malformed, refused, or when entries of it are dropped."""
        if obj is None:
            self._parsed.pop(key, None)
            return None
        cr = self._parsed[key] = self.book.parse(key, obj)
        if cr.refused:
            self._tell_refused(cr, cr.error)
        elif cr.error:
            log.error("Oenuma CR skipped: malformed", cr=cr.ref, generation=cr.generation, error=cr.error)
            if self.events is not None:
                self.events.record(Event(oenuma_regarding(cr.key[0], cr.key[1], cr.uid), "Warning",
                                         "OenumaMalformed", "Skip", f"{self.crs.node_name}: skipped: {cr.error}"))
        if cr.refusals:
            self._tell_refused(cr, "; ".join(cr.refusals), whole=False)
        for problem in cr.problems if was is None or was.problems != cr.problems else ():
            log.warning("Oenuma CR entry ignored", cr=cr.ref, problem=problem)
        return cr

    def _tell_refused(self, cr: CrRules, why: str, whole: bool = True) -> None:
        """What the node refused of a CR, in its log and as a Warning event on the CR (its
        status entry says it too, ``status.py``)."""
        log.warning("Oenuma CR refused" if whole else "Oenuma CR parts refused", cr=cr.ref,
                    generation=cr.generation, why=why[:1000])
        if self.events is not None:
            self.events.record(Event(oenuma_regarding(cr.key[0], cr.key[1], cr.uid), "Warning", "OenumaRefused",
                                     "Refuse", f"{self.crs.node_name}: {why if whole else 'parts refused: ' + why}"))

    def _save(self, version: int, objects: List[Dict[str, Any]]) -> None:
        """The CRs whose rules are in force (not those skipped, refused or past the caps:
        what the file holds stays within the caps, and so does its reading at start)."""
        if version == self._persisted:
            return
        in_force = []
        for obj in objects:
            cr = self._by_key.get(key_of(obj) or ("", ""))
            if cr is not None and not cr.error:
                in_force.append(obj)
        try:
            self.rules_file.save(self.crs.node_name, in_force)
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
        # (pending when the entries are made: the re-pinner may finish while they are written,
        # and an entry that says "Pending" is followed by the outcome all the same)
        pending = bool(self.placement.pending_pods())
        if self.reporter is not None:
            with self._lock:
                changed, self._unreported = self._unreported, {}
            self.reporter.report(self.current, self.placement, interrupted=self._wake.is_set, changed=changed)
        # (the re-pinner may also have applied the moves while the report was made: an entry
        # it wrote "Pending", or a release it waits to tell, is followed up soon all the same)
        awaiting = self.reporter is not None and self.reporter.awaiting
        self.interval = PENDING_INTERVAL if pending or awaiting or self.placement.pending_pods() else self.every
        return moved

    def counts(self) -> Dict[str, int]:
        out = {"rule_changes": self.rule_changes, "repins": self.repins, "skipped_crs": self.skipped_crs,
               "save_failures": self.save_failures}
        if self.reporter is not None:
            out.update(self.reporter.counts())
        return out
