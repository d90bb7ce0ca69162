"""The live moves of each placed pod, for ``anolisnuma-ctl pods`` and ``explain``.

A pod moved live (traffic affinity, a re-spread, a change of the placement rules) keeps
its allocation's ``source``, but not why it moved nor from where: that is recorded here,
the last :data:`MOVES_PER_POD` moves of each pod, from the decision to its outcome
(``applied`` or ``rolled back``). Kept in memory only, and dropped with the pod's
allocation: a restart forgets why, the allocation's source stays (persisted).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any, Deque, Dict, List, Optional, Sequence

MOVES_PER_POD = 8


class MoveHistory:
    """Per pod UID, the last moves as dicts: ``at``, ``from_nodes``, ``to_nodes``,
    ``source``, ``reason``, ``outcome`` (``in flight``, ``applied``, ``rolled back``) and,
    for a rollback, ``error``. Thread-safe."""

    def __init__(self, per_pod: int = MOVES_PER_POD) -> None:
        self.per_pod = per_pod
        self._lock = threading.Lock()
        self._moves: Dict[str, Deque[Dict[str, Any]]] = {}

    def decided(self, pod_uid: str, from_nodes: Sequence[int], to_nodes: Sequence[int], source: str,
                reason: str) -> None:
        entry = {"at": round(time.time(), 3), "from_nodes": list(from_nodes), "to_nodes": list(to_nodes),
                 "source": source, "reason": reason or "", "outcome": "in flight"}
        with self._lock:
            self._moves.setdefault(pod_uid, deque(maxlen=self.per_pod)).append(entry)

    def finished(self, pod_uid: str, outcome: str, error: str = "") -> None:
        """The pod's last move in flight ended (``applied`` or ``rolled back``)."""
        with self._lock:
            moves = self._moves.get(pod_uid)
            if moves and moves[-1]["outcome"] == "in flight":
                moves[-1]["outcome"] = outcome
                if error:
                    moves[-1]["error"] = error

    def of(self, pod_uid: str) -> List[Dict[str, Any]]:
        with self._lock:
            return [dict(m) for m in self._moves.get(pod_uid, ())]

    def last(self, pod_uid: str) -> Optional[Dict[str, Any]]:
        with self._lock:
            moves = self._moves.get(pod_uid)
            return dict(moves[-1]) if moves else None

    def forget(self, pod_uid: str) -> None:
        with self._lock:
            self._moves.pop(pod_uid, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._moves)
