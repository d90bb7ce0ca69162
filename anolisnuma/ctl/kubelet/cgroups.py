"""The kubelet's settings the daemon follows, read from the same view of its unit and config
files as the endpoint: its cgroup settings (``cgroupRoot``, ``cgroupDriver``: where the
daemon's pod-cgroup layout, anolisnuma/system/pod_cgroups.py, and ``kubelet status`` take
them from) and the CPUs it reserves (``reservedSystemCPUs``: what the NodeResourceTopology
leaves out of ``allocatable``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

from anolisnuma.ctl.kubelet.systemd_unit import flag_values
from anolisnuma.ctl.kubelet.view import KubeletView


@dataclass
class CgroupSetting:
    """One of the kubelet's cgroup settings (``cgroupRoot``, ``cgroupDriver``): its value,
    or ``None`` when nothing sets it (the kubelet's default applies), and where it came from."""

    value: Optional[str]
    origin: str


def cgroup_settings(view: KubeletView) -> Dict[str, CgroupSetting]:
    """``{"root": ..., "driver": ...}`` as the kubelet will take them: a flag
    (``--cgroup-root``, ``--cgroup-driver``, the last one given) over the last
    ``--config-dir`` file that sets the key, over the ``--config`` file; ``None`` values
    when none sets it (kubelet defaults: root ``/``, driver ``cgroupfs``)."""
    return {"root": kubelet_setting(view, "--cgroup-root", "cgroupRoot"),
            "driver": kubelet_setting(view, "--cgroup-driver", "cgroupDriver")}


def reserved_cpus(view: KubeletView) -> CgroupSetting:
    """The CPUs the kubelet reserves for the system (``--reserved-cpus`` /
    ``reservedSystemCPUs``, a CPU list), as it will take them; ``None`` when it names none
    (a ``kubeReserved``/``systemReserved`` CPU quantity names no CPU)."""
    return kubelet_setting(view, "--reserved-cpus", "reservedSystemCPUs")


def kubelet_setting(view: KubeletView, flag: str, key: str) -> CgroupSetting:
    """A string setting as the kubelet will take it: its flag (the last one given) over
    the last ``--config-dir`` file that sets the key, over the ``--config`` file."""
    hits = flag_values(view.words, flag)
    if hits:
        return CgroupSetting(hits[-1][0], f"flag {flag} in {hits[-1][1].describe()}")
    for path, data in reversed(view.config_dir_files):
        if isinstance(data.get(key), str):
            return CgroupSetting(data[key], f"{key} in config drop-in {path}")
    if view.config_data is not None and isinstance(view.config_data.get(key), str):
        return CgroupSetting(view.config_data[key], f"{key} in config file {view.config_path}")
    return CgroupSetting(None, "the kubelet's built-in default")
