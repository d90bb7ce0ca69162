"""``TopologyPublisher``: the ``cluster-topology`` loop, this node's NUMA zones published as
its NodeResourceTopology (``[kubernetes] topology = true``).

Every ``topology_interval_seconds`` it builds the object from the placement service's
topology, shared pool and ledger (``topology_object.py``, pure) and, when it differs from
the one published last, applies it whole (server-side apply under the node's field
manager: the object is created the first time). So it is published at most once per
interval, only when something changed, and never from the CRI path: a placement only
changes the ledger, which this loop reads later. ``reserved`` is the kubelet's reserved
CPUs (read by the daemon from the kubelet's flags and config at start, as it reads its
cgroup layout): left out of every zone's ``allocatable``. It is also applied again, changed or
not, every ``REFRESH_SECONDS`` (an object someone deleted comes back). A failed apply
is counted and logged and tried again at the next pass; nothing queues up meanwhile.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Dict, Optional

import structlog

from anolisnuma.cluster.kube_client import ApiError, KubeClient
from anolisnuma.cluster.report import field_manager
from anolisnuma.cluster.topology_object import topology_object
from anolisnuma.controller import Controller
from anolisnuma.policies.numa.cpuset import EMPTY, CpuSet

log = structlog.get_logger("anolisnuma.cluster")

REFRESH_SECONDS = 600.0


class TopologyPublisher(Controller):
    """``TopologyPublisher(client, placement, node_name, interval, policy, scope)``;
    ``placement`` is the NUMA hook's PlacementService."""

    name = "cluster-topology"
    run_at_start = False

    def __init__(self, client: KubeClient, placement: Any, node_name: str, interval: float = 10.0,
                 policy: str = "none", scope: str = "container", clock: Callable[[], float] = time.time,
                 reserved: CpuSet = EMPTY) -> None:
        super().__init__()
        self.reserved = reserved
        self.client = client
        self.placement = placement
        self.node_name = node_name
        self.interval = interval
        self.policy = policy
        self.scope = scope
        self.clock = clock
        self.manager = field_manager(node_name)
        self.publishes = 0
        self.unchanged = 0
        self.failures = 0
        self.last_publish = 0.0          # time.time() of the last apply that succeeded
        self.publish_error = ""
        self._published: Optional[Dict[str, Any]] = None
        self._published_at = 0.0         # (monotonic)

    def build(self) -> Dict[str, Any]:
        p = self.placement
        # (under the placement service's lock when it has one: the loads read at one moment)
        with getattr(p, "_lock", None) or contextlib.nullcontext():
            loads = p.ledger.loads()
            pool = p.shared_pool
        return topology_object(self.node_name, p.topology, pool, loads, self.policy, self.scope, self.reserved)

    def run_once(self) -> bool:
        """True when the object was applied."""
        body = self.build()
        if body == self._published and time.monotonic() - self._published_at < REFRESH_SECONDS:
            self.unchanged += 1
            return False
        try:
            self.client.apply_topology(body, self.manager)
        except ApiError as e:
            self.failures += 1
            first = not self.publish_error
            self.publish_error = str(e)[:500]
            (log.warning if first else log.debug)(
                "NodeResourceTopology not published; tried again in the next pass", node_name=self.node_name,
                error=self.publish_error, retry_in_seconds=self.interval)
            return False
        if self.publish_error:
            log.info("NodeResourceTopology published again", node_name=self.node_name)
        self.publish_error = ""
        self._published, self._published_at = body, time.monotonic()
        self.publishes += 1
        self.last_publish = self.clock()
        return True

    def counts(self) -> Dict[str, int]:
        return {"publishes": self.publishes, "unchanged": self.unchanged, "failures": self.failures}

    def topology_status(self) -> Dict[str, Any]:
        """For ``anolisnuma-ctl status`` (the link's status, under ``topology``)."""
        zones = (self._published or {}).get("zones") or []
        return {"name": self.node_name, "reserved_cpus": str(self.reserved) or None,
                "last_publish": self.last_publish or None, "publishes": self.publishes,
                "failures": self.failures, "last_error": self.publish_error or None, "zones": len(zones)}

    def closed(self) -> None:
        self.client.close()
