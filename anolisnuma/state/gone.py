"""What ended, decided in one place and told to everything that keeps something per pod.

Many parts of the daemon keep state per pod, sandbox or container: the pipeline's per-pod
locks and journal, the QoS state, the NUMA ledger, the affinity caches. Each used to drop
its own entries on the calls it happened to see, so whatever ended without such a call (a
teardown sent straight to containerd, a RunPodSandbox that failed and was never retried)
stayed for good. Here one :class:`Reaper` decides what is gone, from the same events that
end the store's records, and tells every :class:`PodStateHolder`:

- a RemovePodSandbox or RemoveContainer through the proxy (:meth:`Reaper.sandbox_removed`,
  :meth:`Reaper.container_removed`: the store drops the records and the holders follow);
- the resync with containerd (:meth:`Reaper.reap`, after the store agreed with the
  listing): whatever a holder keeps for a pod UID, sandbox or container that the store
  does not know, and that no call named lately, is gone. That covers a removal whose call
  was lost as well as a pod that never got a sandbox (its RunPodSandbox failed and was not
  retried within one resync interval), and state loaded from disk for what ended while the
  daemon was down.

A holder reports what it keeps (:meth:`PodStateHolder.held`), forgets what it is told
(:meth:`PodStateHolder.forget`) and counts its structures for ``anolisnuma-ctl status``
(:meth:`PodStateHolder.structures`). Holders decide nothing about what is gone.
"""

from __future__ import annotations

import abc
import threading
from dataclasses import dataclass
from typing import Container, Dict, FrozenSet, Iterable, List, Set

import structlog

from anolisnuma.state.store import Store

log = structlog.get_logger("anolisnuma.state")


@dataclass(frozen=True)
class PodKeys:
    """Pod UIDs, sandbox IDs and container IDs."""

    uids: FrozenSet[str] = frozenset()
    sandbox_ids: FrozenSet[str] = frozenset()
    container_ids: FrozenSet[str] = frozenset()

    @classmethod
    def of(cls, uids: Iterable[str] = (), sandbox_ids: Iterable[str] = (),
           container_ids: Iterable[str] = ()) -> "PodKeys":
        """Keys from any iterables (empty IDs left out)."""
        return cls(_ids(uids), _ids(sandbox_ids), _ids(container_ids))

    def __bool__(self) -> bool:
        return bool(self.uids or self.sandbox_ids or self.container_ids)


@dataclass(frozen=True)
class PodGone(PodKeys):
    """Pods (by UID), sandboxes and containers that no longer exist; ``reason`` says how
    that was found (``"removed"``: a call through the proxy; ``"resync"``)."""

    reason: str = ""

    @classmethod
    def of_ids(cls, reason: str, uids: Iterable[str] = (), sandbox_ids: Iterable[str] = (),
               container_ids: Iterable[str] = ()) -> "PodGone":
        return cls(_ids(uids), _ids(sandbox_ids), _ids(container_ids), reason)


class PodStateHolder(abc.ABC):
    """Something that keeps state per pod, sandbox or container. ``name`` names it in logs
    and in the ``structures`` section of ``anolisnuma-ctl status``. The methods are called
    from any thread."""

    name: str = "holder"

    @abc.abstractmethod
    def held(self) -> PodKeys:
        """Every pod UID, sandbox ID and container ID it keeps something for."""

    @abc.abstractmethod
    def forget(self, gone: PodGone) -> None:
        """Drop everything kept for what ``gone`` names (what it does not know is ignored)."""

    @abc.abstractmethod
    def structures(self) -> Dict[str, int]:
        """The size of each structure it keeps per pod, by name (0 when nothing runs)."""


class Reaper:
    """``Reaper(store)``: the one place that decides what is gone (see the module
    docstring). Thread-safe."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._holders: List[PodStateHolder] = []
        self.errors = 0     # holders that raised in forget (each logged)

    def add(self, holder: PodStateHolder) -> None:
        if not isinstance(holder, PodStateHolder):
            raise TypeError(f"not a PodStateHolder: {holder!r}")
        with self._lock:
            if holder not in self._holders:
                self._holders.append(holder)

    @property
    def holders(self) -> List[PodStateHolder]:
        with self._lock:
            return list(self._holders)

    # ---------------------------------------------------------------- the events
    def sandbox_removed(self, sandbox_id: str) -> PodGone:
        """RemovePodSandbox succeeded: the store drops the sandbox and its containers.
        What that ended: the sandbox, its containers, and the pod when it was the pod's
        last sandbox (a pod restarted into a new sandbox lives on). To be :meth:`tell`-ed
        once the call's hooks are done."""
        containers = [c.container_id for c in self.store.containers(sandbox_id)]
        pod = self.store.remove_pod(sandbox_id)
        uids = [pod.uid] if pod is not None and pod.uid not in self._store_uids() else []
        return PodGone.of_ids("removed", uids, [sandbox_id], containers)

    def container_removed(self, container_id: str) -> PodGone:
        """RemoveContainer succeeded: the store drops the container."""
        self.store.remove_container(container_id)
        return PodGone.of_ids("removed", container_ids=[container_id])

    def reap(self, fresh: Container[str] = frozenset()) -> PodGone:
        """After the store agreed with containerd: every holder forgets what the store does
        not know, except what is in ``fresh`` (named by calls newer than the listing).
        Returns what was found gone."""
        pods, containers = self.store.pods(), self.store.containers()
        live = PodKeys.of((p.uid for p in pods), (p.sandbox_id for p in pods),
                          (c.container_id for c in containers))
        uids: Set[str] = set()
        sandboxes: Set[str] = set()
        ctrs: Set[str] = set()
        for holder in self.holders:
            held = holder.held()
            uids |= held.uids - live.uids
            sandboxes |= held.sandbox_ids - live.sandbox_ids
            ctrs |= held.container_ids - live.container_ids
        gone = PodGone.of_ids("resync", (u for u in uids if u not in fresh),
                              (s for s in sandboxes if s not in fresh), (c for c in ctrs if c not in fresh))
        if gone:
            log.info("gone pods forgotten", reason=gone.reason, pods=len(gone.uids),
                     sandboxes=len(gone.sandbox_ids), containers=len(gone.container_ids))
            self.tell(gone)
        return gone

    def tell(self, gone: PodGone) -> None:
        """Every holder forgets ``gone``; one that raises is logged and counted, and the
        others are still told. A pod UID the store knows again by now (a new sandbox came
        meanwhile) is left out."""
        known = self._store_uids() if gone.uids else set()
        if gone.uids & known:
            gone = PodGone(gone.uids - known, gone.sandbox_ids, gone.container_ids, gone.reason)
        if not gone:
            return
        for holder in self.holders:
            try:
                holder.forget(gone)
            except Exception as e:   # one holder's bug must not keep the others' state
                self.errors += 1
                log.error("cannot forget gone pods", holder=holder.name, error=repr(e))

    def structures(self) -> Dict[str, Dict[str, int]]:
        """Every holder's structure sizes, by holder name."""
        return {h.name: h.structures() for h in self.holders}

    def _store_uids(self) -> Set[str]:
        return {p.uid for p in self.store.pods()}


def _ids(ids: Iterable[str]) -> FrozenSet[str]:
    return frozenset(i for i in ids if i)
