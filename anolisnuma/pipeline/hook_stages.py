"""Running a call's hook stages: in order per pod, within budgets, on a thread or on the loop.

:class:`HookStages` is the part of the :class:`~anolisnuma.pipeline.interceptor.Interceptor`
that runs the pre- and post-hooks of one call (its state is the interceptor's: the
executor, the configuration, the pod locks, the counters and statistics).

- A stage runs on a worker thread by default, bounded by its hook's budget: a thread cannot
  be stopped, so while ``MAX_OVERRUNNING`` calls of a hook still run past their budget, its
  next calls fail at once instead of taking every worker.
- A stage its hook says only computes in memory (:meth:`Hook.inline`) runs on the event
  loop: two thread switches fewer. It cannot be cut off either; one that took longer than
  ``INLINE_LIMIT_SECONDS`` ``INLINE_STRIKES`` times goes to the threads for good.
- When every stage of a call is to run on the loop and no other call of its pod holds or
  waits for the pod's lock, the stages run at once, without a task, a lock or a timer
  (:meth:`HookStages.pre_now`, :meth:`HookStages.post_now`): nothing can come in between,
  the loop being one thread. Otherwise they run as a task under the pod's lock, so that the
  hooks of one pod's calls run in the order the calls came.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import structlog

from anolisnuma.cri import grpcwire
from anolisnuma.pipeline import hooks as H
from anolisnuma.pipeline.decision import Decision
from anolisnuma.pipeline.podlocks import PodLock

log = structlog.get_logger("anolisnuma.pipeline")

# Calls of one hook allowed to run on past their budget before the hook is skipped.
MAX_OVERRUNNING = 2
# A hook stage run on the event loop (Hook.inline) that took longer than this INLINE_STRIKES
# times runs on the worker threads from then on: the loop answers every other call meanwhile.
# (Not at the first time: on a busy machine any stage may lose its CPU for a while.)
INLINE_LIMIT_SECONDS = 0.005
INLINE_STRIKES = 3


class HookStages:
    """Mixed into the Interceptor; ``pc`` is its PipelineCall."""

    # (the Interceptor's, set in its __init__)
    config: Any
    counters: Any
    hook_stats: Any
    executor: Any
    pod_locks: Any
    journal: Any
    nri_hook_budget: float
    _overrunning: Dict[str, int]
    _long_inline: Dict[Tuple[str, str, str], int]

    # ---------------------------------------------------------------- at once, or as a task
    def runs_now(self, pc: Any, hooks: Sequence[H.Hook], stage: str) -> bool:
        """Whether ``hooks``' ``stage`` of this call can run right here: all on the loop,
        and the pod's lock free (no earlier call of the pod still to finish its hooks)."""
        return (all(self._inline(pc, hook, stage) for hook in hooks)
                and not self._pod_busy(pc.call))

    def pre_now(self, pc: Any, hooks: Sequence[H.Hook], original: bytes) -> Decision:
        for hook in hooks:
            attempt, work = self._attempt(pc)
            refused = self._after_pre(pc, hook, attempt, work, self._run_hook_now(pc, hook, "pre", attempt))
            if refused is not None:
                return refused
        return self._forwarded(pc, original)

    async def _run_pre(self, pc: Any, hooks: List[H.Hook], original: bytes) -> Decision:
        async with self._lock_for(pc.call):
            for hook in hooks:
                attempt, work = self._attempt(pc)
                refused = self._after_pre(pc, hook, attempt, work, await self._run_hook(pc, hook, "pre", attempt))
                if refused is not None:
                    return refused
        return self._forwarded(pc, original)

    def post_now(self, pc: Any, hooks: Sequence[H.Hook]) -> None:
        for hook in hooks:
            self._run_hook_now(pc, hook, "post", pc.call)
        self._post_done(pc)

    async def _run_post(self, pc: Any, hooks: List[H.Hook]) -> None:
        async with self._lock_for(pc.call):
            for hook in hooks:
                await self._run_hook(pc, hook, "post", pc.call)
        self._post_done(pc)

    def _post_done(self, pc: Any) -> None:
        if pc.entry is not None:
            self.journal.amend(pc.entry, pc.call.notes, pc.failures)
        self._tell_gone(pc)

    def _tell_gone(self, pc: Any) -> None:   # (the Interceptor's)
        raise NotImplementedError

    # ---------------------------------------------------------------- one pre-hook's turn
    @staticmethod
    def _attempt(pc: Any) -> Tuple[H.Call, Any]:
        """What a pre-hook gets: a copy of the request, so that a failed hook's half-made
        edits are dropped."""
        call = pc.call
        work = type(call.request)()
        work.CopyFrom(call.request)
        return H.Call(method=call.method, request=work, pod=call.pod, container=call.container, log=pc.log,
                      notes=call.notes), work

    def _after_pre(self, pc: Any, hook: H.Hook, attempt: H.Call, work: Any,
                   error: Optional[BaseException]) -> Optional[Decision]:
        """Keep a pre-hook's edits, or the refusal its failure policy makes of its error."""
        call = pc.call
        if error is None:
            if attempt.modified:
                call.request = work
                call.modified = True
            return None
        if self.config.settings(hook.name).failure_policy == "fail":
            code = error.code if isinstance(error, H.HookRefused) else "UNKNOWN"
            status = grpcwire.STATUS_CODES.get(code, grpcwire.STATUS_CODES["UNKNOWN"])
            self.counters.add("calls_refused")
            return Decision.refuse(status, f"anolisnuma hook {hook.name}: {error}")
        return None

    @staticmethod
    def _forwarded(pc: Any, original: bytes) -> Decision:
        call = pc.call
        if not call.modified or pc.via_nri:   # (NRI reads the edited request itself: no bytes)
            return Decision.forward(original)
        return Decision.forward(grpcwire.frame_message(call.request.SerializeToString()))

    # ---------------------------------------------------------------- one stage
    def _budget(self, pc: Any, hook: H.Hook) -> float:
        budget = self.config.settings(hook.name).budget_seconds
        if pc.via_nri and self.nri_hook_budget > 0:
            budget = min(budget, self.nri_hook_budget)
        return budget

    def _inline(self, pc: Any, hook: H.Hook, stage: str) -> bool:
        inline = getattr(hook, "inline", None)   # (a hook written to the protocol, not the base class, has none)
        return (inline is not None and self._long_inline.get((hook.name, pc.method, stage), 0) < INLINE_STRIKES
                and inline(pc.method, stage))

    async def _run_hook(self, pc: Any, hook: H.Hook, stage: str, call: H.Call) -> Optional[BaseException]:
        """Run one hook stage within its budget; the error it raised (or a timeout), else None."""
        budget = self._budget(pc, hook)
        started = time.perf_counter()
        if self._overrunning.get(hook.name, 0) >= MAX_OVERRUNNING:
            error: Optional[BaseException] = TimeoutError(
                f"earlier calls still run past the budget of {budget:g}s; not called")
        elif self._inline(pc, hook, stage):
            error = self._on_loop(pc, hook, stage, call, budget)
        else:
            error = await self._in_thread(hook, hook.pre if stage == "pre" else hook.post, call, budget)
        return self._stage_done(pc, hook, stage, started, error)

    def _run_hook_now(self, pc: Any, hook: H.Hook, stage: str, call: H.Call) -> Optional[BaseException]:
        """:meth:`_run_hook` for a stage that runs on the loop (``runs_now`` said so)."""
        started = time.perf_counter()
        return self._stage_done(pc, hook, stage, started, self._on_loop(pc, hook, stage, call, self._budget(pc, hook)))

    def _stage_done(self, pc: Any, hook: H.Hook, stage: str, started: float,
                    error: Optional[BaseException]) -> Optional[BaseException]:
        self.hook_stats.observe((hook.name, stage, "ok" if error is None else "failed"),
                                time.perf_counter() - started)
        if error is None:
            self.counters.add(f"hook_{hook.name}_{stage}_ok")
            return None
        self.counters.add(f"hook_{hook.name}_{stage}_failed")
        pc.failures.append(f"{hook.name} {stage}: {str(error) or repr(error)}"[:512])
        policy = self.config.settings(hook.name).failure_policy
        pc.log.warning("hook failed", hook=hook.name, stage=stage, error=str(error) or repr(error),
                       policy=policy if stage == "pre" else "ignore (post-hook)",
                       elapsed_ms=round((time.perf_counter() - started) * 1000, 3))
        return error

    def _on_loop(self, pc: Any, hook: H.Hook, stage: str, call: H.Call, budget: float) -> Optional[BaseException]:
        """Run a stage the hook says only computes in memory (``Hook.inline``) right here.
        It cannot be cut off, so a stage that took longer than ``INLINE_LIMIT_SECONDS``
        ``INLINE_STRIKES`` times goes to the worker threads from its next call on (said
        then), and one past its budget counts as timed out, as on a thread."""
        started = time.perf_counter()
        error: Optional[BaseException] = None
        try:
            (hook.pre if stage == "pre" else hook.post)(call)
        except Exception as e:   # a hook must never take the proxy down
            error = e
        took = time.perf_counter() - started
        key = (hook.name, pc.method, stage)
        strikes = self._long_inline[key] = self._long_inline.get(key, 0) + (took > INLINE_LIMIT_SECONDS)
        if strikes == INLINE_STRIKES and took > INLINE_LIMIT_SECONDS:
            self.counters.add("hook_stages_moved_off_loop")
            log.warning("a hook stage ran long on the event loop; it runs on worker threads from now on",
                        hook=hook.name, method=pc.method, stage=stage, elapsed_ms=round(took * 1000, 3),
                        limit_ms=INLINE_LIMIT_SECONDS * 1000)
        if error is None and took > budget:
            error = TimeoutError(f"exceeded its budget of {budget:g}s")
        return error

    async def _in_thread(self, hook: H.Hook, fn: Any, call: H.Call, budget: float) -> Optional[BaseException]:
        """Run ``fn(call)`` on a worker thread within ``budget``; what it raised, else None."""
        try:
            fut = asyncio.get_running_loop().run_in_executor(self.executor, fn, call)
        except Exception as e:   # no thread, no memory, the executor shut down: it never ran
            return H.HookRefused(f"could not be run: {e!r}", code="UNAVAILABLE")
        try:
            await asyncio.wait_for(asyncio.shield(fut), budget)
        except asyncio.TimeoutError:
            self._overrunning[hook.name] = self._overrunning.get(hook.name, 0) + 1
            fut.add_done_callback(lambda _f, name=hook.name: self._overran(name))
            return TimeoutError(f"exceeded its budget of {budget:g}s")
        except Exception as e:  # a hook must never take the proxy down
            return e
        return None

    def _overran(self, name: str) -> None:
        self._overrunning[name] -= 1

    def _pod_busy(self, call: H.Call) -> bool:
        """Whether an earlier call of the pod still holds or waits for its lock (looked at
        without making one: a call whose stages run at once never needs it)."""
        return self.pod_locks.busy(*_pod_keys(call))

    def _lock_for(self, call: H.Call) -> PodLock:
        return self.pod_locks.hold(*_pod_keys(call))


def _pod_keys(call: H.Call) -> Tuple[str, str]:
    """(uid, sandbox id) of the pod whose lock orders ``call``'s hooks (PodLocks)."""
    if call.pod is not None:
        return call.pod.uid, call.pod.sandbox_id
    return "", call.container.sandbox_id if call.container is not None else ""
