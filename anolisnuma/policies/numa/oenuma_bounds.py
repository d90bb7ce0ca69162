"""The bounds of an Oenuma from the API server, checked before anything of it is parsed.

``deploy/crd-oenuma.yaml`` carries the same numbers (``maxItems``, ``maxLength``,
``pattern``, ``minimum``/``maximum``; ``tests/policies/numa/test_oenuma_bounds.py`` holds
the two together), so the API server refuses a CR over them. The daemon checks them again:
a CR reaches it through an older CRD too (operator-numaadj's own bounds nothing), and a
saved ``cluster-oenumas.json`` may come from an older daemon. On top, what only the node
can count: the entries one CR has for this node, whatever the number of ``spec.node[]``
entries naming it.

Who writes an Oenuma is whoever may ``create oenumas`` in some namespace (docs/cluster.md);
what an unbounded one got them: a pattern whose translation to a regular expression took
the rules thread seconds of CPU (the interpreter lock with it), lists whose parse took
seconds and whose rules were scanned at every CreateContainer, and the daemon's memory.
Over a bound, the CR is refused as a whole and reported with the first bound it breaks
(sizes only, never its text); nothing more of it is read.

Only this node's entries are looked into (and ``spec.node[]``'s length): another node's
entries are that node's to check.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Tuple

from anolisnuma.policies.numa.glob import wildcard_count

MAX_NODES = 5000           # spec.node[]: one entry per node of the largest clusters
MAX_AFFINITY = 256         # podAffinity[] of a node entry, and of all entries naming one node
MAX_NUMA = 64              # numa[] likewise
MAX_SAME_NODE = 16         # spec.node[] entries naming one node (one is what a CR needs)
MAX_NAME = 253             # a node's name, a pod's name or pattern (a DNS subdomain's length)
MAX_NAMESPACE = 63         # a namespace's name or pattern (a DNS label's length)
MAX_CPU_LIST = 1024        # cpuset, memset ("0-63" for a node; the odd CPUs of 256 fit)
MAX_WILDCARDS = 8          # `*` and `?` in one pattern: a name pattern needs few
MAX_NUMA_NUM = 1023        # the kernel's MAX_NUMNODES is at most 1024

_LOWER = "abcdefghijklmnopqrstuvwxyz0123456789"
POD_NAME_CHARS = frozenset(_LOWER + "-.*?")
NAMESPACE_CHARS = frozenset(_LOWER + "-*?")

# The CRD's patterns for the same (ECMA-262, checked by the API server in linear time).
POD_NAME_PATTERN = r"^[-a-z0-9.]*([*?][-a-z0-9.]*){0,8}$"
NAMESPACE_PATTERN = r"^[-a-z0-9]*([*?][-a-z0-9]*){0,8}$"
# A CPU or node list of a CR: numbers 0-65535 (CpuSet's MAX_CPU) and ranges of them, comma
# separated, spaces around items. Not the kernel's grouped form (`A-B:U/G`), which root's
# rule files keep: a CR names the CPUs of a NUMA node, and that form was the door of a
# string whose parse cost gigabytes (issue 33, H1). The daemon matches CRs to the same
# expression (CPU_LIST_RE), so what the API server lets through is what the node reads.
_CPU = r"(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[0-9]{1,4})"
_CPU_ITEM = _CPU + "(-" + _CPU + ")?"
_CPU_LIST = " *(" + _CPU_ITEM + "( *, *" + _CPU_ITEM + ")*)? *"
CPU_LIST_PATTERN = "^" + _CPU_LIST + "$"
CPU_LIST_RE = re.compile(_CPU_LIST)   # (fullmatch: Python's `$` would let a newline through)


def entries_for_node(obj: Any, node_name: str) -> Tuple[Optional[List[int]], str]:
    """Where this node's entries are in the CR ``obj``'s ``spec.node[]``, and why it is refused.

    ``(None, "")``: the CR does not name the node (or has no list of entries to name it
    with); ``(positions, "")``: it does, within the bounds; ``([], why)``: it does and is
    over a bound (``why`` names the first one, by its path and sizes)."""
    spec = obj.get("spec") if isinstance(obj, dict) else None
    nodes = spec.get("node") if isinstance(spec, dict) else None
    if not isinstance(nodes, list):
        return None, ""
    want = node_name.strip().lower()
    at = [i for i, entry in enumerate(nodes) if isinstance(entry, dict) and isinstance(entry.get("name"), str)
          and entry["name"].strip().lower() == want]
    if not at:
        return None, ""
    if len(nodes) > MAX_NODES:
        return [], f"spec.node has {len(nodes)} entries, more than {MAX_NODES}"
    if len(at) > MAX_SAME_NODE:
        return [], f"spec.node names this node {len(at)} times, more than {MAX_SAME_NODE}"
    why = _check_entries([nodes[i] for i in at], at)
    return ([], why) if why else (at, "")


def _check_entries(entries: List[Dict[str, Any]], at: List[int]) -> str:
    affinity = numa = 0
    for entry, i in zip(entries, at):
        where = f"spec.node[{i}]"
        if len(entry["name"]) > MAX_NAME:
            return f"{where}.name: {len(entry['name'])} characters, more than {MAX_NAME}"
        items = entry.get("podAffinity")
        if isinstance(items, list):
            affinity += len(items)
            if affinity > MAX_AFFINITY:
                return (f"{where}.podAffinity: {affinity} entries for this node, more than the "
                        f"{MAX_AFFINITY} an Oenuma may have")
            for j, item in enumerate(items):
                why = _check_affinity(item, f"{where}.podAffinity[{j}]")
                if why:
                    return why
        table = entry.get("numa")
        if isinstance(table, list):
            numa += len(table)
            if numa > MAX_NUMA:
                return f"{where}.numa: {numa} entries for this node, more than the {MAX_NUMA} an Oenuma may have"
            for j, item in enumerate(table):
                why = _check_numa(item, f"{where}.numa[{j}]")
                if why:
                    return why
    return ""


def _check_affinity(item: Any, where: str) -> str:
    if not isinstance(item, dict):
        return ""   # (the parser says what is wrong with its type)
    return (_check_name(item.get("podName"), f"{where}.podName", MAX_NAME, POD_NAME_CHARS)
            or _check_name(item.get("namespace"), f"{where}.namespace", MAX_NAMESPACE, NAMESPACE_CHARS)
            or _check_numa_num(item.get("numaNum"), f"{where}.numaNum"))


def _check_numa(item: Any, where: str) -> str:
    if not isinstance(item, dict):
        return ""
    for key in ("cpuset", "memset"):
        value = item.get(key)
        if isinstance(value, str):
            if len(value) > MAX_CPU_LIST:
                return f"{where}.{key}: {len(value)} characters, more than {MAX_CPU_LIST}"
            if CPU_LIST_RE.fullmatch(value) is None:
                return (f"{where}.{key}: not a list of CPU numbers (0-65535) and ranges of them, "
                        "such as 0-3,8 (an Oenuma has no kernel grouped ranges A-B:U/G)")
    return _check_numa_num(item.get("numaNum"), f"{where}.numaNum")


def _check_name(value: Any, where: str, limit: int, chars: frozenset) -> str:
    if not isinstance(value, str):
        return ""
    if len(value) > limit:
        return f"{where}: {len(value)} characters, more than {limit}"
    if not chars.issuperset(value):
        allowed = "a-z, 0-9, '-', " + ("'.', " if "." in chars else "") + "'*' and '?'"
        return f"{where}: characters other than {allowed}"
    wildcards = wildcard_count(value)
    if wildcards > MAX_WILDCARDS:
        return f"{where}: {wildcards} wildcards, more than {MAX_WILDCARDS}"
    return ""


def _check_numa_num(value: Any, where: str) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and not 0 <= value <= MAX_NUMA_NUM:
        return f"{where}: outside 0-{MAX_NUMA_NUM}"
    return ""
