"""What a traffic sample is: the types every :class:`TrafficSource` speaks, apart from how
the socket-diagnostics source takes its samples (``anolisnuma.system.traffic``), so that
another source (``/dev/relationship_ctrl``, the tests' scripted ones) is written against
these alone."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, NamedTuple, Optional, Tuple

PodPair = Tuple[str, str]          # two pod UIDs, the smaller first


class PodProcess(NamedTuple):
    """What the observer needs of a managed pod: one PID of its containers, and whether
    the pod uses the host's network namespace."""

    pid: int
    host_network: bool = False


def pod_pair(a: str, b: str) -> PodPair:
    return (a, b) if a <= b else (b, a)


@dataclass
class SampleStats:
    pods: int = 0                  # pods asked for
    pods_skipped: int = 0          # PID gone, or not in the pod's cgroup
    namespaces: int = 0
    full_dumps: int = 0            # namespaces dumped in full
    refreshed: int = 0             # namespaces whose followed sockets were looked up
    idle: int = 0                  # namespaces with nothing to follow and no new connection
    sockets: int = 0               # pod sockets examined
    connections: int = 0           # pod-to-pod connections found
    via_conntrack: int = 0         # ... of which matched through conntrack
    via_server_view: int = 0       # ... of which matched through the server's view
    nat_lookups: int = 0
    ambiguous: int = 0             # sockets with more than one possible other end
    errors: int = 0
    seconds: float = 0.0           # wall time of the sample


@dataclass
class TrafficSample:
    at: float                               # monotonic time of the sample
    interval: Optional[float]               # seconds since the previous one (None: first)
    rates: Dict[PodPair, float]             # bytes/s, both directions together; > 0
    stats: SampleStats = field(default_factory=SampleStats)
    errors: List[str] = field(default_factory=list)   # what failed, a few lines at most


class TrafficSource(abc.ABC):
    """Something that can tell pod-pair byte rates since its previous sample."""

    name = "source"

    @abc.abstractmethod
    def sample(self, pods: Mapping[str, PodProcess]) -> TrafficSample:
        """Rates since the previous call, for ``pods`` (UID -> :class:`PodProcess`).
        The first call has ``interval`` ``None`` and no rates."""

    def close(self) -> None:
        """Release what the source holds."""
