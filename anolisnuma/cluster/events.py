"""``EventRecorder``: Kubernetes events (``events.k8s.io/v1``) about what this node did, so
that ``kubectl describe pod`` and ``kubectl describe oenuma`` tell the story.

Recorded by the rules loop (``sync.py``): a pod re-pinned by a CR (``NumaRepinned``), a CR's
rule that could not be applied to a pod (``NumaRuleFailed``), a CR skipped as malformed
(``OenumaMalformed``, on the CR). Sent by the ``cluster-events`` loop, never by the thread
that recorded them, in the way of the kubelet's event recorder:

- **aggregated**: the same event (object, reason, note) within ``SERIES_WINDOW`` of the
  last is not a new Event but a series: the Event already made gets ``series.count`` and
  ``series.lastObservedTime`` (a PATCH);
- **rate-limited**: per object, ``BURST`` events, then one per ``REFILL_SECONDS``; past it
  events are dropped and counted;
- **dropped first**: the queue holds ``QUEUE`` events; when the API server is slow or down
  and it is full, new events are dropped and counted. An event is tried once.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass
from typing import Callable, Deque, Dict, Tuple

import structlog

from anolisnuma.cluster.kube_client import ApiError, KubeClient
from anolisnuma.controller import Controller

log = structlog.get_logger("anolisnuma.cluster")

QUEUE = 256
BURST = 10
REFILL_SECONDS = 30.0
SERIES_WINDOW = 600.0
MAX_SERIES_KEPT = 1024
# reportingController, by the part of anolisnuma that decided what an event tells
# (``kubectl get events -o wide`` shows it as the source): NUMA placement and the Oenuma
# rules, or the QoS hook.
REPORTING_CONTROLLER = "anolisnuma.io/numa"
QOS_CONTROLLER = "anolisnuma.io/qos"
# Every reason this daemon's events have, by reportingController, and every action: the
# node policy (deploy/node-policy*.yaml, anolisnuma-node-events) lets a node's credentials
# make no other, so that root on a node cannot word a Warning as the kubelet's or anyone's
# (tests/cluster/test_event_policy.py keeps the three in step with the code that words them).
REASONS = {
    REPORTING_CONTROLLER: ("NumaPlaced", "NumaMoved", "NumaMoveFailed", "NumaRepinned", "NumaRuleFailed",
                           "NumaReleased", "OenumaMalformed", "OenumaRefused"),
    QOS_CONTROLLER: ("QosApplied", "QosSkipped", "QosApplyFailed", "QosLevelRefused"),
}
ACTIONS = ("Place", "Move", "Rollback", "Repin", "Release", "Skip", "Refuse", "Apply")
# The API server refuses an events.k8s.io note of more bytes (UTF-8) than this, whoever
# sends it (its validation, before any admission policy): a longer one is cut to it, at a
# character's boundary. Every note starts with "<node>: ", which the node policy requires.
MAX_NOTE_BYTES = 1024


@dataclass(frozen=True)
class Regarding:
    """The object an event is about."""

    kind: str
    api_version: str
    namespace: str
    name: str
    uid: str = ""


@dataclass(frozen=True)
class Event:
    regarding: Regarding
    type: str      # Normal | Warning
    reason: str    # CamelCase, e.g. NumaRepinned
    action: str    # what was done, e.g. Repin
    note: str
    controller: str = REPORTING_CONTROLLER   # reportingController: NUMA's, or QOS_CONTROLLER


def micro_time(t: float) -> str:
    """A MicroTime: RFC 3339 with microseconds, UTC."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e6):06d}Z"


class EventRecorder(Controller):
    """``EventRecorder(client, node_name)``: :meth:`record` from any thread; the loop sends."""

    name = "cluster-events"
    interval = 0.0   # when woken

    def __init__(self, client: KubeClient, node_name: str, clock: Callable[[], float] = time.time) -> None:
        super().__init__()
        self.client = client
        self.node_name = node_name
        self.clock = clock
        self._queue: Deque[Tuple[Event, float]] = collections.deque()
        self._lock = threading.Lock()
        self._tokens: Dict[Regarding, Tuple[float, float]] = {}   # object -> (tokens, when counted)
        self._series: "collections.OrderedDict[Event, Tuple[str, str, int, float]]" = collections.OrderedDict()
        self.sent = 0
        self.aggregated = 0
        self.dropped_rate = 0
        self.dropped_full = 0
        self.failed = 0
        self.state = "connecting"   # "up" once an event was sent, "down"/"refused" after a failure

    # ------------------------------------------------------------------ recording (any thread)
    def record(self, event: Event) -> bool:
        """Queue ``event``; False when it was dropped (rate limit, full queue)."""
        now = self.clock()
        with self._lock:
            tokens, then = self._tokens.get(event.regarding, (float(BURST), now))
            tokens = min(float(BURST), tokens + (now - then) / REFILL_SECONDS)
            if tokens < 1:
                self._tokens[event.regarding] = (tokens, now)
                self.dropped_rate += 1
                return False
            if len(self._queue) >= QUEUE:
                self.dropped_full += 1
                return False
            self._tokens[event.regarding] = (tokens - 1, now)
            if len(self._tokens) > 4 * MAX_SERIES_KEPT:   # (objects long gone)
                self._tokens.clear()
            self._queue.append((event, now))
        self.wake()
        return True

    # ------------------------------------------------------------------ sending (its own thread)
    def run_once(self) -> int:
        sent = 0
        while True:
            with self._lock:
                if not self._queue:
                    return sent
                event, when = self._queue.popleft()
            try:
                self._send(event, when)
                sent += 1
                self.state = "up"
            except ApiError as e:
                self.failed += 1
                self.last_error = str(e)[:300]
                self.state = "refused" if e.status in (401, 403) else ("down" if e.status in (0, 200) or
                                                                       e.status >= 500 else "up")
                log.debug("event not sent", reason=event.reason, regarding=event.regarding.name, error=str(e)[:200])

    def _send(self, event: Event, when: float) -> None:
        r = event.regarding
        ns = r.namespace or "default"
        known = self._series.get(event)
        if known is not None and when - known[3] < SERIES_WINDOW:
            name, first, count, _ = known
            try:
                self.client.patch_event_series(ns, name, count + 1, micro_time(when))
                self._series[event] = (name, first, count + 1, when)
                self._series.move_to_end(event)
                self.aggregated += 1
                return
            except ApiError as e:
                if e.status != 404:   # (an Event expires after the API server's event TTL)
                    raise
        regarding = {"kind": r.kind, "apiVersion": r.api_version, "namespace": r.namespace, "name": r.name}
        if r.uid:
            regarding["uid"] = r.uid
        # (named as client-go names them: the object's name and the time in hex; the count
        # of events sent keeps two of one nanosecond apart)
        name = self.client.create_event(
            ns, f"{r.name[:200]}.{int(when * 1e9) + self.sent:x}", when, regarding, type=event.type,
            reason=event.reason, action=event.action, note=clip_note(event.note),
            reportingController=event.controller, reportingInstance=f"anolisnuma-{self.node_name}"[:128])
        self._series[event] = (name, micro_time(when), 1, when)
        while len(self._series) > MAX_SERIES_KEPT:
            self._series.popitem(last=False)
        self.sent += 1

    def closed(self) -> None:
        self.client.close()

    def counts(self) -> Dict[str, int]:
        return {"events_sent": self.sent, "events_aggregated": self.aggregated, "events_failed": self.failed,
                "events_dropped_rate": self.dropped_rate, "events_dropped_full": self.dropped_full,
                "events_queued": len(self._queue)}


def clip_note(note: str) -> str:
    """``note`` in at most :data:`MAX_NOTE_BYTES` bytes of UTF-8 (its first characters)."""
    if len(note) * 4 <= MAX_NOTE_BYTES:   # (no character is more than 4 bytes)
        return note
    # (a character cut in two is left out)
    return note.encode("utf-8", "replace")[:MAX_NOTE_BYTES].decode("utf-8", "ignore")


def pod_regarding(namespace: str, name: str, uid: str) -> Regarding:
    return Regarding("Pod", "v1", namespace, name, uid)


def oenuma_regarding(namespace: str, name: str, uid: str) -> Regarding:
    from anolisnuma.policies.numa.rules import OENUMA_API_VERSION, OENUMA_KIND

    return Regarding(OENUMA_KIND, OENUMA_API_VERSION, namespace, name, uid)

