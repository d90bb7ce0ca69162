"""Hook stages that say they only compute in memory (``Hook.inline``) run on the event loop:
the same edits, failure policies and budgets as on a worker thread, and a stage that keeps
running long is moved to the threads for good."""

from __future__ import annotations

import threading
from typing import Any, Callable, List, Optional

import grpc
import pytest

from anolisnuma.config import HookSettings
from anolisnuma.pipeline import hook_stages as ic
from anolisnuma.pipeline.hooks import CREATE_CONTAINER, RUN_POD_SANDBOX, Call, Hook, HookRefused
from anolisnuma.testing.fake_cri import runtime_path
from anolisnuma.testing.waiting import wait_until

from pipeline_helpers import create_request, pb, sandbox_config

CREATE = runtime_path("CreateContainer")
LOOP_THREAD = "anolisnuma-proxy"   # InProcessProxy runs the daemon's event loop on this thread


class Where(Hook):
    """Records the thread each stage ran on; ``inline_stages`` says which it claims."""

    def __init__(self, name: str, inline_stages=(), pre: Optional[Callable[[Call], Any]] = None,
                 methods=(CREATE_CONTAINER, RUN_POD_SANDBOX)) -> None:
        self.name = name
        self.methods = frozenset(methods)
        self.inline_stages = set(inline_stages)
        self._pre = pre
        self.threads: List[tuple] = []   # (stage, method, thread name)

    def inline(self, method: str, stage: str) -> bool:
        return stage in self.inline_stages

    def pre(self, call: Call) -> None:
        self.threads.append(("pre", call.method, threading.current_thread().name))
        if self._pre is not None:
            self._pre(call)

    def post(self, call: Call) -> None:
        self.threads.append(("post", call.method, threading.current_thread().name))


def pin(call: Call) -> None:
    call.request.config.linux.resources.cpuset_cpus = "1"
    call.mark_modified()


def test_inline_stages_run_on_the_loop_and_their_edits_go_out(start_proxy, fake, open_stub):
    inline = Where("inl", inline_stages={"pre", "post"}, pre=pin)
    threaded = Where("thr")
    proxy = start_proxy([inline, threaded])
    open_stub(proxy.address).CreateContainer(create_request("a" * 64), timeout=10)
    wait_until(lambda: len(inline.threads) == 2 and len(threaded.threads) == 2, "both stages of both hooks")
    assert {t for _, _, t in inline.threads} == {LOOP_THREAD}
    assert LOOP_THREAD not in {t for _, _, t in threaded.threads}
    sent = pb.CreateContainerRequest.FromString(fake.last(CREATE).request)
    assert sent.config.linux.resources.cpuset_cpus == "1"
    assert proxy.interceptor.counters["hook_inl_pre_ok"] == 1
    assert proxy.interceptor.counters["hook_inl_post_ok"] == 1


def test_an_inline_refusal_follows_the_failure_policy(start_proxy, fake, open_stub):
    def refuse(call: Call) -> None:
        raise HookRefused("node full", code="RESOURCE_EXHAUSTED")

    proxy = start_proxy([Where("inl", inline_stages={"pre"}, pre=refuse)],
                        per_hook={"inl": HookSettings(failure_policy="fail")})
    with pytest.raises(grpc.RpcError) as e:
        open_stub(proxy.address).CreateContainer(create_request("a" * 64), timeout=10)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "node full" in e.value.details()
    assert fake.calls(CREATE) == 0


def test_an_inline_stage_past_its_budget_counts_as_timed_out(start_proxy, fake, open_stub):
    # (the stage cannot be cut off on the loop: it is judged once it returned)
    proxy = start_proxy([Where("inl", inline_stages={"pre"}, pre=lambda c: (pin(c), threading.Event().wait(0.2)))],
                        per_hook={"inl": HookSettings(budget_seconds=0.05, failure_policy="ignore")})
    open_stub(proxy.address).CreateContainer(create_request("a" * 64), timeout=10)
    assert proxy.interceptor.counters["hook_inl_pre_failed"] == 1
    # its edit is dropped, as a timed-out thread's is
    sent = pb.CreateContainerRequest.FromString(fake.last(CREATE).request)
    assert sent.config.linux.resources.cpuset_cpus != "1"


def test_a_stage_that_keeps_running_long_moves_to_the_worker_threads(start_proxy, fake, open_stub):
    slow = ic.INLINE_LIMIT_SECONDS * 3
    hook = Where("inl", inline_stages={"pre"}, pre=lambda c: threading.Event().wait(slow))
    proxy = start_proxy([hook])
    stub = open_stub(proxy.address)
    calls = ic.INLINE_STRIKES + 2
    for i in range(calls):
        stub.CreateContainer(create_request(f"{i:064d}"), timeout=10)
    ran_on = [t for stage, _, t in hook.threads if stage == "pre"]
    assert ran_on[:ic.INLINE_STRIKES] == [LOOP_THREAD] * ic.INLINE_STRIKES
    assert LOOP_THREAD not in ran_on[ic.INLINE_STRIKES:]
    assert proxy.interceptor.counters["hook_stages_moved_off_loop"] == 1
    assert proxy.interceptor.counters["hook_inl_pre_ok"] == calls   # within the budget: nothing failed
    moved = [l for l in proxy.log_lines()
             if l.get("message", "").startswith("a hook stage ran long on the event loop")]
    assert [(l["hook"], l["method"], l["stage"], l["level"]) for l in moved] == [
        ("inl", CREATE_CONTAINER, "pre", "warning")]
    # another method's stage of the same hook is judged on its own
    stub.RunPodSandbox(pb.RunPodSandboxRequest(config=sandbox_config(name="p", namespace="n")), timeout=10)
    assert [t for stage, m, t in hook.threads if (stage, m) == ("pre", RUN_POD_SANDBOX)] == [LOOP_THREAD]
