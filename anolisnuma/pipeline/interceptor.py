"""The interception pipeline: decode → pre-hooks → forward → post-hooks.

The relay calls :meth:`Interceptor.begin` for every new stream; only the eight lifecycle
methods of ``runtime.v1.RuntimeService`` get a :class:`PipelineCall`, everything else is
relayed without a second look. For those, the request is decoded (upb protobuf), recorded,
logged, shown to the pre-hooks, and forwarded as the original bytes unless a hook edited
it. The reply is copied for the store and the post-hooks without being held back.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, FrozenSet, List, Optional, Set, Tuple, Union

import structlog
from google.protobuf.message import DecodeError

from anolisnuma.config import HooksConfig
from anolisnuma.cri import grpcwire, methods
from anolisnuma.logsummary import EventSummary
from anolisnuma.pipeline import hooks as H
from anolisnuma.pipeline.decision import Decision
from anolisnuma.pipeline.context import container_from_create, describe, pod_from_sandbox_config, resources_of
from anolisnuma.pipeline.journal import JournalEntry, PodJournal
from anolisnuma.pipeline.metrics import Counters, LatencyStats
from anolisnuma.pipeline.hook_stages import HookStages
from anolisnuma.pipeline.podlocks import PodLocks
from anolisnuma.pipeline.recent import RecentCalls
from anolisnuma.state.gone import PodGone, Reaper
from anolisnuma.state.records import PodRecord
from anolisnuma.state.store import Store
from anolisnuma.workers import WorkerPool

log = structlog.get_logger("anolisnuma.pipeline")

# Hook calls that run at once (on a pool started with the daemon: see anolisnuma.workers).
HOOK_THREADS = 8
# The kubelet stops and removes what may already be gone; containerd before 1.7 answers that
# with NOT_FOUND, which the kubelet takes as done. Logged as a warning it would be noise.
_NOT_FOUND = grpcwire.STATUS_CODES["NOT_FOUND"]
_IDEMPOTENT_TEARDOWN = frozenset((H.STOP_POD_SANDBOX, H.REMOVE_POD_SANDBOX, H.STOP_CONTAINER, H.REMOVE_CONTAINER))

# The calls whose outcome the store keeps (_record), whichever hooks run: the pods and
# containers made, their resources changed, and their removal (the reaper's release).
RECORDED = frozenset((H.RUN_POD_SANDBOX, H.CREATE_CONTAINER, H.UPDATE_CONTAINER_RESOURCES,
                      H.REMOVE_CONTAINER, H.REMOVE_POD_SANDBOX))

# log messages in the anolisbox style: "<what> request from kubelet" / "... reply from containerd"
_WORDS = {
    H.RUN_POD_SANDBOX: "run pod sandbox", H.STOP_POD_SANDBOX: "stop pod sandbox",
    H.REMOVE_POD_SANDBOX: "remove pod sandbox", H.CREATE_CONTAINER: "create container",
    H.START_CONTAINER: "start container", H.STOP_CONTAINER: "stop container",
    H.REMOVE_CONTAINER: "remove container", H.UPDATE_CONTAINER_RESOURCES: "update container resources",
}


class PipelineCall:
    """One intercepted call on its way through the pipeline.

    ``holds_request``: some pre-hook may edit or refuse the call, so the relay must hold
    the request until :meth:`Interceptor.on_request` decided; otherwise the request streams
    through and :meth:`Interceptor.on_forwarded` only records it.
    """

    __slots__ = ("spec", "started", "call", "skip_hooks", "log", "holds_request", "failures", "entry", "gone",
                 "via_nri")

    def __init__(self, spec: methods.MethodSpec, holds_request: bool = True, via_nri: bool = False) -> None:
        self.spec = spec
        self.via_nri = via_nri   # an NRI event of containerd's, not a kubelet call through the relay
        self.started = time.perf_counter()
        self.call: Optional[H.Call] = None
        self.skip_hooks = False
        self.log = log
        self.holds_request = holds_request
        self.failures: List[str] = []            # "<hook> <stage>: <error>", for the journal
        self.entry: Optional[JournalEntry] = None
        self.gone: Optional[PodGone] = None      # what a successful removal ended

    @property
    def method(self) -> str:
        return self.spec.name


class Interceptor(HookStages):
    """Implements the relay's interception interface with hooks, a store and logs."""

    def __init__(self, hooks: Optional[List[H.Hook]], config: HooksConfig, store: Store,
                 executor: Optional[ThreadPoolExecutor] = None, max_message_bytes: int = 16 << 20) -> None:
        """``hooks=None``: they are still being built (the daemon listens first); until
        :meth:`set_hooks` or :meth:`hooks_failed`, every intercepted request is held and
        waits for them, so none passes before its policies exist."""
        self.config = config
        self.store = store
        self.max_message_bytes = max_message_bytes
        self.executor = executor or WorkerPool(HOOK_THREADS, "hook")
        self.counters = Counters()
        # read at scrape time by the metrics endpoint, and by `anolisnuma-ctl explain`
        self.call_stats = LatencyStats()    # (method, gRPC code name)
        self.hook_stats = LatencyStats()    # (hook, stage, "ok" | "failed")
        self.journal = PodJournal()
        self.recent = RecentCalls()         # what calls named lately: a resync leaves it alone
        self.pod_locks = PodLocks()
        # decides what is gone (removals here, the resync) and tells every holder of pod state
        self.reaper = Reaper(store)
        self.reaper.add(self.pod_locks)
        self.reaper.add(self.journal)
        # False in NRI mode: the relay then passes every call unchanged and the policies act
        # on containerd's NRI events only (anolisnuma/nri), never twice on one pod.
        self.relay_hooks = True
        # NRI mode: the most a hook may take on an NRI event, so that every hook of the event
        # fits in containerd's plugin_request_timeout (set by the NRI plugin at Configure;
        # 0: each hook's own budget)
        self.nri_hook_budget = 0.0
        self.hooks: List[H.Hook] = []
        self._pre: Dict[str, List[H.Hook]] = {m: [] for m in methods.INTERCEPTED}
        self._post: Dict[str, List[H.Hook]] = {m: [] for m in methods.INTERCEPTED}
        self._ready = hooks is not None
        self._unavailable = ""        # why the hooks will never be ready
        self._waiting: List["asyncio.Future[None]"] = []
        self._after_reply: Set["asyncio.Future[Any]"] = set()   # post-hooks, releases (settle)
        if hooks is not None:
            self.set_hooks(hooks)
        self._skip_keys = tuple(config.skip_keys)
        self._overrunning: Dict[str, int] = {}
        self._long_inline: Dict[Tuple[str, str, str], int] = {}   # inline stages that ran long, how often
        self._debug = False
        # A client can reset intercepted streams at will: one line per kind, then counts.
        self.aborts = EventSummary(log, "intercepted call ended without a reply")
        # Whatever exhausts the daemon (memory, threads) may fail every call at once.
        self._failures = EventSummary(log, "interception failed; the failure policy decides", level="error")

    def set_debug(self, enabled: bool) -> None:
        self._debug = enabled

    def set_config(self, config: HooksConfig) -> None:
        """New per-hook budgets, failure policies and opt-out keys (a reload)."""
        self.config = config
        self._skip_keys = tuple(config.skip_keys)

    def set_hooks(self, hooks: List[H.Hook]) -> None:
        """The hooks are built: calls waiting for them go on (event loop only)."""
        self.hooks = list(hooks)
        self._pre = {m: [h for h in self.hooks if h.wants_pre(m)] for m in methods.INTERCEPTED}
        self._post = {m: [h for h in self.hooks if h.wants_post(m)] for m in methods.INTERCEPTED}
        self._ready = True
        self._wake_waiting()

    def methods_acted_on(self) -> Optional[FrozenSet[str]]:
        """The intercepted methods a call of which anything here acts on: those a hook
        runs on (pre or post) and those the store records (:data:`RECORDED`); None while
        the hooks are not built (any method may then matter). NRI mode subscribes to the
        events of these methods only (``NriFrontEnd.events``)."""
        if not self._ready:
            return None
        hooked = {m for m, hooks in self._pre.items() if hooks} | {m for m, hooks in self._post.items() if hooks}
        return frozenset(hooked | RECORDED)

    def hooks_failed(self, why: str) -> None:
        """The hooks will never be ready (a fail-policy hook could not start): calls
        waiting for them are refused UNAVAILABLE, saying why."""
        self._unavailable = why
        self._wake_waiting()

    @property
    def calls_waiting_for_hooks(self) -> int:
        return len(self._waiting)

    def _wake_waiting(self) -> None:
        waiting, self._waiting = self._waiting, []
        for fut in waiting:
            if not fut.done():
                fut.set_result(None)

    # ---------------------------------------------------------------- relay interface
    def begin(self, path: str) -> Optional[PipelineCall]:
        spec = methods.INTERCEPTED_PATHS.get(path) if self.relay_hooks else None
        if spec is None:
            if self._debug:
                log.debug("pass-through call", method=path)
            return None
        return PipelineCall(spec, holds_request=not self._ready or bool(self._pre[spec.name]))

    def begin_nri(self, method: str) -> PipelineCall:
        """A call for one of containerd's NRI events, translated into the CRI request the
        kubelet would have sent (``anolisnuma/nri/frontend.py``): it takes the same path
        as a relayed call, minus the relay."""
        return PipelineCall(methods.INTERCEPTED[method], holds_request=True, via_nri=True)

    def on_request(self, pc: PipelineCall, body: bytes,
                   message: Any = None) -> Union[Decision, "asyncio.Future[Decision]"]:
        """Decide what to do with a complete held request: forward it (original or edited)
        or answer it with a status. A request that cannot be read is refused, naming why:
        the policies it must pass cannot be applied to it. ``message``: the request
        already decoded (an NRI event's, made by the front-end; ``body`` is then unused)."""
        if self._unavailable:
            return Decision.refuse(grpcwire.STATUS_CODES["UNAVAILABLE"], f"anolisnuma: {self._unavailable}")
        if not self._ready:
            # The waiter is registered now, not when the coroutine first runs: the hooks may
            # become ready before then, and a waiter added after the wake-up waits forever.
            ready = asyncio.get_running_loop().create_future()
            self._waiting.append(ready)
            return asyncio.ensure_future(self._when_ready(pc, body, ready, message))
        request, why = (message, "") if message is not None else self._read(body, pc.spec.request)
        if request is None:
            self.counters.add("requests_unreadable")
            log.warning("cannot read the request; call refused", method=pc.method, reason=why)
            return Decision.refuse(grpcwire.STATUS_CODES["INVALID_ARGUMENT"],
                                   f"anolisnuma cannot read this {pc.method} request ({why}); "
                                   f"its policies cannot be applied")
        self._begin_call(pc, request)
        hooks = self._pre[pc.method]
        if pc.skip_hooks:
            return Decision.forward(body)
        if self.runs_now(pc, hooks, "pre"):   # (no task, lock or timer: hook_stages.py)
            return self.pre_now(pc, hooks, body)
        return asyncio.ensure_future(self._run_pre(pc, hooks, body))

    def failed(self, pc: PipelineCall, body: bytes, error: BaseException) -> Decision:
        """What a held request becomes when the pipeline itself failed on it (out of
        memory, say): refused UNAVAILABLE when a hook it had to pass is fail-closed (while
        the hooks are still being built: when any configured policy is), else forwarded
        as if anolisnuma were not there."""
        fail = self.fail_closed(pc.method)
        self.counters.add("calls_refused" if fail else "pipeline_failures_forwarded")
        self._failures.note((pc.method, type(error).__name__), method=pc.method, error=repr(error)[:300],
                            decision="refused (failure_policy fail)" if fail else "forwarded unchanged")
        if fail:
            return Decision.refuse(grpcwire.STATUS_CODES["UNAVAILABLE"],
                                   f"anolisnuma could not apply its policies to this {pc.method} "
                                   f"({type(error).__name__}); refused, the failure policy is fail")
        return Decision.forward(body)

    def fail_closed(self, method: Optional[str]) -> bool:
        """Whether a ``method`` call the pipeline could not run must be refused rather than
        passed on: a pre-hook it has to pass is fail-closed (``None``, or while the hooks are
        still being built: any configured policy is)."""
        if self._ready and method is not None:
            policies = {self.config.settings(h.name).failure_policy for h in self._pre.get(method, ())}
        else:
            policies = {self.config.default.failure_policy} | {
                s.failure_policy for s in self.config.per_hook.values()}
        return "fail" in policies

    async def _when_ready(self, pc: PipelineCall, body: bytes, ready: "asyncio.Future[None]",
                          message: Any = None) -> Decision:
        await ready
        outcome = self.on_request(pc, body, message)
        return outcome if isinstance(outcome, Decision) else await outcome

    def on_forwarded(self, pc: PipelineCall, body: bytes) -> None:
        """Record and log a request that no pre-hook needed, after it went out."""
        request = self._decode(pc, body, pc.spec.request, "request")
        if request is not None:
            self._begin_call(pc, request)

    def _begin_call(self, pc: PipelineCall, request: Any) -> None:
        call = H.Call(method=pc.method, request=request)
        self._resolve(call)
        self._note_ids(call)
        pc.call = call
        pc.log = log.bind(**describe(call))
        pc.skip_hooks = self._opted_out(call)
        if self._debug:   # (at info the reply's line says it all: one line per decision)
            pc.log.debug(f"{_WORDS[pc.method]} " + ("event from containerd (NRI)" if pc.via_nri
                                                    else "request from kubelet"),
                         hooks="skipped (pod opted out)" if pc.skip_hooks else None)

    def on_reply(self, pc: PipelineCall, body: Optional[bytes], status: int, message: str,
                 answered_by_proxy: bool = False, reply_message: Any = None) -> None:
        """The call's answer: recorded, logged (its one line at info), its post-hooks
        started. ``reply_message``: the reply already decoded (NRI; ``body`` then unused)."""
        seconds = time.perf_counter() - pc.started
        latency_ms = round(seconds * 1000, 3)
        status_name = grpcwire.STATUS_NAMES.get(status, str(status))
        self.call_stats.observe((pc.method, status_name), seconds)
        source = "anolisnuma" if answered_by_proxy else "containerd"
        said = f"{_WORDS[pc.method]} " + ("answered to containerd (NRI)" if pc.via_nri else f"reply from {source}")
        call = pc.call
        reply = None
        if status == 0 and call is not None:
            if reply_message is not None:
                reply = reply_message
            elif body is not None:
                reply = self._decode(pc, body, pc.spec.reply, "reply")
        if call is not None and reply is not None:
            call.reply = reply
            self.recent.note(getattr(reply, "pod_sandbox_id", ""), getattr(reply, "container_id", ""))
            self._record(pc, call)
        notes = call.notes if call is not None and call.notes else None
        logger = pc.log if call is not None else log.bind(method=pc.method)
        skipped = "skipped (pod opted out)" if pc.skip_hooks else None
        if status == 0:
            logger.info(said, status=status_name,
                        latency_ms=latency_ms, decisions=notes, hooks=skipped, **_reply_ids(call))
        else:
            emit = logger.info if status == _NOT_FOUND and pc.method in _IDEMPOTENT_TEARDOWN else logger.warning
            emit(said, status=status_name,
                 error=message[:512], latency_ms=latency_ms, decisions=notes, hooks=skipped)
        if call is not None:
            self._journal(pc, call, status_name, latency_ms, source)
        post = self._post[pc.method] if call is not None and reply is not None and not pc.skip_hooks else []
        if post and self.runs_now(pc, post, "post"):
            self.post_now(pc, post)
        elif post:
            self._track(asyncio.ensure_future(self._run_post(pc, post)))
        else:
            self._tell_gone(pc)

    def _journal(self, pc: PipelineCall, call: H.Call, status_name: str, latency_ms: float, source: str) -> None:
        uid = call.pod.uid if call.pod is not None else ""
        if not uid:
            return
        pc.entry = JournalEntry(pc.method, status_name, latency_ms, _container_of(call), dict(call.notes),
                                list(pc.failures), source)
        self.journal.record(uid, pc.entry)

    def on_abort(self, pc: PipelineCall, why: str) -> None:
        self.call_stats.observe((pc.method, "NO_REPLY"), time.perf_counter() - pc.started)
        ids = describe(pc.call) if pc.call is not None else {"method": pc.method}
        self.aborts.note((pc.method, why), reason=why,
                         latency_ms=round((time.perf_counter() - pc.started) * 1000, 3), **ids)

    def _tell_gone(self, pc: PipelineCall) -> None:
        """Once a removal's hooks are done, every holder of pod state forgets what it
        ended (in a worker: a holder may write its state file)."""
        if pc.gone is None:
            return
        try:
            fut = asyncio.get_running_loop().run_in_executor(self.executor, self.reaper.tell, pc.gone)
        except Exception as e:   # the pool shut down (stopping): the next resync releases it
            log.warning("cannot release a removed pod's state now; the resync will", error=repr(e))
            return
        fut.add_done_callback(_log_failed_release)
        self._track(fut)

    def _track(self, fut: "asyncio.Future[Any]") -> None:
        """Keep the post-hooks and releases of replied calls until they are done, so that a
        shutdown waits for them (:meth:`settle`)."""
        self._after_reply.add(fut)
        fut.add_done_callback(self._after_reply.discard)

    async def settle(self, timeout: float) -> int:
        """Wait up to ``timeout`` seconds for the post-hooks and releases of the calls
        replied so far (the daemon's shutdown, once the calls are drained); returns how
        many were still running."""
        await asyncio.sleep(0)   # replies of the last loop pass schedule theirs now
        pending = set(self._after_reply)
        if pending:
            await asyncio.wait(pending, timeout=timeout)
        return sum(1 for f in pending if not f.done())

    # ---------------------------------------------------------------- decoding and records
    def _decode(self, pc: PipelineCall, body: bytes, cls: Any, what: str) -> Any:
        """The message in a body that was relayed unchanged, or None (logged) when it
        cannot be read."""
        message, why = self._read(body, cls)
        if message is None and body:
            log.warning(f"cannot read the {what}; relayed unchanged", method=pc.method, reason=why)
        return message

    def _read(self, body: bytes, cls: Any) -> Tuple[Any, str]:
        """(the one message of a gRPC body, "") or (None, why it cannot be read)."""
        # a view: the message is parsed where it lies, not copied out of the body first
        messages = grpcwire.split_messages(memoryview(body))
        if not messages or len(messages) != 1:
            return None, "not one length-prefixed gRPC message"
        compressed, data = messages[0]
        if compressed:
            return None, "compressed gRPC message"
        if len(data) > self.max_message_bytes:
            return None, "larger than server.max_message_bytes"
        try:
            return cls.FromString(data), ""
        except DecodeError as e:
            return None, f"not a {cls.DESCRIPTOR.name}: {e}"

    def _resolve(self, call: H.Call) -> None:
        """Find the pod and container a request concerns, from the request or the store."""
        req = call.request
        m = call.method
        if m == H.RUN_POD_SANDBOX:
            call.pod = pod_from_sandbox_config("", req.config, req.runtime_handler)
        elif m == H.CREATE_CONTAINER:
            call.pod = self.store.pod(req.pod_sandbox_id) or pod_from_sandbox_config(
                req.pod_sandbox_id, req.sandbox_config, "")
        elif m in (H.STOP_POD_SANDBOX, H.REMOVE_POD_SANDBOX):
            call.pod = self.store.pod(req.pod_sandbox_id)
        else:
            call.container = self.store.container(req.container_id)
            if call.container is not None:
                call.pod = self.store.pod(call.container.sandbox_id)

    def _note_ids(self, call: H.Call) -> None:
        req = call.request
        ids = [getattr(req, "pod_sandbox_id", ""), getattr(req, "container_id", "")]
        if call.pod is not None:
            ids += [call.pod.uid, call.pod.sandbox_id]
        if call.container is not None:
            ids += [call.container.container_id, call.container.sandbox_id]
        self.recent.note(*ids)

    def _opted_out(self, call: H.Call) -> bool:
        return call.pod is not None and self.opted_out(call.pod)

    def opted_out(self, pod: PodRecord) -> bool:
        """Whether ``pod`` opted out of every hook (``[hooks] skip_keys``)."""
        for key in self._skip_keys:
            for source in (pod.annotations, pod.labels):
                if source.get(key, "").strip().lower() in ("true", "1", "yes"):
                    return True
        return False

    def _record(self, pc: PipelineCall, call: H.Call) -> None:
        m, req, reply = call.method, call.request, call.reply
        if m == H.RUN_POD_SANDBOX and call.pod is not None:
            call.pod.sandbox_id = reply.pod_sandbox_id
            self.store.put_pod(call.pod)
        elif m == H.CREATE_CONTAINER and call.pod is not None:
            call.container = container_from_create(reply.container_id, req)
            self.store.put_container(call.container)
        elif m == H.UPDATE_CONTAINER_RESOURCES and call.container is not None:
            if req.HasField("linux"):
                call.container.resources = resources_of(req.linux)
                self.store.put_container(call.container)
        elif m == H.REMOVE_CONTAINER:
            pc.gone = self.reaper.container_removed(req.container_id)
        elif m == H.REMOVE_POD_SANDBOX:
            pc.gone = self.reaper.sandbox_removed(req.pod_sandbox_id)


def _log_failed_release(fut: "asyncio.Future[Any]") -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.error("releasing a removed pod's state failed; the resync will retry", error=repr(fut.exception()))


def _container_of(call: H.Call) -> str:
    """The container a call concerns, for the journal: its name when known, else its ID."""
    if call.container is not None:
        return call.container.name
    if call.method == H.CREATE_CONTAINER:
        return call.request.config.metadata.name
    return getattr(call.request, "container_id", "")


def _reply_ids(call: Optional[H.Call]) -> Dict[str, str]:
    if call is None or call.reply is None:
        return {}
    if call.method == H.RUN_POD_SANDBOX:
        return {"pod_sandbox_id": call.reply.pod_sandbox_id}
    if call.method == H.CREATE_CONTAINER:
        return {"container_id": call.reply.container_id}
    return {}
