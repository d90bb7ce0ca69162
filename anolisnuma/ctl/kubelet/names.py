"""The names the switch works with: the kubelet's flags and config keys, systemd's unit
name and search path, the kubelet's defaults, and the paths anolisnuma itself writes.

One spelling for the readers, the planner and the commands, and none of them needs
anolisnuma's own config to know it.
"""

from __future__ import annotations

FLAG = "--container-runtime-endpoint"
CONFIG_FLAG = "--config"
CONFIG_DIR_FLAG = "--config-dir"
KEY = "containerRuntimeEndpoint"
DEFAULT_ENDPOINT = "unix:///run/containerd/containerd.sock"
DEFAULT_KUBELET_CONFIG = "/var/lib/kubelet/config.yaml"
DEFAULT_ANOLISNUMA_CONFIG = "/etc/anolisnuma/config.toml"
BACKUP_DIR = "/var/lib/anolisnuma/kubelet-backup"
MANIFEST = BACKUP_DIR + "/manifest.json"
DROPIN = "/etc/systemd/system/kubelet.service.d/99-anolisnuma-endpoint.conf"
UNIT_NAME = "kubelet.service"
# systemd's unit search path, highest priority first.
UNIT_DIRS = (
    "/etc/systemd/system",
    "/run/systemd/system",
    "/usr/local/lib/systemd/system",
    "/usr/lib/systemd/system",
    "/lib/systemd/system",
)
MANIFEST_FORMAT = 1
