#!/usr/bin/env python3
"""The configuration scripts/run-local.sh runs the daemon with: the user's file with the
paths of this run set in it.

    local_config.py SRC DST --endpoint SOCK --listen SOCK --state DIR --log FILE --admin SOCK
                    [--nri SOCK] [--demo SYS_ROOT [--write-topology]]

- ``[runtime] endpoint``, ``[server] listen``, ``[log] file``, ``[paths] state_dir`` and
  ``[admin] socket`` are this run's;
- ``--nri SOCK``: ``[nri] enabled`` on containerd's NRI socket SOCK (the user's other
  ``[nri]`` keys kept);
- ``--demo SYS_ROOT``: NUMA placement on for the namespace ``anolisnuma-demo``. On a
  machine with fewer than two NUMA nodes, placement reads a fake topology of two nodes over
  this machine's CPUs (the e2e tests' ``2n-2c-e2e`` on a 2-CPU machine:
  :func:`anolisnuma.testing.fake_sysfs.two_nodes_over`) from ``SYS_ROOT``
  (``[paths] sys_root``), with memory not pinned (the fake's node 1 has no memory here);
  ``--write-topology`` writes it there, with a file ``FAKE`` saying what it is.

Writes DST only; exit 2 with one line for a file that is no TOML. The daemon's own
``--check-config`` judges the rest (run-local runs it on DST before it starts anything).
"""

from __future__ import annotations

import argparse
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from anolisnuma.configfile import ConfigError, load_toml  # noqa: E402
from anolisnuma.policies.numa.cpuset import CpuSet  # noqa: E402
from anolisnuma.system.sysfs_topology import SysfsTopologyError, read_sysfs_topology  # noqa: E402
from anolisnuma.testing.fake_sysfs import two_nodes_over  # noqa: E402
from anolisnuma.testing.proxy import write_config  # noqa: E402

DEMO_NAMESPACE = "anolisnuma-demo"
FAKE_NOTE = "FAKE"   # in the fake sys_root: what it is (scripts/demo.py says it)


def real_nodes_with_cpus(sys_root: str = "/sys") -> int:
    try:
        raw = read_sysfs_topology(sys_root)
    except (OSError, SysfsTopologyError):
        return 0
    return sum(1 for node in raw.nodes if node.cpulist.strip())


def online_cpus(sys_root: str = "/sys") -> list:
    with open(os.path.join(sys_root, "devices", "system", "cpu", "online")) as f:
        return sorted(CpuSet.parse(f.read().strip()))


def write_topology(sys_root: str) -> None:
    fake = two_nodes_over(online_cpus())
    fake.write(sys_root)
    nodes = ", ".join(f"node {n} = CPU {c}" for n, c in sorted(fake.node_cpus.items()))
    with open(os.path.join(sys_root, FAKE_NOTE), "w") as f:
        f.write(f"{fake.name}: {nodes}\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="local_config.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    for key in ("endpoint", "listen", "state", "log", "admin"):
        ap.add_argument(f"--{key}", required=True)
    ap.add_argument("--nri", default="", help="containerd's NRI socket: the daemon in NRI mode")
    ap.add_argument("--demo", default="", metavar="SYS_ROOT", help="NUMA on for the demo's namespace")
    ap.add_argument("--write-topology", action="store_true", help="write the demo's fake topology")
    a = ap.parse_args(argv)
    try:
        data = load_toml(a.src)
    except ConfigError as e:
        print(f"run-local: {e}", file=sys.stderr)
        return 2
    for section, key, value in (("runtime", "endpoint", a.endpoint), ("server", "listen", a.listen),
                                ("log", "file", a.log), ("paths", "state_dir", a.state), ("admin", "socket", a.admin)):
        data.setdefault(section, {})[key] = value
    if a.nri:
        data.setdefault("nri", {}).update(enabled=True, socket=a.nri)
    if a.demo:
        numa = data.setdefault("numa", {})
        numa["enabled"] = True
        numa["namespaces"] = sorted(set(numa.get("namespaces", [])) | {DEMO_NAMESPACE})
        if real_nodes_with_cpus() < 2 and len(online_cpus()) >= 2:
            data.setdefault("paths", {})["sys_root"] = a.demo
            numa["memory_pinning"] = "off"
            if a.write_topology:
                write_topology(a.demo)
    write_config(a.dst, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
