"""Placement rules: pods the operator pins to NUMA nodes.

Three sources, one model (:class:`PinRule`):

- ``[[numa.pin]]`` tables in the configuration (namespace and name patterns → nodes);
- YAML files in the operator-numaadj ``Oenuma`` format (``apiVersion:
  resource.sop.huawei.com/v1alpha1``, ``kind: Oenuma``), whose ``spec.node[]`` entry for this
  node (matched by name) lists ``numa[]{numaNum, cpuset, memset}`` and
  ``podAffinity[]{namespace, podName, numaNum}``;
- Oenuma CRs of the API server, read by :mod:`.oenuma_cr` with this module's entry reader,
  under the node's trust (what a CR of a namespace the node does not trust may not do).

Parsing is pure (text in, rules and problems out). A rule that names a NUMA node the
machine does not have, or CPUs it does not have, is reported and dropped; the others apply.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from anolisnuma.policies.numa.cpuset import CpuSet, CpuSetError, union_all
from anolisnuma.policies.numa.glob import Glob
from anolisnuma.policies.numa.topology import NumaTopology

OENUMA_API_VERSION = "resource.sop.huawei.com/v1alpha1"
OENUMA_KIND = "Oenuma"


class RuleFileError(ValueError):
    """A rule file is unusable as a whole (bad YAML, wrong structure)."""


@dataclass(frozen=True)
class PinRule:
    """Pods whose namespace and name match the patterns go to ``nodes``; ``cpus``/``mems``
    override the nodes' CPUs and memory when given.

    The patterns of a rule written on the node (config pins, rule files: root's) are shell
    patterns (``fnmatch``: ``*``, ``?``, ``[...]``); those of a rule from the API server
    (``from_cluster``) have ``*`` and ``?`` only and are matched by :mod:`.glob`: no regular
    expression is ever built from what a CR says. ``selects``: whether the rule may make a
    pod NUMA-managed that the node's ``[numa]`` selection leaves alone (False for a CR of a
    namespace the node does not trust: it pins only pods the node manages anyway)."""

    namespace: str
    name: str
    nodes: Tuple[int, ...]
    cpus: Optional[CpuSet] = None
    mems: Optional[CpuSet] = None
    source: str = "config"
    from_cluster: bool = False
    selects: bool = True
    _ns: Any = field(default=None, compare=False, repr=False)
    _name: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        make = _glob if self.from_cluster else _Shell
        object.__setattr__(self, "_ns", make(self.namespace))
        object.__setattr__(self, "_name", make(self.name))

    def matches(self, namespace: str, name: str) -> bool:
        return self._ns.matches(namespace) and self._name.matches(name)

    @property
    def exact_namespace(self) -> bool:
        """Whether the namespace is a name, not a pattern (the rule index's buckets)."""
        return self._ns.literal is not None

    @property
    def exact_name(self) -> bool:
        return self._name.literal is not None

    def describe(self) -> str:
        who = self.source if self.selects else f"{self.source} [pods [numa] manages only]"
        text = f"{who}: {self.namespace}/{self.name} -> node {','.join(map(str, self.nodes))}"
        if self.cpus is not None:
            text += f" cpus {self.cpus}"
        if self.mems is not None:
            text += f" mems {self.mems}"
        return text


@functools.lru_cache(maxsize=4096)
def _glob(pattern: str) -> Glob:
    """One matcher per pattern (they are immutable): a CR changed is parsed again with the
    same names, and its rules share their namespace's."""
    return Glob(pattern)


class _Shell:
    """A shell pattern of a rule written on the node (fnmatch's, classes and all)."""

    __slots__ = ("literal", "_re")

    def __init__(self, pattern: str) -> None:
        self.literal: Optional[str] = None if any(c in pattern for c in "*?[") else pattern
        self._re = None if self.literal is not None else re.compile(fnmatch.translate(pattern))

    def matches(self, name: str) -> bool:
        return name == self.literal if self._re is None else bool(self._re.match(name))


@dataclass(frozen=True)
class PinSpec:
    """A ``[[numa.pin]]`` table as read from the configuration (not yet checked against
    the machine)."""

    namespace: str
    name: str
    nodes: Tuple[int, ...]
    key: str = "numa.pin"


def resolve_pins(pins: Sequence[PinSpec], topology: NumaTopology) -> Tuple[List[PinRule], List[str]]:
    """Config pins as rules; pins naming a node this machine lacks are reported and dropped."""
    rules: List[PinRule] = []
    problems: List[str] = []
    for spec in pins:
        missing = [n for n in spec.nodes if not topology.has_node(n)]
        if missing:
            problems.append(f"{spec.key}: NUMA node {missing[0]} does not exist on this machine "
                            f"(nodes: {list(topology.node_ids)}); rule ignored")
            continue
        rules.append(PinRule(namespace=spec.namespace, name=spec.name, nodes=tuple(spec.nodes), source=spec.key))
    return rules, problems


def parse_oenuma_documents(documents: Iterable[Any], source: str, node_name: str,
                           topology: NumaTopology) -> Tuple[List[PinRule], List[str]]:
    """Rules for ``node_name`` from the YAML documents of one file (as loaded by
    ``yaml.safe_load_all``).

    Documents that are empty or of another kind are ignored. Raises
    :class:`RuleFileError` when an ``Oenuma`` document is malformed (the caller skips the
    whole file); returns the rules plus the problems of entries that were dropped because
    they name NUMA nodes or CPUs this machine does not have.
    """
    rules: List[PinRule] = []
    problems: List[str] = []
    want = node_name.strip().lower()
    for index, doc in enumerate(documents):
        if doc is None:
            continue
        where = f"{source} document {index + 1}"
        header = oenuma_header(doc, where, f"document {index + 1}")
        if header is None:
            continue
        cr_name, cr_namespace, node_list = header
        for ni, entry in enumerate(node_list):
            at = f"{where}: spec.node[{ni}]"
            name, numa_table, affinity = read_node_entry(entry, at, cr_namespace)
            if name.strip().lower() != want:
                continue
            r, p = rules_for_node(numa_table, affinity, f"{source} ({OENUMA_KIND} {cr_name})", at, topology)
            rules.extend(r)
            problems.extend(p)
    return rules, problems


def oenuma_header(doc: Any, where: str, unnamed: str) -> Optional[Tuple[str, str, List[Any]]]:
    """``(name, namespace, spec.node)`` of an Oenuma document; None for a document of
    another kind; :class:`RuleFileError` when it is not a well-formed Oenuma."""
    if not isinstance(doc, dict):
        raise RuleFileError(f"{where}: not a mapping")
    if doc.get("kind") != OENUMA_KIND:
        return None
    if doc.get("apiVersion") != OENUMA_API_VERSION:
        raise RuleFileError(f"{where}: apiVersion must be {OENUMA_API_VERSION}, not {doc.get('apiVersion')!r}")
    meta = doc.get("metadata") or {}
    if not isinstance(meta, dict):
        raise RuleFileError(f"{where}: metadata is not a mapping")
    cr_name = meta.get("name") if isinstance(meta.get("name"), str) else unnamed
    cr_namespace = meta.get("namespace") if isinstance(meta.get("namespace"), str) else ""
    spec = doc.get("spec")
    if not isinstance(spec, dict):
        raise RuleFileError(f"{where}: spec is missing or not a mapping")
    node_list = spec.get("node")
    if node_list is None:
        node_list = []
    if not isinstance(node_list, list):
        raise RuleFileError(f"{where}: spec.node is not a list")
    return cr_name, cr_namespace, node_list


NumaTable = Dict[int, Tuple[Optional[CpuSet], Optional[CpuSet]]]
Affinity = List[Tuple[str, str, int, str]]   # (namespace, pod name, numaNum, where)


def read_node_entry(entry: Any, at: str, default_namespace: str,
                    cpu_lists: bool = True) -> Tuple[str, NumaTable, Affinity]:
    """``(name, numa table, podAffinity)`` of one ``spec.node[]`` entry; RuleFileError
    when it is malformed. ``cpu_lists=False``: the table's ``cpuset``/``memset`` are not
    read (None in the table): the entry's ``numa[]`` is refused whole, and what is refused
    is not parsed."""
    if not isinstance(entry, dict):
        raise RuleFileError(f"{at} is not a mapping")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise RuleFileError(f"{at}.name is missing or not a string")
    return (name, _numa_table(entry.get("numa"), at, cpu_lists),
            _affinity(entry.get("podAffinity"), at, default_namespace))


def _int(value: Any, at: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise RuleFileError(f"{at} must be a non-negative integer, not {value!r}")
    return value


def _cpu_list(value: Any, at: str) -> Optional[CpuSet]:
    if value is None or value == "":
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)      # YAML reads `memset: 0` as an integer
    if not isinstance(value, str):
        raise RuleFileError(f"{at} must be a CPU list string, not {value!r}")
    try:
        return CpuSet.parse(value)
    except CpuSetError as e:
        raise RuleFileError(f"{at}: {e}") from e


def _numa_table(value: Any, at: str, cpu_lists: bool = True) -> NumaTable:
    if value is None:
        return {}
    if not isinstance(value, list):
        raise RuleFileError(f"{at}.numa is not a list")
    table: NumaTable = {}
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise RuleFileError(f"{at}.numa[{i}] is not a mapping")
        num = _int(item.get("numaNum"), f"{at}.numa[{i}].numaNum")
        if not cpu_lists:
            table[num] = (None, None)
            continue
        table[num] = (_cpu_list(item.get("cpuset"), f"{at}.numa[{i}].cpuset"),
                      _cpu_list(item.get("memset"), f"{at}.numa[{i}].memset"))
    return table


def _affinity(value: Any, at: str, default_namespace: str) -> Affinity:
    if value is None:
        return []
    if not isinstance(value, list):
        raise RuleFileError(f"{at}.podAffinity is not a list")
    out = []
    for i, item in enumerate(value):
        where = f"{at}.podAffinity[{i}]"
        if not isinstance(item, dict):
            raise RuleFileError(f"{where} is not a mapping")
        pod = item.get("podName")
        if not isinstance(pod, str) or not pod:
            raise RuleFileError(f"{where}.podName is missing or not a string")
        ns = item.get("namespace", default_namespace) or default_namespace
        if not isinstance(ns, str) or not ns:
            raise RuleFileError(f"{where}.namespace is missing (and the Oenuma has no metadata.namespace)")
        out.append((ns, pod, _int(item.get("numaNum"), f"{where}.numaNum"), where))
    return out


def rules_for_node(numa_table: NumaTable, affinity: Affinity, source: str, at: str, topology: NumaTopology,
                   from_cluster: bool = False, selects: bool = True) -> Tuple[List[PinRule], List[str]]:
    """The rules of one node entry (``from_cluster``, ``selects``: see :class:`PinRule`),
    and the problems of the entries dropped because the machine lacks what they name."""
    problems: List[str] = []
    # Check the numa[] table against the machine first: a bad entry disables its node.
    usable: NumaTable = {}
    for num, (cpus, mems) in numa_table.items():
        if not topology.has_node(num):
            problems.append(f"{at}: numaNum {num} does not exist on this machine; entry ignored")
            continue
        if cpus is not None and not cpus.issubset(topology.online):
            problems.append(f"{at}: cpuset {cpus} of numaNum {num} is not within the online CPUs "
                            f"{topology.online}; entry ignored")
            continue
        if mems is not None and not all(topology.has_node(m) for m in mems):
            problems.append(f"{at}: memset {mems} of numaNum {num} names NUMA nodes this machine lacks; "
                            "entry ignored")
            continue
        usable[num] = (cpus, mems)
    bad = set(numa_table) - set(usable)
    grouped: Dict[Tuple[str, str], List[int]] = {}
    for ns, pod, num, where in affinity:
        if num in bad:
            problems.append(f"{where}: numaNum {num} has an unusable numa[] entry; pod {ns}/{pod} not pinned")
            continue
        if not topology.has_node(num):
            problems.append(f"{where}: numaNum {num} does not exist on this machine; pod {ns}/{pod} not pinned")
            continue
        nodes = grouped.setdefault((ns, pod), [])
        if num not in nodes:
            nodes.append(num)
    rules = []
    for (ns, pod), nodes in grouped.items():
        nodes.sort()
        cpus_list = [usable.get(n, (None, None))[0] for n in nodes]
        mems_list = [usable.get(n, (None, None))[1] for n in nodes]
        cpus = None
        if any(c is not None for c in cpus_list):
            cpus = union_all(c if c is not None else topology.cpus_of([n]) for c, n in zip(cpus_list, nodes))
        mems = None
        if any(m is not None for m in mems_list):
            mems = union_all(m if m is not None else CpuSet([n]) for m, n in zip(mems_list, nodes))
        rules.append(PinRule(namespace=ns, name=pod, nodes=tuple(nodes), cpus=cpus, mems=mems, source=source,
                             from_cluster=from_cluster, selects=selects))
    return rules, problems
