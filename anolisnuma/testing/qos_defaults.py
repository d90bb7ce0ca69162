"""The QoS values docs/qos.md documents as the defaults, per kernel family: the tests'
oracle, written out by hand (never computed by the code under test), kept in one place for
the hook, daemon and end-to-end tests."""

from __future__ import annotations

from typing import Dict, Tuple

# Alibaba Cloud Linux / Anolis ("What each level gets"): the pod cgroup's files...
ALINUX_POD: Dict[str, Dict[str, int]] = {
    "LSE": {"cpu.bvt_warp_ns": 2, "memory.priority": 5, "memory.use_priority_oom": 1,
            "memory.wmark_ratio": 95, "memory.wmark_scale_factor": 20, "memory.wmark_min_adj": -25},
    "LSR": {"cpu.bvt_warp_ns": 2, "memory.priority": 10, "memory.use_priority_oom": 1,
            "memory.wmark_ratio": 95, "memory.wmark_scale_factor": 20, "memory.wmark_min_adj": -25},
    "LS": {"cpu.bvt_warp_ns": 1, "memory.priority": 10, "memory.use_priority_oom": 1,
           "memory.wmark_ratio": 95, "memory.wmark_scale_factor": 20, "memory.wmark_min_adj": -25},
    "BE": {"cpu.bvt_warp_ns": -1, "memory.priority": 0, "memory.use_priority_oom": 1,
           "memory.wmark_ratio": 95, "memory.wmark_scale_factor": 20, "memory.wmark_min_adj": 50},
}
# ... and those also written on each container's (the pod-only ones rank pods, not containers).
ALINUX_CONTAINER_KNOBS: Tuple[str, ...] = ("cpu.bvt_warp_ns", "memory.wmark_ratio", "memory.wmark_scale_factor",
                                           "memory.wmark_min_adj")

# openEuler ("Kernel families"): the same files on the pod and each container cgroup.
OPENEULER: Dict[str, Dict[str, int]] = {
    "LSE": {"cpu.qos_level": 0, "memory.qos_level": 0},
    "LSR": {"cpu.qos_level": 0, "memory.qos_level": 0},
    "LS": {"cpu.qos_level": 0, "memory.qos_level": 0},
    "BE": {"cpu.qos_level": -1, "memory.qos_level": -1},
}
