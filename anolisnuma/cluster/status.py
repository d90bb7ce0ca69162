"""What this node writes into an Oenuma's status: its ``status.nodes[]`` entry (pure).

Per pod the CR names for this node: ``Pinned`` (the NUMA nodes, cpuset and memset it
got), ``Pending`` (being re-pinned), ``Failed`` (why the rule could not be applied),
``Overridden`` (a rule that comes first names it: config pins and rule files come before
CRs) or ``Absent`` (no pod of that name is placed on this node). A CR skipped as malformed,
or refused whole (over a bound or past the node's caps), gets no pods and the reason in its
problems and its ``Applied`` condition (``Malformed``, ``Refused``); the parts of a CR the
node's trust refused come first in its problems, and make ``Applied`` False (``Refused``).

The entry carries ``observedGeneration`` (the CR's ``metadata.generation`` it reports on)
and one condition, ``Applied``: True when every pod present is pinned and no entry of the
spec was dropped or refused.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from anolisnuma.cluster.oenumas import CrRules
from anolisnuma.policies.numa.cpuset import CpuSet
from anolisnuma.policies.numa.ledger import Allocation
from anolisnuma.policies.numa.rules import PinRule

MAX_PODS = 200       # per entry: a status stays small whatever the patterns match
MAX_PROBLEMS = 20
ABSENT = "no pod of this name is placed on this node"
UNTOLD_FAILURE = "not placed by the rule"
ABSENT_UNTRUSTED = (ABSENT + " (an Oenuma of a namespace this node does not trust pins only pods its [numa] "
                    "selection manages)")


class _Placed:
    """The allocations by namespace and name: a rule's pods without a walk over every pod
    (per rule, at the node's caps, that walk was thousands of matches per entry)."""

    def __init__(self, allocations: List[Allocation]) -> None:
        self.all = allocations
        self.by_name: Dict[Tuple[str, str], List[Allocation]] = {}
        self.by_namespace: Dict[str, List[Allocation]] = {}
        for a in allocations:
            self.by_name.setdefault((a.namespace, a.name), []).append(a)
            self.by_namespace.setdefault(a.namespace, []).append(a)

    def matching(self, rule: PinRule) -> List[Allocation]:
        if rule.exact_namespace and rule.exact_name:
            return self.by_name.get((rule.namespace, rule.name), [])
        among = self.by_namespace.get(rule.namespace, []) if rule.exact_namespace else self.all
        return [a for a in among if rule.matches(a.namespace, a.name)]


def node_entry(node_name: str, cr: CrRules, allocations: List[Allocation], pool: CpuSet,
               rule_of: Callable[[Allocation], Optional[PinRule]], pending: Set[str],
               failure: Callable[[str], str]) -> Dict[str, Any]:
    """The ``status.nodes[]`` entry of ``node_name`` for ``cr`` (without its time fields)."""
    pods: List[Dict[str, Any]] = []
    seen: Set[Tuple[str, str]] = set()
    if not cr.error:
        placed = _Placed(allocations)
        for rule in cr.rules:
            matched = placed.matching(rule)
            if not matched and (rule.namespace, rule.name) not in seen:
                seen.add((rule.namespace, rule.name))
                pods.append({"namespace": rule.namespace, "name": rule.name, "state": "Absent",
                             "reason": ABSENT if rule.selects else ABSENT_UNTRUSTED})
            for a in sorted(matched, key=lambda a: (a.namespace, a.name)):
                if (a.namespace, a.name) in seen:
                    continue
                seen.add((a.namespace, a.name))
                pods.append(_pod(a, rule, pool, rule_of(a), pending, failure(a.pod_uid), cr.trusted))
    pods.sort(key=lambda p: (p["namespace"], p["name"]))
    more = len(pods) - MAX_PODS
    problems = ([cr.error] if cr.error else cr.refusals + cr.problems)
    if more > 0:
        pods = pods[:MAX_PODS]
        problems.append(f"{more} more pods not listed")
    problems = problems[:MAX_PROBLEMS]
    present = [p for p in pods if p["state"] != "Absent"]
    pinned = sum(1 for p in present if p["state"] == "Pinned")
    summary = f"{pinned}/{len(present)} pods pinned"
    absent = len(pods) - len(present)
    if absent:
        summary += f", {absent} absent"
    if cr.error:
        summary = "refused, skipped" if cr.refused else "malformed, skipped"
        condition = ("False", "Refused" if cr.refused else "Malformed", cr.error)
    elif pinned < len(present):
        states = {p["state"] for p in present}
        worst = next(st for st in ("Failed", "Pending", "Overridden") if st in states)
        condition = ("False", worst,
                     "; ".join(f"{p['namespace']}/{p['name']}: {p['state']} {p.get('reason', '')}".strip()
                               for p in present if p["state"] != "Pinned")[:1000])
    elif problems:
        summary += f", {len(problems)} problems"
        condition = ("False", "Refused" if cr.refusals else "EntriesDropped", "; ".join(problems)[:1000])
    else:
        condition = ("True", "Applied", summary)
    status, reason, message = condition
    return {"name": node_name, "observedGeneration": cr.generation, "summary": summary, "pods": pods,
            "problems": problems,
            "conditions": [{"type": "Applied", "status": status, "reason": reason, "message": message,
                            "observedGeneration": cr.generation}]}


def _pod(a: Allocation, rule: PinRule, pool: CpuSet, winner: Optional[PinRule], pending: Set[str],
         failure: str, trusted: bool) -> Dict[str, Any]:
    """One pod's line. What it says of other rules and of why a rule failed is told only on
    a trusted CR: the rule that comes first may be root's (a rule file's path, its
    patterns) and a failure's words may name other pods; a tenant's CR gets the state and
    a fixed reason (issue 33, L2)."""
    out: Dict[str, Any] = {"namespace": a.namespace, "name": a.name, "uid": a.pod_uid,
                           "numaNodes": list(a.nodes), "cpuset": str(a.cpus(pool)), "memset": str(a.mems)}
    if winner != rule:
        who = winner.describe() if winner is not None and trusted else "another rule"
        out.update(state="Overridden", reason=f"{who} comes first")
    elif a.pod_uid in pending:
        out.update(state="Pending", reason="being re-pinned")
    elif a.source != "rule":
        out.update(state="Failed", reason=(failure if trusted else "") or UNTOLD_FAILURE)
    else:
        out["state"] = "Pinned"
    return out


def apply_body(cr: CrRules, entry: Optional[Dict[str, Any]], node_name: str, now: str,
               api_version: str, kind: str) -> Dict[str, Any]:
    """The server-side apply body for ``/status``: this node's entry (None removes it:
    what a field manager stops applying is dropped) and the one-line report."""
    body: Dict[str, Any] = {"apiVersion": api_version, "kind": kind,
                            "metadata": {"name": cr.key[1], "namespace": cr.key[0]}}
    if entry is not None:
        body["status"] = {"summary": f"{node_name}, gen {cr.generation}: {entry['summary']}",
                          "nodes": [dict(entry, lastUpdateTime=now)]}
    # (no status at all, not an empty one: applying `status: {}` makes the manager hold the
    # map, and when it held the last entry the API server is left with `status: null`,
    # which the CRD's schema refuses: the last node's entry could never be taken away)
    return body
