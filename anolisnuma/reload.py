"""What a configuration reload (SIGHUP, ``anolisnuma-ctl reload``) may change live.

Keys are compared as dotted names. Those below :data:`LIVE_KEYS` take effect at once;
every other change (the socket, containerd's endpoint, host paths, the QoS and NUMA
policies, whose state was built from the old values) is reported as needing a restart and
keeps its running value until then.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, NamedTuple

from anolisnuma.config import Config

LIVE_KEYS = (
    "log.level",
    "hooks.",
    "server.shutdown_grace_seconds",
    "server.buffer_bytes_per_connection",
    "server.buffer_bytes_total",
    "runtime.connect_timeout_seconds",
    "runtime.resync_interval_seconds",
)


class ReloadPlan(NamedTuple):
    live: List[str]      # changed keys applied at once
    restart: List[str]   # changed keys that need a restart


def flatten(config: Config) -> Dict[str, Any]:
    """Every leaf value of the configuration by dotted key."""
    out: Dict[str, Any] = {}
    for section in ("server", "runtime", "log", "paths", "cgroups", "hooks", "admin", "metrics", "qos", "numa",
                    "kubernetes"):
        _flatten(section, getattr(config, section), out)
    return out


def _flatten(prefix: str, value: Any, out: Dict[str, Any]) -> None:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            _flatten(f"{prefix}.{f.name}", getattr(value, f.name), out)
    elif isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}", v, out)
    else:
        out[prefix] = value


def plan(old: Config, new: Config) -> ReloadPlan:
    before, after = flatten(old), flatten(new)
    changed = sorted(k for k in set(before) | set(after) if before.get(k, _ABSENT) != after.get(k, _ABSENT))
    live = [k for k in changed if k.startswith(LIVE_KEYS)]
    return ReloadPlan(live=live, restart=[k for k in changed if k not in live])


_ABSENT = object()
