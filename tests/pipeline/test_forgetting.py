"""Nothing the pipeline keeps per pod outlives the pod: its lock and its journal go with a
removal through the proxy, with a removal sent behind the proxy's back (the resync finds
it gone), and with a RunPodSandbox that failed and was not retried (the resync after the
next one forgets it). The fake backend lists no sandbox, so every pod the proxy saw is
gone for the resync."""

from __future__ import annotations

import grpc

from anolisnuma.admin import views
from anolisnuma.pipeline.hooks import Call, Hook
from anolisnuma.testing.fake_cri import runtime_path
from anolisnuma.testing.waiting import wait_until

from pipeline_helpers import create_request, pb, sandbox_config

RUN = runtime_path("RunPodSandbox")
EMPTY = {"pods": 0}


class Noting(Hook):
    """Serves every lifecycle call, so each call takes its pod's lock."""

    name = "noting"
    methods = frozenset({"RunPodSandbox", "CreateContainer", "StartContainer", "StopPodSandbox",
                         "RemovePodSandbox", "RemoveContainer"})

    def pre(self, call: Call) -> None:
        pass

    def post(self, call: Call) -> None:
        pass


def pipeline_structures(proxy) -> dict:
    structures = proxy.interceptor.reaper.structures()
    return {name: structures[name] for name in ("pod_locks", "journal")}


def test_a_lost_teardown_and_a_failed_run_leave_nothing_after_the_next_resyncs(start_proxy, fake, open_stub):
    proxy = start_proxy([Noting()])
    proxy.wait_resynced()
    stub = open_stub(proxy.address)
    resync = proxy.daemon.controllers.get("runtime-resync")
    # a pod run and started through the proxy, whose Stop/Remove went straight to containerd
    sid = stub.RunPodSandbox(pb.RunPodSandboxRequest(config=sandbox_config(name="lost")), timeout=5).pod_sandbox_id
    stub.CreateContainer(create_request(sid), timeout=5)
    # a pod whose RunPodSandbox fails (unknown runtime handler) and is never retried
    fake.set_error(RUN, grpc.StatusCode.UNKNOWN, 'no runtime for "nope" is configured')
    failed = sandbox_config(name="failed")
    try:
        stub.RunPodSandbox(pb.RunPodSandboxRequest(config=failed, runtime_handler="nope"), timeout=5)
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.UNKNOWN
    wait_until(lambda: pipeline_structures(proxy)["journal"]["entries"] == 3)
    assert pipeline_structures(proxy) == {"pod_locks": {"pods": 2}, "journal": {"pods": 2, "entries": 3}}

    resync.step()    # the calls named both pods since the window before: left alone
    assert pipeline_structures(proxy)["journal"]["pods"] == 2
    resync.step()    # no call named them since: gone
    wait_until(lambda: pipeline_structures(proxy) == {"pod_locks": EMPTY, "journal": {"pods": 0, "entries": 0}})
    assert proxy.store.pods() == [] and proxy.store.containers() == []
    assert resync.counts()["forgotten_pods"] == 2


def test_a_retried_run_keeps_its_pod(start_proxy, fake, open_stub):
    """A RunPodSandbox that failed and was retried within the interval is not forgotten:
    the retry names the pod again, and its sandbox is in the store."""
    proxy = start_proxy([Noting()])
    proxy.wait_resynced()
    stub = open_stub(proxy.address)
    resync = proxy.daemon.controllers.get("runtime-resync")
    cfg = sandbox_config(name="retried")
    fake.set_error(RUN, grpc.StatusCode.UNKNOWN, "failed to setup network for sandbox")
    try:
        stub.RunPodSandbox(pb.RunPodSandboxRequest(config=cfg), timeout=5)
    except grpc.RpcError:
        pass
    resync.step()
    fake.clear(RUN)
    stub.RunPodSandbox(pb.RunPodSandboxRequest(config=cfg), timeout=5)
    resync.step()
    assert len(proxy.interceptor.journal.calls(cfg.metadata.uid)) == 2


def test_a_removal_through_the_proxy_forgets_the_pod_at_once(start_proxy, fake, open_stub):
    proxy = start_proxy([Noting()])
    stub = open_stub(proxy.address)
    cfg = sandbox_config(name="short-lived")
    sid = stub.RunPodSandbox(pb.RunPodSandboxRequest(config=cfg), timeout=5).pod_sandbox_id
    cid = stub.CreateContainer(create_request(sid, cfg), timeout=5).container_id
    stub.RemoveContainer(pb.RemoveContainerRequest(container_id=cid), timeout=5)
    stub.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid), timeout=5)
    stub.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid), timeout=5)
    wait_until(lambda: pipeline_structures(proxy) == {"pod_locks": EMPTY, "journal": {"pods": 0, "entries": 0}})
    assert proxy.store.pods() == []


def test_every_structure_is_in_the_status(start_proxy):
    proxy = start_proxy([Noting()])
    structures = views.structures(proxy.daemon)
    assert structures["store"] == {"pods": 0, "containers": 0}
    assert structures["recent_calls"] == {"ids": 0}
    assert structures["pod_locks"] == EMPTY and structures["journal"] == {"pods": 0, "entries": 0}

