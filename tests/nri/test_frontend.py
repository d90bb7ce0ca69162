"""The NRI front-end: containerd's NRI messages run through the real interception pipeline
(store, pod locks, hooks with their budgets and failure policies, journal), and the hooks'
edits come back as NRI adjustments and updates. No socket here: the events are handed to
the front-end as the plugin hands them (the wire is tests/nri/test_session*.py's, the real
containerd tests/e2e/test_nri_e2e.py's)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Iterator, List, Tuple

import pytest

from anolisnuma.config import HookSettings, HooksConfig
from anolisnuma.nri import translate
from anolisnuma.nri.frontend import EVENT_METHODS, NriFrontEnd
from anolisnuma.nri.session import NriRequestError
from anolisnuma.pipeline.hooks import (
    CREATE_CONTAINER, REMOVE_CONTAINER, RUN_POD_SANDBOX, START_CONTAINER, UPDATE_CONTAINER_RESOURCES, Call, Hook,
    HookRefused,
)
from anolisnuma.pipeline.interceptor import Interceptor
from anolisnuma.state.store import Store
from anolisnuma.testing.loop_thread import LoopThread
from nri_proto import api_pb2 as nri


class Pinner(Hook):
    """Pins every container of a pod labelled ``pin`` to CPU 1 (the NUMA hook's kind of edit)
    and records what it saw; refuses pods labelled ``refuse``."""

    name = "numa"
    methods = frozenset({RUN_POD_SANDBOX, CREATE_CONTAINER, START_CONTAINER, UPDATE_CONTAINER_RESOURCES,
                         REMOVE_CONTAINER})

    def __init__(self) -> None:
        self.seen: List[Tuple[str, str, Any]] = []

    def pre(self, call: Call) -> None:
        pod = call.pod
        self.seen.append(("pre", call.method, pod.name if pod is not None else None))
        if pod is not None and pod.labels.get("refuse"):
            raise HookRefused("no room on any node", "RESOURCE_EXHAUSTED")
        if pod is None or not pod.labels.get("pin"):
            return
        if call.method == CREATE_CONTAINER:
            call.request.config.linux.resources.cpuset_cpus = "1"
            call.request.config.linux.resources.cpuset_mems = "0"
            call.mark_modified()
        elif call.method == UPDATE_CONTAINER_RESOURCES:
            call.request.linux.cpuset_cpus = "1"
            call.mark_modified()

    def post(self, call: Call) -> None:
        self.seen.append(("post", call.method, call.pod.name if call.pod is not None else None))


class Driven:
    """The front-end as the test's thread drives it: its event coroutines run on its loop
    (where the NRI session runs them) and are waited for; anything else is the front-end's."""

    def __init__(self, fe: NriFrontEnd) -> None:
        object.__setattr__(self, "fe", fe)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.fe, name)
        if not asyncio.iscoroutinefunction(attr):
            return attr

        async def answered_and_settled(*args: Any) -> Any:
            # (an event's bookkeeping runs just after its answer: the store is looked at after both)
            try:
                return await attr(*args)
            finally:
                await self.fe.settled()
        return lambda *args: asyncio.run_coroutine_threadsafe(answered_and_settled(*args), self.fe.loop).result(30)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.fe, name, value)


@pytest.fixture
def running() -> Iterator[Tuple[NriFrontEnd, Interceptor, Pinner]]:
    hook = Pinner()
    config = HooksConfig(per_hook={"numa": HookSettings(budget_seconds=1.0, failure_policy="fail")})
    ic = Interceptor([hook], config, Store())
    try:
        # (its tasks, a post-hook still running, finished before it stops: nothing left to GC)
        with LoopThread() as lt:
            yield Driven(NriFrontEnd(ic, lt.loop, timeout=5.0)), ic, hook
    finally:
        ic.executor.shutdown(wait=False)


def pod(name: str = "web", **labels: str) -> Any:
    p = nri.PodSandbox(id=f"sb-{name}", name=name, uid=f"uid-{name}", namespace="ns", labels=labels)
    p.linux.cgroup_parent = f"/kubepods/burstable/poduid-{name}"
    return p


def container(p: Any, name: str = "main", cpus: str = "0-1") -> Any:
    c = nri.Container(id=f"c-{p.name}-{name}", pod_sandbox_id=p.id, name=name)
    c.linux.resources.cpu.cpus = cpus
    c.linux.resources.cpu.shares.value = 512
    return c


def test_create_container_edit_becomes_the_adjustment(running):
    fe, ic, hook = running
    p = pod(pin="yes")
    fe.run_pod_sandbox(p)
    assert ic.store.pod(p.id).uid == p.uid   # recorded under its sandbox id, as the relay does
    adjust = fe.create_container(p, container(p))
    assert adjust.linux.resources.cpu.cpus == "1" and adjust.linux.resources.cpu.mems == "0"
    rec = ic.store.container("c-web-main")
    assert rec is not None and rec.sandbox_id == p.id and rec.resources.cpuset_cpus == "1"
    assert ("pre", CREATE_CONTAINER, "web") in hook.seen
    calls = [c["method"] for c in ic.journal.calls(p.uid)]
    assert calls[:2] == [RUN_POD_SANDBOX, CREATE_CONTAINER]


def test_no_edit_no_adjustment(running):
    fe, ic, hook = running
    p = pod()
    fe.run_pod_sandbox(p)
    adjust = fe.create_container(p, container(p))
    assert adjust == nri.ContainerAdjustment()   # nothing for containerd to change


def test_update_container_edit_becomes_a_container_update(running):
    fe, ic, _ = running
    p = pod(pin="yes")
    fe.run_pod_sandbox(p)
    c = container(p)
    fe.create_container(p, c)
    asked = nri.LinuxResources()
    asked.cpu.cpus = "0-1"
    update = fe.update_container(c, asked)
    assert update is not None and update.container_id == c.id and update.linux.resources.cpu.cpus == "1"
    q = pod("other")
    fe.run_pod_sandbox(q)
    d = container(q)
    fe.create_container(q, d)
    assert fe.update_container(d, asked) is None


def test_refusal_under_fail_policy_is_an_error_with_the_call_code(running):
    fe, ic, _ = running
    p = pod("full", refuse="yes")
    with pytest.raises(NriRequestError) as e:
        fe.run_pod_sandbox(p)
    assert e.value.code == 8 and "no room" in str(e.value)   # RESOURCE_EXHAUSTED
    assert ic.store.pod(p.id) is None


def test_opted_out_pod_sees_no_hook(running):
    fe, ic, hook = running
    p = pod("quiet", pin="yes")
    p.annotations["anolisnuma.io/skip"] = "true"
    fe.run_pod_sandbox(p)
    assert fe.create_container(p, container(p)) == nri.ContainerAdjustment()
    assert not [s for s in hook.seen if s[2] == "quiet"]


def test_remove_container_forgets_it(running):
    fe, ic, _ = running
    p = pod()
    fe.run_pod_sandbox(p)
    c = container(p)
    fe.create_container(p, c)
    fe.start_container(c)
    fe.stop_container(c)
    fe.remove_container(c)
    assert ic.store.container(c.id) is None


def test_hooks_slower_than_containerds_timeout_answer_deadline_exceeded(running):
    fe, ic, hook = running
    gate = threading.Event()
    slow = Pinner()
    slow.pre = lambda call: gate.wait(10)  # type: ignore[method-assign]
    ic.set_hooks([slow])
    fe.timeout = 0.2
    try:
        with pytest.raises(NriRequestError) as e:
            fe.run_pod_sandbox(pod("slow"))
        assert e.value.code == 4   # DEADLINE_EXCEEDED
    finally:
        gate.set()


@pytest.mark.parametrize("policy", ["ignore", "fail"])
def test_a_slow_hook_is_timed_out_by_the_pipeline_within_containerds_timeout(running, policy):
    """containerd's 2 s is the whole event's; the hooks' budgets are cut to fit it, so the
    pipeline's own decision is what containerd gets: under ignore the event is answered
    unchanged (the hook's half-made edit discarded), under fail it is refused."""
    fe, ic, _ = running
    gate = threading.Event()
    slow = Pinner()

    def stuck(call: Call) -> None:
        if call.method != CREATE_CONTAINER:
            return
        call.request.config.linux.resources.cpuset_cpus = "1"
        call.mark_modified()
        gate.wait(10)

    slow.pre = stuck  # type: ignore[method-assign]
    ic.set_hooks([slow])
    ic.set_config(HooksConfig(per_hook={"numa": HookSettings(budget_seconds=5.0, failure_policy=policy)}))
    fe.fit_to(0.5)
    assert fe.timeout == pytest.approx(0.45) and ic.nri_hook_budget == pytest.approx(0.4)
    p = pod("slow")
    fe.run_pod_sandbox(p)
    try:
        if policy == "ignore":
            assert fe.create_container(p, container(p)) == nri.ContainerAdjustment()
            assert ic.store.container("c-slow-main").resources.cpuset_cpus == "0-1"   # what containerd made
        else:
            with pytest.raises(NriRequestError) as e:
                fe.create_container(p, container(p))
            assert e.value.code != 4 and "budget" in str(e.value)   # the hook's refusal, not our deadline
        assert ic.counters.snapshot().get("nri_events_past_deadline", 0) == 0
    finally:
        gate.set()


def test_translate_keeps_what_the_hooks_read():
    p = pod("x", app="a")
    p.annotations["anolisbox.sh/qoslevel"] = "BE"
    p.linux.pod_resources.cpu.quota.value = 50000
    p.linux.pod_resources.cpu.period.value = 100000
    p.linux.pod_resources.memory.limit.value = 1 << 30
    c = container(p)
    req, reply = translate.create_container(p, c)
    assert reply.container_id == c.id and req.pod_sandbox_id == p.id
    sc = req.sandbox_config
    assert (sc.metadata.name, sc.metadata.uid, sc.metadata.namespace) == ("x", "uid-x", "ns")
    assert dict(sc.labels) == {"app": "a"} and sc.annotations["anolisbox.sh/qoslevel"] == "BE"
    assert sc.linux.cgroup_parent == "/kubepods/burstable/poduid-x"
    r = sc.linux.resources
    assert (r.cpu_quota, r.cpu_period, r.memory_limit_in_bytes) == (50000, 100000, 1 << 30)
    cr = req.config.linux.resources
    assert (cr.cpu_shares, cr.cpu_quota, cr.cpuset_cpus) == (512, 0, "0-1")   # unset optionals are 0
    empty = nri.Container(id="bare", pod_sandbox_id="sb")
    req2, _ = translate.create_container(nri.PodSandbox(id="sb"), empty)
    assert req2.config.linux.resources.cpuset_cpus == "" and not req2.sandbox_config.linux.HasField("resources")


# ------------------------------------------------------------------ the events subscribed
class OnCreateOnly(Hook):
    """A policy that acts on CreateContainer alone (pre), as a cpuset-only plugin would."""

    name = "numa"
    methods = frozenset({CREATE_CONTAINER})

    def pre(self, call: Call) -> None:
        pass


def test_the_events_subscribed_are_those_a_hook_or_the_store_acts_on(nri_subscription):
    # the store's own: pods and containers made, resources changed, removals
    store = {"CREATE_CONTAINER", "REMOVE_CONTAINER", "REMOVE_POD_SANDBOX", "RUN_POD_SANDBOX", "UPDATE_CONTAINER"}
    assert nri_subscription([OnCreateOnly()]) == store
    assert nri_subscription([]) == store
    # a hook on StartContainer (QoS's knobs for the container) brings that event in
    assert nri_subscription([OnCreateOnly(), Pinner()]) == store | {"START_CONTAINER"}


def test_every_event_is_subscribed_while_the_hooks_are_not_built(nri_subscription):
    assert nri_subscription(None) == {nri.Event.Name(e) for e in EVENT_METHODS}
    assert len(EVENT_METHODS) == 8


def test_the_answer_comes_before_the_calls_bookkeeping_which_the_next_event_finds_done(running):
    """containerd waits for the answer only: the call's record, log line, journal and inline
    post-hooks run just after it is made, on the loop's next turn, before any later event."""
    fe, ic, _ = running
    p = pod("order", pin="1")
    fe.run_pod_sandbox(p)
    cid = f"c-{p.name}-main"

    async def create_then_look() -> Any:
        adjust = await fe.fe.create_container(p, container(p))
        at_answer = ic.store.container(cid) is not None
        await fe.fe.settled()
        return adjust, at_answer, ic.store.container(cid)

    adjust, at_answer, recorded = asyncio.run_coroutine_threadsafe(create_then_look(), fe.fe.loop).result(30)
    assert adjust.linux.resources.cpu.cpus == "1"
    assert at_answer is False
    assert recorded is not None and recorded.resources.cpuset_cpus == "1"
    fe.remove_container(container(p))   # the next event of the pod: the container is known
    assert ic.store.container(cid) is None
