"""The node's caps on CR entries: how many rules the CRs naming this node may bring, in all
and per namespace.

One CR is bounded by ``policies/numa/oenuma_bounds.py``; these bound them together, so that
no number of CRs makes the rules lookup at CreateContainer, the status passes or the saved
rules (``cluster-oenumas.json``, read before the hooks take calls) grow past what the node
budgets. A CR counts its entries for this node (``podAffinity`` and ``numa``, one at least),
and its pod-name patterns: a pattern is tried against the name of every pod of its
namespace at every lookup (``rule_index.py``; an exact name is one dict lookup), so a
namespace the node does not trust has few.

Who gets what, computed afresh from the CRs in force at every pass (a count kept as CRs
come and go drifted when a parse failed halfway: issue 33, H2):

1. the CRs of trusted namespaces first, in namespace/name order, up to the node's cap: an
   administrator's CRs are not crowded out by a tenant's;
2. what is left is shared among the namespaces the node does not trust, max-min fair in
   whole CRs: they take turns, the namespace with the fewest entries taken so far first,
   each turn its next CR in name order (within its own caps). Four tenants at their own
   cap no longer leave nothing for a fifth (issue 33, L5): each tenant's first CRs come
   before any tenant's later ones;
3. a CR that does not fit is refused whole (its status entry and a Warning event say why),
   and the ones after it may still fit.
"""

from __future__ import annotations

import heapq
from typing import AbstractSet, Dict, Iterable, List

from anolisnuma.cluster.oenumas import CrRules, Key

MAX_NODE_ENTRIES = 2048       # a node runs 110 pods by default, 250 at most in most clusters
MAX_NAMESPACE_ENTRIES = 512   # per namespace the node does not trust
MAX_NAMESPACE_PATTERNS = 16   # pod-name patterns, likewise: up to ~40 us each at a pod's first lookup


def over_caps(crs: Iterable[CrRules], trusted: AbstractSet[str]) -> Dict[Key, str]:
    """The CRs (of those naming this node and parsed without error) whose rules are not
    taken, and why. Pure: the same CRs give the same answer, whatever came before."""
    over: Dict[Key, str] = {}
    mine: List[CrRules] = []
    tenants: Dict[str, List[CrRules]] = {}
    for cr in sorted(crs, key=lambda c: c.key):
        if cr.error:
            continue
        if cr.key[0] in trusted:
            mine.append(cr)
        else:
            tenants.setdefault(cr.key[0], []).append(cr)
    total = 0
    for cr in mine:
        if total + cr.entries > MAX_NODE_ENTRIES:
            over[cr.key] = (f"its {cr.entries} entries for this node would take the node's past "
                            f"{MAX_NODE_ENTRIES} (it has {total} from Oenumas that come first)")
            continue
        total += cr.entries
    # Untrusted namespaces take turns, the one with the fewest entries taken so far first
    # (name order between equals), each turn its next CR in name order: max-min fair in
    # whole CRs. A CR past the room left is refused; its namespace's next may still fit.
    queues = {ns: _within_namespace_caps(crs, over) for ns, crs in tenants.items()}
    turns = [(0, ns) for ns, queue in queues.items() if queue]
    heapq.heapify(turns)
    at = dict.fromkeys(queues, 0)
    while turns:
        used, ns = heapq.heappop(turns)
        queue = queues[ns]
        while at[ns] < len(queue):
            cr = queue[at[ns]]
            at[ns] += 1
            if total + cr.entries <= MAX_NODE_ENTRIES:
                total += cr.entries
                heapq.heappush(turns, (used + cr.entries, ns))
                break
            over[cr.key] = (f"its {cr.entries} entries for this node would take the node's past "
                            f"{MAX_NODE_ENTRIES} (it has {total}: the trusted namespaces' first, then the others' "
                            f"shared in turns, {ns} having {used})")
    return over


def _within_namespace_caps(crs: List[CrRules], over: Dict[Key, str]) -> List[CrRules]:
    """The CRs of one untrusted namespace (in name order) within its own caps; the others
    go into ``over`` with why."""
    taken: List[CrRules] = []
    entries = patterns = 0
    for cr in crs:
        namespace = cr.key[0]
        if entries + cr.entries > MAX_NAMESPACE_ENTRIES:
            over[cr.key] = (f"its {cr.entries} entries for this node would take namespace {namespace}'s past "
                            f"{MAX_NAMESPACE_ENTRIES} (it has {entries} from Oenumas that come first)")
            continue
        if patterns + cr.patterns > MAX_NAMESPACE_PATTERNS:
            over[cr.key] = (f"its {cr.patterns} pod-name patterns for this node would take namespace {namespace}'s "
                            f"past {MAX_NAMESPACE_PATTERNS} (it has {patterns} from Oenumas that come first)")
            continue
        entries += cr.entries
        patterns += cr.patterns
        taken.append(cr)
    return taken
