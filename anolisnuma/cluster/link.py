"""``ClusterLink``: one node's link to the API server, built by the NUMA hook.

It holds the CRs seen, loads the last rules saved (so they apply from the first
CreateContainer after a restart, whether or not the API server answers), and hands the
daemon its loops: ``cluster-watch`` (list + watch), ``cluster-rules`` (rules, re-pins,
status) and ``cluster-events`` (events on pods and CRs), and the policies their sink for
what they decide about pods (:meth:`ClusterLink.decision_events`). :meth:`ClusterLink.status`
is what ``anolisnuma-ctl status`` shows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

import structlog

from anolisnuma.cluster.config import KubernetesConfig
from anolisnuma.cluster.kubeconfig import load_kubeconfig
from anolisnuma.cluster.oenumas import OenumaSet, RuleBook, RulesFile
from anolisnuma.controller import Controller
from anolisnuma.decision_events import DecisionEvents, no_events

if TYPE_CHECKING:
    from anolisnuma.cluster.pod_events import PodEventSink
    from anolisnuma.cluster.topology_publisher import TopologyPublisher

log = structlog.get_logger("anolisnuma.cluster")


class ClusterLink:
    """``ClusterLink(config, placement, state_dir, node_name)``; raises
    :class:`~anolisnuma.cluster.kubeconfig.KubeconfigError` when the kubeconfig is unusable."""

    def __init__(self, config: KubernetesConfig, placement: Any, state_dir: str, node_name: str) -> None:
        # (lightkube is imported here, by the loops' modules: a node without [kubernetes]
        # does not pay for it)
        from anolisnuma.cluster.events import EventRecorder
        from anolisnuma.cluster.kube_client import KubeClient
        from anolisnuma.cluster.pod_events import PodEventSink
        from anolisnuma.cluster.report import StatusReporter
        from anolisnuma.cluster.sync import ClusterSync
        from anolisnuma.cluster.topology_publisher import TopologyPublisher
        from anolisnuma.cluster.watcher import OenumaWatcher

        kubeconfig = load_kubeconfig(config.kubeconfig)
        timeout = config.request_timeout_seconds
        self.config = config
        self.node_name = node_name
        self.crs = OenumaSet(node_name)
        self.rules_file = RulesFile(state_dir)
        self._wake_repin: Callable[[], None] = lambda: None
        self.events = None
        self.pod_events: Optional[PodEventSink] = None
        if config.events:
            self.events = EventRecorder(KubeClient(kubeconfig, timeout), node_name)
            self.pod_events = PodEventSink(self.events, node_name)
        reporter = None
        if config.write_status:
            reporter = StatusReporter(KubeClient(kubeconfig, timeout), node_name,
                                      events=self.events)
        self.sync = ClusterSync(placement, self.crs, RuleBook(node_name, placement.topology), self.rules_file,
                                lambda: self._wake_repin(), reporter, events=self.events)
        self.watcher = OenumaWatcher(KubeClient(kubeconfig, timeout), self.crs,
                                     self.sync.wake, watch_timeout=config.watch_timeout_seconds,
                                     backoff_max=config.backoff_max_seconds)
        self.topology: Optional[TopologyPublisher] = None
        if config.topology:
            self.topology = TopologyPublisher(KubeClient(kubeconfig, timeout), placement, node_name,
                                              config.topology_interval_seconds, config.topology_manager_policy,
                                              config.topology_manager_scope)
        saved = self.rules_file.load(node_name)
        self.saved_crs = len(saved or ())
        if saved:
            self.crs.replace(saved)
            self.sync.use_rules(persist=False)
        log.info("Oenuma CRs watched from the API server", server=kubeconfig.server, node_name=node_name,
                 saved_crs=self.saved_crs, rules=len(self.rules()), status=config.write_status,
                 topology=config.topology)

    def controllers(self, wake_repin: Callable[[], None]) -> List[Controller]:
        """The watch loop and the rules loop (and the events and topology loops when on);
        ``wake_repin()`` makes the re-pinner apply the re-pins the rules caused at once."""
        self._wake_repin = wake_repin
        return [self.watcher, self.sync] + [c for c in (self.events, self.topology) if c is not None]

    def decision_events(self) -> DecisionEvents:
        """The sink for the policies' decisions about pods: events on the pods when
        ``[kubernetes] events`` is on, else nothing."""
        return self.pod_events if self.pod_events is not None else no_events

    def rules(self) -> List[str]:
        return [r.describe() for cr in self.sync.current for r in cr.rules]

    def status(self) -> Dict[str, Any]:
        """The connection, the CRs and the rules in force (plain data)."""
        w = self.watcher
        rules_from = "apiserver" if w.lists else ("saved" if self.saved_crs else "none")
        return {"node_name": self.node_name, **w.connection(), "rules_from": rules_from,
                "crs_naming_node": len(self.sync.current),
                "crs_skipped": [cr.ref for cr in self.sync.current if cr.error],
                "rules": self.rules(), **self.sync.counts(), **(self.events.counts() if self.events else {}),
                **({"pod_events": self.pod_events.counts()} if self.pod_events is not None else {}),
                **({"topology": self.topology.topology_status()} if self.topology is not None else {})}


def cluster_link(config: Optional[KubernetesConfig], placement: Any, state_dir: str,
                 node_name: str) -> Optional[ClusterLink]:
    """The link when ``[kubernetes]`` names a kubeconfig; None (logged) when it names none
    or an unusable one: the node then runs with its own rules only."""
    if config is None or not config.enabled:
        return None
    from anolisnuma.cluster.kubeconfig import KubeconfigError

    try:
        return ClusterLink(config, placement, state_dir, config.node_name.lower() or node_name)
    except KubeconfigError as e:
        log.error("kubernetes.kubeconfig unusable; no Oenuma CRs from the API server", error=str(e))
        return None
    except ImportError as e:
        log.error("lightkube, the Kubernetes client, cannot be imported; no Oenuma CRs from the API server",
                  error=str(e))
        return None
