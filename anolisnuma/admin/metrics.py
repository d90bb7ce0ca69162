"""Prometheus metrics: the daemon's counters, read when scraped, served over HTTP.

:class:`DaemonCollector` turns what the daemon counts anyway (the interceptor's counters
and latency histograms, the relay's counters and buffer budget, the NUMA ledger, the
reconcilers' totals) into metric families at scrape time: a CRI call pays nothing for
metrics beyond those counters, scraped or not.
:class:`~anolisnuma.admin.metrics_http.MetricsServer` serves them on ``[metrics] listen``,
collected at most once a second on a worker thread, never on the event loop.

Families (all prefixed ``anolisnuma_``):

========================================  ==============================================
``intercepted_calls_total``               method, code (gRPC status name, or NO_REPLY
``intercepted_call_duration_seconds``     when the call ended without one)
``hook_calls_total``                      hook, stage (pre/post), outcome (ok/failed)
``hook_duration_seconds``                 hook, stage, outcome
``pipeline_events_total``                 event (requests_unreadable, calls_refused)
``calls_waiting_for_hooks``, ``ready``,
``uptime_seconds``, ``build_info``
``relay_connections``                     kubelet connections being relayed
``relay_connections_limit``               the connection cap (server.max_connections, or
                                          from the open-files limit); ``relay_events_total``
                                          counts ``connections_shed_idle`` and
                                          ``connections_refused_over_cap``
``relay_buffer_bytes``,                   bytes the relay holds now, the most it ever
``relay_buffer_peak_bytes``,              held, and its daemon-wide and per-connection
``relay_buffer_limit_bytes``,             budgets
``relay_buffer_connection_limit_bytes``
``relay_refused_calls_total``             intercepted calls refused: buffer budget spent
``relay_connections_ended_total``         http2_error: connections ended with GOAWAY
``relay_events_total``                    event: any other relay counter
``numa_node_cpus``, ``numa_node_shared_cpus``, ``numa_node_kubelet_exclusive_cpus``,
``numa_node_allocated_cpus``, ``numa_node_allocated_memory_bytes``, ``numa_node_pods``
                                          node: per NUMA node
``numa_pending_updates``                  placements waiting for the repin loop
``qos_pods``                              level: managed pods
``qos_knob_supported``                    knob: 1 when this kernel has it
``qos_kernel_family``                     family (alinux, openeuler): 1 when this kernel
                                          has its files
``reconcile_runs_total``,                 reconciler (qos, numa_repin): passes, values
``reconcile_drift_fixed_total``,          put back (files rewritten, cpusets repinned)
``reconcile_errors_total``                and failures
``controller_runs_total``,                controller (every background loop: store-writer,
``controller_errors_total``,              qos-reconcile, numa-watch, numa-repin,
``controller_last_pass_seconds``          numa-affinity): passes, failed passes, the last
                                          pass's duration
``controller_events_total``               controller, event: a loop's own counts (e.g.
                                          numa-affinity samples, moves, moves_refused,
                                          moves_rolled_back)
``cluster_connection_state``              state (connecting, synced, down, refused): 1 for
                                          the API server link's state now, 0 for the others
``cluster_last_sync_timestamp_seconds``   the last full list of the CRs (absent before)
``cluster_last_watch_event_timestamp_seconds``  the last watch event or bookmark (ditto)
``cluster_crs_seen``, ``cluster_rules``,  Oenuma CRs seen; rules in force from them; CRs
``cluster_crs_naming_node``,              naming this node, and those of them skipped as
``cluster_crs_skipped``                   malformed or refused
``cluster_watch_requests_total``          request (list, watch): relists and watch restarts
``cluster_watch_events_total``            type (event, bookmark)
``cluster_watch_gone_total``,             410 Gone answers; list or watch sessions that
``cluster_watch_failures_total``          failed
``cluster_rule_changes_total``,           rule changes; running pods re-pinned by them
``cluster_repins_total``
``cluster_events_sent_total``,            events created; repeats counted in a series
``cluster_events_aggregated_total``
``cluster_events_dropped_total``          reason (rate_limit, queue_full, send_failed)
``cluster_events_queued``                 events waiting to be sent
``cluster_pod_events_total``              reason (NumaPlaced, QosApplied, ...): events on
                                          pods queued for the policies' decisions
``cluster_status_applies_total``          outcome (ok, failed): server-side applies of
                                          the CRs' status
``cluster_topology_publishes_total``      outcome (ok, failed): server-side applies of the
                                          node's NodeResourceTopology (``topology = true``)
``cluster_topology_last_publish_timestamp_seconds``  the last one that succeeded
                                          (no ``cluster_`` family when ``[kubernetes]`` is
                                          off)
``metrics_connections_total``             outcome: what became of connections to the
                                          endpoint itself (served, busy, rejected,
                                          head_timeout, closed_early, write_timeout, failed)
``metrics_collections_total``             times the daemon was collected for scrapes
========================================  ==============================================
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Dict, Iterator, List, Optional

import structlog
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from anolisnuma import __version__
from anolisnuma.admin import views
from anolisnuma.pipeline.metrics import LatencyStats
from anolisnuma.system.knobs import FAMILIES

if TYPE_CHECKING:  # pragma: no cover
    from anolisnuma.admin.daemon_view import DaemonView

log = structlog.get_logger("anolisnuma.admin")

P = "anolisnuma_"


class DaemonCollector:
    """A prometheus_client collector over a running daemon (:class:`~anolisnuma.admin.daemon_view.DaemonView`)."""

    def __init__(self, daemon: "DaemonView", started: Optional[float] = None) -> None:
        self.daemon = daemon
        self.started = time.monotonic() if started is None else started

    def collect(self) -> Iterator[Metric]:
        # A section that fails (a hook being rebuilt, say) is left out of this scrape; the
        # others are still served.
        for section in (self._daemon, self._calls, self._hooks, self._relay, self._numa, self._qos,
                        self._reconcilers, self._controllers, self._cluster):
            try:
                yield from section()
            except Exception as e:
                log.warning("metrics section skipped", section=section.__name__, error=repr(e))

    # ---------------------------------------------------------------- sections
    def _daemon(self) -> Iterator[Metric]:
        d = self.daemon
        info = GaugeMetricFamily(P + "build_info", "anolisnuma's version", labels=["version"])
        info.add_metric([__version__], 1)
        yield info
        yield GaugeMetricFamily(P + "ready", "1 once the socket listens and the hooks are up", value=int(d.ready))
        yield GaugeMetricFamily(P + "uptime_seconds", "seconds since the daemon started",
                                value=time.monotonic() - self.started)
        yield GaugeMetricFamily(P + "calls_waiting_for_hooks", "intercepted calls waiting for the hooks to start",
                                value=d.interceptor.calls_waiting_for_hooks)

    def _calls(self) -> Iterator[Metric]:
        yield from _histogram(self.daemon.interceptor.call_stats, "intercepted_calls", "intercepted_call_duration_seconds",
                              "intercepted CRI calls (lifecycle methods), from the request to the reply",
                              ["method", "code"])

    def _hooks(self) -> Iterator[Metric]:
        yield from _histogram(self.daemon.interceptor.hook_stats, "hook_calls", "hook_duration_seconds",
                              "hook calls, by outcome", ["hook", "stage", "outcome"])
        events = CounterMetricFamily(P + "pipeline_events", "what the interception pipeline refused or could not read",
                                     labels=["event"])
        for name, n in sorted(self.daemon.interceptor.counters.snapshot().items()):
            if not name.startswith("hook_"):
                events.add_metric([name], n)
        yield events

    def _relay(self) -> Iterator[Metric]:
        relay = self.daemon.relay
        budget = relay.budget
        yield GaugeMetricFamily(P + "relay_connections", "kubelet connections being relayed", value=len(relay.splices))
        yield GaugeMetricFamily(P + "relay_connections_limit", "the connection cap: at it the connection idle "
                                "longest is closed for a new one", value=relay.max_connections)
        yield GaugeMetricFamily(P + "relay_buffer_bytes", "bytes the relay buffers now", value=budget.used)
        yield GaugeMetricFamily(P + "relay_buffer_peak_bytes", "the most bytes the relay ever buffered",
                                value=budget.peak)
        yield GaugeMetricFamily(P + "relay_buffer_limit_bytes", "server.buffer_bytes_total", value=budget.limit)
        yield GaugeMetricFamily(P + "relay_buffer_connection_limit_bytes", "server.buffer_bytes_per_connection",
                                value=relay.budget_per_connection)
        refused = CounterMetricFamily(P + "relay_refused_calls", "intercepted calls refused RESOURCE_EXHAUSTED: "
                                                                 "a relay buffer budget was spent")
        ended = CounterMetricFamily(P + "relay_connections_ended", "kubelet connections the relay ended (GOAWAY)",
                                    labels=["http2_error"])
        other = CounterMetricFamily(P + "relay_events", "other relay events", labels=["event"])
        refused_n = 0
        for name, n in sorted(relay.counters.snapshot().items()):
            if name == "calls_refused_resource_exhausted":
                refused_n = n
            elif name.startswith("connections_ended_"):
                ended.add_metric([name[len("connections_ended_"):].upper()], n)
            else:
                other.add_metric([name], n)
        refused.add_metric([], refused_n)
        yield refused
        yield ended
        yield other

    def _numa(self) -> Iterator[Metric]:
        service = views.placement(self.daemon)
        if service is None:
            return
        loads = service.ledger.loads()
        pool = service.shared_pool
        exclusive = service.kubelet_state.exclusive_cpus
        fams = {
            "cpus": GaugeMetricFamily(P + "numa_node_cpus", "online CPUs of the node", labels=["node"]),
            "shared": GaugeMetricFamily(P + "numa_node_shared_cpus", "CPUs of the node in the kubelet's shared pool",
                                        labels=["node"]),
            "exclusive": GaugeMetricFamily(P + "numa_node_kubelet_exclusive_cpus",
                                           "CPUs of the node the kubelet gave containers exclusively", labels=["node"]),
            "allocated": GaugeMetricFamily(P + "numa_node_allocated_cpus", "CPUs our placements put on the node",
                                           labels=["node"]),
            "memory": GaugeMetricFamily(P + "numa_node_allocated_memory_bytes",
                                        "memory limits of the pods placed on the node", labels=["node"]),
            "pods": GaugeMetricFamily(P + "numa_node_pods", "pods placed on the node", labels=["node"]),
        }
        for node in service.topology.nodes:
            label = [str(node.id)]
            load = loads.get(node.id)
            fams["cpus"].add_metric(label, len(node.cpus))
            fams["shared"].add_metric(label, len(node.cpus & pool))
            fams["exclusive"].add_metric(label, len(node.cpus & exclusive))
            fams["allocated"].add_metric(label, load.millicpu / 1000 if load else 0)
            fams["memory"].add_metric(label, load.memory_bytes if load else 0)
            fams["pods"].add_metric(label, load.pods if load else 0)
        yield from fams.values()
        yield GaugeMetricFamily(P + "numa_pending_updates", "placements waiting for the repin loop",
                                value=len(service.pending_updates()))
        yield CounterMetricFamily(P + "numa_rule_files_skipped", "rule files skipped as malformed (each reading)",
                                  value=service.rule_files_skipped)

    def _qos(self) -> Iterator[Metric]:
        hook = views.qos_hook(self.daemon)
        if hook is None:
            return
        levels: Dict[str, int] = {}
        for pod, _ in hook.state.snapshot():
            levels[pod.level.value] = levels.get(pod.level.value, 0) + 1
        pods = GaugeMetricFamily(P + "qos_pods", "pods the QoS hook manages, by level", labels=["level"])
        for level in ("LSE", "LSR", "LS", "BE"):
            pods.add_metric([level], levels.get(level, 0))
        yield pods
        knobs = GaugeMetricFamily(P + "qos_knob_supported", "1 when this kernel has the knob", labels=["knob"])
        for name in sorted(set(hook.support.supported) | set(hook.support.unsupported)):
            knobs.add_metric([name], int(name in hook.support.supported))
        yield knobs
        families = GaugeMetricFamily(P + "qos_kernel_family", "1 when this kernel has the family's files",
                                     labels=["family"])
        for family in FAMILIES:
            families.add_metric([family.name], int(family.name in hook.service.plan.families))
        yield families

    def _reconcilers(self) -> Iterator[Metric]:
        runs = CounterMetricFamily(P + "reconcile_runs", "reconciler passes", labels=["reconciler"])
        fixed = CounterMetricFamily(P + "reconcile_drift_fixed", "values put back by a reconciler (QoS files "
                                                                  "rewritten, NUMA cpusets repinned)",
                                    labels=["reconciler"])
        errors = CounterMetricFamily(P + "reconcile_errors", "reconciler writes that failed", labels=["reconciler"])
        for name, r in views.reconcilers(self.daemon).items():
            runs.add_metric([name], r["runs"])
            fixed.add_metric([name], r["rewritten"] if name == "qos" else r["applied"])
            errors.add_metric([name], r["errors"] if name == "qos" else r["failed"])
        yield runs
        yield fixed
        yield errors

    def _controllers(self) -> Iterator[Metric]:
        runs = CounterMetricFamily(P + "controller_runs", "background loop passes", labels=["controller"])
        errors = CounterMetricFamily(P + "controller_errors", "background loop passes that failed",
                                     labels=["controller"])
        last = GaugeMetricFamily(P + "controller_last_pass_seconds", "how long the last pass took",
                                 labels=["controller"])
        events = CounterMetricFamily(P + "controller_events", "a background loop's own counts",
                                     labels=["controller", "event"])
        for c in self.daemon.controllers:
            st = c.status()
            runs.add_metric([c.name], st["runs"])
            errors.add_metric([c.name], st["errors"])
            last.add_metric([c.name], c.last_pass_seconds)
            for event, n in sorted(c.counts().items()):
                events.add_metric([c.name, event], n)
        yield runs
        yield errors
        yield last
        yield events

    def _cluster(self) -> Iterator[Metric]:
        st = views.cluster(self.daemon)
        if st is None:
            return
        state = GaugeMetricFamily(P + "cluster_connection_state", "1 for the API server link's state now",
                                  labels=["state"])
        for name in sorted({"connecting", "synced", "down", "refused", str(st.get("state"))}):
            state.add_metric([name], int(name == st.get("state")))
        yield state
        for key, name, doc in (("last_sync", "last_sync", "when the Oenuma CRs were last listed in full"),
                               ("last_event", "last_watch_event", "when the last watch event or bookmark came")):
            if st.get(key):
                yield GaugeMetricFamily(P + f"cluster_{name}_timestamp_seconds", doc + " (Unix time)", value=st[key])
        yield GaugeMetricFamily(P + "cluster_crs_seen", "Oenuma CRs seen on the API server",
                                value=st.get("crs_seen", 0))
        yield GaugeMetricFamily(P + "cluster_crs_naming_node", "Oenuma CRs naming this node",
                                value=st.get("crs_naming_node", 0))
        yield GaugeMetricFamily(P + "cluster_crs_skipped", "Oenuma CRs naming this node skipped as malformed or refused",
                                value=len(st.get("crs_skipped") or ()))
        yield GaugeMetricFamily(P + "cluster_rules", "placement rules in force from Oenuma CRs",
                                value=len(st.get("rules") or ()))
        requests = CounterMetricFamily(P + "cluster_watch_requests", "full lists and watches of the Oenuma CRs",
                                       labels=["request"])
        requests.add_metric(["list"], st.get("lists", 0))
        requests.add_metric(["watch"], st.get("watches", 0))
        yield requests
        events = CounterMetricFamily(P + "cluster_watch_events", "watch events of the Oenuma CRs", labels=["type"])
        events.add_metric(["event"], st.get("events", 0))
        events.add_metric(["bookmark"], st.get("bookmarks", 0))
        yield events
        for key, name, doc in (("gone", "watch_gone", "watches answered 410 Gone (each followed by a relist)"),
                               ("failures", "watch_failures", "list or watch sessions that failed"),
                               ("rule_changes", "rule_changes", "changes of the rules from Oenuma CRs"),
                               ("repins", "repins", "running pods re-pinned by rule changes")):
            yield CounterMetricFamily(P + f"cluster_{name}", doc, value=st.get(key, 0))
        if "events_sent" in st:   # ([kubernetes] events = true)
            yield CounterMetricFamily(P + "cluster_events_sent", "events created on the API server",
                                      value=st["events_sent"])
            yield CounterMetricFamily(P + "cluster_events_aggregated", "repeats of an event counted in its series",
                                      value=st.get("events_aggregated", 0))
            dropped = CounterMetricFamily(P + "cluster_events_dropped", "events not sent, by why",
                                          labels=["reason"])
            for key, reason in (("events_dropped_rate", "rate_limit"), ("events_dropped_full", "queue_full"),
                                ("events_failed", "send_failed")):
                dropped.add_metric([reason], st.get(key, 0))
            yield dropped
            yield GaugeMetricFamily(P + "cluster_events_queued", "events waiting to be sent",
                                    value=st.get("events_queued", 0))
            pod_events = CounterMetricFamily(P + "cluster_pod_events", "events on pods queued for the policies' "
                                                                       "decisions, by reason", labels=["reason"])
            for reason, n in sorted((st.get("pod_events") or {}).items()):
                if reason not in ("dropped", "unworded"):
                    pod_events.add_metric([reason], n)
            yield pod_events
        if "status_writes" in st:   # ([kubernetes] write_status = true)
            applies = CounterMetricFamily(P + "cluster_status_applies", "server-side applies of Oenuma status",
                                          labels=["outcome"])
            applies.add_metric(["ok"], st["status_writes"] + st.get("status_removals", 0))
            applies.add_metric(["failed"], st.get("status_failures", 0))
            yield applies
        topo = st.get("topology")
        if topo is not None:   # ([kubernetes] topology = true)
            publishes = CounterMetricFamily(P + "cluster_topology_publishes", "server-side applies of this node's "
                                                                              "NodeResourceTopology", labels=["outcome"])
            publishes.add_metric(["ok"], topo.get("publishes", 0))
            publishes.add_metric(["failed"], topo.get("failures", 0))
            yield publishes
            if topo.get("last_publish"):
                yield GaugeMetricFamily(P + "cluster_topology_last_publish_timestamp_seconds",
                                        "when this node's NodeResourceTopology was last published (Unix time)",
                                        value=topo["last_publish"])


def _histogram(stats: LatencyStats, count_name: str, seconds_name: str, doc: str,
               labels: List[str]) -> Iterator[Metric]:
    snapshot = stats.snapshot()
    calls = CounterMetricFamily(P + count_name, doc, labels=labels)
    seconds = HistogramMetricFamily(P + seconds_name, doc + " (seconds)", labels=labels)
    bounds = [_le(b) for b in stats.buckets] + ["+Inf"]
    for key, (count, total, cumulative) in sorted(snapshot.items()):
        calls.add_metric(list(key), count)
        seconds.add_metric(list(key), list(zip(bounds, cumulative)), total)
    yield calls
    yield seconds


def _le(bound: float) -> str:
    return repr(float(bound))


__all__ = ["DaemonCollector", "P"]
