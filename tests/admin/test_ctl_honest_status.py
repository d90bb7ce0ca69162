"""``anolisnuma-ctl`` says what is so, no more: degraded while containerd does not answer
(and why), ready again once it does and a resync worked; which QoS knobs this kernel has;
a pod moved live shows the move's source and reason in the tables and its history; a
stopped sandbox is shown stopped, not "not managed"."""

from __future__ import annotations

from conftest import Node
from test_ctl_on_a_running_daemon import busy_node, rows_of

from anolisnuma.testing.fake_cri import FakeCri
from anolisnuma.testing.waiting import wait_until
from cri_proto import api_pb2 as pb


def test_status_is_degraded_while_containerd_does_not_answer_and_ready_again_after(node: Node):
    busy_node(node)
    s = node.ctl_json("status")
    assert s["state"] == "ready" and s["degraded_because"] == []
    code, out, _ = node.ctl("status")
    assert ", ready\n" in out.splitlines(keepends=True)[0]
    # which QoS knobs this kernel has, and that the others are listed with why
    assert "kernel knobs:       cpu.bvt_warp_ns, kernel.sched_group_identity_enabled, memory.priority" in out
    assert "(3 not on this kernel, listed below)" in out
    assert "kubelet cgroups:    root / (cgroupfs kubepods, systemd kubepods.slice; from kubelet defaults)" in out

    socket_path = node.fake.socket_path
    node.fake.stop(0)
    s = node.ctl_json("status")
    assert s["state"] == "degraded"
    assert s["degraded_because"][0].startswith(f"containerd does not answer at {node.data['runtime']['endpoint']}: "
                                               "UNAVAILABLE")
    resync = node.daemon.controllers.get("runtime-resync")
    assert resync.step() is None   # the periodic pass fails: counted, its retry backed off
    s = node.ctl_json("status")
    assert len(s["degraded_because"]) == 2
    assert s["degraded_because"][1].startswith("cannot list containerd: 1 failed pass in a row")
    assert "next try in 2s" in s["degraded_because"][1]
    assert resync.wait_seconds() == 2.0
    code, out, _ = node.ctl("status")
    assert code == 0
    assert out.splitlines()[0].endswith('DEGRADED (see "degraded because")')
    assert "degraded because:   containerd does not answer at" in out
    assert "degraded because:   cannot list containerd: 1 failed pass" in out

    node.fake = FakeCri(socket_path, containers=0, sandboxes=0).start()
    s = node.ctl_json("status")   # containerd answers; the resync has not caught up yet
    assert s["state"] == "degraded" and len(s["degraded_because"]) == 1
    assert s["degraded_because"][0].startswith("cannot list containerd")
    assert resync.step() is not None
    s = node.ctl_json("status")
    assert s["state"] == "ready" and s["degraded_because"] == [] and resync.wait_seconds() == 60.0


def test_a_pod_moved_live_shows_the_moves_source_and_reason(node: Node):
    pods = busy_node(node)
    web0 = pods["web-0"]
    before = next(p for p in node.ctl_json("pods") if p["name"] == "web-0")["numa"]
    assert before["source"] == "balance" and before["moves"] == []
    to = 1 - before["nodes"][0]
    service = node.daemon.hooks[0].placement
    assert service.move(web0.uid, [to], reason="talks to batch/web-1 at 20 MB/s")
    assert node.daemon.controllers.get("numa-repin").step() == 1

    after = next(p for p in node.ctl_json("pods") if p["name"] == "web-0")["numa"]
    assert after["source"] == "affinity" and after["nodes"] == [to]
    assert after["why"] == (f"affinity; moved live from node {before['nodes'][0]} to node {to} by affinity "
                            f"(talks to batch/web-1 at 20 MB/s)")
    [move] = after["moves"]
    assert move["outcome"] == "applied" and move["from_nodes"] == before["nodes"] and move["to_nodes"] == [to]

    code, out, err = node.ctl("pods")
    assert code == 0, err
    row = next(r for r in rows_of(out) if r[1] == "web-0")
    assert row[9].startswith("affinity; moved live from node") and "talks to batch/web-1" in row[9]

    [e] = node.ctl_json("explain", "batch/web-0")
    assert e["numa"]["moves"] == [move]
    code, out, err = node.ctl("explain", "batch/web-0")
    assert code == 0, err
    head = dict(line.split(":", 1) for line in out.split("\n\n")[0].splitlines())
    assert head["numa"].strip().endswith(after["why"])
    calls = rows_of(out.split("\n\n")[-1])
    moved = [r for r in calls if r[1] == "live NUMA move"]
    assert moved == [[moved[0][0], "live NUMA move", "-", "applied", "-",
                      f"numa: moved from node {before['nodes'][0]} to node {to} by affinity "
                      f"(talks to batch/web-1 at 20 MB/s)"]]
    assert calls.index(moved[0]) == len(calls) - 1   # after the pod's calls, in time order


def test_a_stopped_sandbox_is_shown_stopped(node: Node):
    pods = busy_node(node)
    web0 = pods["web-0"]
    k = node.kubelet
    for cid in web0.containers.values():
        k.call("StopContainer", pb.StopContainerRequest(container_id=cid), pb.StopContainerResponse)
    k.call("StopPodSandbox", pb.StopPodSandboxRequest(pod_sandbox_id=web0.sandbox_id), pb.StopPodSandboxResponse)
    node.settle()
    row = wait_until(lambda: next((p for p in node.ctl_json("pods") if p["name"] == "web-0" and p["state"] == "stopped"),
                                  None), "web-0 to show stopped")
    assert row["qos"] == {"level": None, "why": "sandbox stopped: its cgroup (and what was set there) is gone"}
    assert row["numa"] == {"placed": False, "why": "sandbox stopped: its CPUs were released"}
    assert all(p["state"] == "ready" for p in node.ctl_json("pods") if p["name"] != "web-0")
    code, out, _ = node.ctl("pods")
    row = next(r for r in rows_of(out) if r[1] == "web-0")
    assert "sandbox stopped" in row[5] and row[-1] == "sandbox stopped: its CPUs were released"
    code, out, _ = node.ctl("explain", "batch/web-0")
    assert f"{web0.sandbox_id} (stopped)" in out
    assert "not managed" not in out
