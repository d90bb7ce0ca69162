"""``StatusReporter``: this node's entries written into the Oenuma CRs' status.

Each write is a server-side apply of ``/status`` under a field manager of this node's own
(``anolisnuma/<node>``), so the API server merges the entries of several nodes into the
list keyed by node name and no node overwrites another's. An entry is written when it
differs from the one written last (its time fields aside), and removed (applied empty)
when the CR stops naming this node. ``Applied``'s ``lastTransitionTime`` changes only when
its status does. A CR deleted meanwhile (404) is forgotten; other failures are counted and
the entry is tried again at the next pass.

With events on, what an entry says about its pods is also told on them (re-pinned, not
applied, released by a CR that no longer pins them, and where they went):
``cr_events.py``.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Set, Tuple

import structlog

from anolisnuma.cluster.cr_events import CrPodEvents
from anolisnuma.cluster.events import EventRecorder
from anolisnuma.cluster.kube_client import ApiError, KubeClient
from anolisnuma.cluster.oenumas import CrRules, Key
from anolisnuma.cluster.status import apply_body, node_entry
from anolisnuma.policies.numa.rules import OENUMA_API_VERSION, OENUMA_KIND

log = structlog.get_logger("anolisnuma.cluster")


def field_manager(node_name: str) -> str:
    """``anolisnuma/<node>``; a name past the API server's 128 characters is shortened
    with a hash of it (still one per node)."""
    name = f"anolisnuma/{node_name}"
    if len(name) <= 128:
        return name
    return name[:100] + "-" + hashlib.sha256(node_name.encode()).hexdigest()[:16]


def rfc3339(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


class StatusReporter:
    """``StatusReporter(client, node_name)``; :meth:`report` once per pass of the rules loop."""

    def __init__(self, client: KubeClient, node_name: str, clock: Callable[[], float] = time.time,
                 events: Optional[EventRecorder] = None) -> None:
        self.client = client
        self.pods_told: Optional[CrPodEvents] = CrPodEvents(events, node_name) if events is not None else None
        self.node_name = node_name
        self.manager = field_manager(node_name)
        self.clock = clock
        self._written: Dict[Key, str] = {}                       # the entry last written, as JSON
        self._inputs: Dict[Key, Tuple[CrRules, int]] = {}   # what it was made of (skips the making)
        self._placed: Any = None                             # the placement entries were made from
        self._placed_version = 0
        self._transitions: Dict[Key, Tuple[str, str]] = {}       # Applied: (status, lastTransitionTime)
        self._left: Dict[Key, Optional[CrRules]] = {}            # entries to look at again (None: remove)
        self.awaiting = False   # the last report saw re-pins pending, or releases to tell: come back soon
        self.writes = 0
        self.removals = 0
        self.failures = 0
        self.last_error = ""

    def report(self, crs: List[CrRules], placement: Any, interrupted: Callable[[], bool] = lambda: False,
               changed: Optional[Mapping[Key, Optional[CrRules]]] = None) -> int:
        """Write every entry that changed (``placement`` is the PlacementService); returns
        how many requests succeeded. When ``interrupted()`` turns true (the CRs changed
        again), the entries left are written at the next pass: rules and re-pins come
        before reports.

        ``changed``: the CRs changed since the last call (None: a CR no longer naming this
        node), when the caller knows; then, unless the placements changed meanwhile, only
        those and the entries left over from before (failed, interrupted) are looked at:
        a flood of changes to a few CRs among a thousand does not walk the thousand."""
        allocations = placement.allocations()
        pending: Set[str] = placement.pending_pods()
        pool = placement.shared_pool
        # an entry depends on its CR's rules and on this; when neither changed, it is not made
        # again (a watch flood re-parses the CRs that changed, not every entry)
        placed = (str(pool), frozenset(pending), tuple(sorted(
            (a.pod_uid, a.namespace, a.name, a.nodes, str(a.home), str(a.mems), a.source,
             placement.rule_failure(a.pod_uid)) for a in allocations)))
        everything = changed is None or placed != self._placed
        if placed != self._placed:
            self._placed, self._placed_version = placed, self._placed_version + 1
        told = self.pods_told.known() if self.pods_told is not None else []
        if everything:
            self._left = {}
            current = {cr.key for cr in crs}
            present: List[CrRules] = crs
            gone = [k for k in dict.fromkeys(list(self._written) + told) if k not in current]
        else:
            left, self._left = self._left, {}
            left.update(changed or {})
            present = [cr for _, cr in sorted((k, cr) for k, cr in left.items() if cr is not None)]
            gone = [k for k, cr in left.items() if cr is None and (k in self._written or k in told)]
        done = 0
        for cr in present:
            made_of = self._inputs.get(cr.key)
            # (the CR's rules are the same object until its spec changes: held here, its
            # identity cannot be reused by another)
            if made_of is not None and made_of[0] is cr and made_of[1] == self._placed_version:
                continue
            if interrupted():
                self._left[cr.key] = cr
                continue
            entry = node_entry(self.node_name, cr, allocations, pool, placement.rule_of, pending,
                               placement.rule_failure)
            text = json.dumps(entry, sort_keys=True)
            if self.pods_told is not None:
                self.pods_told.entry(cr, entry)
            if self._written.get(cr.key) != text:
                self._stamp(cr.key, entry)
                if not self._apply(cr, entry):
                    self._left[cr.key] = cr
                    continue
                self._written[cr.key] = text
                self.writes += 1
                done += 1
            self._inputs[cr.key] = (cr, self._placed_version)
        for key in gone:
            if interrupted():
                self._left[key] = None
                continue
            if self.pods_told is not None:
                made_of = self._inputs.get(key)
                # (a CR made again tells its pods again)
                self.pods_told.gone(key, trusted=made_of is not None and made_of[0].trusted)
            if key in self._written and self._apply(CrRules(key=key, generation=0, uid=""), None):
                self.removals += 1
                done += 1
            self._written.pop(key, None)
            self._inputs.pop(key, None)
            self._transitions.pop(key, None)
        if self.pods_told is not None:
            self.pods_told.announce(allocations, pending, pool, placement.rule_of, placement.rule_failure)
        self.awaiting = bool(pending) or (self.pods_told is not None and self.pods_told.waiting)
        return done

    def _stamp(self, key: Key, entry: Dict[str, Any]) -> None:
        cond = entry["conditions"][0]
        was = self._transitions.get(key)
        when = was[1] if was is not None and was[0] == cond["status"] else rfc3339(self.clock())
        self._transitions[key] = (cond["status"], when)
        cond["lastTransitionTime"] = when

    def _apply(self, cr: CrRules, entry: Optional[Dict[str, Any]]) -> bool:
        ns, name = cr.key
        body = apply_body(cr, entry, self.node_name, rfc3339(self.clock()), OENUMA_API_VERSION, OENUMA_KIND)
        try:
            self.client.apply_oenuma_status(ns, name, body, self.manager)
        except ApiError as e:
            if e.status == 404:
                return entry is None   # the CR is gone: nothing left to report on
            self.failures += 1
            if str(e)[:300] != self.last_error:
                log.warning("cannot write Oenuma status; tried again at the next pass", cr=f"{ns}/{name}",
                            error=str(e)[:300])
            self.last_error = str(e)[:300]
            return False
        self.last_error = ""
        return True

    def counts(self) -> Dict[str, int]:
        out = {"status_writes": self.writes, "status_removals": self.removals, "status_failures": self.failures}
        if self.pods_told is not None:
            out["pods_released"] = self.pods_told.released
        return out
