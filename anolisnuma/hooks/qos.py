"""``QosHook``: the kubelet's CRI calls, read for the QoS service.

The hook only translates: it reads the CRI messages, asks
:class:`~anolisnuma.qos.service.QosService` (which decides each pod's level, keeps the pods
and writes what this kernel's family offers: group identity, OOM priority, async reclaim on
Alibaba Cloud Linux / Anolis, cpu.qos_level and memory.qos_level on openEuler; and
LLC/MBA), and puts the answer in the call (its decision note, or the refused writes as :class:`QosApplyError`).

=====================  =====  =========================================================
call                   stage  what happens
=====================  =====  =========================================================
RunPodSandbox          pre    resolve the pod's level, write the pod cgroup's knobs (the
                              kubelet made the cgroup already, so ``fail`` can refuse)
RunPodSandbox          post   remember the sandbox ID; retry the knobs if the cgroup was
                              not there in pre
CreateContainer        post   remember the container; write its knobs if its cgroup exists
StartContainer         pre    write the container's knobs if still missing
StartContainer         post   write them if still missing; move its threads to the pod's
                              resctrl group
StopPodSandbox         post   forget the sandbox (the pod with its last one)
=====================  =====  =========================================================

What is removed (through the proxy or behind its back) is forgotten when the daemon's
:class:`~anolisnuma.state.gone.Reaper` says so: the service is a
:class:`~anolisnuma.state.gone.PodStateHolder` (:meth:`QosHook.holders`).

containerd creates a container's cgroup when the container's task is created, which is
during StartContainer, so the container knobs usually land in StartContainer post; the
earlier attempts cost one failed ``open`` each and cover runtimes that create it sooner.
A container that ended before its post-hook ran (stopped right after it started, or done
at once) has no cgroup left: that is said at info, nothing is wrong.

Errors: a refused write (read-only file, EINVAL, ...) is collected while the other knobs
are still written, then raised as :class:`QosApplyError` -- the pipeline logs it and goes
on (``ignore``) or refuses the call (``fail``, pre stage only). A pod or container whose
cgroup vanished meanwhile is skipped quietly. Hostile annotation values never reach a
path; they are logged (escaped and cut) and ignored.

Background loop (:meth:`QosHook.controllers`): the reconciler over the service
(``reconcile/qos.py``), when ``[qos] reconcile_interval_seconds`` is above 0.
"""

from __future__ import annotations

from typing import Any, Container, Dict, List, Optional

from anolisnuma.config import PathsConfig
from anolisnuma.controller import Controller
from anolisnuma.decision_events import DecisionEvents, no_events
from anolisnuma.pipeline.hooks import (
    CREATE_CONTAINER, RUN_POD_SANDBOX, START_CONTAINER, STOP_POD_SANDBOX, Call, Hook, HookRefused,
)
from anolisnuma.policies.qos.config import QosConfig
from anolisnuma.qos.service import Applied, QosService
from anolisnuma.reconcile.qos import QosReconciler, ReconcileCounts
from anolisnuma.state.gone import PodStateHolder
from anolisnuma.state.records import ContainerRecord, PodRecord
from anolisnuma.system.cgroups import HostFileError, KubeletCgroupLayout


class QosApplyError(HookRefused):
    """Some knob writes were refused; ``errors`` holds each (the others were written)."""

    def __init__(self, ref: str, errors: List[HostFileError]) -> None:
        detail = "; ".join(str(e) for e in errors[:3])
        more = f" (+{len(errors) - 3} more)" if len(errors) > 3 else ""
        super().__init__(f"qos: {len(errors)} knob write(s) refused for {ref}: {detail}{more}", "INTERNAL")
        self.errors = errors


class QosHook(Hook):
    """``QosHook(config, paths)``; optional ``log`` (a structlog logger) and ``layout``
    (the kubelet's cgroup layout)."""

    name = "qos"
    methods = frozenset({RUN_POD_SANDBOX, CREATE_CONTAINER, START_CONTAINER, STOP_POD_SANDBOX})

    def __init__(self, config: QosConfig, paths: PathsConfig, *, log: Any = None,
                 layout: Optional[KubeletCgroupLayout] = None) -> None:
        self.cfg = config
        self.paths = paths
        self.service = QosService(config, paths, log=log, layout=layout)
        s = self.service
        self.log = s.log
        self.reconciler = QosReconciler(s, config.reconcile_interval_seconds, log=self.log)
        # What the admin surface (views, metrics) and the tests read through the hook.
        self.cgroups, self.state, self.support, self.applier = s.cgroups, s.state, s.support, s.applier
        self.decisions: DecisionEvents = no_events
        self.log.info("qos hook ready", enabled=config.enabled, dry_run=config.dry_run,
                      cgroup_version=s.cgroups.version, cgroup_root=s.cgroups.root,
                      kubelet_cgroups=s.cgroups.layout.describe(),
                      supported=sorted(s.support.supported), families=list(s.plan.families))

    def wants_pre(self, method: str) -> bool:
        return method in (RUN_POD_SANDBOX, START_CONTAINER)

    def use_decision_events(self, sink: DecisionEvents) -> None:
        """Report each pod's level (applied, or skipped and why) to ``sink`` (the daemon
        wires it)."""
        self.decisions = sink
        self.service.use_decision_events(sink)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self.service.prepare()

    def prepare(self) -> None:
        self.service.prepare()

    def controllers(self, connect: Any, store: Any = None) -> List[Controller]:
        """The reconciler, when enabled with an interval."""
        return [self.reconciler] if self.cfg.enabled and self.reconciler.interval > 0 else []

    def close(self) -> None:
        self.reconciler.stop()

    def holders(self) -> List[PodStateHolder]:
        return [self.service] if self.cfg.enabled else []

    def run_once(self) -> ReconcileCounts:
        """One reconciler pass now (tests, benchmarks)."""
        self.service.prepare()
        return self.reconciler.step()

    # ------------------------------------------------------------------ dispatch
    def pre(self, call: Call) -> None:
        if not self.cfg.enabled:
            return
        s = self.service
        s.prepare()
        if call.method == RUN_POD_SANDBOX:
            self._answer(call, s.sandbox_starting(_pod_of_config(call.request.config, "")))
        elif call.method == START_CONTAINER:
            self._answer(call, s.container_starting(call.request.container_id, call.container, call.pod))

    def post(self, call: Call) -> None:
        if not self.cfg.enabled:
            return
        s = self.service
        s.prepare()
        m = call.method
        if m == RUN_POD_SANDBOX:
            self._answer(call, s.sandbox_started(_pod_of_config(call.request.config, call.reply.pod_sandbox_id)))
        elif m == CREATE_CONTAINER:
            container_id = getattr(call.reply, "container_id", "") or \
                (call.container.container_id if call.container is not None else "")
            sandbox_id = call.request.pod_sandbox_id
            self._answer(call, s.container_created(sandbox_id, container_id, _pod_of_create(call, sandbox_id)))
        elif m == START_CONTAINER:
            self._answer(call, s.container_started(call.request.container_id, call.container, call.pod))
        elif m == STOP_POD_SANDBOX:
            pod = s.sandbox_stopped(call.request.pod_sandbox_id)
            if pod is not None:
                self.log.info("pod forgotten", pod=pod.ref, method=m)

    @staticmethod
    def _answer(call: Call, applied: Applied) -> None:
        """The service's answer into the call: the decision note, the refused writes."""
        if applied.note:
            call.notes["qos"] = applied.note
        if applied.pod is not None and applied.errors:
            raise QosApplyError(applied.pod.ref, applied.errors)

    # ------------------------------------------------------------------ resync
    def resync(self, pods: List[PodRecord], containers: List[ContainerRecord],
               fresh: Container[str] = frozenset()) -> None:
        """Adopt everything containerd runs now, apply it, drop what is gone; leave alone
        what calls newer than the listing named (``fresh``)."""
        self.service.resync(pods, containers, fresh)

    def pods_adopted(self, pods: List[PodRecord]) -> None:
        """Each pod's level told (a QosApplied or QosSkipped event), unless the resync's
        writes told it already."""
        self.service.tell_adopted(pods)


def _str_map(m: Any) -> Dict[str, str]:
    try:
        return dict(m) if m is not None else {}
    except Exception:
        return {}


def _pod_of_config(config: Any, sandbox_id: str) -> PodRecord:
    """The pod a ``PodSandboxConfig`` message describes."""
    md = config.metadata
    return PodRecord(sandbox_id, md.uid, md.name, md.namespace, config.linux.cgroup_parent,
                     _str_map(config.labels), _str_map(config.annotations))


def _pod_of_create(call: Call, sandbox_id: str) -> Optional[PodRecord]:
    """The pod of a CreateContainer: the store's record, else the sandbox config it carries."""
    if call.pod is not None:
        return call.pod
    if call.request.HasField("sandbox_config"):
        return _pod_of_config(call.request.sandbox_config, sandbox_id)
    return None


__all__ = ["QosHook", "QosApplyError"]
