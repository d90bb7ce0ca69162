"""Sanity of the harness itself: the private containerd, talked to directly (no proxy)."""

from __future__ import annotations

import os
import time

import pytest
from cri_client import BUSYBOX_IMAGE, PAUSE_IMAGE, pb, read_file

CG = "/sys/fs/cgroup"
CONTAINERD_BUILDS = ("1.6", "1.7", "2.2")   # the harness every other test relies on, on each build



def test_version_names_containerd(kubelet_direct, containerd):
    print(f"\ncold start (containerd up + images imported): {containerd.cold_start_s:.3f} s")
    v = kubelet_direct.version()
    assert v.runtime_name == "containerd"
    assert v.runtime_api_version.startswith("v1")


def test_runtime_and_network_ready(kubelet_direct):
    conditions = kubelet_direct.status()
    assert conditions.get("RuntimeReady") is True
    assert conditions.get("NetworkReady") is True  # our CNI bridge conflist was loaded


def test_both_test_images_are_listed(kubelet_direct):
    tags = kubelet_direct.list_images()
    assert PAUSE_IMAGE in tags and BUSYBOX_IMAGE in tags, tags


def test_host_network_pod_resources_land_in_cgroup_files(kubelet_direct):
    # given a burstable host-network pod whose cgroup the "kubelet" created
    t0 = time.monotonic()
    pod = kubelet_direct.run_pod(name="direct-node", network="node")
    res = kubelet_direct.resources(cpu_shares=512, cpu_period=100000, cpu_quota=150000,
                                   memory_limit=64 << 20, cpuset_cpus="1", cpuset_mems="0")
    # when a container with resources starts in it
    cid = kubelet_direct.run_container(pod, "work", res)
    print(f"\npod start (RunPodSandbox+CreateContainer+StartContainer): "
          f"{time.monotonic() - t0:.3f} s")
    assert pod.cgroup_parent == f"/kubepods/burstable/pod{pod.uid}"

    # then the values are in the container's cgroup v1 files under the pod dir
    status, info = kubelet_direct.container_status(cid)
    assert status.state == pb.CONTAINER_RUNNING
    assert info["runtimeSpec"]["linux"]["cgroupsPath"] == f"{pod.cgroup_parent}/{cid}"
    d = {c: f"{CG}/{c}{pod.cgroup_parent}/{cid}" for c in ("cpu", "cpuset", "memory")}
    assert read_file(f"{d['cpu']}/cpu.shares") == "512"
    assert read_file(f"{d['cpu']}/cpu.cfs_quota_us") == "150000"
    assert read_file(f"{d['cpuset']}/cpuset.cpus") == "1"
    assert read_file(f"{d['memory']}/memory.limit_in_bytes") == str(64 << 20)
    assert str(info["pid"]) in read_file(f"{d['cpu']}/cgroup.procs").split()

    # and an update lands there too
    kubelet_direct.update_resources(cid, kubelet_direct.resources(
        cpu_shares=256, cpu_period=100000, cpu_quota=50000, memory_limit=96 << 20,
        cpuset_cpus="0", cpuset_mems="0"))
    assert read_file(f"{d['cpu']}/cpu.shares") == "256"
    assert read_file(f"{d['cpuset']}/cpuset.cpus") == "0"
    assert read_file(f"{d['memory']}/memory.limit_in_bytes") == str(96 << 20)

    # and stop/remove take the container and then the pod cgroup away
    kubelet_direct.stop_container(cid)
    kubelet_direct.remove_container(cid)
    assert not os.path.exists(d["cpu"])
    kubelet_direct.stop_pod(pod)
    kubelet_direct.remove_pod(pod)
    assert not os.path.exists(f"{CG}/cpu{pod.cgroup_parent}")


def test_pod_network_pod_gets_an_ip_from_the_bridge(kubelet_direct, containerd):
    pod = kubelet_direct.run_pod(name="direct-cni", network="pod")
    st = kubelet_direct.pod_status(pod.id).status
    assert st.state == pb.SANDBOX_READY
    prefix = containerd.subnet.rsplit(".", 1)[0] + "."
    assert st.network.ip.startswith(prefix), (st.network.ip, containerd.subnet)
    cid = kubelet_direct.run_container(pod, "net")
    r = kubelet_direct.exec_sync(cid, ["ip", "-4", "-o", "addr", "show", "eth0"])
    assert r.exit_code == 0 and st.network.ip in r.stdout.decode(), r.stdout


@pytest.mark.parametrize("n", [2])
def test_cleanup_of_kubelet_like_removes_running_pods(containerd, n):
    from cri_client import KubeletLike

    kl = KubeletLike(containerd.socket, harness=containerd)
    pods = [kl.run_pod(network="node") for _ in range(n)]
    for p in pods:
        kl.run_container(p, "c")
    assert kl.cleanup() == []
    ids = {p.id for p in kl.list_pods()}
    kl.close()
    assert not ids & {p.id for p in pods}
    for p in pods:
        assert not os.path.exists(f"{CG}/cpu{p.cgroup_parent}")


def test_containers_survive_a_containerd_kill_and_restart(kubelet_direct, containerd):
    # given a running container
    pod = kubelet_direct.run_pod(network="node")
    cid = kubelet_direct.run_container(pod, "survivor")
    _, before = kubelet_direct.container_status(cid)
    # when containerd is SIGKILLed and started again on the same state
    containerd.kill()
    assert containerd.pid is None
    containerd.restart()
    # then the container is still running, with the same process, in its shim
    status, after = kubelet_direct.container_status(cid)
    assert status.state == pb.CONTAINER_RUNNING
    assert after["pid"] == before["pid"]
