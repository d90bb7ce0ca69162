"""``NriFrontEnd``: containerd's NRI events through the same pipeline as the kubelet's calls.

Each event is translated into the CRI request the kubelet sent for it (``translate.py``)
and run through the :class:`~anolisnuma.pipeline.interceptor.Interceptor` as if the relay
had received it: pre-hooks (which may edit the cpuset or refuse), then the "reply" that
containerd's own handling amounts to, then the post-hooks. The store, the pod locks, the
hooks' budgets and failure policies, the journal, the decision events and the metrics are
therefore the proxy's, call for call:

==========================  ==========================  =======================================
NRI event (containerd 2.x)   runs as                      answered to containerd with
==========================  ==========================  =======================================
RunPodSandbox (sandbox up)   RunPodSandbox                 --
CreateContainer              CreateContainer               the hooks' cpuset as ContainerAdjustment
StartContainer (task made,   StartContainer                --
not yet started)
UpdateContainer              UpdateContainerResources      the hooks' cpuset as a ContainerUpdate
StopContainer                StopContainer                 --
RemoveContainer              RemoveContainer               --
StopPodSandbox               StopPodSandbox                --
RemovePodSandbox             RemovePodSandbox              --
==========================  ==========================  =======================================

A refusal (a pre-hook under ``failure_policy = "fail"``) is raised as
:class:`~anolisnuma.nri.session.NriRequestError` with the call's gRPC code: containerd then
fails the CRI call that caused the event, as it would have failed through the proxy.

The interceptor lives on the daemon's event loop, and so does the NRI session
(``session.py``): each event method is a coroutine the session's task awaits on that loop,
so an event crosses no thread but its hooks' executor hop (``Interceptor._run_hook``).
"""

from __future__ import annotations

import asyncio
from typing import Any, Dict, Optional, Tuple

import structlog

from anolisnuma.cri import grpcwire
from anolisnuma.nri import translate
from anolisnuma.nri.session import NriRequestError
from anolisnuma.pipeline import hooks as H
from anolisnuma.pipeline.decision import Decision
from cri_proto import api_pb2 as cri
from nri_proto import api_pb2 as nri

log = structlog.get_logger("anolisnuma.nri")

# The NRI events this front-end takes, and the CRI method each runs as (the table above).
EVENT_METHODS: Dict[int, str] = {
    nri.RUN_POD_SANDBOX: H.RUN_POD_SANDBOX, nri.STOP_POD_SANDBOX: H.STOP_POD_SANDBOX,
    nri.REMOVE_POD_SANDBOX: H.REMOVE_POD_SANDBOX, nri.CREATE_CONTAINER: H.CREATE_CONTAINER,
    nri.START_CONTAINER: H.START_CONTAINER, nri.UPDATE_CONTAINER: H.UPDATE_CONTAINER_RESOURCES,
    nri.STOP_CONTAINER: H.STOP_CONTAINER, nri.REMOVE_CONTAINER: H.REMOVE_CONTAINER,
}

# for a call the pipeline did not finish within the time containerd gives us
_DEADLINE_EXCEEDED = grpcwire.STATUS_CODES["DEADLINE_EXCEEDED"]


class NriFrontEnd:
    """``NriFrontEnd(interceptor, loop)``; ``timeout`` bounds each event (containerd's own
    ``plugin_request_timeout`` is 2 s and closes a plugin that overruns it)."""

    def __init__(self, interceptor: Any, loop: asyncio.AbstractEventLoop, timeout: float = 2.0) -> None:
        self.interceptor = interceptor
        self.loop = loop
        self.timeout = timeout

    def fit_to(self, request_timeout: float) -> None:
        """Take containerd's ``plugin_request_timeout``: we answer within 90 % of it, and
        each hook's budget on an NRI event is cut so that all the hooks of one event fit in
        80 % of it. The pipeline then times a slow hook out itself (its failure policy
        decides, as through the proxy) before containerd gives up on us: what we answer is
        what the pipeline decided, and what the hooks recorded agrees with it."""
        self.timeout = max(request_timeout * 0.9, 0.1)
        hooks = max(len(self.interceptor.hooks), 1)
        self.interceptor.nri_hook_budget = max(request_timeout * 0.8 / hooks, 0.05)
        over = {h.name: self.interceptor.config.settings(h.name).budget_seconds for h in self.interceptor.hooks
                if self.interceptor.config.settings(h.name).budget_seconds > self.interceptor.nri_hook_budget}
        if over:
            log.info("NRI: hook budgets cut to fit containerd's request timeout", request_timeout_seconds=request_timeout,
                     budget_seconds=round(self.interceptor.nri_hook_budget, 3), configured=over)

    def events(self) -> Tuple[int, ...]:
        """The NRI events to subscribe to: those whose method a hook or the store acts on
        (``Interceptor.methods_acted_on``), every one while the hooks are not built.

        containerd waits for a subscribed plugin's answer before it goes on with the
        container, so an event nothing here acts on is not asked for: with NUMA alone
        (no hook on StartContainer or StopContainer) a pod start is two events, not three.
        The hooks are fixed for the daemon's life (a policy change needs a restart), and
        so is this set."""
        wanted = self.interceptor.methods_acted_on()
        return tuple(e for e, method in EVENT_METHODS.items() if wanted is None or method in wanted)

    # ------------------------------------------------------------------ events
    # (coroutines, on the loop; each raises NriRequestError for a refusal or an overrun)
    async def run_pod_sandbox(self, pod: Any) -> None:
        await self._call(H.RUN_POD_SANDBOX, *translate.run_pod_sandbox(pod))

    async def create_container(self, pod: Any, ctr: Any) -> Any:
        """The ``ContainerAdjustment`` for a container about to be created."""
        req, reply = translate.create_container(pod, ctr)
        edited = await self._call(H.CREATE_CONTAINER, req, reply)
        return translate.adjustment(req, edited)

    async def start_container(self, ctr: Any) -> None:
        await self._call(H.START_CONTAINER, cri.StartContainerRequest(container_id=ctr.id),
                         cri.StartContainerResponse())

    async def update_container(self, ctr: Any, resources: Any) -> Optional[Any]:
        """The ``ContainerUpdate`` for a container being updated, or None."""
        req = translate.update_container(ctr, resources)
        edited = await self._call(H.UPDATE_CONTAINER_RESOURCES, req, cri.UpdateContainerResourcesResponse())
        return translate.container_update(ctr.id, req, edited)

    async def stop_container(self, ctr: Any) -> None:
        await self._call(H.STOP_CONTAINER, cri.StopContainerRequest(container_id=ctr.id),
                         cri.StopContainerResponse())

    async def remove_container(self, ctr: Any) -> None:
        await self._call(H.REMOVE_CONTAINER, cri.RemoveContainerRequest(container_id=ctr.id),
                         cri.RemoveContainerResponse())

    async def stop_pod_sandbox(self, pod: Any) -> None:
        await self._call(H.STOP_POD_SANDBOX, cri.StopPodSandboxRequest(pod_sandbox_id=pod.id),
                         cri.StopPodSandboxResponse())

    async def remove_pod_sandbox(self, pod: Any) -> None:
        await self._call(H.REMOVE_POD_SANDBOX, cri.RemovePodSandboxRequest(pod_sandbox_id=pod.id),
                         cri.RemovePodSandboxResponse())

    # ------------------------------------------------------------------ the pipeline
    async def _call(self, method: str, request: Any, reply: Any) -> Any:
        """Run one call through the pipeline within ``timeout``; the request as the
        pre-hooks left it. No task of its own: a call no hook holds is decided at once, and
        one whose hooks run is the pipeline's task, waited for here up to the deadline."""
        ic = self.interceptor
        pc = ic.begin_nri(method)
        # (the messages go in as they are: no bytes to make and read again)
        outcome = ic.on_request(pc, b"", message=request)
        if not isinstance(outcome, Decision):
            done, _ = await asyncio.wait((outcome,), timeout=self.timeout)
            if not done:
                # Not the hooks (their budgets fit, fit_to): the call waited for its pod's
                # lock behind another, or the loop is starved. containerd is about to give up
                # on us and close the connection; the call still finishes on its own (its
                # hooks recorded what they did: the store must agree), unanswered.
                outcome.add_done_callback(lambda f: self._finish_late(pc, reply, f))
                ic.counters.add("nri_events_past_deadline")
                log.warning("NRI: an event took longer than containerd waits", method=method,
                            timeout_seconds=self.timeout)
                raise NriRequestError(_DEADLINE_EXCEEDED, f"anolisnuma: {method} took more than {self.timeout:g}s")
            outcome = outcome.result()   # (what the pipeline raised, raised here: the plugin's to contain)
        # containerd waits for the answer, not for the call's bookkeeping: that runs right
        # after the answer is written (_finish_soon), as the proxy runs a call's post-hooks
        # once its reply is on the way
        self._finish_soon(pc, outcome, reply)
        if outcome.status:
            raise NriRequestError(outcome.status, outcome.message)
        return pc.call.request if pc.call is not None else request   # (as the pre-hooks left it)

    def _finish_soon(self, pc: Any, decision: Decision, reply: Any) -> None:
        """:meth:`_finish` on the loop's next turn: after this event's answer is written (the
        rest of the event's handling, up to the write, runs in the same step) and before
        any event read later, so the pod's next event finds the call recorded."""
        self.loop.call_soon(self._finish_logged, pc, decision, reply)

    def _finish_logged(self, pc: Any, decision: Decision, reply: Any) -> None:
        try:
            self._finish(pc, decision, reply)
        except Exception as e:   # (the answer is out; a callback's error would only reach asyncio's handler)
            log.error("NRI: finishing an answered event failed", method=pc.method, error=repr(e)[:300])

    async def settled(self) -> None:
        """Return once the events answered so far have finished their bookkeeping (their
        record, log line, journal, inline post-hooks; a post-hook on a thread is the
        interceptor's to settle): one turn of the loop, on which :meth:`_finish_soon` put them."""
        await asyncio.sleep(0)

    def _finish(self, pc: Any, decision: Decision, reply: Any) -> None:
        """The pipeline's end of a decided call (its record, log line, journal, post-hooks)."""
        if decision.status:
            self.interceptor.on_reply(pc, None, decision.status, decision.message, answered_by_proxy=True)
        else:
            self.interceptor.on_reply(pc, None, 0, "", reply_message=reply)

    def _finish_late(self, pc: Any, reply: Any, outcome: "asyncio.Future[Decision]") -> None:
        if outcome.cancelled() or outcome.exception() is not None:
            return   # (the pipeline logged it; nobody waits for the answer any more)
        try:
            self._finish(pc, outcome.result(), reply)
        except Exception as e:   # a callback's error would only reach asyncio's handler
            log.error("NRI: finishing an event answered past its deadline failed", error=repr(e)[:300])
