"""A bounded journal of the intercepted calls of each pod, for ``anolisnuma-ctl explain``.

Per pod UID it keeps the last :data:`CALLS_PER_POD` calls: method, time, status, latency,
the container, the decisions the hooks noted (``call.notes``) and the hooks that failed.
At most :data:`MAX_PODS` pods are kept (the least recently seen goes first), and a pod's
entries are dropped when the :class:`~anolisnuma.state.gone.Reaper` says the pod is gone
(its last sandbox removed, through the proxy or behind its back, or a RunPodSandbox that
failed for good): the journal never grows with the node's history, only with what runs now.

Entries are appended on the event loop and read by the admin socket's worker thread, hence
the lock; post-hooks amend their entry when they are done (their notes come after the reply).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from typing import Any, Deque, Dict, List

from anolisnuma.state.gone import PodGone, PodKeys, PodStateHolder

CALLS_PER_POD = 32
MAX_PODS = 4096


class JournalEntry:
    __slots__ = ("at", "method", "status", "latency_ms", "container", "notes", "hook_errors", "answered_by")

    def __init__(self, method: str, status: str, latency_ms: float, container: str, notes: Dict[str, Any],
                 hook_errors: List[str], answered_by: str) -> None:
        self.at = time.time()
        self.method = method
        self.status = status
        self.latency_ms = latency_ms
        self.container = container
        self.notes = notes
        self.hook_errors = hook_errors
        self.answered_by = answered_by

    def to_json(self) -> Dict[str, Any]:
        return {"at": round(self.at, 3), "method": self.method, "status": self.status,
                "latency_ms": self.latency_ms, "container": self.container or None,
                "decisions": dict(self.notes), "hook_errors": list(self.hook_errors),
                "answered_by": self.answered_by}


class PodJournal(PodStateHolder):
    name = "journal"

    def __init__(self, calls_per_pod: int = CALLS_PER_POD, max_pods: int = MAX_PODS) -> None:
        self.calls_per_pod = calls_per_pod
        self.max_pods = max_pods
        self._lock = threading.Lock()
        self._pods: "OrderedDict[str, Deque[JournalEntry]]" = OrderedDict()

    def record(self, pod_uid: str, entry: JournalEntry) -> None:
        with self._lock:
            calls = self._pods.get(pod_uid)
            if calls is None:
                calls = self._pods[pod_uid] = deque(maxlen=self.calls_per_pod)
                if len(self._pods) > self.max_pods:
                    self._pods.popitem(last=False)
            else:
                self._pods.move_to_end(pod_uid)
            calls.append(entry)

    def amend(self, entry: JournalEntry, notes: Dict[str, Any], hook_errors: List[str]) -> None:
        """What the post-hooks noted, once they are done."""
        with self._lock:
            entry.notes = dict(notes)
            entry.hook_errors = list(hook_errors)

    def held(self) -> PodKeys:
        with self._lock:
            return PodKeys.of(list(self._pods))

    def forget(self, gone: PodGone) -> None:
        with self._lock:
            for uid in gone.uids:
                self._pods.pop(uid, None)

    def structures(self) -> Dict[str, int]:
        with self._lock:
            return {"pods": len(self._pods), "entries": sum(len(calls) for calls in self._pods.values())}

    def calls(self, pod_uid: str) -> List[Dict[str, Any]]:
        """The pod's journal, oldest first (empty for a pod never seen or forgotten)."""
        with self._lock:
            return [e.to_json() for e in self._pods.get(pod_uid, ())]

    def __len__(self) -> int:
        with self._lock:
            return len(self._pods)
