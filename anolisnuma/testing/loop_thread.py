"""An asyncio event loop on a thread of its own, for tests that drive loop-owned objects
(the NRI session, the plugin) from the test's thread as the daemon's threads do."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Awaitable, Optional


class LoopThread:
    """``with LoopThread() as lt:`` a running loop (``lt.loop``); :meth:`run` waits for a
    coroutine on it. Leaving stops the loop and joins its thread (within ``timeout``)."""

    def __init__(self, timeout: float = 30.0) -> None:
        self.loop = asyncio.new_event_loop()
        self.timeout = timeout
        self._thread = threading.Thread(target=self.loop.run_forever, name="test_loop", daemon=True)

    def __enter__(self) -> "LoopThread":
        self._thread.start()
        return self

    def run(self, coro: Awaitable[Any], timeout: Optional[float] = None) -> Any:
        """What ``coro`` returns (or raises), run on the loop; waits at most ``timeout``."""
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)  # type: ignore[arg-type]
        return fut.result(timeout or self.timeout)

    def __exit__(self, *exc: Any) -> None:
        # as asyncio.run ends: what still runs is cancelled and finished, transports closed,
        # so that nothing is left for the garbage collector to report at a random moment
        try:
            self.run(_finish_tasks())
        except Exception:
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(self.timeout)
        if not self._thread.is_alive():
            self.loop.close()


async def _finish_tasks() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.sleep(0)   # (a transport aborted meanwhile closes its socket on the next turn)
