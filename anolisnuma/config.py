"""The daemon's configuration: typed dataclasses read strictly from TOML.

The keys of ``[server] [runtime] [log] [paths]`` are the product's contract (design.md §7).
``[qos]`` and ``[numa]`` belong to their policy packages, which parse them from a
:class:`~anolisnuma.configfile.Table` themselves, as ``[kubernetes]`` belongs to
``anolisnuma/cluster``; ``[hooks.<name>]`` sets each hook's time
budget and failure policy; ``[admin]`` and ``[metrics]`` are the daemon's inspection
surfaces (``anolisnuma/admin``).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from anolisnuma.configfile import ConfigError, Table, did_you_mean, load_toml, shown

MIB = 1 << 20


def _abs_path(table: Table, name: str, default: str) -> str:
    value = table.str(name, default)
    if not value.startswith("/"):
        return table.invalid(name, f"must be an absolute path; got {shown(value)}", default)
    return value.rstrip("/") or "/"


@dataclass
class ServerConfig:
    listen: str = "/var/run/anolisnuma/anolisnuma.sock"
    socket_mode: int = 0o660
    # Largest intercepted request the proxy decodes; pass-through calls are spliced frame by
    # frame and carry no limit of ours at all (the kubelet's and containerd's 16 MiB apply).
    max_message_bytes: int = 16 * MIB
    # How long SIGTERM waits for in-flight calls before closing connections.
    shutdown_grace_seconds: float = 10.0
    # What the relay may buffer (held intercepted requests, reply copies, bytes waiting for
    # containerd's flow-control window): per kubelet connection and for the whole daemon.
    # Past either, new intercepted calls are refused with RESOURCE_EXHAUSTED.
    buffer_bytes_per_connection: int = 32 * MIB
    buffer_bytes_total: int = 64 * MIB
    # Connections relayed at once; 0: as many as the open-files limit carries (at most
    # 16384, transport/connection_cap.py). At the cap the connection idle longest is asked
    # to go before a new one is refused. And how long a new one may take to send the
    # HTTP/2 preface before it is closed.
    max_connections: int = 0
    handshake_timeout_seconds: float = 10.0

    @classmethod
    def from_table(cls, t: Table) -> "ServerConfig":
        mode = t.str("socket_mode", "0660")
        try:
            socket_mode = int(mode, 8)
        except ValueError:
            socket_mode = t.invalid("socket_mode", f"must be an octal string like \"0660\"; got {shown(mode)}",
                                    cls.socket_mode)
        if not 0 <= socket_mode <= 0o777:
            socket_mode = t.invalid("socket_mode", f"must be within 0000..0777; got {shown(mode)}", cls.socket_mode)
        max_message_bytes = t.int("max_message_bytes", cls.max_message_bytes, min=16 * MIB, max=2**31 - 1)
        # The budgets' defaults hold two messages of the largest size per connection and
        # two connections' worth in all; explicit values must hold at least one message.
        per_connection = t.int("buffer_bytes_per_connection", max(cls.buffer_bytes_per_connection,
                                                                   2 * max_message_bytes),
                               min=max_message_bytes, max=2**40)
        total = t.int("buffer_bytes_total", max(cls.buffer_bytes_total, 2 * per_connection),
                      min=per_connection, max=2**40)
        cfg = cls(
            listen=t.socket_path("listen", cls.listen),
            socket_mode=socket_mode,
            max_message_bytes=max_message_bytes,
            shutdown_grace_seconds=t.float("shutdown_grace_seconds", cls.shutdown_grace_seconds, min=0, max=600),
            buffer_bytes_per_connection=per_connection,
            buffer_bytes_total=total,
            max_connections=t.int("max_connections", cls.max_connections, min=0, max=1 << 20),
            handshake_timeout_seconds=t.float("handshake_timeout_seconds", cls.handshake_timeout_seconds,
                                              min=0.05, max=600),
        )
        t.finish()
        return cfg


@dataclass
class RuntimeConfig:
    endpoint: str = "/run/containerd/containerd.sock"
    # Budget for connecting to containerd; a kubelet call fails fast with UNAVAILABLE
    # (its connection is closed) when containerd cannot be reached within it.
    connect_timeout_seconds: float = 1.0
    # Limit for the replies of the daemon's own calls to containerd (List*, status).
    max_message_bytes: int = 16 * MIB
    # How often the store and the policies are reconciled with what containerd runs (a
    # removal the proxy missed is dropped, a pod it never saw adopted); 0: at start only.
    resync_interval_seconds: float = 60.0

    @classmethod
    def from_table(cls, t: Table) -> "RuntimeConfig":
        cfg = cls(
            endpoint=t.socket_path("endpoint", cls.endpoint),
            connect_timeout_seconds=t.float("connect_timeout_seconds", cls.connect_timeout_seconds,
                                            min=0.01, max=60),
            max_message_bytes=t.int("max_message_bytes", cls.max_message_bytes, min=16 * MIB, max=2**31 - 1),
            resync_interval_seconds=t.float("resync_interval_seconds", cls.resync_interval_seconds,
                                            min=0, max=86400),
        )
        t.finish()
        return cfg


LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass
class LogConfig:
    file: str = "/var/log/anolisnuma.log"   # "" logs to stderr only
    level: str = "info"                     # of anolisnuma's loggers; other libraries' stay at warning
    stderr: bool = False                    # also to stderr when a file is set (journald keeps a copy)

    @classmethod
    def from_table(cls, t: Table) -> "LogConfig":
        file = t.str("file", cls.file)
        if file and not file.startswith("/"):
            file = t.invalid("file", f"must be an absolute path or empty; got {shown(file)}", cls.file)
        cfg = cls(file=file, level=t.str("level", cls.level, choices=LOG_LEVELS),
                  stderr=t.bool("stderr", cls.stderr))
        t.finish()
        return cfg


@dataclass
class PathsConfig:
    cgroup_root: str = "/sys/fs/cgroup"
    resctrl_root: str = "/sys/fs/resctrl"
    sys_root: str = "/sys"
    proc_root: str = "/proc"
    state_dir: str = "/var/lib/anolisnuma"
    kubelet_cpu_manager_state: str = "/var/lib/kubelet/cpu_manager_state"

    @classmethod
    def from_table(cls, t: Table) -> "PathsConfig":
        cfg = cls(**{name: _abs_path(t, name, getattr(cls, name)) for name in (
            "cgroup_root", "resctrl_root", "sys_root", "proc_root", "state_dir",
            "kubelet_cpu_manager_state")})
        t.finish()
        return cfg


@dataclass
class CgroupsConfig:
    """Where the kubelet puts pod cgroups (anolisnuma/system/pod_cgroups.py): its cgroup
    root (``--cgroup-root``) and driver, ``"auto"`` = read from the kubelet's own flags and
    config files below ``kubelet_files_root`` (the files ``anolisnuma-ctl kubelet`` reads)."""

    kubelet_cgroup_root: str = "auto"
    kubelet_cgroup_driver: str = "auto"
    kubelet_files_root: str = "/"

    @classmethod
    def from_table(cls, t: Table) -> "CgroupsConfig":
        from anolisnuma.system.pod_cgroups import InvalidCgroupPath, parse_root

        root = t.str("kubelet_cgroup_root", cls.kubelet_cgroup_root)
        if root != "auto":
            try:
                parse_root(root)
            except InvalidCgroupPath as e:
                root = t.invalid("kubelet_cgroup_root", f"must be \"auto\" or the kubelet's --cgroup-root "
                                                        f"(\"/\", \"/custom\"): {e}", cls.kubelet_cgroup_root)
        cfg = cls(kubelet_cgroup_root=root,
                  kubelet_cgroup_driver=t.str("kubelet_cgroup_driver", cls.kubelet_cgroup_driver,
                                              choices=("auto", "cgroupfs", "systemd")),
                  kubelet_files_root=_abs_path(t, "kubelet_files_root", cls.kubelet_files_root))
        t.finish()
        return cfg


@dataclass
class AdminConfig:
    """The admin socket ``anolisnuma-ctl`` talks to (root only, mode 0600); "" = none."""

    socket: str = "/var/run/anolisnuma/admin.sock"

    @classmethod
    def from_table(cls, t: Table) -> "AdminConfig":
        value = t.str("socket", cls.socket)
        cfg = cls(socket=t.socket_path("socket", cls.socket) if value else "")
        t.finish()
        return cfg


@dataclass
class MetricsConfig:
    """Prometheus text over HTTP on ``listen`` ("host:port"; "" = off). Only loopback
    addresses unless ``allow_remote``: the page names every pod's method counts and the
    node's NUMA load, which is nobody else's business by default."""

    listen: str = ""
    allow_remote: bool = False

    @property
    def address(self) -> Tuple[str, int]:
        """``(host, port)`` of :attr:`listen` (only meaningful when it is set)."""
        return split_host_port(self.listen)

    @classmethod
    def from_table(cls, t: Table) -> "MetricsConfig":
        listen = t.str("listen", cls.listen).strip()
        allow_remote = t.bool("allow_remote", cls.allow_remote)
        if listen:
            try:
                host, _ = split_host_port(listen)
            except ValueError as e:
                listen = t.invalid("listen", str(e), cls.listen)
            else:
                if not allow_remote and not is_loopback(host):
                    listen = t.invalid("listen", f"{host} is not a loopback address; metrics stay on this node "
                                                 f"unless metrics.allow_remote = true", cls.listen)
        cfg = cls(listen=listen, allow_remote=allow_remote)
        t.finish()
        return cfg


def split_host_port(text: str) -> Tuple[str, int]:
    """``"127.0.0.1:9464"``, ``"[::1]:9464"`` or ``"localhost:9464"`` -> (host, port);
    ValueError saying what is wrong. The host must be an IP address or ``localhost`` (a
    name would be resolved, and could change, behind the operator's back); port 0 picks
    a free port (tests)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"must be \"host:port\", e.g. \"127.0.0.1:9464\"; got {shown(text)}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host != "localhost":
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise ValueError(f"host must be an IP address or localhost; got {shown(host)}") from None
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"port must be a number in 0..65535; got {shown(port)}")
    return host, int(port)


def is_loopback(host: str) -> bool:
    return host == "localhost" or ipaddress.ip_address(host).is_loopback


# The hooks the daemon can build (anolisnuma.daemon.build_hooks), by name.
HOOK_NAMES = ("numa", "qos")


@dataclass
class HookSettings:
    budget_seconds: float = 2.0
    failure_policy: str = "ignore"


@dataclass
class HooksConfig:
    """Per-hook settings, plus the pod annotations/labels that opt a pod out of every hook."""

    default: HookSettings = field(default_factory=HookSettings)
    per_hook: Dict[str, HookSettings] = field(default_factory=dict)
    skip_keys: List[str] = field(default_factory=lambda: [
        "anolisnuma.io/skip", "runtimeproxy.koordinator.sh/skip-hookserver"])

    def settings(self, hook_name: str) -> HookSettings:
        return self.per_hook.get(hook_name, self.default)

    @classmethod
    def from_table(cls, t: Table) -> "HooksConfig":
        default = _hook_settings(t, HookSettings())
        per_hook = {}
        skip_keys = t.str_list("skip_keys", cls().skip_keys)
        for name in t.keys():
            if name in ("budget_seconds", "failure_policy", "skip_keys"):
                continue
            if name not in HOOK_NAMES:
                known = HOOK_NAMES + ("budget_seconds", "failure_policy", "skip_keys")
                t.invalid(name, f"unknown key (hooks are {', '.join(HOOK_NAMES)})" + did_you_mean(name, known))
                continue
            per_hook[name] = _hook_settings(t.table(name), default, finish=True)
        t.finish()
        return cls(default=default, per_hook=per_hook, skip_keys=skip_keys)


def _hook_settings(t: Table, base: HookSettings, finish: bool = False) -> HookSettings:
    s = HookSettings(
        budget_seconds=t.float("budget_seconds", base.budget_seconds, min=0.001, max=300),
        failure_policy=t.str("failure_policy", base.failure_policy, choices=("ignore", "fail")),
    )
    if finish:
        t.finish()
    return s


@dataclass
class Config:
    server: ServerConfig = field(default_factory=ServerConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    log: LogConfig = field(default_factory=LogConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    cgroups: CgroupsConfig = field(default_factory=CgroupsConfig)
    hooks: HooksConfig = field(default_factory=HooksConfig)
    admin: AdminConfig = field(default_factory=AdminConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    qos: Any = None    # anolisnuma.policies.qos.config.QosConfig
    numa: Any = None   # anolisnuma.policies.numa.config.NumaConfig
    kubernetes: Any = None   # anolisnuma.cluster.config.KubernetesConfig
    nri: Any = None   # anolisnuma.nri.config.NriConfig
    source: Optional[str] = None

    @classmethod
    def from_dict(cls, data: Dict[str, Any], source: Optional[str] = None) -> "Config":
        from anolisnuma.cluster.config import KubernetesConfig
        from anolisnuma.nri.config import NriConfig
        from anolisnuma.policies.numa.config import NumaConfig
        from anolisnuma.policies.qos.config import QosConfig

        root = Table(data)

        def section(name: str, reader: Any) -> Any:
            # A section that stops at an error (a required key missing) is noted, and
            # the next one read: every section's errors are named in one run.
            try:
                return reader(root.table(name))
            except ConfigError as e:
                root.errors.add(e)
                return None

        cfg = cls(**{name: section(name, reader) for name, reader in (
            ("server", ServerConfig.from_table), ("runtime", RuntimeConfig.from_table),
            ("log", LogConfig.from_table), ("paths", PathsConfig.from_table),
            ("cgroups", CgroupsConfig.from_table), ("hooks", HooksConfig.from_table),
            ("admin", AdminConfig.from_table), ("metrics", MetricsConfig.from_table),
            ("qos", QosConfig.from_table), ("numa", NumaConfig.from_table),
            ("kubernetes", KubernetesConfig.from_table), ("nri", NriConfig.from_table))}, source=source)
        # Compared only when neither side was wrong (a wrong one reads as its default).
        errors = root.errors
        if not any(errors.in_section(s) for s in ("server", "runtime")):
            if cfg.server.listen == cfg.runtime.endpoint:
                errors.add(ConfigError("server.listen", "must differ from runtime.endpoint"))
        if not any(errors.in_section(s) for s in ("server", "runtime", "admin")):
            if cfg.admin.socket in (cfg.server.listen, cfg.runtime.endpoint):
                errors.add(ConfigError("admin.socket", "must differ from server.listen and runtime.endpoint "
                                                       "(the admin socket is anolisnuma's own, root only)"))
        root.finish()   # raises every error noted
        return cfg

    @classmethod
    def load(cls, path: str) -> "Config":
        """Read and validate ``path``; raises :class:`ConfigError` naming the bad key, or
        :class:`~anolisnuma.configfile.ConfigErrors` naming each of several."""
        return cls.from_dict(load_toml(path), source=path)
