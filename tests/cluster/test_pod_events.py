"""The wording of the events on pods (``cluster/pod_events.py``) and the sink that queues
them: what an operator reads in ``kubectl describe pod``, the reasons and types, and a sink
that never blocks, never raises and never holds more than the recorder's queue. Pure: the
recorder's queue is read, nothing is sent (tests/cluster/test_decision_events_live.py
sends them to a real API server)."""

from __future__ import annotations

from typing import Any, List

from anolisnuma.cluster.events import BURST, QUEUE, EventRecorder
from anolisnuma.cluster.pod_events import PodEventSink, pod_event
from anolisnuma.daemon import wire_decision_events
from anolisnuma.decision_events import (
    NumaMoved, NumaMoveFailed, NumaPlaced, NumaPoolMoved, PodRef, QosApplied, QosLevelRefused, QosSkipped, no_events,
    pod_ref)

POD = PodRef("batch", "web-0", "0c7b2a1e-5d7c-4c55-a7f3-6b7c1bb2b0f1")


def test_numa_placed_says_where_and_why() -> None:
    ev = pod_event(NumaPlaced(POD, (2,), "4-5", "2", "balance", detail="most free capacity (2 of 2 CPUs free)"), "n1")
    assert (ev.type, ev.reason, ev.action) == ("Normal", "NumaPlaced", "Place")
    assert ev.regarding.kind == "Pod" and ev.regarding.uid == POD.uid and ev.regarding.namespace == "batch"
    assert ev.note == "n1: NUMA node 2, cpuset 4-5, memset 2, by balance: most free capacity (2 of 2 CPUs free)"
    ev = pod_event(NumaPlaced(POD, (0, 1), "0-3", "", "rule", rule="apiserver batch/web (Oenuma web)"), "n1")
    assert ev.note == "n1: NUMA nodes 0,1, cpuset 0-3, pinned by rule apiserver batch/web (Oenuma web)"
    ev = pod_event(NumaPlaced(POD, (1,), "7", "", "kubelet-exclusive", container="main"), "n1")
    assert ev.note == ("n1: container main: NUMA node 1, cpuset 7, exclusive CPUs of the kubelet's static CPU "
                       "manager; left as the kubelet set them")


def test_an_adopted_pod_says_it_was_found_running() -> None:
    ev = pod_event(NumaPlaced(POD, (1,), "1", "1", "balance", detail="most free capacity (1 of 1 CPUs free)",
                              adopted=True), "n1")
    assert (ev.type, ev.reason) == ("Normal", "NumaPlaced")
    assert ev.note == ("n1: NUMA node 1, cpuset 1, memset 1, by balance: most free capacity (1 of 1 CPUs free); "
                       "found running unpinned at a resync (created while anolisnuma was not there): pinned live")
    ev = pod_event(NumaPlaced(POD, (2,), "8-11", "", "adopted", adopted=True), "n1")
    assert ev.note == "n1: NUMA node 2, cpuset 8-11, adopted as it runs (found already pinned)"


def test_a_pod_the_kubelets_exclusive_cpus_moved_says_so() -> None:
    ev = pod_event(NumaPoolMoved(POD, (0,), (1,), "32-127"), "n1")
    assert (ev.type, ev.reason, ev.action, ev.controller) == ("Normal", "NumaMoved", "Move", "anolisnuma.io/numa")
    assert ev.note == ("n1: moved from NUMA node 0 to node 1: the kubelet's static CPU manager gave the shared "
                       "CPUs of node 0 to exclusive containers (shared pool now 32-127)")


def test_qos_events_come_from_the_qos_component_numa_events_from_numa() -> None:
    qos = [QosApplied(POD, "BE", "annotation", knobs=(("memory.priority", 0),)), QosApplied(POD, "LS", "class"),
           QosApplied(POD, "BE", "x", refused=("EROFS",)), QosSkipped(POD, "cgroup_parent not recognized")]
    assert {pod_event(d, "n1").controller for d in qos} == {"anolisnuma.io/qos"}
    numa = [NumaPlaced(POD, (2,), "4-5", "2", "balance"), NumaMoved(POD, (0,), (3,), "batch/db-0", 1.0),
            NumaMoveFailed(POD, (3,), (0,), "x")]
    assert {pod_event(d, "n1").controller for d in numa} == {"anolisnuma.io/numa"}


def test_moves_say_the_peer_the_rate_and_a_rollback_is_a_warning() -> None:
    ev = pod_event(NumaMoved(POD, (0,), (3,), "batch/db-0", 12_345_678.0, "join"), "n1")
    assert (ev.type, ev.reason) == ("Normal", "NumaMoved")
    assert ev.note == "n1: moved live from NUMA node 0 to node 3 for traffic with batch/db-0 (12.3 MB/s, join)"
    ev = pod_event(NumaMoveFailed(POD, (3,), (0,), "rpc error: cannot update"), "n1")
    assert (ev.type, ev.reason, ev.action) == ("Warning", "NumaMoveFailed", "Rollback")
    assert ev.note == "n1: live move to NUMA node 3 failed and was rolled back to node 0: rpc error: cannot update"


def test_qos_applied_skipped_and_failed() -> None:
    why = "annotation anolisbox.sh/qoslevel=BE"
    ev = pod_event(QosApplied(POD, "BE", why, knobs=(("cpu.bvt_warp_ns", -1), ("memory.priority", 0)),
                              lacking=("memory.wmark_ratio",)), "n1")
    assert (ev.type, ev.reason) == ("Normal", "QosApplied")
    assert ev.note == (f"n1: QoS level BE ({why}): cpu.bvt_warp_ns=-1, memory.priority=0; "
                       "not on this kernel: memory.wmark_ratio")
    ev = pod_event(QosApplied(POD, "LS", "kube QoS class burstable maps to LS", lacking=("cpu.bvt_warp_ns",)), "n1")
    assert (ev.type, ev.reason) == ("Normal", "QosSkipped")
    assert ev.note.endswith("no knob written: not on this kernel: cpu.bvt_warp_ns")
    bad = "annotation anolisbox.sh/qoslevel has unknown value 'turbo'; expected one of LSE, LSR, LS, BE"
    ev = pod_event(QosApplied(POD, "LS", "kube QoS class burstable maps to LS", knobs=(("memory.priority", 10),),
                              ignored=(bad,)), "n1")
    assert (ev.type, ev.reason) == ("Warning", "QosSkipped")
    assert ev.note == f"n1: {bad}: skipped; QoS level LS (kube QoS class burstable maps to LS): memory.priority=10"
    ev = pod_event(QosApplied(POD, "BE", why, knobs=(("memory.priority", 0),), refused=("EROFS: x",)), "n1")
    assert (ev.type, ev.reason) == ("Warning", "QosApplyFailed") and "refused: EROFS: x" in ev.note
    ev = pod_event(QosSkipped(POD, "cgroup_parent not recognized: '/x'"), "n1")
    assert (ev.type, ev.reason) == ("Warning", "QosSkipped")
    assert ev.note == "n1: QoS not applied: cgroup_parent not recognized: '/x'"


def test_an_online_level_refused_for_an_offline_pod_is_a_warning() -> None:
    why = "the pod is offline, and an offline pod is never turned online while it runs"
    ev = pod_event(QosLevelRefused(POD, "LS", "BE", why), "n1")
    assert (ev.type, ev.reason, ev.action) == ("Warning", "QosLevelRefused", "Refuse")
    assert ev.note == f"n1: QoS level LS refused, kept at BE: {why}"
    assert ev.controller == "anolisnuma.io/qos"


def test_pod_ref_splits_namespace_and_name() -> None:
    assert pod_ref("batch/web-0", "u") == PodRef("batch", "web-0", "u")
    assert pod_ref("lonely", "u") == PodRef("", "lonely", "u")


def recorder(now: List[float]) -> EventRecorder:
    return EventRecorder(client=None, node_name="n1", clock=lambda: now[0])   # type: ignore[arg-type]


def test_the_sink_queues_counts_drops_and_never_raises() -> None:
    now = [1000.0]
    rec = recorder(now)
    sink = PodEventSink(rec, "n1")
    for i in range(BURST + 3):   # one pod: the rate limit is per object
        sink(NumaPlaced(POD, (0,), "0-1", "", "balance", detail=f"pass {i}"))
    sink("garbage")   # type: ignore[arg-type]
    assert sink.counts() == {"NumaPlaced": BURST, "dropped": 3, "unworded": 1}
    assert rec.dropped_rate == 3 and len(rec._queue) == BURST


def test_a_full_queue_holds_no_more_and_counts_the_rest() -> None:
    """The sender is stuck (the API server slow): recording goes on, the queue never holds
    more than QUEUE, and the rest is dropped and counted."""
    now = [1000.0]
    rec = recorder(now)
    sink = PodEventSink(rec, "n1")
    pods = [PodRef("batch", f"p{i}", f"u{i}") for i in range(4 * QUEUE)]
    for p in pods:
        sink(QosApplied(p, "LS", "default", knobs=(("memory.priority", 10),)))
    assert len(rec._queue) == QUEUE and rec.dropped_full == 3 * QUEUE
    assert sink.counts() == {"QosApplied": QUEUE, "dropped": 3 * QUEUE}
    assert rec.counts()["events_queued"] == QUEUE


class _Hook:
    def __init__(self) -> None:
        self.sink: Any = None

    def use_decision_events(self, sink: Any) -> None:
        self.sink = sink


class _Link:
    def __init__(self, sink: Any) -> None:
        self.sink = sink

    def decision_events(self) -> Any:
        return self.sink


def test_the_daemon_wires_the_links_sink_to_every_hook_that_tells() -> None:
    sink = PodEventSink(recorder([0.0]), "n1")
    numa, qos, quiet = _Hook(), _Hook(), object()
    wire_decision_events([numa, qos, quiet], _Link(sink))   # type: ignore[list-item]
    assert numa.sink is sink and qos.sink is sink
    alone = _Hook()
    wire_decision_events([alone], None)   # type: ignore[list-item]   # no API server link: the no-op stays
    assert alone.sink is None
    assert no_events(QosSkipped(POD, "x")) is None
