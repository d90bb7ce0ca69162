"""``PodLocks``: one asyncio lock per pod, so that the hooks of one pod's calls run in the
order the calls came (a CreateContainer pre-hook sees what the RunPodSandbox post-hook did).

A pod is keyed by its UID, or by its sandbox ID while the pipeline knows no UID for it
(an ID-only call for a pod the store never saw); calls that name no pod at all share one
lock. A lock is made when a call first holds it (:meth:`PodLocks.busy` only looks) and
dropped when the :class:`~anolisnuma.state.gone.Reaper` says its pod is gone, or, when a
call holds or waits for it then (a StopPodSandbox's post-hook still running when the
RemovePodSandbox is done), once the last of them lets it go. The locks belong to the event
loop: :meth:`PodLocks.forget`, called from any thread, drops them on the loop, where no
call can be between finding a lock and taking it.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Callable, Dict, Iterable, Optional

from anolisnuma.state.gone import PodGone, PodKeys, PodStateHolder


class PodLocks(PodStateHolder):
    name = "pod_locks"

    def __init__(self) -> None:
        self._by_uid: Dict[str, PodLock] = {}
        self._by_sandbox: Dict[str, PodLock] = {}
        self._anonymous: Optional[PodLock] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None

    def hold(self, uid: str, sandbox_id: str) -> "PodLock":
        """``async with locks.hold(uid, sandbox_id):`` the pod ``uid`` (or, without one,
        ``sandbox_id``) is this call's until the block ends; event loop only."""
        self._loop = asyncio.get_running_loop()
        if uid:
            table, key = self._by_uid, uid
        elif sandbox_id:
            table, key = self._by_sandbox, sandbox_id
        else:
            if self._anonymous is None:
                self._anonymous = PodLock()
            return self._anonymous
        lock = table.get(key)
        if lock is None:
            lock = table[key] = PodLock()
        return lock

    def busy(self, uid: str, sandbox_id: str) -> bool:
        """Whether a call holds or waits for the lock ``hold(uid, sandbox_id)`` would give,
        without making one; event loop only."""
        if uid:
            lock = self._by_uid.get(uid)
        elif sandbox_id:
            lock = self._by_sandbox.get(sandbox_id)
        else:
            lock = self._anonymous
        return lock is not None and lock.users > 0

    # ---------------------------------------------------------------- PodStateHolder
    def held(self) -> PodKeys:
        return PodKeys.of(list(self._by_uid), list(self._by_sandbox))

    def forget(self, gone: PodGone) -> None:
        loop = self._loop
        if loop is None or not (gone.uids or gone.sandbox_ids):
            return
        if _on(loop):
            self._drop(gone.uids, gone.sandbox_ids)
        else:
            try:
                loop.call_soon_threadsafe(self._drop, gone.uids, gone.sandbox_ids)
            except RuntimeError:   # the loop is closed: the daemon stopped
                pass

    def structures(self) -> Dict[str, int]:
        return {"pods": len(self._by_uid) + len(self._by_sandbox)}

    def _drop(self, uids: Iterable[str], sandbox_ids: Iterable[str]) -> None:
        for table, keys in ((self._by_uid, uids), (self._by_sandbox, sandbox_ids)):
            for key in keys:
                lock = table.get(key)
                if lock is None:
                    continue
                if lock.users:
                    lock.when_free = functools.partial(_drop_if_same, table, key, lock)
                else:
                    del table[key]


def _drop_if_same(table: Dict[str, "PodLock"], key: str, lock: "PodLock") -> None:
    # (a call for the pod after it was said gone finds this same lock, or makes a new one
    # once it was dropped: either way one lock per key at a time)
    if table.get(key) is lock and not lock.users:
        del table[key]


class PodLock:
    """An asyncio lock that counts the calls holding or waiting for it: an unlocked lock
    may still have a waiter about to take it (asyncio wakes the next waiter on release),
    and dropping it then would let that waiter and a later call run side by side."""

    __slots__ = ("_lock", "users", "when_free")

    def __init__(self) -> None:
        # made on the event loop (by PodLocks.hold): on Python 3.9 a lock binds to the
        # loop current where it is made
        self._lock = asyncio.Lock()
        self.users = 0
        self.when_free: Optional[Callable[[], None]] = None   # its pod is gone: drop it then

    async def __aenter__(self) -> None:
        self.users += 1
        try:
            await self._lock.acquire()
        except BaseException:
            self.users -= 1
            raise

    async def __aexit__(self, *exc: object) -> None:
        self._lock.release()
        self.users -= 1
        if not self.users and self.when_free is not None:
            when_free, self.when_free = self.when_free, None
            when_free()


def _on(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
