"""Which pods NUMA placement manages.

A pod is managed when NUMA placement is enabled, the pod has not opted out, and at least
one of these holds:

- a placement rule that may select pods names it (config ``[[numa.pin]]``, an ``Oenuma``
  file, an Oenuma CR of a namespace the node trusts);
- its namespace matches one of ``numa.namespaces``;
- its name matches one of ``numa.pod_name_patterns`` (a pattern with a ``/`` is matched
  against ``namespace/name``).

A rule of a CR the node does not trust pins a pod only when one of the last two holds: a
tenant may move its own pods among those the node manages, never make the node manage
more. Patterns of the configuration are shell-style (``fnmatch``, case-sensitive: root's
own, compiled once). The opt-out is the annotation (or label) ``numa.anolisnuma.io/skip:
"true"``. Everything else is left exactly as the kubelet sent it.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from anolisnuma.policies.numa.rule_index import RuleIndex
from anolisnuma.policies.numa.rules import PinRule

SKIP_KEY = "numa.anolisnuma.io/skip"
_TRUE = ("true", "1", "yes", "on")


@dataclass(frozen=True)
class Selection:
    managed: bool
    rule: Optional[PinRule] = None
    why: str = ""


NOT_MANAGED = Selection(False, None, "not selected")


def opted_out(annotations: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    """True when the pod carries ``numa.anolisnuma.io/skip`` set to true/1/yes/on."""
    for source in (annotations, labels):
        value = source.get(SKIP_KEY)
        if value is not None and value.strip().lower() in _TRUE:
            return True
    return False


class PodSelector:
    """Decides whether a pod is managed, and by which rule it is pinned (first match wins:
    config pins in order, then rule files in file-name order, then CRs; :class:`RuleIndex`)."""

    def __init__(self, namespaces: Sequence[str], name_patterns: Sequence[str],
                 rules: Sequence[PinRule] = ()) -> None:
        self.namespaces = tuple(namespaces)
        self.name_patterns = tuple(name_patterns)
        self.rules = tuple(rules)
        self._index = RuleIndex(self.rules)
        self._ns = _compile(self.namespaces)
        self._plain = _compile([p for p in self.name_patterns if "/" not in p])
        self._qualified = _compile([p for p in self.name_patterns if "/" in p])

    def with_rules(self, rules: Sequence[PinRule]) -> "PodSelector":
        return PodSelector(self.namespaces, self.name_patterns, rules)

    def select(self, namespace: str, name: str, annotations: Mapping[str, str],
               labels: Mapping[str, str]) -> Selection:
        if opted_out(annotations, labels):
            return Selection(False, None, f"opted out ({SKIP_KEY})")
        why = self._selected(namespace, name)
        rule = self._index.first(namespace, name, managed=bool(why))
        if rule is not None:
            return Selection(True, rule, f"rule {rule.source}")
        return Selection(True, None, why) if why else NOT_MANAGED

    def _selected(self, namespace: str, name: str) -> str:
        """Why ``[numa]``'s namespaces or name patterns manage the pod; "" when they do not."""
        if self._ns is not None and self._ns.match(namespace):
            return "namespace"
        if self._plain is not None and self._plain.match(name):
            return "pod name pattern"
        if self._qualified is not None and self._qualified.match(f"{namespace}/{name}"):
            return "pod name pattern"
        return ""


def _compile(patterns: Sequence[str]) -> Optional["re.Pattern[str]"]:
    if not patterns:
        return None
    return re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns))
