"""``anolisnuma-ctl kubelet enable|disable|status``: point the kubelet at anolisnuma and back.

``status`` reads how the kubelet will be started (its systemd unit, drop-ins, environment
files and config files) and says which CRI endpoint it will use and from where. ``enable``
rewrites the one source that wins, as a minimal textual edit checked before it is made,
with the originals backed up; ``disable`` puts them back. Everything works under
``--root DIR`` (default ``/``): paths are the node's, read and written below DIR.

The rooms, in the order a switch walks them:

reading the node (nothing here writes, and nothing here reads anolisnuma's own config: the
daemon imports these for the kubelet's cgroup settings)
    names.py           the kubelet's flags and keys, systemd's unit paths, the paths we write
    node_root.py       the node's files below --root, with planned contents overlaid
    text.py            bytes to text and back without loss, lines with offsets, sha256
    systemd_unit.py    [Service] settings of the unit and drop-ins, systemd's word splitting
    env_file.py        EnvironmentFile= files (kubeadm-flags.env, /etc/sysconfig/kubelet)
    config_yaml.py     the kubelet's config files: PyYAML to read, one-line edits of the key
    endpoints.py       whether two endpoints name the same socket
    view.py            inspect(): which endpoint wins, from where (the precedence is there)
    cgroups.py         the kubelet's cgroupRoot, cgroupDriver and reserved CPUs from the same view

changing it
    flag_text.py       the endpoint flag rewritten in place, and put back
    plan.py            the smallest edit that switches, checked (why each way is there)
    node_writes.py     atomic replacement, fsync, created directories, one run per root
    backups.py         the originals and manifest.json

the commands
    outcome.py         what a command returns: lines, exit code, CtlError
    probe.py           does our socket answer Version; which kubelet version runs
    ours.py            our socket and runtime, from anolisnuma's config
    status.py, enable.py, disable.py, cli.py (arguments and exit codes; also __main__.py)

Only the readers the daemon uses are re-exported here (system/pod_cgroups.py takes the
kubelet's cgroup settings through it, the NodeResourceTopology its reserved CPUs);
everything else is imported from its room.
"""

from __future__ import annotations

from anolisnuma.ctl.kubelet.cgroups import cgroup_settings, reserved_cpus
from anolisnuma.ctl.kubelet.node_root import Root
from anolisnuma.ctl.kubelet.view import inspect

__all__ = ["Root", "cgroup_settings", "inspect", "reserved_cpus"]
