"""The kubelet's cgroup settings (``cgroupRoot``, ``cgroupDriver``), read from the same view
of its unit and config files as the endpoint: where the daemon's pod-cgroup layout
(anolisnuma/system/pod_cgroups.py) and ``kubelet status`` take them from.
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
    out: Dict[str, CgroupSetting] = {}
    for what, flag, key in (("root", "--cgroup-root", "cgroupRoot"), ("driver", "--cgroup-driver", "cgroupDriver")):
        hits = flag_values(view.words, flag)
        if hits:
            out[what] = CgroupSetting(hits[-1][0], f"flag {flag} in {hits[-1][1].describe()}")
            continue
        found = None
        for path, data in reversed(view.config_dir_files):
            if isinstance(data.get(key), str):
                found = CgroupSetting(data[key], f"{key} in config drop-in {path}")
                break
        if found is None and view.config_data is not None and isinstance(view.config_data.get(key), str):
            found = CgroupSetting(view.config_data[key], f"{key} in config file {view.config_path}")
        out[what] = found or CgroupSetting(None, "the kubelet's built-in default")
    return out
