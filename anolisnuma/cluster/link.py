"""``ClusterLink``: one node's link to the API server, owned by the daemon.

Built once by the daemon when ``[kubernetes]`` names a kubeconfig, whichever hooks run:

- with NUMA placement on (the placement service given): the Oenuma CRs seen, the last
  rules saved (loaded here, so they apply from the first CreateContainer after a restart,
  whether or not the API server answers), the ``cluster-watch`` loop (list + watch) and
  the ``cluster-rules`` loop (rules, re-pins, status);
- whenever ``[kubernetes] events`` is on: the ``cluster-events`` loop (events on pods and
  CRs) and the policies' sink for what they decide about pods
  (:meth:`ClusterLink.decision_events`): the QoS hook's events do not need NUMA;
- with ``[kubernetes] topology`` on and NUMA placement on: the ``cluster-topology`` loop.
  Without NUMA placement no NodeResourceTopology is published (logged once): its
  ``available`` is the placement service's accounting, and a zone without it would tell
  the scheduler that a busy node is empty.

:meth:`ClusterLink.status` is what ``anolisnuma-ctl status`` shows; :meth:`close` ends
the loops and closes every client (the daemon calls it at shutdown, started or not).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

import structlog

from anolisnuma.cluster.config import KubernetesConfig
from anolisnuma.cluster.kubeconfig import load_kubeconfig
from anolisnuma.cluster.oenumas import OenumaSet, RuleBook, RulesFile
from anolisnuma.controller import Controller
from anolisnuma.decision_events import DecisionEvents, no_events
from anolisnuma.state.persist import StateFormatTooNew

if TYPE_CHECKING:
    from anolisnuma.cluster.events import EventRecorder
    from anolisnuma.cluster.pod_events import PodEventSink
    from anolisnuma.cluster.report import StatusReporter
    from anolisnuma.cluster.sync import ClusterSync
    from anolisnuma.cluster.topology_publisher import TopologyPublisher
    from anolisnuma.cluster.watcher import OenumaWatcher

log = structlog.get_logger("anolisnuma.cluster")

SWITCH_INTERVAL = 0.001   # seconds a thread may hold the interpreter lock while another waits


class ClusterLink:
    """``ClusterLink(config, placement, state_dir, node_name)``; ``placement`` is the NUMA
    hook's PlacementService, or None when NUMA placement is off (events only);
    ``reserved_cpus``: the kubelet's, left out of the NodeResourceTopology's allocatable.
    Raises :class:`~anolisnuma.cluster.kubeconfig.KubeconfigError` when the kubeconfig is
    unusable."""

    def __init__(self, config: KubernetesConfig, placement: Optional[Any], state_dir: str, node_name: str,
                 reserved_cpus: Any = None) -> None:
        # (lightkube is imported here, by the loops' modules: a node without [kubernetes]
        # does not pay for it)
        from anolisnuma.cluster.events import EventRecorder
        from anolisnuma.cluster.kube_client import KubeClient
        from anolisnuma.cluster.pod_events import PodEventSink

        kubeconfig = load_kubeconfig(config.kubeconfig)
        for warning in kubeconfig.warnings:
            log.warning("a credential of the API server link is readable by others", problem=warning)
        timeout = config.request_timeout_seconds
        self.config = config
        self.server = kubeconfig.server
        self.node_name = node_name
        self._wake_repin: Callable[[], None] = lambda: None
        self.events: Optional[EventRecorder] = None
        self.pod_events: Optional[PodEventSink] = None
        if config.events:
            self.events = EventRecorder(KubeClient(kubeconfig, timeout), node_name)
            self.pod_events = PodEventSink(self.events, node_name)
        self.crs: Optional[OenumaSet] = None
        self.reporter: Optional[StatusReporter] = None
        self.sync: Optional[ClusterSync] = None
        self.watcher: Optional[OenumaWatcher] = None
        self.topology: Optional[TopologyPublisher] = None
        self.saved_crs = 0
        if placement is not None:
            self._watch_crs(config, kubeconfig, placement, state_dir, timeout)
            if config.topology:
                from anolisnuma.cluster.topology_publisher import TopologyPublisher
                from anolisnuma.policies.numa.cpuset import EMPTY

                self.topology = TopologyPublisher(KubeClient(kubeconfig, timeout), placement, node_name,
                                                  config.topology_interval_seconds, config.topology_manager_policy,
                                                  config.topology_manager_scope,
                                                  reserved=reserved_cpus if reserved_cpus is not None else EMPTY)
            return
        if config.topology:
            log.warning("kubernetes.topology is on but NUMA placement is off: no NodeResourceTopology is "
                        "published (its available CPUs and memory are the placement service's accounting)",
                        node_name=node_name)
        log.info("API server link without NUMA placement: events only, no Oenuma CRs watched",
                 server=kubeconfig.server, node_name=node_name, events=config.events)

    def _watch_crs(self, config: KubernetesConfig, kubeconfig: Any, placement: Any, state_dir: str,
                   timeout: float) -> None:
        from anolisnuma.cluster.kube_client import KubeClient
        from anolisnuma.cluster.report import StatusReporter
        from anolisnuma.cluster.sync import ClusterSync
        from anolisnuma.cluster.watcher import OenumaWatcher

        node_name = self.node_name
        # The watch and rules threads decode and parse CRs (at the node's caps, hundreds of
        # ms a round) while the relay waits for the interpreter lock: handed over every 1 ms
        # rather than Python's 5, the relay's waits behind them stay short (docs/cluster.md,
        # "Bounded by construction": Version's p99 beside a daemon without the link).
        if sys.getswitchinterval() > SWITCH_INTERVAL:
            sys.setswitchinterval(SWITCH_INTERVAL)
        self.crs = OenumaSet(node_name)
        rules_file = RulesFile(state_dir)
        if config.write_status:
            self.reporter = StatusReporter(KubeClient(kubeconfig, timeout), node_name, events=self.events)
        book = RuleBook(node_name, placement.topology, config.trusted_namespaces)
        self.sync = ClusterSync(placement, self.crs, book, rules_file,
                                lambda: self._wake_repin(), self.reporter, events=self.events)
        self.watcher = OenumaWatcher(KubeClient(kubeconfig, timeout), self.crs,
                                     self.sync.wake, watch_timeout=config.watch_timeout_seconds,
                                     backoff_max=config.backoff_max_seconds)
        self.saved_crs = self._load_saved(rules_file, node_name)
        log.info("Oenuma CRs watched from the API server", server=kubeconfig.server, node_name=node_name,
                 saved_crs=self.saved_crs, rules=len(self.rules()), status=config.write_status,
                 topology=config.topology, trusted_namespaces=config.trusted_namespaces)

    def _load_saved(self, rules_file: Any, node_name: str) -> int:
        """The CRs saved at the last pass, taken as if the API server had listed them (each
        checked by the same code: one bad entry is dropped and reported alone); how many.
        A file that cannot be taken at all is reported and the node starts without it:
        never without the link (issue 33, H2)."""
        try:
            saved = rules_file.load(node_name)
            if saved:
                self.crs.replace(saved)
                self.sync.use_rules(persist=False)
            return len(saved or ())
        except StateFormatTooNew:
            raise   # (a newer daemon's file: left untouched, and said so by cluster_link)
        except Exception as e:  # noqa: BLE001 - the saved rules are a convenience, the link is not
            log.error("saved Oenuma rules unusable; starting without them (the API server's list replaces them)",
                      path=rules_file.path, error_type=type(e).__name__, error=str(e)[:300])
            self.crs.replace([])
            return 0

    def controllers(self, wake_repin: Callable[[], None] = lambda: None) -> List[Controller]:
        """The watch and rules loops (with NUMA placement), the events and topology loops
        (when on); ``wake_repin()`` makes the NUMA hook's re-pinner apply the re-pins the
        rules caused at once."""
        self._wake_repin = wake_repin
        return [c for c in (self.watcher, self.sync, self.events, self.topology) if c is not None]

    def decision_events(self) -> DecisionEvents:
        """The sink for the policies' decisions about pods: events on the pods when
        ``[kubernetes] events`` is on, else nothing."""
        return self.pod_events if self.pod_events is not None else no_events

    def rules(self) -> List[str]:
        return [r.describe() for r in self.sync.rules_in_order()] if self.sync is not None else []

    def status(self) -> Dict[str, Any]:
        """The connection, the CRs and the rules in force (plain data)."""
        out: Dict[str, Any] = {"node_name": self.node_name}
        w, sync = self.watcher, self.sync
        if w is not None and sync is not None:
            rules_from = "apiserver" if w.lists else ("saved" if self.saved_crs else "none")
            out.update(w.connection(), rules_from=rules_from, crs_naming_node=len(sync.current),
                       crs_skipped=[cr.ref for cr in sync.current if cr.error], rules=self.rules(), **sync.counts())
        else:
            out.update(self._events_connection(), rules_from="off (NUMA placement is off)", rules=[])
        if self.events is not None:
            out.update(self.events.counts())
        if self.pod_events is not None:
            out["pod_events"] = self.pod_events.counts()
        if self.topology is not None:
            out["topology"] = self.topology.topology_status()
        return out

    def _events_connection(self) -> Dict[str, Any]:
        """Without the watch, the connection is what the last event sent tells."""
        ev = self.events
        if ev is None:
            return {"server": self.server, "state": "idle", "last_error": None}
        failing = ev.state in ("down", "refused")
        return {"server": self.server, "state": ev.state, "last_error": (ev.last_error or None) if failing else None}

    def close(self) -> None:
        """Stop the loops (idempotent) and close every client, the loops' and the
        status reporter's."""
        for c in (self.watcher, self.sync, self.events, self.topology):
            if c is not None:
                c.stop()
        if self.reporter is not None:
            try:
                self.reporter.client.close()
            except Exception as e:
                log.debug("status client did not close cleanly", error=str(e)[:200])


def link_node_name(config: KubernetesConfig, numa: Optional[Any]) -> str:
    """``[kubernetes] node_name``, else what ``[numa] node_name`` resolves to (the host's
    name when both are empty)."""
    if config.node_name:
        return config.node_name.lower()
    if numa is not None:
        return numa.effective_node_name()
    import socket

    return socket.gethostname().strip().lower()


def cluster_link(config: Optional[KubernetesConfig], placement: Optional[Any], state_dir: str,
                 node_name: str, reserved_cpus: Any = None) -> Optional[ClusterLink]:
    """The link when ``[kubernetes]`` names a kubeconfig; None (logged) when it names none
    or an unusable one: the node then runs with its own rules only, and no events."""
    if config is None or not config.enabled:
        return None
    from anolisnuma.cluster.kubeconfig import KubeconfigError

    try:
        return ClusterLink(config, placement, state_dir, node_name, reserved_cpus)
    except KubeconfigError as e:
        log.error("kubernetes.kubeconfig unusable; no API server link (no Oenuma CRs, no events)", error=str(e))
        return None
    except ImportError as e:
        log.error("lightkube, the Kubernetes client, cannot be imported; no API server link (no Oenuma CRs, "
                  "no events)", error=str(e))
        return None
    except Exception as e:  # noqa: BLE001 - the relay and the hooks run on without the cluster side
        # e.g. a rules file of a newer format (StateFormatTooNew: left untouched, since
        # nothing of the link runs to write it)
        log.error("cannot set up the API server link; the node runs without it (no Oenuma CRs, no events)",
                  error=str(e), error_type=type(e).__name__)
        return None
