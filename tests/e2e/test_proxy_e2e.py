"""The proxy in front of a real containerd, driven by a real CRI client.

With no policy enabled, a kubelet must not be able to tell anolisnuma from containerd.
"""

from __future__ import annotations

import os
import threading
import time

import grpc
import pytest
from cri_client import KubeletLike, pb, read_file

from anolisnuma.testing.proxy import InProcessProxy
from anolisnuma.testing.waiting import wait_until

CG = "/sys/fs/cgroup"
# 1.7 too: what a kubelet sees of the runtime through the proxy differs on each (conftest.py)
CONTAINERD_BUILDS = ("1.6", "1.7", "2.2")


def _cgroup_dir(controller: str, info: dict) -> str:
    return f"{CG}/{controller}{info['runtimeSpec']['linux']['cgroupsPath']}"


def test_version_status_and_images_equal_direct(kubelet, kubelet_direct):
    assert kubelet.version() == kubelet_direct.version()
    assert kubelet.version().runtime_name == "containerd"
    assert kubelet.status()["RuntimeReady"] is True
    assert kubelet.list_images() == kubelet_direct.list_images()
    spec = pb.ImageSpec(image="docker.io/library/busybox:anolisnuma")
    via = kubelet.images.ImageStatus(pb.ImageStatusRequest(image=spec))
    direct = kubelet_direct.images.ImageStatus(pb.ImageStatusRequest(image=spec))
    assert via == direct and via.image.id
    via_fs = kubelet.images.ImageFsInfo(pb.ImageFsInfoRequest()).image_filesystems
    direct_fs = kubelet_direct.images.ImageFsInfo(pb.ImageFsInfoRequest()).image_filesystems
    assert [f.fs_id.mountpoint for f in via_fs] == [f.fs_id.mountpoint for f in direct_fs]


def test_host_network_pod_lifecycle_through_proxy(kubelet, kubelet_direct, proxy):
    pod = kubelet.run_pod(name="e2e-host", namespace="e2e", network="node")
    res = kubelet.resources(cpu_shares=512, cpu_quota=150000, cpu_period=100000,
                            memory_limit=128 << 20, cpuset_cpus="0", cpuset_mems="0")
    cid = kubelet.run_container(pod, "work", res)

    status, info = kubelet.container_status(cid)
    assert status.state == pb.CONTAINER_RUNNING
    cpu_dir, mem_dir, cpuset_dir = (_cgroup_dir(c, info) for c in ("cpu", "memory", "cpuset"))
    assert cpu_dir.startswith(f"{CG}/cpu{pod.cgroup_parent}/")
    assert read_file(f"{cpu_dir}/cpu.shares") == "512"
    assert read_file(f"{cpu_dir}/cpu.cfs_quota_us") == "150000"
    assert read_file(f"{mem_dir}/memory.limit_in_bytes") == str(128 << 20)
    assert read_file(f"{cpuset_dir}/cpuset.cpus") == "0"

    # UpdateContainerResources lands in the real cgroup files.
    kubelet.update_resources(cid, kubelet.resources(cpu_shares=256, cpu_quota=50000, cpu_period=100000,
                                                    memory_limit=96 << 20, cpuset_cpus="0-1", cpuset_mems="0"))
    assert read_file(f"{cpu_dir}/cpu.shares") == "256"
    assert read_file(f"{cpu_dir}/cpu.cfs_quota_us") == "50000"
    assert read_file(f"{mem_dir}/memory.limit_in_bytes") == str(96 << 20)
    assert read_file(f"{cpuset_dir}/cpuset.cpus") == "0-1"

    r = kubelet.exec_sync(cid, ["echo", "hello from the pod"])
    assert r.exit_code == 0 and r.stdout == b"hello from the pod\n"

    # Replies through the proxy equal containerd's own.
    assert [c.id for c in kubelet.list_containers(pod.id)] == [cid]
    assert kubelet.list_containers() == kubelet_direct.list_containers()
    assert kubelet.list_pods() == kubelet_direct.list_pods()
    assert kubelet.container_status(cid) == kubelet_direct.container_status(cid)
    assert kubelet.pod_status(pod.id, verbose=True) == kubelet_direct.pod_status(pod.id, verbose=True)

    # The pipeline recorded what the ID-only calls will need.
    store = proxy.daemon.store
    assert store.pod(pod.id).uid == pod.uid
    assert store.pod(pod.id).cgroup_parent == pod.cgroup_parent
    assert store.container(cid).sandbox_id == pod.id
    assert store.container(cid).resources.cpuset_cpus == "0-1"

    kubelet.stop_container(cid)
    assert kubelet.container_status(cid)[0].state == pb.CONTAINER_EXITED
    kubelet.remove_container(cid)
    kubelet.stop_pod(pod)
    kubelet.remove_pod(pod)
    wait_until(lambda: store.container(cid) is None and store.pod(pod.id) is None,
               "the store to forget the removed pod", timeout=3, interval=0.01)
    assert not os.path.exists(cpu_dir)

    # One log line per intercepted call at info (its reply's), with the pod's identity.
    lines = proxy.log_lines()
    assert not [entry for entry in lines if entry["message"] == "run pod sandbox request from kubelet"]
    rep = [entry for entry in lines if entry["message"] == "run pod sandbox reply from containerd"]
    assert rep and rep[-1]["pod_name"] == "e2e-host" and rep[-1]["pod_namespace"] == "e2e"
    assert rep[-1]["pod_uid"] == pod.uid and rep[-1]["status"] == "OK"
    assert rep[-1]["pod_sandbox_id"] == pod.id and rep[-1]["latency_ms"] > 0
    assert any(entry["message"] == "create container reply from containerd" and entry.get("container_id") == cid
               for entry in lines)


def test_cni_pod_gets_an_ip_through_proxy(kubelet):
    pod = kubelet.run_pod(name="e2e-cni", network="pod")
    ip = kubelet.pod_status(pod.id).status.network.ip
    assert ip.startswith("10.")
    cid = kubelet.run_container(pod, "work")
    r = kubelet.exec_sync(cid, ["sh", "-c", "ip -4 -o addr show eth0"])
    assert ip in r.stdout.decode()


def test_unknown_method_v1alpha2_and_events_behave_as_direct(proxy, containerd):
    def call(sock, path, payload=b""):
        with grpc.insecure_channel(f"unix://{sock}") as ch:
            fn = ch.unary_unary(path, request_serializer=lambda b: b, response_deserializer=lambda b: b)
            try:
                return ("ok", fn(payload, timeout=5))
            except grpc.RpcError as e:
                return (e.code(), e.details())

    for path in ("/runtime.v1.RuntimeService/NoSuchMethodYet", "/runtime.v2.FutureService/Version"):
        direct = call(containerd.socket, path)
        assert direct[0] == grpc.StatusCode.UNIMPLEMENTED
        assert call(proxy.socket, path) == direct

    # containerd 1.6 and 1.7 serve CRI v1alpha2 too; 2.x dropped it: UNIMPLEMENTED, the same both ways
    from cri_api.v1alpha2 import api_pb2 as a2
    req = a2.VersionRequest(version="v1alpha2").SerializeToString()
    direct = call(containerd.socket, "/runtime.v1alpha2.RuntimeService/Version", req)
    via = call(proxy.socket, "/runtime.v1alpha2.RuntimeService/Version", req)
    assert via == direct
    if containerd.build.serves_cri_v1alpha2:
        assert via[0] == "ok" and a2.VersionResponse.FromString(via[1]).runtime_name == "containerd"
    else:
        assert via[0] == grpc.StatusCode.UNIMPLEMENTED


def test_the_evented_pleg_stream_behaves_as_direct(kubelet, proxy, containerd):
    """containerd 1.6 does not implement the evented-PLEG stream (GetContainerEvents): the
    kubelet must see exactly that (it then falls back to relisting), not an error of ours.
    containerd 1.7 and 2.x stream it: containers created through the proxy are told on the proxy's
    stream as on containerd's own. containerd 1.7 gives each event to one stream only, so
    there the proxy's stream is the only one (as the kubelet's is on a node), and what it
    tells is compared with the pod's status read from containerd's socket."""
    from cri_api.v1 import api_pb2_grpc as pbg

    socks = [proxy.socket, containerd.socket]
    if not containerd.build.container_events_to_every_stream:
        socks = [proxy.socket]
    streams = [EventWatch(sock, pbg) for sock in socks]
    try:
        if not containerd.build.streams_container_events:
            for w in streams:
                wait_until(lambda: w.error is not None, "the stream's answer")
                assert w.error.code() == grpc.StatusCode.UNIMPLEMENTED
            return
        pod = kubelet.run_pod("events-e2e")
        # A stream is subscribed some time after it opens, and says nothing until then: create
        # containers until one is told on both, then every later one must be told on both too.
        for attempt in range(20):
            first = kubelet.create_container(pod, f"c{attempt}")
            try:
                wait_until(lambda: all(w.created(first) for w in streams), "the container's event", 5)
                break
            except AssertionError:
                continue
        else:
            pytest.fail("no container's event was told on both streams")
        later = [kubelet.create_container(pod, f"later{i}") for i in range(3)]
        wait_until(lambda: all(w.created(c) for w in streams for c in later), "the later containers' events", 60)
        with KubeletLike(containerd.socket) as direct:
            status = direct.pod_status(pod.id).status.metadata
        for cid in [first] + later:
            told = [w.created(cid).pod_sandbox_status.metadata for w in streams]
            assert told == [status] * len(streams)
    finally:
        for w in streams:
            w.close()


class EventWatch:
    """GetContainerEvents on ``sock``, its events gathered by a thread."""

    def __init__(self, sock: str, pbg) -> None:  # type: ignore[no-untyped-def]
        self.channel = grpc.insecure_channel(f"unix://{sock}")
        self.call = pbg.RuntimeServiceStub(self.channel).GetContainerEvents(pb.GetEventsRequest(), timeout=300)
        self.events: list = []
        self.error = None
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for event in self.call:
                self.events.append(event)
        except grpc.RpcError as e:
            self.error = e

    def created(self, cid: str):  # type: ignore[no-untyped-def]
        return next((e for e in list(self.events) if e.container_id == cid
                     and e.container_event_type == pb.CONTAINER_CREATED_EVENT), None)

    def close(self) -> None:
        self.call.cancel()
        self.thread.join(10)
        self.channel.close()


def test_containerd_restart_under_running_proxy(containerd, tmp_path):
    with InProcessProxy.for_backend(containerd.socket, str(tmp_path)) as p:
        kl = KubeletLike(p.socket, harness=containerd)
        try:
            assert kl.version().runtime_name == "containerd"
            containerd.kill()
            t0 = time.monotonic()
            with pytest.raises(grpc.RpcError) as err:
                kl.version(timeout=30)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert time.monotonic() - t0 < 5.0, "calls must fail fast while containerd is down, not at the deadline"
            containerd.restart()
            deadline = time.monotonic() + 15
            while True:
                try:
                    assert kl.version().runtime_name == "containerd"
                    break
                except grpc.RpcError as e:
                    assert e.code() == grpc.StatusCode.UNAVAILABLE
                    assert time.monotonic() < deadline, "calls did not recover after containerd came back"
                    time.sleep(0.1)
            assert kl.status()["RuntimeReady"] is True
        finally:
            kl.close()


def test_stop_waits_for_a_call_in_flight(containerd, tmp_path):
    """SIGTERM path: a slow StopContainer (its process ignores SIGTERM, so containerd waits
    for the whole timeout) in flight when the proxy is told to stop still completes OK."""
    p = InProcessProxy.for_backend(containerd.socket, str(tmp_path), grace=15.0).start()
    kl = KubeletLike(p.socket, harness=containerd)
    try:
        pod = kl.run_pod(name="e2e-slow-stop")
        cid = kl.run_container(pod, "stubborn", command=["sh", "-c", "trap '' TERM; while :; do sleep 1; done"])
        result = {}

        def slow_stop():
            t0 = time.monotonic()
            try:
                kl.stop_container(cid, timeout=2)
                result["ok"] = time.monotonic() - t0
            except grpc.RpcError as e:
                result["error"] = e.code()

        t = threading.Thread(target=slow_stop)
        t.start()
        wait_until(lambda: any(m.endswith("/StopContainer") for s in p.daemon.relay.splices
                               for m in s.open_methods()), "the StopContainer to be in flight")
        assert p.stop() == 0
        t.join(10)
        assert "ok" in result, result
        assert result["ok"] >= 1.5
        assert not os.path.exists(p.socket), "the socket file must be removed at shutdown"
    finally:
        kl.close()
        with KubeletLike(containerd.socket, harness=containerd) as cleaner:
            cleaner.pods, cleaner.containers, cleaner._cgroups = kl.pods, kl.containers, kl._cgroups
        p.stop()
