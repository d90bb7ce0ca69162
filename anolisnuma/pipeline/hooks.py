"""The contract between the interception pipeline and the hooks that apply policies.

A hook is a small object with a name, the CRI methods it serves, and ``pre``/``post``
methods. The pipeline calls ``pre`` with the decoded request before it is forwarded (the
hook may edit ``call.request`` and must then call ``call.mark_modified()``), and ``post``
after containerd answered successfully (``call.reply`` is the decoded reply). Hooks run in
worker threads, so they may do blocking file I/O (a stage that only computes in memory may
say so, :meth:`Hook.inline`, and runs on the event loop); the pipeline bounds each call by
the hook's time budget and applies its failure policy:

- ``ignore`` (default): the error is logged and counted, the call goes on as if the hook
  were absent (a pre-hook's half-made edits are discarded);
- ``fail``: a pre-hook error is returned to the kubelet as the gRPC status of the call
  (``HookRefused.code`` or UNKNOWN) and nothing is forwarded. Post-hooks run after the call
  already happened in containerd, so their failures are only logged, whatever the policy.

Hooks for the same pod run one at a time, in the order the calls arrived, so a
CreateContainer pre-hook always sees what the RunPodSandbox post-hook did.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Container, FrozenSet, List, Optional

from anolisnuma.state.records import ContainerRecord, PodRecord

if TYPE_CHECKING:
    from anolisnuma.controller import Controller
    from anolisnuma.state.gone import PodStateHolder


class FailurePolicy(str, enum.Enum):
    IGNORE = "ignore"
    FAIL = "fail"


# The methods the pipeline decodes. Everything else is relayed as bytes.
RUN_POD_SANDBOX = "RunPodSandbox"
STOP_POD_SANDBOX = "StopPodSandbox"
REMOVE_POD_SANDBOX = "RemovePodSandbox"
CREATE_CONTAINER = "CreateContainer"
START_CONTAINER = "StartContainer"
STOP_CONTAINER = "StopContainer"
REMOVE_CONTAINER = "RemoveContainer"
UPDATE_CONTAINER_RESOURCES = "UpdateContainerResources"


class HookRefused(Exception):
    """Raised by a pre-hook to refuse a call with a specific gRPC status code name
    (e.g. ``"RESOURCE_EXHAUSTED"``); only takes effect under the ``fail`` policy."""

    def __init__(self, message: str, code: str = "UNKNOWN") -> None:
        super().__init__(message)
        self.code = code


@dataclass
class Call:
    """One intercepted CRI call as the hooks see it."""

    method: str
    request: Any                       # cri_proto message, editable by pre-hooks
    pod: Optional[PodRecord] = None    # the pod this call concerns, when known
    container: Optional[ContainerRecord] = None
    reply: Any = None                  # set for post-hooks
    log: Any = None                    # structlog logger bound to the pod/container
    modified: bool = False
    notes: dict = field(default_factory=dict)  # decisions hooks report for the reply log line

    def mark_modified(self) -> None:
        self.modified = True


class Hook:
    """Base class: override ``pre`` and/or ``post``; set ``name`` and ``methods``."""

    name: str = "hook"
    methods: FrozenSet[str] = frozenset()

    def pre(self, call: Call) -> None:
        """Called before the request is forwarded; may edit ``call.request``."""

    def post(self, call: Call) -> None:
        """Called after a successful reply; ``call.reply`` is set."""

    def wants_pre(self, method: str) -> bool:
        return method in self.methods and type(self).pre is not Hook.pre

    def wants_post(self, method: str) -> bool:
        return method in self.methods and type(self).post is not Hook.post

    def inline(self, method: str, stage: str) -> bool:
        """Whether ``stage`` ("pre" or "post") of ``method`` only computes in memory (no
        file or socket I/O, no lock held long by another thread): the pipeline then runs it
        on the event loop instead of a worker thread, and moves it to the threads for good
        if it ever takes longer than a few milliseconds (``INLINE_LIMIT_SECONDS``)."""
        return False

    def start(self) -> None:
        """Called once by the daemon after :meth:`resync`, before :meth:`controllers`."""

    def controllers(self, connect: Callable[[Optional[float]], Any], store: Any = None) -> List["Controller"]:
        """The background loops this hook needs (reconcilers, watchers); the daemon
        registers, starts and stops them. ``connect(timeout_seconds)`` opens a new client
        to containerd (None: its default timeout) for a loop that calls it; ``store`` is
        the daemon's pod/container store, for a loop that changes containers itself."""
        return []

    def holders(self) -> List["PodStateHolder"]:
        """What keeps state per pod for this hook (its own state, its loops' caches), called
        by the daemon after :meth:`controllers`: the daemon's
        :class:`~anolisnuma.state.gone.Reaper` tells each what is gone."""
        return []

    def resync(self, pods: List[PodRecord], containers: List[ContainerRecord],
               fresh: Container[str] = frozenset()) -> None:
        """Called at start and then periodically, after the store was reconciled with
        containerd: ``pods`` and ``containers`` are everything containerd runs now (stale
        records already dropped). Drop what is gone, adopt what is new, but leave alone
        every pod UID, sandbox ID and container ID in ``fresh``: calls newer than the
        listing named them."""

    def pods_adopted(self, pods: List[PodRecord]) -> None:
        """Called after :meth:`resync` with the pods (of its ``pods``) the store first
        learned of from that listing rather than from a call or an event: created while the
        daemon was down, or while NRI mode was not registered. A hook tells its decision
        about each as it would have at the pod's creation (the decision events), even when
        the resync had nothing to write for it."""

    def close(self) -> None:
        """Release resources (watchers, threads) at shutdown."""
