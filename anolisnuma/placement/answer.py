"""What the placement service answers a kubelet call with, and the cpuset text helpers the
service and the NUMA hook share (kept apart from the service so that it stays readable)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from anolisnuma.policies.numa.cpuset import CpuSet, CpuSetError


@dataclass(frozen=True)
class Answer:
    """What to do with a container's cpuset fields: ``cpus`` None leaves the container as
    the kubelet sent it; ``mems`` None leaves the kubelet's ``cpuset_mems``; ``note`` says
    why, for the call's log line ("" when there is nothing to say)."""

    cpus: Optional[CpuSet] = None
    mems: Optional[CpuSet] = None
    note: str = ""


def parse_cpus(text: str) -> Optional[CpuSet]:
    """A cpuset field as the kubelet or containerd wrote it; None when it does not parse."""
    try:
        return CpuSet.parse(text)
    except CpuSetError:
        return None


def where(nodes: Sequence[int]) -> str:
    """``node 1`` / ``nodes 0,1``, for log lines and call notes."""
    return ("node " if len(nodes) == 1 else "nodes ") + ",".join(str(n) for n in nodes)
