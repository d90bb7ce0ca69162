"""Per-pod locks go with their pod, never from under a call that holds or awaits one."""

from __future__ import annotations

import asyncio
import threading

from anolisnuma.pipeline.podlocks import PodLocks
from anolisnuma.state.gone import PodGone, PodKeys


def test_a_gone_pods_lock_is_dropped_unless_a_call_holds_or_awaits_it():
    async def story() -> None:
        locks = PodLocks()
        order = []

        async def call(name: str, uid: str) -> None:
            async with locks.hold(uid, ""):
                order.append(f"{name} in")
                for _ in range(3):
                    await asyncio.sleep(0)
                order.append(f"{name} out")

        async with locks.hold("uid-a", ""):
            waiter = asyncio.ensure_future(call("second", "uid-a"))
            await asyncio.sleep(0)                 # the second call waits for the lock
        # released: the waiter is woken but has not run yet (asyncio.Lock says unlocked)
        locks.forget(PodGone.of_ids("removed", ["uid-a"]))
        late = asyncio.ensure_future(call("third", "uid-a"))
        await asyncio.gather(waiter, late)
        assert order == ["second in", "second out", "third in", "third out"]   # one after the other
        locks.forget(PodGone.of_ids("removed", ["uid-a"]))
        assert locks.held() == PodKeys() and locks.structures() == {"pods": 0}

    asyncio.run(story())


def test_forget_from_another_thread_drops_on_the_loop():
    async def story() -> None:
        locks = PodLocks()
        async with locks.hold("", "sandbox-1"):   # a pod known only by its sandbox
            pass
        assert locks.held() == PodKeys.of([], ["sandbox-1"])
        t = threading.Thread(target=locks.forget, args=(PodGone.of_ids("resync", sandbox_ids=["sandbox-1"]),))
        t.start()
        t.join()
        for _ in range(10):
            if not locks.structures()["pods"]:
                break
            await asyncio.sleep(0)
        assert locks.structures() == {"pods": 0}

    asyncio.run(story())
