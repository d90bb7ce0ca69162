"""Calls that arrive before the hooks exist wait for them, whenever the hooks become ready:
also in the very loop turn the call arrived in (its waiter must already be registered)."""

import asyncio

from anolisnuma.config import HooksConfig
from anolisnuma.cri import grpcwire
from anolisnuma.pipeline.decision import Decision
from anolisnuma.pipeline.interceptor import Interceptor, PipelineCall
from anolisnuma.state.store import Store
from cri_proto import api_pb2 as pb

PATH = "/runtime.v1.RuntimeService/RunPodSandbox"


def request_body() -> bytes:
    req = pb.RunPodSandboxRequest(config=pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name="p", namespace="ns", uid="5b7a4c1e-8d0f-4c2a-9f1e-2a3b4c5d6e7f")))
    return grpcwire.frame_message(req.SerializeToString())


def waiting_call(interceptor: Interceptor):
    pc = interceptor.begin(PATH)
    assert isinstance(pc, PipelineCall) and pc.holds_request
    return interceptor.on_request(pc, request_body())


def test_hooks_ready_in_the_same_loop_turn_as_the_call():
    async def scenario():
        interceptor = Interceptor(None, HooksConfig(), Store())
        outcome = waiting_call(interceptor)
        assert interceptor.calls_waiting_for_hooks == 1
        interceptor.set_hooks([])                 # before the waiting coroutine ever ran
        return await asyncio.wait_for(outcome, 5)

    decision = asyncio.run(scenario())
    assert isinstance(decision, Decision) and decision.status == 0 and decision.body == request_body()


def test_hooks_that_fail_refuse_the_waiting_call_unavailable():
    async def scenario():
        interceptor = Interceptor(None, HooksConfig(), Store())
        outcome = waiting_call(interceptor)
        interceptor.hooks_failed("hook numa cannot start: boom")
        return await asyncio.wait_for(outcome, 5)

    decision = asyncio.run(scenario())
    assert decision.status == grpcwire.STATUS_CODES["UNAVAILABLE"] and "boom" in decision.message
