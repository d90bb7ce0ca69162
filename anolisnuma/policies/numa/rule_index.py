"""The first placement rule that names a pod, found without scanning every rule.

Consulted at every CreateContainer (and by the status and re-pin passes, per pod), over up
to the node's cap of CR entries (``cluster/node_caps.py``) besides config pins and rule
files. Rules are kept in their order (first match wins) in three buckets:

- exact namespace and exact name: one dict lookup;
- exact namespace, name pattern: the patterns of that namespace only (a CR of an untrusted
  namespace has only these, capped per namespace);
- namespace pattern (config pins, rule files, CRs of trusted namespaces): scanned for
  every pod.

A pattern is tried only while it comes before the best rule found so far. A rule that may
not make a pod managed (``PinRule.selects`` False) is passed over for a pod the node's
``[numa]`` selection does not manage. What a lookup found is kept (an index is made anew
whenever the rules change): a pod's later containers, its re-pins and its status entries
ask again for the same name.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from anolisnuma.policies.numa.rules import PinRule

_NONE = 1 << 62
MAX_REMEMBERED = 4096


class RuleIndex:
    """``RuleIndex(rules).first(namespace, name, managed)``."""

    def __init__(self, rules: Sequence[PinRule]) -> None:
        self.rules = tuple(rules)
        # (namespace, name) -> (the first rule, the first rule that selects)
        self._exact: Dict[Tuple[str, str], Tuple[int, int]] = {}
        self._named: Dict[str, List[Tuple[int, PinRule]]] = {}
        self._any: List[Tuple[int, PinRule]] = []
        self._found: Dict[Tuple[str, str, bool], Optional[PinRule]] = {}
        for i, rule in enumerate(self.rules):
            if not rule.exact_namespace:
                self._any.append((i, rule))
            elif not rule.exact_name:
                self._named.setdefault(rule.namespace, []).append((i, rule))
            else:
                key = (rule.namespace, rule.name)
                first, selecting = self._exact.get(key, (_NONE, _NONE))
                self._exact[key] = (min(first, i), selecting if selecting != _NONE or not rule.selects else i)

    def first(self, namespace: str, name: str, managed: bool) -> Optional[PinRule]:
        """The first rule naming ``namespace/name``; ``managed``: ``[numa]`` selection
        manages the pod (else only rules that select count)."""
        key = (namespace, name, managed)
        try:
            return self._found[key]
        except KeyError:
            pass
        if len(self._found) >= MAX_REMEMBERED:
            self._found = {}   # (pods long gone; another thread may hold the old dict: harmless)
        rule = self._found[key] = self._first(namespace, name, managed)
        return rule

    def _first(self, namespace: str, name: str, managed: bool) -> Optional[PinRule]:
        best = _NONE
        hit = self._exact.get((namespace, name))
        if hit is not None:
            best = hit[0] if managed else hit[1]
        for bucket in (self._named.get(namespace, ()), self._any):
            for i, rule in bucket:
                if i >= best:
                    break
                if (managed or rule.selects) and rule.matches(namespace, name):
                    best = i
                    break
        return self.rules[best] if best != _NONE else None
