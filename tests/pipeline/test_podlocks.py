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


def test_a_lock_in_use_when_its_pod_goes_is_dropped_once_its_last_user_lets_go():
    """A StopPodSandbox's post-hook may still hold the pod's lock when the RemovePodSandbox
    is done and the pod said gone: the lock goes when the hook lets it go, not never."""
    async def story() -> None:
        locks = PodLocks()
        release = asyncio.Event()

        async def post_hook() -> None:
            async with locks.hold("uid-a", "sb-a"):
                await release.wait()

        task = asyncio.ensure_future(post_hook())
        await asyncio.sleep(0)
        locks.forget(PodGone.of_ids("removed", ["uid-a"]))
        assert locks.structures() == {"pods": 1}            # held: kept
        release.set()
        await task
        assert locks.structures() == {"pods": 0} and locks.held() == PodKeys()

    asyncio.run(story())


def test_looking_whether_a_pod_is_busy_makes_no_lock():
    async def story() -> None:
        locks = PodLocks()
        assert not locks.busy("uid-a", "sb-a") and not locks.busy("", "sb-b") and not locks.busy("", "")
        assert locks.structures() == {"pods": 0}
        async with locks.hold("uid-a", "sb-a"):
            assert locks.busy("uid-a", "") and not locks.busy("uid-b", "sb-a")
        async with locks.hold("", "sb-b"):
            assert locks.busy("", "sb-b")
        assert not locks.busy("uid-a", "") and locks.structures() == {"pods": 2}
        # a pod said gone and taken again before its lock went: one lock for it, then none
        async with locks.hold("uid-a", ""):
            locks.forget(PodGone.of_ids("removed", ["uid-a"]))
            async with locks.hold("", "sb-c"):
                pass
        assert locks.held() == PodKeys.of([], ["sb-b", "sb-c"])

    asyncio.run(story())
