"""Events on pods for what this node decided about them: the wording, and the sink.

The policies report facts (``anolisnuma/decision_events.py``); :func:`pod_event` words
each as a Kubernetes event on the pod, and :class:`PodEventSink` hands it to the
:class:`~anolisnuma.cluster.events.EventRecorder` (whose ``record`` only appends to a
bounded queue: the sending, the series and the per-pod rate limit are its loop's).

=================  =======  ==================================================================
reason             type     when
=================  =======  ==================================================================
NumaPlaced         Normal   a managed pod got its NUMA nodes and cpuset: by balance, by a rule
                            (which rule file or Oenuma CR), or a container's CPUs are the
                            kubelet's static CPU manager's (left as it set them); or a resync
                            adopted it (found running by a restart, or created while the NRI
                            plugin was not registered): kept where its cpuset is, or placed
                            then and re-pinned live
NumaMoved          Normal   a running pod moved live for traffic affinity (the peer, bytes/s),
                            or because the kubelet's static CPU manager gave its nodes' shared
                            CPUs to exclusive containers (the shared pool now)
NumaMoveFailed     Warning  a live move's re-pin failed: the pod was rolled back
QosApplied         Normal   the pod's QoS level and the knobs written for it
QosSkipped         Normal   the level has no knob to write (none on this kernel, or none on)
QosSkipped         Warning  a QoS marking of the pod is not a level (ignored; the level the
                            pod got instead is said), or the pod's cgroup cannot be placed
QosApplyFailed     Warning  the kernel refused some of the pod's knob writes
QosLevelRefused    Warning  the pod's markings ask for an online level, but the pod is offline
                            and is never turned online while it runs: it keeps its level
=================  =======  ==================================================================

The NUMA events are reported by ``anolisnuma.io/numa``, the QoS events by
``anolisnuma.io/qos`` (their ``reportingController``).
"""

from __future__ import annotations

from typing import Dict, Sequence, Tuple, Union

import structlog

from anolisnuma.cluster.events import QOS_CONTROLLER, Event, EventRecorder, pod_regarding
from anolisnuma.decision_events import (
    Decision, NumaMoved, NumaMoveFailed, NumaPlaced, NumaPoolMoved, QosApplied, QosLevelRefused, QosSkipped)
from anolisnuma.pipeline.metrics import Counters

log = structlog.get_logger("anolisnuma.cluster")

NORMAL = "Normal"
WARNING = "Warning"


def _nodes(nodes: Sequence[int], numa: str = "NUMA ") -> str:
    return numa + ("node " if len(nodes) == 1 else "nodes ") + ",".join(str(n) for n in nodes)


def _rate(bytes_per_second: float) -> str:
    for unit, size in (("MB/s", 1e6), ("kB/s", 1e3)):
        if bytes_per_second >= size:
            return f"{bytes_per_second / size:.1f} {unit}"
    return f"{bytes_per_second:.0f} B/s"


def _knobs(d: QosApplied) -> str:
    return ", ".join(f"{name}={value}" for name, value in d.knobs)


def pod_event(d: Decision, node_name: str) -> Event:
    """The event that tells ``d`` on its pod, its note prefixed with ``node_name``.
    Raises TypeError for what is no decision."""
    about = pod_regarding(d.pod.namespace, d.pod.name, d.pod.uid)
    if isinstance(d, NumaPlaced):
        where = f"{_nodes(d.nodes)}, cpuset {d.cpus}" + (f", memset {d.mems}" if d.mems else "")
        if d.why == "kubelet-exclusive":
            note = (f"container {d.container}: {where}, exclusive CPUs of the kubelet's static CPU manager; "
                    f"left as the kubelet set them")
        elif d.why == "adopted":
            note = f"{where}, adopted as it runs (found already pinned)"
        elif d.why == "rule":
            note = f"{where}, pinned by rule {d.rule}"
        else:
            note = f"{where}, by balance" + (f": {d.detail}" if d.detail else "")
        if d.adopted and d.why != "adopted":
            note += "; found running unpinned at a resync (created while anolisnuma was not there): pinned live"
        return Event(about, NORMAL, "NumaPlaced", "Place", f"{node_name}: {note}")
    if isinstance(d, NumaPoolMoved):
        note = (f"moved from {_nodes(d.from_nodes)} to {_nodes(d.to_nodes, '')}: the kubelet's static CPU manager "
                f"gave the shared CPUs of {_nodes(d.from_nodes, '')} to exclusive containers (shared pool now "
                f"{d.pool})")
        return Event(about, NORMAL, "NumaMoved", "Move", f"{node_name}: {note}")
    if isinstance(d, NumaMoved):
        note = (f"moved live from {_nodes(d.from_nodes)} to {_nodes(d.to_nodes, '')} for traffic with {d.peer} "
                f"({_rate(d.bytes_per_second)}" + (f", {d.kind}" if d.kind else "") + ")")
        return Event(about, NORMAL, "NumaMoved", "Move", f"{node_name}: {note}")
    if isinstance(d, NumaMoveFailed):
        note = (f"live move to {_nodes(d.to_nodes)} failed and was rolled back to {_nodes(d.back_to, '')}: "
                f"{d.error or 'the re-pin failed'}")
        return Event(about, WARNING, "NumaMoveFailed", "Rollback", f"{node_name}: {note}")
    if isinstance(d, QosLevelRefused):
        note = f"QoS level {d.wanted} refused, kept at {d.kept}: {d.why}"
        return Event(about, WARNING, "QosLevelRefused", "Refuse", f"{node_name}: {note}", QOS_CONTROLLER)
    if isinstance(d, (QosApplied, QosSkipped)):
        type_, reason, action, note = _qos(d)
        return Event(about, type_, reason, action, f"{node_name}: {note}", QOS_CONTROLLER)
    raise TypeError(f"not a decision: {type(d).__name__}")


def _qos(d: Union[QosApplied, QosSkipped]) -> Tuple[str, str, str, str]:
    """(type, reason, action, note) of a QoS decision."""
    if isinstance(d, QosSkipped):
        return WARNING, "QosSkipped", "Skip", f"QoS not applied: {d.why}"
    level = f"QoS level {d.level} ({d.why})"
    lacking = f"not on this kernel: {', '.join(d.lacking)}" if d.lacking else ""
    if d.refused:
        note = f"{level}: knob writes refused: {'; '.join(d.refused)}" + (f"; set: {_knobs(d)}" if d.knobs else "")
        return WARNING, "QosApplyFailed", "Apply", note
    if d.knobs:
        applied = f"{level}: {_knobs(d)}" + (f"; {lacking}" if lacking else "")
    else:
        applied = f"{level}: no knob written: " + (lacking or "no QoS feature is on")
    if d.ignored:
        return WARNING, "QosSkipped", "Skip", f"{'; '.join(d.ignored)}: skipped; {applied}"
    if not d.knobs:
        return NORMAL, "QosSkipped", "Skip", applied
    return NORMAL, "QosApplied", "Apply", applied


class PodEventSink:
    """``PodEventSink(recorder, node_name)``: a :data:`~anolisnuma.decision_events.DecisionEvents`
    sink. A call words the fact and queues the event: no I/O, no wait, never raises (a fact
    it cannot word is counted and dropped)."""

    def __init__(self, recorder: EventRecorder, node_name: str) -> None:
        self.recorder = recorder
        self.node_name = node_name
        self.counters = Counters()

    def __call__(self, decision: Decision) -> None:
        try:
            event = pod_event(decision, self.node_name)
            queued = self.recorder.record(event)
        except Exception as e:   # (a decision is never failed by its telling)
            self.counters.add("unworded")
            log.debug("pod event not made", decision=type(decision).__name__, error=repr(e)[:200])
            return
        self.counters.add(event.reason if queued else "dropped")

    def counts(self) -> Dict[str, int]:
        """Events queued by reason, ``dropped`` (rate limit or full queue) and
        ``unworded``."""
        return self.counters.snapshot()


__all__ = ["pod_event", "PodEventSink"]
