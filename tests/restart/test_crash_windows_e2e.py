"""kill -9 while numa.json lags the calls, on the real containerd.

numa.json is written behind the kubelet's calls (anolisnuma/state/write_behind.py). Here
the daemon's writes are dropped from one instant on (a ``sitecustomize`` on its
``PYTHONPATH`` replaces ``NumaStateFile.save_encoded`` once a flag file names the daemon's
pid, keeping each dropped snapshot aside so the test sees what the daemon decided), so that
at the kill numa.json misses a pod created since, still lists a pod removed since, and
knows nothing of a pod placed in the pre-hook of a CreateContainer that containerd is still
working on. After the restart nothing is forgotten or counted twice: the start-up resync
rebuilt it from what containerd runs (docs/restarts.md, "What a crash can lose").
"""

from __future__ import annotations

import json
import os
import signal
from typing import Any, Dict, Iterator, List

import pytest

from anolisnuma.testing.restart_lab import NAMESPACE, RestartLab
from anolisnuma.testing.waiting import wait_until

pytestmark = pytest.mark.containerd
CONTAINERD_BUILDS = ("1.6", "1.7", "2.2")   # conftest.py: kill -9 on each build

FLAG_ENV = "ANOLISNUMA_TEST_DROP_NUMA_WRITES"
SITECUSTOMIZE = '''
import os

flag = os.environ.get("%s")
if flag:
    from anolisnuma.state import numa_state

    real = numa_state.NumaStateFile.save_encoded

    def save_encoded(self, allocations):
        try:
            with open(flag) as f:
                held = f.read().strip() == str(os.getpid())
        except OSError:
            held = False
        if not held:
            return real(self, allocations)
        # dropped: what the daemon would have written, kept aside for the test
        tmp = flag + ".tmp"
        with open(tmp, "w") as f:
            f.write('{"allocations":[' + ",".join(allocations) + ']}')
        os.replace(tmp, flag + ".dropped")

    numa_state.NumaStateFile.save_encoded = save_encoded
''' % FLAG_ENV


@pytest.fixture
def lab(containerd, tmp_path) -> Iterator[RestartLab]:  # type: ignore[no-untyped-def]
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    lab = RestartLab(containerd, str(tmp_path / "lab"))
    lab.flag = str(tmp_path / "drop-numa-writes")  # type: ignore[attr-defined]
    lab.supervisor.env["PYTHONPATH"] = f"{site}{os.pathsep}{lab.supervisor.env['PYTHONPATH']}"
    lab.supervisor.env[FLAG_ENV] = lab.flag  # type: ignore[attr-defined]
    try:
        lab.start()
        yield lab
    finally:
        problems = lab.close()
        assert not problems, problems


def dropped(lab: RestartLab) -> Dict[str, Dict[str, Any]]:
    """The newest snapshot the daemon would have written, by pod uid."""
    try:
        with open(lab.flag + ".dropped") as f:  # type: ignore[attr-defined]
            return {a["pod_uid"]: a for a in json.load(f)["allocations"]}
    except FileNotFoundError:
        return {}


def on_disk(lab: RestartLab) -> Dict[str, Dict[str, Any]]:
    return {a["pod_uid"]: a for a in lab.numa_state()}


def test_kill9_while_numa_json_lags_forgets_nothing_and_counts_nothing_twice(lab):
    import grpc
    from cri_api.v1 import api_pb2 as pb
    from cri_api.v1 import api_pb2_grpc as pbg

    # given two pods on disk
    gone_sid, _ = lab.run_pod("gone")
    lab.run_pod("kept")
    wait_until(lambda: len(on_disk(lab)) == 2, "both pods in numa.json")
    # ... and from now on no write of the daemon lands
    with open(lab.flag, "w") as f:  # type: ignore[attr-defined]
        f.write(str(lab.supervisor.proc.pid))
    # created, not written
    created_sid, created_cid = lab.run_pod("created")
    channel = grpc.insecure_channel(f"unix://{lab.socket}")
    rt = pbg.RuntimeServiceStub(channel)
    # removed, not written
    rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=gone_sid), timeout=60)
    rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=gone_sid), timeout=60)
    # placed in the pre-hook, containerd still creating it
    sandbox, container, inflight_uid = lab.pod_template("inflight")
    sb = pb.PodSandboxConfig.FromString(sandbox)
    inflight_sid = rt.RunPodSandbox(pb.RunPodSandboxRequest(config=sb), timeout=60).pod_sandbox_id
    containerd_pid = lab.containerd.pid
    os.kill(containerd_pid, signal.SIGSTOP)
    try:
        call = rt.CreateContainer.future(pb.CreateContainerRequest(
            pod_sandbox_id=inflight_sid, config=pb.ContainerConfig.FromString(container), sandbox_config=sb),
            timeout=60)
        wait_until(lambda: "main" in dropped(lab).get(inflight_uid, {}).get("pending", {}),
                   "the pre-hook's placement of the in-flight container")
        # the windows are open: numa.json lags what the daemon decided
        disk, decided = on_disk(lab), dropped(lab)
        created_uid = next(uid for uid, a in decided.items() if created_cid in a["containers"])
        assert created_uid not in disk and inflight_uid not in disk
        gone_uid = next(uid for uid, a in disk.items() if a["sandbox_id"] == gone_sid)
        assert gone_uid not in decided
        # when the daemon is killed (containerd goes on with the create it was given)
        lab.supervisor.stop(signal.SIGKILL)
    finally:
        os.kill(containerd_pid, signal.SIGCONT)
    assert isinstance(call.exception(60), grpc.RpcError)
    channel.close()
    lab.supervisor.start()   # (Restart=always; the next daemon's pid is not in the flag)

    # then: the pod removed holds nothing, the pod created is counted where it runs
    settled = wait_until(lambda: (lambda d: d if gone_uid not in d and created_uid in d else None)(on_disk(lab)),
                         "the start-up resync written")
    assert created_cid in settled[created_uid]["containers"]
    assert settled[created_uid]["nodes"] == decided[created_uid]["nodes"]
    # the in-flight create: counted if containerd made it, else the kubelet's retry places it
    with grpc.insecure_channel(f"unix://{lab.containerd.socket}") as ch:
        made = [c for c in pbg.RuntimeServiceStub(ch).ListContainers(pb.ListContainersRequest(), timeout=30).containers
                if c.pod_sandbox_id == inflight_sid]
    with grpc.insecure_channel(f"unix://{lab.socket}") as ch:
        rt = pbg.RuntimeServiceStub(ch)
        if made:
            # (not started: containerd may fail to start what a cut call created; the
            # kubelet would then remove it and create another)
            assert made[0].id in settled[inflight_uid]["containers"]
            assert settled[inflight_uid]["nodes"] == decided[inflight_uid]["nodes"]
        else:
            assert inflight_uid not in settled
            cid = rt.CreateContainer(pb.CreateContainerRequest(
                pod_sandbox_id=inflight_sid, config=pb.ContainerConfig.FromString(container), sandbox_config=sb),
                timeout=60).container_id
            rt.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=60)
    print(f"\nin-flight create {'made' if made else 'not made'} by containerd")
    assert lab.placements_missing() == []
    assert_counted_once(lab)


def assert_counted_once(lab: RestartLab) -> None:
    """Every container containerd runs for a ready pod of NAMESPACE is counted in numa.json,
    once, under its own pod; numa.json counts nothing else."""
    from cri_api.v1 import api_pb2 as pb
    from cri_api.v1 import api_pb2_grpc as pbg
    import grpc

    with grpc.insecure_channel(f"unix://{lab.containerd.socket}") as ch:
        rt = pbg.RuntimeServiceStub(ch)
        ready = {p.id for p in rt.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=30).items
                 if p.metadata.namespace == NAMESPACE and p.state == pb.SANDBOX_READY}
        live = {c.id: c.pod_sandbox_id for c in rt.ListContainers(pb.ListContainersRequest(), timeout=30).containers
                if c.pod_sandbox_id in ready and c.state in (pb.CONTAINER_CREATED, pb.CONTAINER_RUNNING)}

    def counted() -> List[str]:
        return [cid for a in lab.numa_state() for cid in a["containers"]]

    wait_until(lambda: sorted(counted()) == sorted(live), "numa.json to count what containerd runs", 10)
    allocs = lab.numa_state()
    assert all(a["sandbox_id"] in ready for a in allocs), allocs
    assert all(live[cid] == a["sandbox_id"] for a in allocs for cid in a["containers"]), allocs
