"""``NumaHook``: the kubelet's CRI calls, read for the NUMA placement service.

The hook only translates: it reads the CRI messages, asks
:class:`~anolisnuma.placement.service.PlacementService` (which decides and records; its
writer thread persists), and writes the answer into the request.

- **CreateContainer (pre)**: the first container of a managed pod places the pod; every
  container of the pod gets the pod's CPUs (its nodes' CPUs within the kubelet's shared
  pool) in ``cpuset_cpus`` and its memory nodes in ``cpuset_mems``, recorded before the
  request goes on (``numa.json`` is written behind it: docs/restarts.md, "What a crash can
  lose"). Containers the kubelet gave exclusive CPUs are left alone.
- **CreateContainer (post)**: the container is counted under its new id.
- **UpdateContainerResources (pre)**: the kubelet re-sends the shared pool as the cpuset of
  shared containers; it is merged (our CPUs within its pool), never swallowed.
- **RunPodSandbox (post)**: a pod that got a new sandbox loses the old sandbox's placement.
- **StopPodSandbox / RemovePodSandbox / RemoveContainer (pre)**: capacity is released.

Why the first CreateContainer rather than RunPodSandbox: it carries both the pod-level
resources (``sandbox_config.linux.resources``, the kubelet's sum over the containers) and the
container's own, so nothing is known earlier, and a sandbox that never gets a container
never holds capacity.

Background loops (:meth:`NumaHook.controllers`): the watcher of the kubelet checkpoint and
rule files, the re-pinner, traffic affinity when ``[numa.affinity]`` is on, re-spread when
``[numa.respread]`` is on (the default). The Oenuma CRs of the API server are the daemon's
link's (``anolisnuma/cluster/link.py``), which gives their rules to this hook's placement
service and wakes its re-pinner (:attr:`NumaHook.repinner`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Container, List, Optional

import structlog

from anolisnuma.config import PathsConfig
from anolisnuma.controller import Controller
from anolisnuma.decision_events import DecisionEvents, no_events
from anolisnuma.pipeline.hooks import (
    CREATE_CONTAINER, REMOVE_CONTAINER, REMOVE_POD_SANDBOX, RUN_POD_SANDBOX, STOP_POD_SANDBOX,
    UPDATE_CONTAINER_RESOURCES, Call, Hook)
from anolisnuma.placement.answer import Answer, parse_cpus, where
from anolisnuma.placement.service import PlacementService
from anolisnuma.placement.watcher import PlacementWatcher
from anolisnuma.policies.numa.balance import PodRequest, millicpu_of
from anolisnuma.policies.numa.config import NumaConfig
from anolisnuma.policies.numa.ledger import ContainerShare
from anolisnuma.policies.numa.topology import NumaTopology
from anolisnuma.state.gone import PodStateHolder
from anolisnuma.state.numa_state import NumaStateFile
from anolisnuma.state.records import PodRecord
from anolisnuma.system.cgroups import CgroupFs, KubeletCgroupLayout
from anolisnuma.system.kubelet_state import CpuManagerStateFile
from anolisnuma.system.sysfs_topology import read_sysfs_topology

if TYPE_CHECKING:   # imported when affinity is on (it brings the traffic observer)
    from anolisnuma.reconcile.affinity import AffinityController

log = structlog.get_logger("anolisnuma.numa")

_PRE = frozenset({CREATE_CONTAINER, UPDATE_CONTAINER_RESOURCES, STOP_POD_SANDBOX, REMOVE_POD_SANDBOX,
                  REMOVE_CONTAINER})
_POST = frozenset({RUN_POD_SANDBOX, CREATE_CONTAINER})
_METHODS = _PRE | _POST


def load_topology(sys_root: str) -> NumaTopology:
    """The machine's topology read from ``<sys_root>/devices/system/...``."""
    return NumaTopology.from_raw(read_sysfs_topology(sys_root))


class NumaHook(Hook):
    """Balanced NUMA pinning for managed pods, coexisting with the kubelet's CPU manager.

    ``NumaHook(config, paths, topology=None)``: the topology is read from
    ``paths.sys_root`` when not given; allocations are loaded from
    ``<paths.state_dir>/numa.json``; the kubelet checkpoint is
    ``paths.kubelet_cpu_manager_state``. When ``config.enabled`` is false the hook serves
    no method, has no placement service and does nothing.
    """

    name = "numa"

    def __init__(self, config: NumaConfig, paths: PathsConfig, topology: Optional[NumaTopology] = None,
                 layout: Optional[KubeletCgroupLayout] = None) -> None:
        self.config = config
        self.paths = paths
        self.layout = layout   # the kubelet's cgroup layout (None: root /, either driver)
        self.methods = _METHODS if config.enabled else frozenset()
        self.placement: Optional[PlacementService] = None
        self.affinity: Optional["AffinityController"] = None   # made by controllers() when on
        self.respread: Any = None   # the RespreadController, made by controllers() when on
        self.repinner: Any = None   # the CpusetRepinner, made by controllers()
        self.decisions: DecisionEvents = no_events
        if not config.enabled:
            return
        self.placement = PlacementService(
            config, topology if topology is not None else load_topology(paths.sys_root),
            CpuManagerStateFile(paths.kubelet_cpu_manager_state), NumaStateFile(paths.state_dir),
            CgroupFs(paths.cgroup_root, layout))
        p = self.placement
        log.info("NUMA placement enabled", topology=p.topology.describe(), shared_pool=str(p.shared_pool),
                 kubelet_policy=p.kubelet_state.policy, allocations=len(p.ledger), rules=p.rule_count)

    def use_decision_events(self, sink: DecisionEvents) -> None:
        """Report placements and live moves to ``sink`` (the daemon wires it)."""
        self.decisions = sink
        if self.placement is not None:
            self.placement.decisions = sink
        if self.affinity is not None:
            self.affinity.decisions = sink

    def controllers(self, connect: Callable[[Optional[float]], Any], store: Any = None) -> List[Controller]:
        """The writer of numa.json, the watcher (kubelet checkpoint, rule files), the
        re-pinner (which records what it applied in ``store``) and, when ``[numa.affinity]`` is on, the traffic-affinity
        controller (whose moves the re-pinner applies at once)."""
        if self.placement is None:
            return []
        from anolisnuma.reconcile.numa import CpusetRepinner

        # The writer of numa.json first: the daemon stops its loops in reverse order, so it
        # writes the changes of every other loop's last pass before it ends.
        loops: List[Controller] = [self.placement.writer,
                                   PlacementWatcher(self.placement, self.config.poll_interval_seconds)]
        repinner = CpusetRepinner(self.placement, connect(None), applied=store.set_cpuset if store is not None else None)
        loops.append(repinner)
        self.repinner = repinner
        if self.config.affinity.enabled:
            self.affinity = _affinity_controller(self.placement, self.config, self.paths, connect, repinner,
                                                 self.layout)
            if self.affinity is not None:
                self.affinity.decisions = self.decisions
                loops.append(self.affinity)
        if self.config.respread.enabled:
            from anolisnuma.reconcile.respread import RespreadController

            aff = self.affinity   # (its groups move whole or not at all)
            self.respread = RespreadController(self.placement, self.config.respread, apply=repinner.run_once,
                                               groups=aff.affine_groups if aff is not None else None,
                                               check_interval=self.config.poll_interval_seconds)
            loops.append(self.respread)
        return loops

    def close(self) -> None:
        """Write what the placement service has not written yet and stop its writer."""
        if self.placement is not None:
            self.placement.close()

    def holders(self) -> List[PodStateHolder]:
        """The placement service (the ledger) and the affinity controller's caches."""
        return [h for h in (self.placement, self.affinity, self.respread) if h is not None]

    # ================================================================== pipeline entry points
    def wants_pre(self, method: str) -> bool:
        return method in self.methods and method in _PRE

    def wants_post(self, method: str) -> bool:
        return method in self.methods and method in _POST

    def inline(self, method: str, stage: str) -> bool:
        # Every stage asks the placement service, which decides in memory (numa.json is
        # written behind, the kubelet's checkpoint re-read only when its stat changed).
        return True

    def pre(self, call: Call) -> None:
        p = self.placement
        if p is None:
            return
        m = call.method
        pod = _pod_of(call)
        if m == CREATE_CONTAINER:
            if pod is not None:
                self._create_container(p, call, pod)
        elif m == UPDATE_CONTAINER_RESOURCES:
            self._update_container(p, call)
        elif m in (STOP_POD_SANDBOX, REMOVE_POD_SANDBOX):
            nodes = p.release_sandbox(call.request.pod_sandbox_id)
            if nodes is not None:
                call.notes["numa"] = f"released {where(nodes)}"
        elif m == REMOVE_CONTAINER:
            nodes = p.release_container(call.request.container_id)
            if nodes is not None:
                call.notes["numa"] = f"released the container's share of {where(nodes)}"

    def post(self, call: Call) -> None:
        p = self.placement
        if p is None:
            return
        pod = _pod_of(call)
        if pod is None:
            return
        if call.method == CREATE_CONTAINER:
            res = call.request.config.linux.resources
            p.container_created(pod.uid, call.request.config.metadata.name, call.reply.container_id,
                                parse_cpus(res.cpuset_cpus))
        elif call.method == RUN_POD_SANDBOX:
            p.sandbox_started(pod.uid, call.reply.pod_sandbox_id, call.log)
            sel = p.select(pod)
            if sel.managed:
                call.notes["numa"] = f"managed ({sel.why}); placed at its first container"

    # ================================================================== CreateContainer
    def _create_container(self, p: PlacementService, call: Call, pod: PodRecord) -> None:
        req = call.request
        logger = call.log or log
        res = req.config.linux.resources
        kcpus = parse_cpus(res.cpuset_cpus)
        if kcpus is None:
            if p.select(pod).managed or p.knows_pod(pod.uid):
                logger.warning("kubelet sent an unreadable cpuset_cpus; container left alone",
                               cpuset_cpus=res.cpuset_cpus)
            return
        share = ContainerShare(req.config.metadata.name, millicpu_of(res.cpu_period, res.cpu_quota, res.cpu_shares),
                               max(res.memory_limit_in_bytes, 0))
        pod_res = req.sandbox_config.linux.resources
        pod_demand = PodRequest(millicpu_of(pod_res.cpu_period, pod_res.cpu_quota, pod_res.cpu_shares),
                                max(pod_res.memory_limit_in_bytes, 0))
        answer = p.place_container(pod, req.pod_sandbox_id or pod.sandbox_id, share, pod_demand, kcpus,
                                   res.cpuset_mems, logger)
        self._apply(call, res, answer)

    # ================================================================== UpdateContainerResources
    def _update_container(self, p: PlacementService, call: Call) -> None:
        req = call.request
        if not req.HasField("linux"):
            return
        claim = (call.pod, call.container) if call.pod is not None and call.container is not None else None
        if not p.knows_container(req.container_id) and claim is None:
            return
        res = req.linux
        kcpus = parse_cpus(res.cpuset_cpus)
        if kcpus is None:
            (call.log or log).warning("kubelet sent an unreadable cpuset_cpus; update left alone",
                                      cpuset_cpus=res.cpuset_cpus)
            return
        resize = None
        if res.cpu_quota != 0 or res.cpu_shares != 0 or res.memory_limit_in_bytes > 0:
            # in-place resize: the container's demand changes
            resize = (millicpu_of(res.cpu_period, res.cpu_quota, res.cpu_shares),
                      res.memory_limit_in_bytes if res.memory_limit_in_bytes > 0 else None)
        answer = p.update_container(req.container_id, kcpus, res.cpuset_mems, resize, claim, call.log)
        self._apply(call, res, answer)

    @staticmethod
    def _apply(call: Call, res: Any, answer: Answer) -> None:
        """Write the answer into the request's cpuset fields."""
        if answer.cpus is not None:
            changed = False
            text = str(answer.cpus)
            if res.cpuset_cpus != text:
                res.cpuset_cpus = text
                changed = True
            if answer.mems is not None and res.cpuset_mems != str(answer.mems):
                res.cpuset_mems = str(answer.mems)
                changed = True
            if changed:
                call.mark_modified()
        if answer.note:
            call.notes["numa"] = answer.note

    # ================================================================== start-up
    def resync(self, pods: List[PodRecord], containers: List[Any], fresh: Container[str] = frozenset()) -> None:
        if self.placement is not None:
            self.placement.resync(pods, containers, fresh)


def _pod_of(call: Call) -> Optional[PodRecord]:
    """The pod of the call: the store's record, else what a CreateContainer carries."""
    if call.pod is not None and call.pod.uid:
        return call.pod
    sc = getattr(call.request, "sandbox_config", None)
    if sc is None or not sc.metadata.uid:
        return None
    return PodRecord(sandbox_id=getattr(call.request, "pod_sandbox_id", ""), uid=sc.metadata.uid,
                     name=sc.metadata.name, namespace=sc.metadata.namespace, labels=dict(sc.labels),
                     annotations=dict(sc.annotations))


def _affinity_controller(service: PlacementService, config: NumaConfig, paths: PathsConfig,
                         connect: Callable[[Optional[float]], Any], repinner: Any,
                         layout: Optional[KubeletCgroupLayout] = None) -> Optional["AffinityController"]:
    from anolisnuma.reconcile.affinity import AffinityController, ContainerPids
    from anolisnuma.system.traffic import TrafficObserver

    try:
        observer = TrafficObserver(proc_root=paths.proc_root, layout=layout)
    except Exception as e:
        log.error("traffic affinity cannot start; pods are not moved", error=repr(e))
        return None
    pids = ContainerPids(connect(10.0), proc_root=paths.proc_root)
    return AffinityController(service, observer, pids, config.affinity, apply=repinner.run_once)
