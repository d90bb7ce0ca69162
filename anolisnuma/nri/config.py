"""``[nri]``: the NRI front-end (docs/nri.md).

Off by default: the CRI proxy is the product's front-end. With ``enabled = true`` the
policies act on containerd's NRI events and the CRI socket relays every call unchanged, so
that no pod is handled twice (the proxy defers to NRI; the log and ``anolisnuma-ctl status``
say so).

Who writes these keys: root, in the configuration file. ``socket`` is a path the daemon
connects to (containerd's NRI socket, root-only); ``plugin_index`` orders anolisnuma among
containerd's plugins and must be two digits, as containerd requires.
"""

from __future__ import annotations

from dataclasses import dataclass

from anolisnuma.configfile import Table, shown


@dataclass
class NriConfig:
    enabled: bool = False
    socket: str = "/var/run/nri/nri.sock"
    plugin_name: str = "anolisnuma"
    plugin_index: str = "50"
    # reconnect delays double from 0.5 s up to this while containerd's NRI socket is away
    reconnect_max_seconds: float = 10.0

    @classmethod
    def from_table(cls, t: Table) -> "NriConfig":
        cfg = cls(
            enabled=t.bool("enabled", cls.enabled),
            socket=t.socket_path("socket", cls.socket),
            plugin_name=t.str("plugin_name", cls.plugin_name),
            plugin_index=t.str("plugin_index", cls.plugin_index),
            reconnect_max_seconds=t.float("reconnect_max_seconds", cls.reconnect_max_seconds, min=0.5, max=300),
        )
        name = cfg.plugin_name
        if not name or len(name) > 63 or not all(c.isascii() and (c.isalnum() or c in "-_.") for c in name):
            cfg.plugin_name = t.invalid("plugin_name", f"must be 1-63 of [A-Za-z0-9._-]; got {shown(name)}",
                                        cls.plugin_name)
        idx = cfg.plugin_index
        if len(idx) != 2 or not idx.isascii() or not idx.isdigit():
            cfg.plugin_index = t.invalid("plugin_index", "must be two digits (containerd orders plugins by it); "
                                                         f"got {shown(idx)}", cls.plugin_index)
        t.finish()
        return cfg
