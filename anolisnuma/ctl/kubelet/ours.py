"""anolisnuma as the switch sees it: the socket it listens on (``--socket``, else
``server.listen`` of its config, else the default) and the runtime socket it forwards to.

The one room of the package that reads anolisnuma's own config: the readers of the
kubelet's files, which the daemon imports, stay clear of it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from anolisnuma.ctl.kubelet.names import DEFAULT_ANOLISNUMA_CONFIG
from anolisnuma.ctl.kubelet.node_root import Root
from anolisnuma.ctl.kubelet.outcome import CtlError

try:
    from anolisnuma.config import ServerConfig as _ServerConfig
    DEFAULT_SOCKET = str(_ServerConfig.listen)
except Exception:  # pragma: no cover - the module must work even if the config moves
    DEFAULT_SOCKET = "/var/run/anolisnuma/anolisnuma.sock"


@dataclass
class Ours:
    """anolisnuma as the switch sees it: its socket and, when its config was read, the
    runtime socket it forwards to."""

    socket: str
    runtime: Optional[str] = None
    config: Optional[str] = None


def resolve_ours(root: Root, socket: Optional[str] = None, anolisnuma_config: Optional[str] = None) -> Ours:
    """Our socket: ``--socket``, else ``server.listen`` of the anolisnuma config (``--anolisnuma-config``,
    else /etc/anolisnuma/config.toml below the root when present), else the default."""
    path: Optional[str] = None
    if socket:
        path = socket[len("unix://"):] if socket.startswith("unix://") else socket
        if not path.startswith("/"):
            raise CtlError(f"--socket must be an absolute unix socket path; got {socket!r}")
    config = anolisnuma_config
    if config is None and os.path.isfile(root.host(DEFAULT_ANOLISNUMA_CONFIG)):
        config = root.host(DEFAULT_ANOLISNUMA_CONFIG)
    if config is None:
        return Ours(path or DEFAULT_SOCKET)
    try:
        from anolisnuma.config import Config

        cfg = Config.load(config)
    except Exception as e:
        if path is not None and anolisnuma_config is None:
            return Ours(path)  # the socket was given; the config was only a hint
        raise CtlError(f"cannot read the anolisnuma config {config}: {e}"
                       + ("" if path else "; pass --socket"))
    return Ours(path or str(cfg.server.listen), str(cfg.runtime.endpoint), config)
