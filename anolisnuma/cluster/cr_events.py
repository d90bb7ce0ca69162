"""Events on the pods an Oenuma CR concerns: re-pinned by it, not applied, released.

What a CR's status entry says about a pod (``status.py``) is told on the pod too, so that
``kubectl describe pod`` says where it is and why, from the first pin to the last release:

- ``NumaRepinned`` (Normal): the CR pinned it, to a place it had not been told of;
- ``NumaRuleFailed`` (Warning): the CR's rule could not be applied, and where it stays;
- ``NumaReleased`` (Normal): the CR no longer pins it (the CR was deleted, its entry for
  this node or the pod's ``podAffinity`` entry removed, or a rule that comes first names
  it now), and where it went: told once its move back is applied (the status reporter
  passes every 0.2 s while one is pending), by balance or by the rule that names it now,
  or where it stays when it could not be moved. A pod deleted meanwhile is told nothing.

What was told is kept per CR and forgotten with it: a CR deleted and made again tells its
pods again. Only pods still named by a CR present, and pods waiting for their release to
be told, are kept: the memory is bounded by the status entries (``MAX_PODS`` each).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

from anolisnuma.cluster.events import Event, EventRecorder, pod_regarding
from anolisnuma.cluster.oenumas import CrRules, Key
from anolisnuma.policies.numa.cpuset import CpuSet
from anolisnuma.policies.numa.ledger import Allocation

PodName = Tuple[str, str]              # (namespace, name)
PINNING = ("Pinned", "Pending")        # a pod in these states is the CR's: released when it goes
Told = Tuple[str, str, str]            # (state, cpuset, pod uid) last told for a pod


class CrPodEvents:
    """``CrPodEvents(events, node_name)``: :meth:`entry` for each CR's entry as it is
    written, :meth:`gone` for a CR that no longer names this node, :meth:`announce` once
    per pass (with the placement service's state)."""

    def __init__(self, events: EventRecorder, node_name: str) -> None:
        self.events = events
        self.node_name = node_name
        self._told: Dict[Key, Dict[PodName, Told]] = {}
        # pod uid -> (pod, "Oenuma ns/name", whether that CR is trusted: what its events may tell)
        self._releasing: Dict[str, Tuple[PodName, str, bool]] = {}
        self.released = 0

    @property
    def waiting(self) -> bool:
        """Some release waits for its move to be applied before it is told."""
        return bool(self._releasing)

    def known(self) -> List[Key]:
        """The CRs some pod was told about."""
        return list(self._told)

    def entry(self, cr: CrRules, entry: Dict[str, Any]) -> None:
        """Tell the pods of the CR's new entry what changed for them."""
        told = self._told.setdefault(cr.key, {})
        now: Dict[PodName, Dict[str, Any]] = {(p["namespace"], p["name"]): p for p in entry["pods"]}
        for pod, (state, _, uid) in list(told.items()):
            p = now.get(pod)
            if p is not None and p["state"] in ("Pinned", "Pending", "Failed"):
                continue
            del told[pod]
            if state in PINNING and uid and (p is None or p["state"] == "Overridden"):
                self._releasing[uid] = (pod, f"Oenuma {cr.ref}", cr.trusted)
        for pod, p in now.items():
            state, cpuset, uid = p["state"], p.get("cpuset", ""), p.get("uid", "")
            if state not in ("Pinned", "Pending", "Failed") or told.get(pod, ("", "", ""))[:2] == (state, cpuset):
                continue
            told[pod] = (state, cpuset, uid)   # (Pending: kept, not told; a release of it is)
            self._releasing.pop(uid, None)
            if state != "Pending":
                self._tell_pinned(cr, p)
        if not told:
            del self._told[cr.key]

    def gone(self, key: Key, trusted: bool = False) -> None:
        """The CR no longer names this node (deleted, or its entry removed): each pod it
        pinned is released; what was told of it is forgotten. ``trusted``: the CR was of a
        namespace the node trusts (else its pods' events tell nothing of other rules)."""
        for pod, (state, _, uid) in self._told.pop(key, {}).items():
            if state in PINNING and uid:
                self._releasing[uid] = (pod, f"Oenuma {key[0]}/{key[1]}", trusted)

    def announce(self, allocations: List[Allocation], pending: Any, pool: CpuSet,
                 rule_of: Callable[[Allocation], Any], failure: Callable[[str], str]) -> int:
        """Tell each released pod where it went, once its move is applied; returns how many."""
        if not self._releasing:
            return 0
        by_uid = {a.pod_uid: a for a in allocations}
        told = 0
        for uid, (pod, by, trusted) in list(self._releasing.items()):
            alloc = by_uid.get(uid)
            if alloc is None:          # the pod is gone: nothing to tell
                del self._releasing[uid]
                continue
            if uid in pending:         # its move is being applied: told once it is
                continue
            del self._releasing[uid]
            self.events.record(Event(pod_regarding(pod[0], pod[1], uid), "Normal", "NumaReleased", "Release",
                                     f"{self.node_name}: {by} no longer pins it: "
                                     f"{_where_now(alloc, pool, rule_of(alloc), failure(uid), trusted)}"))
            told += 1
        self.released += told
        return told

    def _tell_pinned(self, cr: CrRules, p: Dict[str, Any]) -> None:
        where = (f"NUMA node {','.join(str(n) for n in p['numaNodes'])}, cpuset {p['cpuset']}"
                 + (f", memset {p['memset']}" if p.get("memset") else ""))
        about = pod_regarding(p["namespace"], p["name"], p.get("uid", ""))
        if p["state"] == "Pinned":
            event = Event(about, "Normal", "NumaRepinned", "Repin", f"{self.node_name}: {where}, by Oenuma {cr.ref}")
        else:
            event = Event(about, "Warning", "NumaRuleFailed", "Repin",
                          f"{self.node_name}: Oenuma {cr.ref} not applied: {p.get('reason', '')}; stays on {where}")
        self.events.record(event)


def _where_now(alloc: Allocation, pool: CpuSet, rule: Optional[Any], failure: str, trusted: bool) -> str:
    """Where a released pod is now; the rule that pins it, and why a move failed, only for
    the pods of a trusted CR (status.py's ``_pod`` says why)."""
    nodes = ",".join(str(n) for n in alloc.nodes)
    where = (f"NUMA node{'s' if len(alloc.nodes) > 1 else ''} {nodes}, cpuset {alloc.cpus(pool)}"
             + (f", memset {alloc.mems}" if str(alloc.mems) else ""))
    if alloc.source == "balance":
        return f"back to balance: {where}"
    if rule is not None:
        return f"{where}, pinned by rule {rule.describe()}" if trusted else f"{where}, pinned by another rule"
    return f"stays on {where}" + (f": {failure}" if failure and trusted else "")
