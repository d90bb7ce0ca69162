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

[numa.affinity]                      # move pods that talk to each other onto one node
enabled = false                      # live moves of running pods: opt in
interval_seconds = 10.0              # how often traffic is sampled and moves are planned
threshold_bytes_per_second = 1000000 # a pod pair is affine at or above this smoothed rate
confirm_samples = 3                  # ... in each of this many samples in a row
half_life_seconds = 30.0             # EWMA half-life of a pair's rate
max_moves_per_interval = 2           # pods moved per interval, at most
cooldown_seconds = 300.0             # a moved pod stays put at least this long
min_improvement = 0.2                # a plan must cut this share of its pairs' distance cost

[numa.respread]                      # move pods back toward balance after departures
enabled = true                       # (live moves, capped; only pods anolisnuma placed)
interval_seconds = 30.0              # a plan at least this often, and the window of the cap
threshold_cpus = 8.0                 # move while max - min free CPUs over the nodes exceeds this
pods_threshold = 2                   # ... or a node has this many more demand-free pods
settle_seconds = 60.0                # ... and has for this long
max_moves_per_interval = 2           # pods moved per interval, at most
cooldown_seconds = 600.0             # a moved pod stays put at least this long
```
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Any, List, Mapping, Optional, Tuple

from anolisnuma.configfile import ConfigError, Table, shown
from anolisnuma.policies.numa.balance import MEMORY_POLICIES, MEMORY_WIDEN
from anolisnuma.policies.numa.respread import RespreadConstraints
from anolisnuma.policies.numa.rules import PinSpec

MAX_NODE_ID = 1023   # the kernel's MAX_NUMNODES is at most 1024


@dataclass
class AffinityConfig:
    """``[numa.affinity]``: traffic affinity (docs/numa.md, "Traffic affinity")."""

    enabled: bool = False
    interval_seconds: float = 10.0
    threshold_bytes_per_second: float = 1_000_000.0
    confirm_samples: int = 3
    half_life_seconds: float = 30.0
    max_moves_per_interval: int = 2
    cooldown_seconds: float = 300.0
    min_improvement: float = 0.2

    @classmethod
    def from_table(cls, t: Table) -> "AffinityConfig":
        cfg = cls(
            enabled=t.bool("enabled", False),
            interval_seconds=t.float("interval_seconds", 10.0, min=0.1, max=3600),
            threshold_bytes_per_second=t.float("threshold_bytes_per_second", 1_000_000.0, min=1.0, max=1e12),
            confirm_samples=t.int("confirm_samples", 3, min=1, max=100),
            half_life_seconds=t.float("half_life_seconds", 30.0, min=0.1, max=86400),
            max_moves_per_interval=t.int("max_moves_per_interval", 2, min=1, max=1000),
            cooldown_seconds=t.float("cooldown_seconds", 300.0, min=0, max=86400 * 7),
            min_improvement=t.float("min_improvement", 0.2, min=0.0, max=1.0),
        )
        t.finish()
        return cfg


@dataclass
class RespreadConfig:
    """``[numa.respread]``: re-spread after departures and pool changes (docs/numa.md,
    "Re-spread")."""

    enabled: bool = True
    interval_seconds: float = 30.0
    threshold_cpus: float = 8.0
    pods_threshold: int = 2
    settle_seconds: float = 60.0
    max_moves_per_interval: int = 2
    cooldown_seconds: float = 600.0
    urgent_cpus: float = 0.0
    idle_share_cpus: float = 1.0

    @property
    def threshold_millicpu(self) -> int:
        return int(round(self.threshold_cpus * 1000))

    @property
    def urgent_millicpu(self) -> int:
        return int(round(self.urgent_cpus * 1000))

    @property
    def idle_share_millicpu(self) -> int:
        return int(round(self.idle_share_cpus * 1000))

    def constraints(self, max_moves: int, now: float, last_moved: Mapping[str, float]) -> RespreadConstraints:
        """The plan's bounds from these settings (the controller's and the simulator's)."""
        return RespreadConstraints(threshold_millicpu=self.threshold_millicpu, pods_threshold=self.pods_threshold,
                                   idle_share_millicpu=self.idle_share_millicpu,
                                   urgent_millicpu=self.urgent_millicpu, max_moves=max_moves,
                                   cooldown=self.cooldown_seconds, now=now, last_moved=last_moved)

    @classmethod
    def from_table(cls, t: Table) -> "RespreadConfig":
        cfg = cls(
            enabled=t.bool("enabled", True),
            interval_seconds=t.float("interval_seconds", 30.0, min=1.0, max=86400),
            threshold_cpus=t.float("threshold_cpus", 8.0, min=0.5, max=4096),
            pods_threshold=t.int("pods_threshold", 2, min=2, max=10000),
            settle_seconds=t.float("settle_seconds", 60.0, min=0, max=86400),
            max_moves_per_interval=t.int("max_moves_per_interval", 2, min=1, max=1000),
            cooldown_seconds=t.float("cooldown_seconds", 600.0, min=0, max=86400 * 7),
            urgent_cpus=t.float("urgent_cpus", 0.0, min=0, max=4096),
            idle_share_cpus=t.float("idle_share_cpus", 1.0, min=0, max=4096),
        )
        t.finish()
        return cfg


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
    affinity: AffinityConfig = field(default_factory=AffinityConfig)
    respread: RespreadConfig = field(default_factory=RespreadConfig)

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
            rules_dir = t.invalid("rules_dir", f"must be an absolute path or empty; got {shown(rules_dir)}", "")
        node_name = t.str("node_name", "")
        if node_name != node_name.strip():
            node_name = t.invalid("node_name", "must not start or end with whitespace", "")
        cfg = cls(
            enabled=t.bool("enabled", False),
            namespaces=namespaces,
            pod_name_patterns=patterns,
            node_name=node_name,
            rules_dir=rules_dir.rstrip("/") or ("/" if rules_dir else ""),
            memory_pinning=t.str("memory_pinning", MEMORY_WIDEN, choices=MEMORY_POLICIES),
            poll_interval_seconds=t.float("poll_interval_seconds", 1.0, min=0.05, max=3600),
            pins=_pins(t),
            affinity=AffinityConfig.from_table(t.table("affinity")),
            respread=RespreadConfig.from_table(t.table("respread")),
        )
        t.finish()
        return cfg


def _patterns(t: Table, name: str) -> List[str]:
    values = t.str_list(name, [])
    for i, v in enumerate(values):
        if not v.strip():
            t.errors.add(ConfigError(f"{t.key(name)}[{i}]", "must not be empty"))
    return [v for v in values if v.strip()]


def _pins(t: Table) -> Tuple[PinSpec, ...]:
    raw: Any = t.raw("pin", [])
    if not isinstance(raw, list):
        return t.invalid("pin", "must be an array of tables ([[numa.pin]])", ())
    out = []
    for i, item in enumerate(raw):
        key = f"{t.key('pin')}[{i}]"
        if not isinstance(item, dict):
            t.errors.add(ConfigError(key, "must be a table"))
            continue
        pin = _pin(t.child(item, key), key)   # a wrong pin is noted and left out
        if pin is not None:
            out.append(pin)
    return tuple(out)


def _pin(pt: Table, key: str) -> Optional[PinSpec]:
    errors = len(pt.errors.listed) + pt.errors.more
    namespace = pt.str("namespace", "*")
    name = pt.str("name", None)   # None: absent, or not a string (noted)
    if not namespace.strip():
        pt.invalid("namespace", "must not be empty")
    if not pt.has("name"):
        pt.invalid("name", "is required")
    elif name is not None and not name.strip():
        pt.invalid("name", "must not be empty")
    nodes = pt.raw("nodes", None)
    if (not isinstance(nodes, list) or not nodes
            or not all(isinstance(n, int) and not isinstance(n, bool) for n in nodes)):
        pt.invalid("nodes", "is required" if nodes is None else "must be a non-empty list of NUMA node ids (integers)")
    elif not all(0 <= n <= MAX_NODE_ID for n in nodes):
        wrong = next(n for n in nodes if not 0 <= n <= MAX_NODE_ID)
        pt.invalid("nodes", f"NUMA node ids must be in 0..{MAX_NODE_ID}; got {shown(wrong)}")
    elif len(set(nodes)) != len(nodes):
        pt.invalid("nodes", "lists a node twice")
    pt.finish()
    if len(pt.errors.listed) + pt.errors.more != errors:
        return None
    return PinSpec(namespace=namespace, name=name, nodes=tuple(sorted(nodes)), key=key)
