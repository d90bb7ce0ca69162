"""One Oenuma CR of the API server turned into rules for this node, under the node's trust.

A CR is written by whoever may ``create oenumas`` in its namespace: a tenant, when the
cluster's RBAC lets one. So what it may do depends on its namespace:

- a CR of a namespace the node trusts (``[kubernetes] trusted_namespaces``) may do what a
  rule file may: name pods of any namespace (by name or pattern), give ``numa[]`` tables
  (the CPUs and memory of NUMA nodes), and make a pod NUMA-managed that ``[numa]``
  selection leaves alone;
- any other CR may name pods of its own namespace only, by name or by a pattern over names
  there, and pins only pods the node manages anyway (``PinRule.selects`` False). A
  ``podAffinity`` entry naming another namespace or a namespace pattern, and a ``numa[]``
  table (with the entries pinning to its NUMA nodes; its CPU lists are refused unread), are
  refused: listed in ``refusals``,
  which the rules loop reports in the CR's status entry for this node and as a Warning
  event on the CR. The rest of the CR applies.

What it must not cost is bounded before this is called (``oenuma_bounds.py``, on the
trimmed CR that ``cluster/oenumas.py`` keeps: this node's entries only, their positions in
``spec.node[]`` in ``nodeIndex``). Pure: a CR in, rules and words out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Tuple

from anolisnuma.policies.numa.glob import is_pattern
from anolisnuma.policies.numa.rules import (
    OENUMA_KIND, Affinity, NumaTable, PinRule, RuleFileError, oenuma_header, read_node_entry, rules_for_node)
from anolisnuma.policies.numa.topology import NumaTopology


@dataclass
class CrParse:
    """The rules of one CR for this node, the entries dropped because the machine lacks what
    they name (``problems``), the parts refused by the trust policy (``refusals``), and what
    the node's caps count: the entries the CR has for this node (``entries``, at least 1)
    and its rules whose pod name is a pattern (``patterns``)."""

    rules: List[PinRule] = field(default_factory=list)
    problems: List[str] = field(default_factory=list)
    refusals: List[str] = field(default_factory=list)
    entries: int = 1
    patterns: int = 0


def parse_cr(obj: Any, source: str, node_name: str, topology: NumaTopology, trusted: bool) -> CrParse:
    """The rules of the CR ``obj`` (trimmed) for ``node_name``; ``trusted``: its namespace
    is one the node trusts. Raises :class:`RuleFileError` when it is malformed."""
    header = oenuma_header(obj, source, "")
    if header is None:
        raise RuleFileError(f"{source}: not an {OENUMA_KIND}")
    cr_name, cr_namespace, node_list = header
    positions = obj.get("nodeIndex")
    if not (isinstance(positions, list) and len(positions) == len(node_list)
            and all(isinstance(p, int) for p in positions)):
        positions = list(range(len(node_list)))
    out = CrParse(entries=0)
    want = node_name.strip().lower()
    rule_source = f"{source} ({OENUMA_KIND} {cr_name})"
    for ni, entry in zip(positions, node_list):
        at = f"spec.node[{ni}]"
        # (an untrusted CR's numa[] is refused whole: its CPU lists are not even parsed)
        name, numa_table, affinity = read_node_entry(entry, at, cr_namespace, cpu_lists=trusted)
        if name.strip().lower() != want:
            continue
        out.entries += len(numa_table) + len(affinity)
        if not trusted:
            numa_table, affinity, refused = untrusted_part(numa_table, affinity, at, cr_namespace)
            out.refusals.extend(refused)
        rules, problems = rules_for_node(numa_table, affinity, rule_source, at, topology, from_cluster=True,
                                         selects=trusted)
        out.rules.extend(rules)
        out.problems.extend(problems)
    out.entries = max(out.entries, 1)
    out.patterns = sum(1 for r in out.rules if not r.exact_name)
    return out


def untrusted_part(numa_table: NumaTable, affinity: Affinity, at: str,
                   namespace: str) -> Tuple[NumaTable, Affinity, List[str]]:
    """What a CR of the untrusted ``namespace`` may have of a node entry, and why the rest
    is refused."""
    refused: List[str] = []
    if numa_table:
        refused.append(f"{at}.numa: a numa[] table (the CPUs and memory of whole NUMA nodes) is honoured only "
                       f"from an Oenuma of a namespace this node trusts, and {namespace} is not one: refused")
    kept: Affinity = []
    for ns, pod, num, where in affinity:
        if ns != namespace:
            what = f"the namespace pattern {ns}" if is_pattern(ns) else f"namespace {ns}"
            refused.append(f"{where}: {what} is not the Oenuma's own ({namespace}); only an Oenuma of a namespace "
                           f"this node trusts may name pods of other namespaces: refused")
        elif num in numa_table:
            refused.append(f"{where}: numaNum {num} has a refused numa[] entry: pod {ns}/{pod} not pinned")
        else:
            kept.append((ns, pod, num, where))
    return {}, kept, refused
