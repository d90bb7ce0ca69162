"""The ``[numa]`` section of the configuration.

```toml
[numa]
enabled = false                      # NUMA pinning changes where pods run: opt in
namespaces = ["batch"]               # manage every pod in these namespaces (patterns)
pod_name_patterns = ["specjbb-*"]    # ... and pods with these names ("ns/name" patterns too)
node_name = ""                       # this node's Kubernetes name for Oenuma files; "" = hostname
rules_dir = ""                       # directory of Oenuma YAML rule files; "" = none
memory_pinning = "widen"             # widen | strict | off
poll_interval_seconds = 1.0          # how often cpu_manager_state and rules_dir are checked

[[numa.pin]]                         # pin pods to NUMA nodes
namespace = "default"                # pattern, default "*"
name = "web-*"                       # pattern, required
nodes = [2, 3]                       # NUMA node ids, required
```
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Any, List, Tuple

from anolisnuma.configfile import ConfigError, Table
from anolisnuma.policies.numa.balance import MEMORY_POLICIES, MEMORY_WIDEN
from anolisnuma.policies.numa.rules import PinSpec

MAX_NODE_ID = 1023   # the kernel's MAX_NUMNODES is at most 1024


@dataclass
class NumaConfig:
    enabled: bool = False
    namespaces: List[str] = field(default_factory=list)
    pod_name_patterns: List[str] = field(default_factory=list)
    node_name: str = ""
    rules_dir: str = ""
    memory_pinning: str = MEMORY_WIDEN
    poll_interval_seconds: float = 1.0
    pins: Tuple[PinSpec, ...] = ()

    def effective_node_name(self) -> str:
        """``node_name``, or this host's name (lower case, as Kubernetes names nodes)."""
        return (self.node_name or socket.gethostname()).strip().lower()

    @classmethod
    def from_table(cls, t: Table) -> "NumaConfig":
        """Read ``[numa]``; raises :class:`ConfigError` naming the dotted key on any unknown
        key or bad value."""
        namespaces = _patterns(t, "namespaces")
        patterns = _patterns(t, "pod_name_patterns")
        rules_dir = t.str("rules_dir", "")
        if rules_dir and not rules_dir.startswith("/"):
            raise ConfigError(t.key("rules_dir"), f"must be an absolute path or empty; got {rules_dir!r}")
        node_name = t.str("node_name", "")
        if node_name != node_name.strip():
            raise ConfigError(t.key("node_name"), "must not start or end with whitespace")
        cfg = cls(
            enabled=t.bool("enabled", False),
            namespaces=namespaces,
            pod_name_patterns=patterns,
            node_name=node_name,
            rules_dir=rules_dir.rstrip("/") or ("/" if rules_dir else ""),
            memory_pinning=t.str("memory_pinning", MEMORY_WIDEN, choices=MEMORY_POLICIES),
            poll_interval_seconds=t.float("poll_interval_seconds", 1.0, min=0.05, max=3600),
            pins=_pins(t),
        )
        t.finish()
        return cfg


def _patterns(t: Table, name: str) -> List[str]:
    values = t.str_list(name, [])
    for i, v in enumerate(values):
        if not v.strip():
            raise ConfigError(f"{t.key(name)}[{i}]", "must not be empty")
    return values


def _pins(t: Table) -> Tuple[PinSpec, ...]:
    raw: Any = t.raw("pin", [])
    if not isinstance(raw, list):
        raise ConfigError(t.key("pin"), "must be an array of tables ([[numa.pin]])")
    out = []
    for i, item in enumerate(raw):
        key = f"{t.key('pin')}[{i}]"
        if not isinstance(item, dict):
            raise ConfigError(key, "must be a table")
        pt = Table(item, key)
        namespace = pt.str("namespace", "*")
        name = pt.str("name")
        if not namespace.strip():
            raise ConfigError(pt.key("namespace"), "must not be empty")
        if not name.strip():
            raise ConfigError(pt.key("name"), "must not be empty")
        nodes = pt.raw("nodes")
        if (not isinstance(nodes, list) or not nodes
                or not all(isinstance(n, int) and not isinstance(n, bool) for n in nodes)):
            raise ConfigError(pt.key("nodes"), "must be a non-empty list of NUMA node ids (integers)")
        for n in nodes:
            if not 0 <= n <= MAX_NODE_ID:
                raise ConfigError(pt.key("nodes"), f"NUMA node ids must be in 0..{MAX_NODE_ID}; got {n}")
        if len(set(nodes)) != len(nodes):
            raise ConfigError(pt.key("nodes"), "lists a node twice")
        pt.finish()
        out.append(PinSpec(namespace=namespace, name=name, nodes=tuple(sorted(nodes)), key=key))
    return tuple(out)
