"""Which pods NUMA placement manages.

A pod is managed when NUMA placement is enabled, the pod has not opted out, and at least
one of these holds:

- a placement rule names it (config ``[[numa.pin]]`` or an ``Oenuma`` file);
- its namespace matches one of ``numa.namespaces``;
- its name matches one of ``numa.pod_name_patterns`` (a pattern with a ``/`` is matched
  against ``namespace/name``).

Patterns are shell-style (``fnmatch``, case-sensitive). The opt-out is the annotation (or
label) ``numa.anolisnuma.io/skip: "true"``. Everything else is left exactly as the kubelet
sent it.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

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
    config pins in order, then rule files in file-name order)."""

    def __init__(self, namespaces: Sequence[str], name_patterns: Sequence[str],
                 rules: Sequence[PinRule] = ()) -> None:
        self.namespaces = tuple(namespaces)
        self.name_patterns = tuple(name_patterns)
        self.rules = tuple(rules)
        self._ns = _compile(self.namespaces)
        self._plain = _compile([p for p in self.name_patterns if "/" not in p])
        self._qualified = _compile([p for p in self.name_patterns if "/" in p])

    def with_rules(self, rules: Sequence[PinRule]) -> "PodSelector":
        return PodSelector(self.namespaces, self.name_patterns, rules)

    def select(self, namespace: str, name: str, annotations: Mapping[str, str],
               labels: Mapping[str, str]) -> Selection:
        if opted_out(annotations, labels):
            return Selection(False, None, f"opted out ({SKIP_KEY})")
        for rule in self.rules:
            if rule.matches(namespace, name):
                return Selection(True, rule, f"rule {rule.source}")
        if self._ns is not None and self._ns.match(namespace):
            return Selection(True, None, "namespace")
        if self._plain is not None and self._plain.match(name):
            return Selection(True, None, "pod name pattern")
        if self._qualified is not None and self._qualified.match(f"{namespace}/{name}"):
            return Selection(True, None, "pod name pattern")
        return NOT_MANAGED


def _compile(patterns: Sequence[str]) -> Optional["re.Pattern[str]"]:
    if not patterns:
        return None
    return re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns))
