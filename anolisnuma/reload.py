"""What a configuration reload (SIGHUP, ``anolisnuma-ctl reload``) may change live.

Keys are compared as dotted names. Those below :data:`LIVE_KEYS` take effect at once;
every other change (the socket, containerd's endpoint, host paths, the QoS and NUMA
policies, whose state was built from the old values) is reported as needing a restart and
keeps its running value until then; :func:`restart_hint` says how to restart without a
disturbance.
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
    "server.max_connections",
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
                    "kubernetes", "nri"):
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

# Keys systemd's socket unit holds when the socket is passed in (socket activation).
SOCKET_UNIT_KEYS = ("server.listen", "server.socket_mode")


def restart_hint(plan: ReloadPlan, socket_activated: bool) -> str:
    """How to apply ``plan.restart`` without a failed kubelet call ("" when nothing needs it)."""
    if not plan.restart:
        return ""
    socket_keys = [k for k in plan.restart if k in SOCKET_UNIT_KEYS]
    if socket_activated and socket_keys:
        return (f"{', '.join(socket_keys)}: the socket is anolisnuma.socket's; change ListenStream=/SocketMode= "
                f"there as well, then `systemctl daemon-reload && systemctl restart anolisnuma.socket "
                f"anolisnuma.service` (restarting the socket drops the connections waiting in it: do it "
                f"while the kubelet is stopped)")
    if socket_activated:
        return ("`systemctl restart anolisnuma.service`: calls in flight finish, the kubelet's new "
                "connections wait in anolisnuma.socket's backlog for the new process; no call fails")
    return ("restart anolisnuma (`systemctl restart anolisnuma.service`); started without anolisnuma.socket, "
            "the kubelet's calls fail UNAVAILABLE until the new process listens: enable the socket unit "
            "for restarts without a disturbance")
