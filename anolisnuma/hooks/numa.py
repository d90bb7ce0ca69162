"""``NumaHook``: NUMA placement applied to the kubelet's CRI calls.

Where things happen:

- **CreateContainer (pre)**: the first container of a managed pod places the pod (a
  placement rule if one names it, else balance); every container of the pod gets the pod's
  CPUs (its nodes' CPUs within the kubelet's shared pool) in ``cpuset_cpus`` and its memory
  nodes in ``cpuset_mems``. The decision is recorded and persisted before the request goes
  on. Containers the kubelet gave exclusive CPUs are left alone.
- **CreateContainer (post)**: the container's demand is counted under its new id.
- **UpdateContainerResources (pre)**: the kubelet re-sends the shared pool as the cpuset of
  shared containers; it is merged (our CPUs within its pool), never swallowed. When the pool
  left the pod's nodes, the pod follows it (re-placed within the new pool).
- **RunPodSandbox (post)**: a pod that got a new sandbox loses the old sandbox's placement.
- **StopPodSandbox / RemovePodSandbox / RemoveContainer (pre)**: capacity is released.

Why the first CreateContainer rather than RunPodSandbox: it carries both the pod-level
resources (``sandbox_config.linux.resources``, the kubelet's sum over the containers) and the
container's own, so nothing is known earlier, and a sandbox that never gets a container
never holds capacity.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import structlog
import yaml

from anolisnuma.config import PathsConfig
from anolisnuma.pipeline.hooks import (
    CREATE_CONTAINER, REMOVE_CONTAINER, REMOVE_POD_SANDBOX, RUN_POD_SANDBOX, STOP_POD_SANDBOX,
    UPDATE_CONTAINER_RESOURCES, Call, Hook)
from anolisnuma.policies.numa.balance import (
    NoPlacement, Placement, PodRequest, balance, free_capacity, millicpu_of, node_capacity, pin)
from anolisnuma.policies.numa.config import NumaConfig
from anolisnuma.policies.numa.cpu_manager import CpuManagerStateError, KubeletCpuState
from anolisnuma.policies.numa.cpuset import CpuSet, CpuSetError
from anolisnuma.policies.numa.ledger import Allocation, ContainerShare, Ledger
from anolisnuma.policies.numa.rules import PinRule, RuleFileError, parse_oenuma_documents, resolve_pins
from anolisnuma.policies.numa.selection import PodSelector, Selection
from anolisnuma.policies.numa.topology import NumaTopology
from anolisnuma.state.numa_state import NumaStateFile
from anolisnuma.state.records import ContainerRecord, PodRecord
from anolisnuma.system.cgroups import CgroupFs, enable_memory_migrate
from anolisnuma.system.kubelet_state import CpuManagerStateFile, Poller
from anolisnuma.system.sysfs_topology import read_sysfs_topology

log = structlog.get_logger("anolisnuma.numa")

RULE_FILE_SUFFIXES = (".yaml", ".yml")
MAX_RULE_FILE = 1 << 20

_PRE = frozenset({CREATE_CONTAINER, UPDATE_CONTAINER_RESOURCES, STOP_POD_SANDBOX, REMOVE_POD_SANDBOX,
                  REMOVE_CONTAINER})
_POST = frozenset({RUN_POD_SANDBOX, CREATE_CONTAINER})
_METHODS = _PRE | _POST


def load_topology(sys_root: str) -> NumaTopology:
    """The machine's topology read from ``<sys_root>/devices/system/...``."""
    return NumaTopology.from_raw(read_sysfs_topology(sys_root))


def load_rule_files(rules_dir: str, node_name: str, topology: NumaTopology) -> Tuple[List[PinRule], List[str]]:
    """Rules for ``node_name`` from every ``*.yaml``/``*.yml`` file in ``rules_dir`` (file-name
    order); files that cannot be used are reported in the problems and skipped."""
    rules: List[PinRule] = []
    problems: List[str] = []
    for fname in _rule_files(rules_dir):
        path = os.path.join(rules_dir, fname)
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_RULE_FILE + 1)
            if len(data) > MAX_RULE_FILE:
                raise RuleFileError(f"{path}: larger than {MAX_RULE_FILE} bytes")
            docs = list(yaml.safe_load_all(data.decode("utf-8")))
            r, p = parse_oenuma_documents(docs, path, node_name, topology)
        except (OSError, UnicodeDecodeError, yaml.YAMLError, RuleFileError) as e:
            problems.append(f"rule file {path} skipped: {_one_line(e)}")
            continue
        rules.extend(r)
        problems.extend(p)
    return rules, problems


def _rule_files(rules_dir: str) -> List[str]:
    try:
        names = os.listdir(rules_dir)
    except OSError:
        return []
    return sorted(n for n in names if n.endswith(RULE_FILE_SUFFIXES) and not n.startswith("."))


def _rules_signature(rules_dir: str) -> Any:
    out = []
    for n in _rule_files(rules_dir):
        try:
            st = os.stat(os.path.join(rules_dir, n))
        except OSError:
            continue
        out.append((n, st.st_ino, st.st_size, st.st_mtime_ns))
    return (os.path.isdir(rules_dir), tuple(out))


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:400]


def _parse_cpus(text: str) -> Optional[CpuSet]:
    """A cpuset field as sent by the kubelet; None when it does not parse."""
    try:
        return CpuSet.parse(text)
    except CpuSetError:
        return None


@dataclass
class _MoveInFlight:
    """A live move (``move_pod``) whose re-pins are not all applied yet: what to go back to
    when one fails, and the containers already re-pinned."""

    nodes: Tuple[int, ...]
    home: CpuSet
    mems: CpuSet
    source: str
    reason: str
    applied: Set[str] = field(default_factory=set)


class NumaHook(Hook):
    """Balanced NUMA pinning for managed pods, coexisting with the kubelet's CPU manager.

    ``NumaHook(config, paths, topology=None)``: the topology is read from
    ``paths.sys_root`` when not given; allocations are loaded from
    ``<paths.state_dir>/numa.json``; the kubelet checkpoint is ``paths.kubelet_cpu_manager_state``.
    When ``config.enabled`` is false the hook serves no method and does nothing.
    """

    name = "numa"

    def __init__(self, config: NumaConfig, paths: PathsConfig, topology: Optional[NumaTopology] = None) -> None:
        self.config = config
        self.paths = paths
        self.methods = _METHODS if config.enabled else frozenset()
        self.topology = topology if topology is not None else load_topology(paths.sys_root)
        for problem in self.topology.problems:
            log.warning("NUMA topology", problem=problem)
        self._lock = threading.RLock()
        self._kubelet_file = CpuManagerStateFile(paths.kubelet_cpu_manager_state)
        self._kubelet = KubeletCpuState()
        self.ledger = Ledger(self.topology, self.topology.cpus)
        self._refresh_kubelet()
        self._state = NumaStateFile(paths.state_dir)
        self._pending_updates: Dict[str, Tuple[CpuSet, CpuSet]] = {}
        self._moves: Dict[str, _MoveInFlight] = {}   # live moves being applied, by pod uid
        # Pods and containers that passed through before the start-up resync: it works from
        # a containerd listing taken earlier, so these are newer than it and never dropped.
        self._resynced = False
        self._seen_pods: Set[str] = set()
        self._seen_containers: Set[str] = set()
        self._save_failed = False
        self.node_name = config.effective_node_name()
        self._config_rules, problems = resolve_pins(config.pins, self.topology)
        for problem in problems:
            log.warning("placement rule ignored", problem=problem)
        self._selector = PodSelector(config.namespaces, config.pod_name_patterns, self._config_rules)
        self._rules_sig: Any = None
        self._poller: Optional[Poller] = None
        if config.enabled:
            self.reload_rules()
            self._load_state()
            log.info("NUMA placement enabled", topology=self.topology.describe(),
                     shared_pool=str(self.ledger.pool), kubelet_policy=self._kubelet.policy,
                     allocations=len(self.ledger), rules=len(self._selector.rules))

    # ================================================================== lifecycle
    def start(self) -> None:
        """Start polling the kubelet checkpoint and the rules directory."""
        if not self.config.enabled or self._poller is not None:
            return
        checks = [self._refresh_kubelet]
        if self.config.rules_dir:
            checks.append(self.reload_rules)
        self._poller = Poller(self.config.poll_interval_seconds, checks, name="numa-poller")
        self._poller.start()

    def close(self) -> None:
        if self._poller is not None:
            self._poller.stop()
            self._poller = None

    # ================================================================== pipeline entry points
    def wants_pre(self, method: str) -> bool:
        return method in self.methods and method in _PRE

    def wants_post(self, method: str) -> bool:
        return method in self.methods and method in _POST

    def pre(self, call: Call) -> None:
        m = call.method
        self._saw(call)
        if m == CREATE_CONTAINER:
            self._create_container(call)
        elif m == UPDATE_CONTAINER_RESOURCES:
            self._update_container(call)
        elif m in (STOP_POD_SANDBOX, REMOVE_POD_SANDBOX):
            self._release_sandbox(call)
        elif m == REMOVE_CONTAINER:
            self._remove_container(call)

    def post(self, call: Call) -> None:
        m = call.method
        self._saw(call)
        if m == CREATE_CONTAINER:
            self._container_created(call)
        elif m == RUN_POD_SANDBOX:
            self._sandbox_started(call)

    def _saw(self, call: Call) -> None:
        if self._resynced:
            return
        pod = self._pod_of(call)
        with self._lock:
            if pod is not None and pod.uid:
                self._seen_pods.add(pod.uid)
            if call.container is not None:
                self._seen_containers.add(call.container.container_id)

    # ================================================================== queries
    def select(self, pod: PodRecord) -> Selection:
        """Whether ``pod`` is managed, and the rule that pins it."""
        if not self.config.enabled:
            return Selection(False, None, "NUMA placement disabled")
        return self._selector.select(pod.namespace, pod.name, pod.annotations, pod.labels)

    @property
    def shared_pool(self) -> CpuSet:
        return self.ledger.pool

    @property
    def kubelet_state(self) -> KubeletCpuState:
        return self._kubelet

    def allocations(self) -> List[Allocation]:
        """A snapshot of the allocations (copies are not made: do not edit)."""
        with self._lock:
            return list(self.ledger)

    def pending_updates(self) -> List[Tuple[str, str, str]]:
        """Containers whose cpuset differs from their pod's placement and that no CRI call
        will fix by itself (adopted unpinned at resync, or an edit that did not reach
        containerd): ``(container_id, cpuset_cpus, cpuset_mems)`` for a reconciler to apply
        with UpdateContainerResources. ``cpuset_mems`` is "" when memory is not pinned."""
        with self._lock:
            return [(cid, str(c), str(m)) for cid, (c, m) in sorted(self._pending_updates.items())]

    def mark_applied(self, container_id: str, cpus: Optional[str] = None, mems: Optional[str] = None) -> None:
        """The reconciler applied a pending update. With ``cpus``/``mems`` (what it sent),
        an update that changed meanwhile (a move decided during the call) stays pending."""
        with self._lock:
            if cpus is not None:
                now = self._pending_updates.get(container_id)
                if now is not None and (str(now[0]), str(now[1])) != (cpus, mems if mems is not None else str(now[1])):
                    return
            self._pending_updates.pop(container_id, None)
            alloc = self.ledger.by_container(container_id)
            if alloc is not None and alloc.pod_uid in self._moves:
                self._moves[alloc.pod_uid].applied.add(container_id)
                self._move_progress(alloc)

    def apply_failed(self, container_id: str, error: str = "") -> bool:
        """The reconciler could not apply a container's pending cpuset. When the container
        belongs to a live move (``move_pod``), the move is rolled back: the pod's allocation
        goes back where it was (persisted), containers already re-pinned are listed to be
        re-pinned back, the others are no longer pending. True when a move was rolled back
        (other failures stay pending and are retried)."""
        with self._lock:
            alloc = self.ledger.by_container(container_id)
            if alloc is None or alloc.pod_uid not in self._moves:
                return False
            mv = self._moves.pop(alloc.pod_uid)
            new_nodes = alloc.nodes
            self.ledger.move(alloc.pod_uid, Placement(nodes=mv.nodes, home=mv.home, cpus=mv.home & self.ledger.pool,
                                                       mems=mv.mems), source=mv.source)
            want = alloc.cpus(self.ledger.pool)
            for cid in alloc.containers:
                if cid in mv.applied and want:
                    self._pending_updates[cid] = (want, alloc.mems)
                else:
                    self._pending_updates.pop(cid, None)
            self._save()
        log.warning("live NUMA move failed; pod rolled back", pod=alloc.ref, pod_uid=alloc.pod_uid,
                    from_nodes=list(new_nodes), back_to=list(mv.nodes), container_id=container_id,
                    error=error or None, repin_back=sorted(mv.applied) or None)
        return True

    def moves_in_flight(self) -> List[str]:
        """Pods whose live move is not fully applied yet."""
        with self._lock:
            return sorted(self._moves)

    def _move_progress(self, alloc: Allocation) -> None:
        if any(cid in self._pending_updates for cid in alloc.containers):
            return
        mv = self._moves.pop(alloc.pod_uid, None)
        if mv is not None:
            log.info("live NUMA move applied", pod=alloc.ref, pod_uid=alloc.pod_uid, from_nodes=list(mv.nodes),
                     to_nodes=list(alloc.nodes), cpus=str(alloc.cpus(self.ledger.pool)), mems=str(alloc.mems),
                     reason=mv.reason)

    # ================================================================== live moves
    def move_pod(self, pod_uid: str, nodes: Sequence[int], reason: str = "") -> bool:
        """Move a running managed pod onto ``nodes`` (traffic affinity): under the lock,
        check it may move and fits, move its allocation, persist, and list every container
        of the pod for the reconciler to re-pin (``pending_updates``) with the new
        ``cpuset_cpus`` and ``cpuset_mems``. On cgroup v1, ``cpuset.memory_migrate`` is set in
        the containers' cpuset cgroups first, so that their memory follows the new mems.

        Refused (False, with a log line) when the pod is unknown, pinned by a rule, has
        kubelet-exclusive CPUs, has no container, is being moved already, is already there,
        or the target nodes lack shared CPUs or free capacity for its demand. A re-pin that
        fails later rolls the move back (:meth:`apply_failed`).
        """
        target = tuple(sorted(set(int(n) for n in nodes)))
        if not self.config.enabled or not target:
            return False
        self._refresh_kubelet()
        with self._lock:
            alloc = self.ledger.get(pod_uid)
            why = self._why_not_movable(pod_uid, alloc, target)
            if why is not None or alloc is None:
                log.info("live NUMA move refused", pod=alloc.ref if alloc else None, pod_uid=pod_uid,
                         to_nodes=list(target), why=why, reason=reason or None)
                return False
            pool = self.ledger.pool
            request = PodRequest(alloc.demand_millicpu(), alloc.demand_memory())
            old = _MoveInFlight(alloc.nodes, alloc.home, alloc.mems, alloc.source, reason)
            self.ledger.remove(pod_uid)
            try:
                loads = self.ledger.loads()
                cap = node_capacity(self.topology, pool)
                free = free_capacity(self.topology, pool, loads)
                room = sum(free.get(n, 0) for n in target)
                if any(cap.get(n, 0) <= 0 for n in target):
                    why = "a target node has no CPU in the shared pool"
                elif room < max(request.millicpu, 1):
                    why = f"not enough free capacity ({room / 1000:g} CPUs free, {request.millicpu / 1000:g} needed)"
                placement = None if why else pin(self.topology, pool, loads, target, request,
                                                   memory_pinning=self.config.memory_pinning, reason=reason)
            except NoPlacement as e:
                why, placement = str(e), None
            finally:
                self.ledger.add(alloc)
            if placement is None:
                log.info("live NUMA move refused", pod=alloc.ref, pod_uid=pod_uid, to_nodes=list(target), why=why,
                         reason=reason or None)
                return False
            if placement.mems and placement.mems != alloc.mems:
                problems = enable_memory_migrate(CgroupFs(self.paths.cgroup_root), pod_uid, sorted(alloc.containers))
                for problem in problems:
                    log.warning("cannot make memory follow a live NUMA move; pages stay where they are",
                                pod=alloc.ref, problem=problem)
            self.ledger.move(pod_uid, placement, source="affinity")
            want = alloc.cpus(pool)
            for cid in alloc.containers:
                self._pending_updates[cid] = (want, alloc.mems)
            self._moves[pod_uid] = old
            self._save()
        log.info("live NUMA move decided", pod=alloc.ref, pod_uid=pod_uid, from_nodes=list(old.nodes),
                 to_nodes=list(target), cpus=str(want), mems=str(alloc.mems), containers=len(alloc.containers),
                 reason=reason or None)
        return True

    def _why_not_movable(self, pod_uid: str, alloc: Optional[Allocation], target: Tuple[int, ...]) -> Optional[str]:
        if alloc is None:
            return "not a placed pod"
        if self.rule_pinned(alloc):
            return "pinned by a placement rule"
        if self._kubelet.has_exclusive(pod_uid):
            return "has kubelet-exclusive CPUs"
        if not alloc.containers:
            return "no running container"
        if pod_uid in self._moves:
            return "a move of this pod is still being applied"
        if any(not self.topology.has_node(n) for n in target):
            return "no such NUMA node"
        if tuple(alloc.nodes) == target:
            return "already there"
        return None

    def rule_pinned(self, alloc: Allocation) -> bool:
        """Whether a placement rule pins this pod (it never moves)."""
        return alloc.source == "rule" or self._selector.select(alloc.namespace, alloc.name, {}, {}).rule is not None

    # ================================================================== CreateContainer
    def _pod_of(self, call: Call) -> Optional[PodRecord]:
        if call.pod is not None and call.pod.uid:
            return call.pod
        req = call.request
        sc = getattr(req, "sandbox_config", None)
        if sc is None or not sc.metadata.uid:
            return None
        return PodRecord(sandbox_id=getattr(req, "pod_sandbox_id", ""), uid=sc.metadata.uid, name=sc.metadata.name,
                         namespace=sc.metadata.namespace, labels=dict(sc.labels), annotations=dict(sc.annotations))

    def _create_container(self, call: Call) -> None:
        pod = self._pod_of(call)
        if pod is None:
            return
        sel = self.select(pod)
        if not sel.managed and pod.uid not in self.ledger:
            # (a pod already placed stays managed even if the rules changed since: all of
            # its containers must share one placement)
            return
        req = call.request
        logger = call.log or log
        cname = req.config.metadata.name
        self._refresh_kubelet()
        kstate = self._kubelet
        if kstate.is_exclusive(pod.uid, cname):
            call.notes["numa"] = "kubelet-exclusive CPUs; left alone"
            return
        res = req.config.linux.resources
        kcpus = _parse_cpus(res.cpuset_cpus)
        if kcpus is None:
            logger.warning("kubelet sent an unreadable cpuset_cpus; container left alone", cpuset_cpus=res.cpuset_cpus)
            return
        sandbox_id = req.pod_sandbox_id or pod.sandbox_id
        share = ContainerShare(cname, millicpu_of(res.cpu_period, res.cpu_quota, res.cpu_shares),
                               max(res.memory_limit_in_bytes, 0))
        with self._lock:
            pool = self.ledger.pool
            if kcpus and kcpus.isdisjoint(pool):
                # CPUs outside the shared pool can only be an exclusive assignment we have not
                # read yet: never move a container off CPUs the kubelet reserved for it.
                call.notes["numa"] = f"kubelet cpuset {kcpus} outside the shared pool; left alone"
                return
            alloc = self.ledger.get(pod.uid)
            if alloc is not None and sandbox_id and alloc.sandbox_id and alloc.sandbox_id != sandbox_id:
                logger.info("pod has a new sandbox; its old placement is released", old_sandbox_id=alloc.sandbox_id)
                self.ledger.remove(pod.uid)
                alloc = None
            decided: Optional[Placement] = None
            if alloc is None:
                pod_res = req.sandbox_config.linux.resources
                pod_milli, pod_mem = 0, 0
                if not kstate.has_exclusive(pod.uid):
                    # (the pod-level sum would include the exclusive containers' CPUs)
                    pod_milli = millicpu_of(pod_res.cpu_period, pod_res.cpu_quota, pod_res.cpu_shares)
                    pod_mem = max(pod_res.memory_limit_in_bytes, 0)
                request = PodRequest(max(pod_milli, share.millicpu), max(pod_mem, share.memory_bytes))
                try:
                    decided, source = self._decide(sel.rule, request, pool, pod, logger)
                except NoPlacement as e:
                    call.notes["numa"] = f"not placed: {e}"
                    logger.warning("NUMA placement impossible; container left as the kubelet sent it", reason=str(e))
                    return
                alloc = Allocation(pod_uid=pod.uid, namespace=pod.namespace, name=pod.name, sandbox_id=sandbox_id,
                                   nodes=decided.nodes, home=decided.home, mems=decided.mems,
                                   pod_millicpu=pod_milli, pod_memory_bytes=pod_mem, source=source)
                self.ledger.add(alloc)
            elif sandbox_id and not alloc.sandbox_id:
                self.ledger.set_sandbox(pod.uid, sandbox_id)
            self.ledger.set_pending(pod.uid, cname, share)
            view = kcpus or pool
            cpus = alloc.home & view
            if not cpus:
                moved = self._follow_pool(alloc, view, logger)
                if moved is None:
                    self._save()
                    call.notes["numa"] = "shared pool left the pod's nodes and no node fits; kubelet's cpuset kept"
                    return
                cpus = alloc.home & view
            mems = self._merge_mems(alloc.mems, res.cpuset_mems, logger)
            self._save()
        changed = self._apply(res, cpus, mems)
        if changed:
            call.mark_modified()
        note = f"{'placed on' if decided else 'pod on'} {_where(alloc.nodes)} cpus {cpus}"
        if mems is not None and str(mems):
            note += f" mems {mems}"
        if decided is not None:
            note += f" ({alloc.source}: {decided.reason})"
        call.notes["numa"] = note

    def _decide(self, rule: Optional[PinRule], request: PodRequest, pool: CpuSet, pod: PodRecord,
                logger: Any) -> Tuple[Placement, str]:
        loads = self.ledger.loads()
        if rule is not None:
            try:
                placement = pin(self.topology, pool, loads, rule.nodes, request, cpus=rule.cpus, mems=rule.mems,
                                memory_pinning=self.config.memory_pinning, reason=f"pinned by {rule.source}")
                return placement, "rule"
            except NoPlacement as e:
                logger.warning("placement rule cannot be applied; balancing instead", rule=rule.describe(),
                               reason=str(e))
        placement = balance(self.topology, pool, loads, request, memory_pinning=self.config.memory_pinning)
        return placement, "balance"

    def _follow_pool(self, alloc: Allocation, pool: CpuSet, logger: Any) -> Optional[Allocation]:
        """The shared pool no longer covers the pod's home CPUs: re-place the pod within it
        (closest to where it was). None when no node has shared CPUs left."""
        old_nodes = alloc.nodes
        request = PodRequest(alloc.demand_millicpu(), alloc.demand_memory(), near=old_nodes)
        self.ledger.remove(alloc.pod_uid)
        try:
            placement = balance(self.topology, pool, self.ledger.loads(), request,
                                memory_pinning=self.config.memory_pinning)
        except NoPlacement as e:
            self.ledger.add(alloc)
            logger.warning("shared pool left the pod's NUMA nodes and no node has shared CPUs; "
                           "following the kubelet's cpuset", pod=alloc.ref, old_nodes=list(old_nodes), reason=str(e))
            return None
        self.ledger.add(alloc)
        self.ledger.move(alloc.pod_uid, placement, source="balance")
        logger.warning("shared pool left the pod's NUMA nodes; pod re-placed", pod=alloc.ref,
                       old_nodes=list(old_nodes), new_nodes=list(placement.nodes), pool=str(pool))
        return alloc

    def _merge_mems(self, ours: CpuSet, kubelet_text: str, logger: Any) -> Optional[CpuSet]:
        """The memory nodes to set: ours within the kubelet's (its memory manager may set
        them); None to leave the field as the kubelet sent it."""
        if not ours:
            return None
        if not kubelet_text.strip():
            return ours
        theirs = _parse_cpus(kubelet_text)
        if theirs is None:
            return None
        merged = ours & theirs
        if not merged:
            logger.info("kubelet's cpuset_mems is disjoint from the pod's NUMA nodes; keeping the kubelet's",
                        kubelet=str(theirs), ours=str(ours))
            return None
        return merged

    @staticmethod
    def _apply(res: Any, cpus: CpuSet, mems: Optional[CpuSet]) -> bool:
        changed = False
        text = str(cpus)
        if res.cpuset_cpus != text:
            res.cpuset_cpus = text
            changed = True
        if mems is not None:
            mtext = str(mems)
            if res.cpuset_mems != mtext:
                res.cpuset_mems = mtext
                changed = True
        return changed

    def _container_created(self, call: Call) -> None:
        pod = self._pod_of(call)
        if pod is None or pod.uid not in self.ledger:
            return
        cid = call.reply.container_id
        cname = call.request.config.metadata.name
        with self._lock:
            alloc = self.ledger.get(pod.uid)
            if alloc is None or cname not in alloc.pending or not cid:
                return
            share = alloc.pending[cname]
            self.ledger.add_container(pod.uid, cid, share)
            want = alloc.cpus(self.ledger.pool)
            res = call.request.config.linux.resources
            got = _parse_cpus(res.cpuset_cpus)
            if want and (not got or not got.issubset(alloc.home)):
                # our edit did not reach containerd (the pre-hook failed or ran out of time)
                self._pending_updates[cid] = (want, alloc.mems)
            self._save()

    # ================================================================== UpdateContainerResources
    def _update_container(self, call: Call) -> None:
        req = call.request
        cid = req.container_id
        if not req.HasField("linux"):
            return
        if not self.ledger.knows_container(cid) and not self._claim_pending(call):
            return
        logger = call.log or log
        res = req.linux
        kcpus = _parse_cpus(res.cpuset_cpus)
        if kcpus is None:
            logger.warning("kubelet sent an unreadable cpuset_cpus; update left alone", cpuset_cpus=res.cpuset_cpus)
            return
        self._refresh_kubelet()
        with self._lock:
            alloc = self.ledger.by_container(cid)
            if alloc is None:
                return
            share = alloc.containers[cid]
            if self._kubelet.is_exclusive(alloc.pod_uid, share.name):
                return
            if res.cpu_quota != 0 or res.cpu_shares != 0 or res.memory_limit_in_bytes > 0:
                # in-place resize: the container's demand changes
                milli = millicpu_of(res.cpu_period, res.cpu_quota, res.cpu_shares)
                mem = res.memory_limit_in_bytes if res.memory_limit_in_bytes > 0 else None
                if milli != share.millicpu or (mem is not None and mem != share.memory_bytes):
                    self.ledger.update_container(cid, milli, mem)
                    self._save()
            view = kcpus or self.ledger.pool
            cpus = alloc.home & view
            if not cpus:
                if self._follow_pool(alloc, view, logger) is None:
                    self._save()
                    call.notes["numa"] = "shared pool left the pod's nodes; kubelet's cpuset kept"
                    return
                self._save()
                cpus = alloc.home & view
            mems = self._merge_mems(alloc.mems, res.cpuset_mems, logger)
            self._pending_updates.pop(cid, None)
        if self._apply(res, cpus, mems):
            call.mark_modified()
            call.notes["numa"] = f"merged kubelet cpuset {kcpus or '(none)'} -> {cpus} ({_where(alloc.nodes)})"

    def _claim_pending(self, call: Call) -> bool:
        """A container we pinned whose CreateContainer reply we never saw (the post-hook
        failed): count it under its id now. False when it is not one of ours."""
        c, pod = call.container, call.pod
        if c is None or pod is None or pod.uid not in self.ledger:
            return False
        with self._lock:
            alloc = self.ledger.get(pod.uid)
            if alloc is None or alloc.sandbox_id != c.sandbox_id or c.name not in alloc.pending:
                return False
            self.ledger.add_container(pod.uid, c.container_id, alloc.pending[c.name])
            self._save()
        return True

    # ================================================================== release
    def _release_sandbox(self, call: Call) -> None:
        sid = call.request.pod_sandbox_id
        if not self.ledger.knows_sandbox(sid):
            return
        with self._lock:
            alloc = self.ledger.by_sandbox(sid)
            if alloc is None:
                return
            self._forget(alloc)
            self._save()
        call.notes["numa"] = f"released {_where(alloc.nodes)}"

    def _remove_container(self, call: Call) -> None:
        cid = call.request.container_id
        if not self.ledger.knows_container(cid):
            return
        with self._lock:
            alloc = self.ledger.remove_container(cid)
            self._pending_updates.pop(cid, None)
            if alloc is None:
                return
            if alloc.pod_uid in self._moves:
                self._move_progress(alloc)
            self._save()
        call.notes["numa"] = f"released the container's share of {_where(alloc.nodes)}"

    def _sandbox_started(self, call: Call) -> None:
        pod = call.pod
        if pod is None or not pod.uid:
            return
        sid = call.reply.pod_sandbox_id
        alloc = self.ledger.get(pod.uid)
        if alloc is not None and alloc.sandbox_id and sid and alloc.sandbox_id != sid:
            with self._lock:
                alloc = self.ledger.get(pod.uid)
                if alloc is not None and alloc.sandbox_id != sid:
                    (call.log or log).info("pod has a new sandbox; its old placement is released",
                                           old_sandbox_id=alloc.sandbox_id)
                    self._forget(alloc)
                    self._save()
        sel = self.select(pod)
        if sel.managed:
            call.notes["numa"] = f"managed ({sel.why}); placed at its first container"

    def _forget(self, alloc: Allocation) -> None:
        self.ledger.remove(alloc.pod_uid)
        self._moves.pop(alloc.pod_uid, None)
        for cid in alloc.containers:
            self._pending_updates.pop(cid, None)

    # ================================================================== kubelet checkpoint
    def _refresh_kubelet(self) -> None:
        raw = self._kubelet_file.refresh()
        if raw is None:
            return
        try:
            state = KubeletCpuState.from_raw(raw)
        except CpuManagerStateError as e:
            log.warning("kubelet cpu_manager_state has a garbled CPU list; keeping the last good one",
                        path=self._kubelet_file.path, error=str(e))
            return
        with self._lock:
            self._kubelet = state
            old = self.ledger.pool
            pool = state.shared_pool(self.topology.cpus)
            if pool == old:
                return
            self.ledger.set_pool(pool)
            stranded = [a.ref for a in self.ledger if a.home.isdisjoint(pool)]
            log.info("kubelet shared CPU pool changed", policy=state.policy, old=str(old), new=str(pool),
                     exclusive=str(state.exclusive_cpus),
                     stranded_pods=stranded or None)

    # ================================================================== rules
    def reload_rules(self) -> None:
        """Re-read ``rules_dir`` when a file in it changed (called by the poller)."""
        if not self.config.rules_dir:
            return
        sig = _rules_signature(self.config.rules_dir)
        if sig == self._rules_sig:
            return
        if not sig[0]:
            log.warning("NUMA rules directory does not exist", rules_dir=self.config.rules_dir)
        rules, problems = load_rule_files(self.config.rules_dir, self.node_name, self.topology)
        for problem in problems:
            log.error("placement rule problem", problem=problem)
        self._rules_sig = sig
        self._selector = self._selector.with_rules(list(self._config_rules) + rules)
        log.info("NUMA placement rules loaded", rules_dir=self.config.rules_dir, node_name=self.node_name,
                 rules=[r.describe() for r in rules], problems=len(problems))

    # ================================================================== persistence and resync
    def _load_state(self) -> None:
        records = self._state.load()
        if records is None:
            return
        with self._lock:
            problems = self.ledger.load_records(records)
        for problem in problems:
            log.warning("saved NUMA allocation dropped", problem=problem)

    def _save(self) -> None:
        try:
            self._state.save_encoded(self.ledger.encoded())
        except OSError as e:
            if not self._save_failed:
                log.error("cannot save NUMA allocations; going on in memory", path=self._state.path, error=str(e))
            self._save_failed = True
        else:
            if self._save_failed:
                log.info("NUMA allocations saved again", path=self._state.path)
            self._save_failed = False

    def resync(self, pods: List[PodRecord], containers: List[ContainerRecord]) -> None:
        """Reconcile the allocations with what containerd runs now: drop pods and containers
        that are gone, count containers we did not know under their pod (adopting managed
        pods from the cpusets they have), and never count a container twice."""
        if not self.config.enabled:
            return
        self._refresh_kubelet()
        with self._lock:
            by_sandbox = {p.sandbox_id: p for p in pods if p.sandbox_id}
            live_uids = {p.uid for p in pods}
            live_cids = {c.container_id for c in containers}
            dropped = []
            for alloc in self.ledger:
                if alloc.pod_uid in self._seen_pods:
                    continue  # changed by calls newer than the listing: the calls are right
                if alloc.pod_uid not in live_uids or (alloc.sandbox_id and alloc.sandbox_id not in by_sandbox):
                    self._forget(alloc)
                    dropped.append(alloc.ref)
                    continue
                for cid in list(alloc.containers):
                    if cid not in live_cids and cid not in self._seen_containers:
                        self.ledger.remove_container(cid)
                        self._pending_updates.pop(cid, None)
                self.ledger.clear_pending(alloc.pod_uid)
            adopted: Dict[str, List[str]] = {}
            unpinned: Dict[str, List[ContainerRecord]] = {}
            pool = self.ledger.pool
            for c in containers:
                pod = by_sandbox.get(c.sandbox_id)
                if pod is None:
                    continue
                known = self.ledger.by_container(c.container_id)
                if known is not None:
                    self._note_drift(c, known, _parse_cpus(c.resources.cpuset_cpus) or CpuSet())
                    continue
                if self._kubelet.is_exclusive(pod.uid, c.name):
                    continue
                share = ContainerShare(c.name, millicpu_of(c.resources.cpu_period, c.resources.cpu_quota,
                                                           c.resources.cpu_shares),
                                       max(c.resources.memory_limit_in_bytes, 0))
                have = _parse_cpus(c.resources.cpuset_cpus) or CpuSet()
                alloc = self.ledger.get(pod.uid)
                if alloc is not None:
                    if alloc.sandbox_id != c.sandbox_id:
                        continue
                    self.ledger.add_container(pod.uid, c.container_id, share)
                    self._note_drift(c, alloc, have)
                    adopted.setdefault(pod.ref, []).append(c.name)
                    continue
                if not self.select(pod).managed:
                    continue
                cpus = have & self.topology.cpus
                if not cpus or (pool.issubset(cpus) and len(self.topology.nodes_of_cpus(pool)) > 1):
                    # no cpuset, or the whole multi-node pool: nobody pinned it
                    unpinned.setdefault(pod.sandbox_id, []).append(c)
                    continue
                alloc = self._adopt(pod, c, cpus, share)
                adopted.setdefault(pod.ref, []).append(c.name)
                self._note_drift(c, alloc, have)
            for sid, group in unpinned.items():
                pod = by_sandbox[sid]
                alloc = self.ledger.get(pod.uid)
                if alloc is None:
                    demand = PodRequest(
                        sum(millicpu_of(c.resources.cpu_period, c.resources.cpu_quota, c.resources.cpu_shares)
                            for c in group),
                        sum(max(c.resources.memory_limit_in_bytes, 0) for c in group))
                    try:
                        placement, source = self._decide(self.select(pod).rule, demand, pool, pod, log)
                    except NoPlacement:
                        continue
                    alloc = Allocation(pod_uid=pod.uid, namespace=pod.namespace, name=pod.name,
                                       sandbox_id=pod.sandbox_id, nodes=placement.nodes, home=placement.home,
                                       mems=placement.mems, source=source)
                    self.ledger.add(alloc)
                for c in group:
                    self.ledger.add_container(pod.uid, c.container_id, ContainerShare(
                        c.name, millicpu_of(c.resources.cpu_period, c.resources.cpu_quota, c.resources.cpu_shares),
                        max(c.resources.memory_limit_in_bytes, 0)))
                    self._note_drift(c, alloc, _parse_cpus(c.resources.cpuset_cpus) or CpuSet())
                    adopted.setdefault(pod.ref, []).append(c.name)
            self._resynced = True
            self._seen_pods.clear()
            self._seen_containers.clear()
            self._save()
        log.info("NUMA allocations reconciled with containerd", allocations=len(self.ledger),
                 dropped_pods=dropped or None, adopted=adopted or None,
                 pending_updates=len(self._pending_updates) or None)

    def _adopt(self, pod: PodRecord, c: ContainerRecord, cpus: CpuSet, share: ContainerShare) -> Allocation:
        """An allocation for a managed pod found running with a cpuset: its nodes are those
        owning the CPUs; its home is those nodes' CPUs when the cpuset is what we would have
        given (the nodes' shared CPUs), else the cpuset itself (a rule's CPU list)."""
        nodes = self.topology.nodes_of_cpus(cpus)
        node_cpus = self.topology.cpus_of(nodes)
        home = node_cpus if (node_cpus & self.ledger.pool).issubset(cpus) else cpus
        mems = _parse_cpus(c.resources.cpuset_mems) or CpuSet()
        if not all(self.topology.has_node(m) for m in mems):
            mems = CpuSet(nodes)
        alloc = Allocation(pod_uid=pod.uid, namespace=pod.namespace, name=pod.name, sandbox_id=pod.sandbox_id,
                           nodes=nodes, home=home, mems=mems, source="adopted")
        self.ledger.add(alloc)
        self.ledger.add_container(pod.uid, c.container_id, share)
        return alloc

    def _note_drift(self, c: ContainerRecord, alloc: Allocation, have: CpuSet) -> None:
        want = alloc.cpus(self.ledger.pool)
        have_mems = _parse_cpus(c.resources.cpuset_mems) or CpuSet()
        mems_off = bool(alloc.mems) and not (have_mems and have_mems.issubset(alloc.mems))
        if want and (have != want or mems_off):
            self._pending_updates[c.container_id] = (want, alloc.mems)
        else:
            self._pending_updates.pop(c.container_id, None)


def _where(nodes: Tuple[int, ...]) -> str:
    return ("node " if len(nodes) == 1 else "nodes ") + ",".join(str(n) for n in nodes)
