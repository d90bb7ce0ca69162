"""The node's caps on CR entries: how many rules the CRs naming this node may bring, in all
and per namespace.

One CR is bounded by ``policies/numa/oenuma_bounds.py``; these bound them together, so that
no number of CRs makes the rules lookup at CreateContainer, the status passes or the saved
rules (``cluster-oenumas.json``, read before the hooks take calls) grow past what the node
budgets. A CR counts its entries for this node (``podAffinity`` and ``numa``, one at least),
and its pod-name patterns: a pattern is tried against the name of every pod of its
namespace at every lookup (``rule_index.py``; an exact name is one dict lookup), so a
namespace the node does not trust has few.

CRs are taken in order, those of trusted namespaces first (an administrator's CRs are not
crowded out by a tenant's), then the others, each in namespace/name order; a CR that would
go past a cap is refused whole, reported in its status entry and by a Warning event, and
the ones after it may still fit. A namespace the node does not trust has its own cap, so
that one tenant cannot take the whole node's budget from the others.
"""

from __future__ import annotations

from typing import AbstractSet, Callable, Dict, Iterable, Optional, Tuple

from anolisnuma.cluster.oenumas import CrRules, Key

MAX_NODE_ENTRIES = 2048       # a node runs 110 pods by default, 250 at most in most clusters
MAX_NAMESPACE_ENTRIES = 512   # per namespace the node does not trust
MAX_NAMESPACE_PATTERNS = 16   # pod-name patterns, likewise: up to ~40 us each at a pod's first lookup


def over_caps(crs: Iterable[CrRules], trusted: AbstractSet[str]) -> Dict[Key, str]:
    """The CRs (of those naming this node) whose rules are not taken, and why."""
    over: Dict[Key, str] = {}
    total = 0
    per_namespace: Dict[str, Tuple[int, int]] = {}   # entries, patterns
    for cr in sorted(crs, key=_order(trusted)):
        if cr.error:
            continue
        namespace = cr.key[0]
        entries, patterns = per_namespace.get(namespace, (0, 0))
        if namespace not in trusted and entries + cr.entries > MAX_NAMESPACE_ENTRIES:
            over[cr.key] = (f"its {cr.entries} entries for this node would take namespace {namespace}'s past "
                            f"{MAX_NAMESPACE_ENTRIES} (it has {entries} from Oenumas that come first)")
            continue
        if namespace not in trusted and patterns + cr.patterns > MAX_NAMESPACE_PATTERNS:
            over[cr.key] = (f"its {cr.patterns} pod-name patterns for this node would take namespace {namespace}'s "
                            f"past {MAX_NAMESPACE_PATTERNS} (it has {patterns} from Oenumas that come first)")
            continue
        if total + cr.entries > MAX_NODE_ENTRIES:
            over[cr.key] = (f"its {cr.entries} entries for this node would take the node's past "
                            f"{MAX_NODE_ENTRIES} (it has {total} from Oenumas that come first)")
            continue
        total += cr.entries
        per_namespace[namespace] = (entries + cr.entries, patterns + cr.patterns)
    return over


class NodeCaps:
    """The entries of the parsed CRs counted as they come and go (:meth:`count`), so that
    a pass looks at each CR (:func:`over_caps`) only when the totals say one may be over."""

    def __init__(self, trusted: AbstractSet[str]) -> None:
        self.trusted = trusted
        self.total = 0
        self.per_namespace: Dict[str, Tuple[int, int]] = {}   # entries, patterns

    def count(self, cr: Optional[CrRules], sign: int) -> None:
        if cr is None or cr.error:
            return
        namespace = cr.key[0]
        self.total += sign * cr.entries
        entries, patterns = self.per_namespace.get(namespace, (0, 0))
        left = (entries + sign * cr.entries, patterns + sign * cr.patterns)
        if left[0]:
            self.per_namespace[namespace] = left
        else:
            self.per_namespace.pop(namespace, None)

    def over(self, parsed: Callable[[], Iterable[CrRules]]) -> Dict[Key, str]:
        """The CRs over the caps now; ``parsed()`` gives every CR, called only when needed."""
        if self.total <= MAX_NODE_ENTRIES and all(
                entries <= MAX_NAMESPACE_ENTRIES and patterns <= MAX_NAMESPACE_PATTERNS
                for ns, (entries, patterns) in self.per_namespace.items() if ns not in self.trusted):
            return {}
        return over_caps(parsed(), self.trusted)


def _order(trusted: AbstractSet[str]):  # type: ignore[no-untyped-def]
    def key(cr: CrRules) -> Tuple[bool, Key]:
        return cr.key[0] not in trusted, cr.key
    return key
