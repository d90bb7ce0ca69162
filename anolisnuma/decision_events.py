"""What the policies decided about a pod, as plain facts, for whoever wants to tell it.

The NUMA placement service, the traffic-affinity controller and the QoS hook report each
decision they take about a pod (placed or adopted, moved, move rolled back, moved because the
kubelet's exclusive CPUs took its nodes' shared CPUs, QoS level applied or
skipped, a level refused) to a :data:`DecisionEvents` sink: a callable taking one of the fact classes
below. The daemon wires the sink once the hooks are built: with ``[kubernetes]`` on, the
cluster side's (``anolisnuma/cluster/pod_events.py``) turns each fact into a Kubernetes
event on the pod; otherwise it is :func:`no_events`.

Why a sink of facts rather than the event recorder itself: the policies stay below the
cluster package (they import this module, which imports nothing of the daemon's), and the
wording of an event lives in one place, beside the recorder.

A sink is called on the CRI path (the hooks' threads) and on background loops: it must
return at once, never block, never do I/O and never raise. The facts carry the pod's
namespace, name and UID as the kubelet sent them; they are never used to build a path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Tuple, Union


@dataclass(frozen=True)
class PodRef:
    """The pod a decision is about, as its sandbox metadata names it."""

    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class NumaPlaced:
    """A managed pod got its NUMA placement (its first container, or adopted at a resync:
    found running by a restart, or created while the NRI plugin was not registered).
    ``why`` is ``balance``, ``rule``, ``kubelet-exclusive`` or ``adopted`` (found pinned:
    kept where its cpuset is); ``rule`` names the rule's source (a rule file or an Oenuma
    CR) when one pinned it; ``detail`` is the placement's own reason (e.g. "most free
    capacity (1.5 of 2 CPUs free)"); ``container`` is the container the kubelet gave
    exclusive CPUs (``why`` kubelet-exclusive); ``adopted``: placed at a resync, not at
    its creation (its containers are re-pinned live)."""

    pod: PodRef
    nodes: Tuple[int, ...]
    cpus: str
    mems: str
    why: str
    rule: str = ""
    detail: str = ""
    container: str = ""
    adopted: bool = False


@dataclass(frozen=True)
class NumaPoolMoved:
    """The kubelet's static CPU manager gave CPUs of the pod's NUMA nodes to exclusive
    containers, so that its shared pool (``pool``, now) left them: the pod was placed again
    within the pool, closest to where it was."""

    pod: PodRef
    from_nodes: Tuple[int, ...]
    to_nodes: Tuple[int, ...]
    pool: str


@dataclass(frozen=True)
class NumaMoved:
    """A running pod was moved live for traffic affinity: the peer pod and the bytes/s
    between them that motivated it."""

    pod: PodRef
    from_nodes: Tuple[int, ...]
    to_nodes: Tuple[int, ...]
    peer: str
    bytes_per_second: float
    kind: str = ""


@dataclass(frozen=True)
class NumaMoveFailed:
    """A live move could not be applied (a re-pin failed): the pod went back."""

    pod: PodRef
    to_nodes: Tuple[int, ...]
    back_to: Tuple[int, ...]
    error: str
    reason: str = ""


@dataclass(frozen=True)
class QosApplied:
    """A pod's QoS level and the knobs written for it. ``knobs`` are ``(name, value)``
    (pod and container files alike); ``lacking`` the knobs the level would use that this
    kernel does not have; ``ignored`` the pod's markings that were not a level (the level
    then came from the next source); ``refused`` the writes the kernel refused."""

    pod: PodRef
    level: str
    why: str
    knobs: Tuple[Tuple[str, int], ...] = ()
    lacking: Tuple[str, ...] = ()
    ignored: Tuple[str, ...] = ()
    refused: Tuple[str, ...] = ()


@dataclass(frozen=True)
class QosLevelRefused:
    """The level a pod's markings ask for was refused: it would turn an offline pod online
    while it runs, which the kernel does not allow. The pod is ``kept`` at the level it
    had (its writes those of that level); ``why`` says so and what to do."""

    pod: PodRef
    wanted: str
    kept: str
    why: str


@dataclass(frozen=True)
class QosSkipped:
    """The QoS hook manages no such pod: ``why`` (its cgroup cannot be placed)."""

    pod: PodRef
    why: str


Decision = Union[NumaPlaced, NumaPoolMoved, NumaMoved, NumaMoveFailed, QosApplied, QosLevelRefused, QosSkipped]
DecisionEvents = Callable[[Decision], None]


def no_events(decision: Decision) -> None:
    """The sink when nothing listens (``[kubernetes]`` off, or its events off)."""


def pod_ref(ref: str, uid: str) -> PodRef:
    """A :class:`PodRef` from ``namespace/name`` (a namespace has no ``/``)."""
    namespace, _, name = ref.partition("/")
    return PodRef(namespace, name, uid) if name else PodRef("", ref, uid)


__all__ = ["PodRef", "NumaPlaced", "NumaPoolMoved", "NumaMoved", "NumaMoveFailed", "QosApplied", "QosLevelRefused", "QosSkipped",
           "Decision",
           "DecisionEvents", "no_events", "pod_ref"]
