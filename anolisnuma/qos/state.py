"""What the QoS service keeps per pod: the managed pods and containers, and for each the
kernel files and values decided when it was admitted (by the QoS hook or the start-up
resync). :class:`QosState` indexes them by UID, sandbox and container ID."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Set, Tuple

from anolisnuma.decision_events import QosApplied
from anolisnuma.policies.qos.levels import QosLevel
from anolisnuma.policies.qos.plan import KnobSetting, LevelWrites, sched_core_conflict
from anolisnuma.system import knobs
from anolisnuma.system.cgroups import CgroupFs, PodCgroup


@dataclass
class FileTarget:
    """One kernel file kept at one value. ``sched_core_held``: the value is one core
    scheduling forbids (not written while ``kernel.sched_core`` is 1), decided when the
    target is made so that the writer asks nothing of the policy."""

    knob: knobs.Knob
    path: str
    value: int
    missing_logged: bool = False
    sched_core_held: bool = False
    final_logged: bool = False     # told once that an offline file is kept offline


def file_targets(cgroups: CgroupFs, rel: str, settings: Iterable[KnobSetting]) -> List[FileTarget]:
    """The files of the cgroup directory ``rel`` (relative to a hierarchy root) kept at
    ``settings``."""
    return [FileTarget(s.knob, cgroups.knob_path(s.knob, rel), s.value,
                       sched_core_held=sched_core_conflict(s.knob, s.value, True) is not None) for s in settings]


@dataclass
class ManagedContainer:
    container_id: str
    rel: str                                  # cgroup dir relative to a hierarchy root
    targets: List[FileTarget]
    applied: bool = False                     # its cgroup existed once and got the values


@dataclass
class ManagedPod:
    uid: str
    ref: str
    level: QosLevel
    source: str
    cgroup: PodCgroup
    targets: List[FileTarget]
    container_settings: Tuple[KnobSetting, ...]
    llc_group: Optional[str] = None           # resctrl group its threads go to
    why: str = ""                             # the annotation, label or class behind the level
    sandbox_ids: Set[str] = field(default_factory=set)
    containers: Dict[str, ManagedContainer] = field(default_factory=dict)
    applied: bool = False
    told: Optional[QosApplied] = None         # the decision, told once its knobs are first applied
    writes: Optional[LevelWrites] = None      # what its level means on this kernel (explain says it)
    refused: str = ""                         # why the level its markings ask for was refused


class QosState:
    """Managed pods by UID, with indexes by sandbox and container ID. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pods: Dict[str, ManagedPod] = {}
        self._by_sandbox: Dict[str, str] = {}
        self._by_container: Dict[str, str] = {}

    def put(self, pod: ManagedPod) -> None:
        with self._lock:
            old = self._pods.get(pod.uid)
            if old is not None:
                pod.sandbox_ids |= old.sandbox_ids
                for cid, c in old.containers.items():
                    pod.containers.setdefault(cid, c)
            self._pods[pod.uid] = pod
            for sid in pod.sandbox_ids:
                self._by_sandbox[sid] = pod.uid
            for cid in pod.containers:
                self._by_container[cid] = pod.uid

    def by_uid(self, uid: str) -> Optional[ManagedPod]:
        with self._lock:
            return self._pods.get(uid)

    def bind_sandbox(self, uid: str, sandbox_id: str) -> None:
        with self._lock:
            pod = self._pods.get(uid)
            if pod is not None and sandbox_id:
                pod.sandbox_ids.add(sandbox_id)
                self._by_sandbox[sandbox_id] = uid

    def by_sandbox(self, sandbox_id: str) -> Optional[ManagedPod]:
        with self._lock:
            uid = self._by_sandbox.get(sandbox_id)
            return self._pods.get(uid) if uid else None

    def by_container(self, container_id: str) -> Tuple[Optional[ManagedPod], Optional[ManagedContainer]]:
        with self._lock:
            uid = self._by_container.get(container_id)
            pod = self._pods.get(uid) if uid else None
            return pod, (pod.containers.get(container_id) if pod else None)

    def add_container(self, pod: ManagedPod, ctr: ManagedContainer) -> None:
        with self._lock:
            pod.containers[ctr.container_id] = ctr
            self._by_container[ctr.container_id] = pod.uid

    def forget_container(self, container_id: str) -> bool:
        with self._lock:
            uid = self._by_container.pop(container_id, None)
            pod = self._pods.get(uid) if uid else None
            return bool(pod and pod.containers.pop(container_id, None))

    def forget_sandbox(self, sandbox_id: str) -> Optional[ManagedPod]:
        """Drop ``sandbox_id``; the pod is forgotten (and returned) when it was its last."""
        with self._lock:
            uid = self._by_sandbox.pop(sandbox_id, None)
            pod = self._pods.get(uid) if uid else None
            if pod is None:
                return None
            pod.sandbox_ids.discard(sandbox_id)
            if pod.sandbox_ids:
                return None
            self._drop(pod)
            return pod

    def forget_pod(self, pod: ManagedPod) -> None:
        with self._lock:
            if self._pods.get(pod.uid) is pod:
                self._drop(pod)

    def forget_uid(self, uid: str) -> Optional[ManagedPod]:
        """Drop the pod ``uid`` with every sandbox and container (returned when known)."""
        with self._lock:
            pod = self._pods.get(uid)
            if pod is not None:
                self._drop(pod)
            return pod

    def keys(self) -> Tuple[List[str], List[str], List[str]]:
        """(the UIDs of pods that have no sandbox, every sandbox ID, every container ID).
        A pod with a sandbox is named by it: its UID is the one its cgroup path spells."""
        with self._lock:
            return ([uid for uid, p in self._pods.items() if not p.sandbox_ids],
                    list(self._by_sandbox), list(self._by_container))

    def container_count(self) -> int:
        with self._lock:
            return len(self._by_container)

    def _drop(self, pod: ManagedPod) -> None:
        self._pods.pop(pod.uid, None)
        for sid in pod.sandbox_ids:
            if self._by_sandbox.get(sid) == pod.uid:
                del self._by_sandbox[sid]
        for cid in pod.containers:
            if self._by_container.get(cid) == pod.uid:
                del self._by_container[cid]

    def snapshot(self) -> List[Tuple[ManagedPod, List[ManagedContainer]]]:
        with self._lock:
            return [(p, list(p.containers.values())) for p in self._pods.values()]

    def __len__(self) -> int:
        with self._lock:
            return len(self._pods)
