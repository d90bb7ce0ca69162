"""NumaHook driven the way the pipeline drives it, against a fake kubelet and containerd."""

import json
import os
import threading
import uuid
from typing import Dict, List, Optional

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from structlog.testing import capture_logs

from anolisnuma.config import PathsConfig
from anolisnuma.hooks.numa import NumaHook
from anolisnuma.pipeline import hooks as H
from anolisnuma.policies.numa.balance import millicpu_of
from anolisnuma.policies.numa.config import NumaConfig
from anolisnuma.policies.numa.cpuset import CpuSet
from anolisnuma.policies.numa.rules import PinSpec
from anolisnuma.policies.numa.selection import SKIP_KEY
from anolisnuma.state.gone import PodGone, PodKeys
from anolisnuma.state.records import ContainerRecord, ContainerResources, PodRecord
from anolisnuma.testing import fake_sysfs as F
from anolisnuma.testing.waiting import wait_until
from cri_proto import api_pb2 as pb

PERIOD = 100000
GIB = F.GIB


_ids = iter(range(1, 1 << 62))


def hexid() -> str:
    """A containerd-style ID (64 hex digits)."""
    return f"{next(_ids):064x}"


class FakeNode:
    """A kubelet + containerd stand-in: builds CRI requests, runs the hook's pre and post
    stages as the pipeline does (pre on a copy that is kept only when the hook succeeds),
    and remembers the resources every container ended up with."""

    def __init__(self, tmp: str, spec: F.FakeTopology, config: Optional[NumaConfig] = None,
                 kubelet_policy: str = "none") -> None:
        self.tmp = tmp
        self.spec = spec
        self.topology = spec.topology(os.path.join(tmp, "sys"))
        self.paths = PathsConfig(sys_root=os.path.join(tmp, "sys"), state_dir=os.path.join(tmp, "state"),
                                 kubelet_cpu_manager_state=os.path.join(tmp, "kubelet", "cpu_manager_state"))
        self.config = config or NumaConfig(enabled=True, namespaces=["batch"])
        self.pods: Dict[str, PodRecord] = {}
        self.sandbox_configs: Dict[str, pb.PodSandboxConfig] = {}
        self.containers: Dict[str, ContainerRecord] = {}
        self.policy = kubelet_policy
        self._serial = 0
        self.entries: Dict[str, Dict[str, str]] = {}
        self.default = self.topology.online if kubelet_policy == "static" else CpuSet()
        if kubelet_policy == "static":
            self._write_state()
        self.hook = NumaHook(self.config, self.paths, self.topology)

    # ------------------------------------------------------------------ kubelet checkpoint
    def _write_state(self) -> None:
        F.write_cpu_manager_state(self.paths.kubelet_cpu_manager_state, policy=self.policy,
                                  default_cpuset=str(self.default), entries=self.entries)

    def exclusive(self) -> CpuSet:
        out = CpuSet()
        for containers in self.entries.values():
            for cpus in containers.values():
                out = out | CpuSet.parse(cpus)
        return out

    def kubelet_reconcile(self) -> None:
        """What the kubelet's CPU manager does after its state changed: send the shared pool
        to every shared container, the exclusive set to every exclusive one."""
        for cid, c in list(self.containers.items()):
            uid = self.pods[c.sandbox_id].uid
            cpus = self.entries.get(uid, {}).get(c.name)
            self.update(cid, cpus if cpus is not None else str(self.default))

    def set_kubelet_state(self, default: str, entries: Dict[str, Dict[str, str]]) -> None:
        self.default = CpuSet.parse(default)
        self.entries = entries
        self._write_state()
        self.kubelet_reconcile()

    # ------------------------------------------------------------------ pipeline stand-in
    def _run(self, call: H.Call, reply=None) -> H.Call:
        if self.hook.wants_pre(call.method):
            work = type(call.request)()
            work.CopyFrom(call.request)
            attempt = H.Call(method=call.method, request=work, pod=call.pod, container=call.container,
                             notes=call.notes)
            self.hook.pre(attempt)
            if attempt.modified:
                call.request = work
                call.modified = True
        return call

    def _post(self, call: H.Call, reply) -> None:
        call.reply = reply
        if self.hook.wants_post(call.method):
            self.hook.post(call)

    def run_pod(self, name: str, namespace: str = "batch", annotations: Optional[Dict[str, str]] = None,
                uid: Optional[str] = None, pod_millicpu: int = 0, pod_memory: int = 0) -> PodRecord:
        req = pb.RunPodSandboxRequest()
        md = req.config.metadata
        self._serial += 1
        md.name, md.namespace, md.uid = name, namespace, uid or str(uuid.UUID(int=self._serial))
        for k, v in (annotations or {}).items():
            req.config.annotations[k] = v
        req.config.linux.cgroup_parent = f"/kubepods/burstable/pod{md.uid}"
        if pod_millicpu:
            req.config.linux.resources.cpu_shares = pod_millicpu * 1024 // 1000
        if pod_memory:
            req.config.linux.resources.memory_limit_in_bytes = pod_memory
        pod = PodRecord(sandbox_id="", uid=md.uid, name=name, namespace=namespace,
                        cgroup_parent=req.config.linux.cgroup_parent, annotations=dict(annotations or {}))
        call = self._run(H.Call(H.RUN_POD_SANDBOX, req, pod=pod))
        sid = f"{self._serial:032x}" * 2
        pod.sandbox_id = sid
        self.pods[sid] = pod
        self.sandbox_configs[sid] = req.config
        self._post(call, pb.RunPodSandboxResponse(pod_sandbox_id=sid))
        return pod

    def create(self, pod: PodRecord, name: str, request: int = 0, limit: int = 0, memory: int = 0,
               kubelet_cpus: Optional[str] = None, post: bool = True) -> str:
        req = pb.CreateContainerRequest(pod_sandbox_id=pod.sandbox_id)
        req.config.metadata.name = name
        req.sandbox_config.CopyFrom(self.sandbox_configs[pod.sandbox_id])
        res = req.config.linux.resources
        res.cpu_period = PERIOD
        res.cpu_shares = max(request * 1024 // 1000, 2)
        res.cpu_quota = limit * PERIOD // 1000 if limit else -1
        res.memory_limit_in_bytes = memory
        if kubelet_cpus is None:
            kubelet_cpus = self.entries.get(pod.uid, {}).get(name, str(self.default))
        res.cpuset_cpus = kubelet_cpus
        call = self._run(H.Call(H.CREATE_CONTAINER, req, pod=pod))
        self.last_call = call
        self._serial += 1
        cid = f"{self._serial:064x}"
        r = call.request.config.linux.resources
        record = ContainerRecord(cid, pod.sandbox_id, name, resources=ContainerResources(
            r.cpu_period, r.cpu_quota, r.cpu_shares, r.memory_limit_in_bytes, r.cpuset_cpus, r.cpuset_mems))
        self.containers[cid] = record
        if post:
            call.container = record
            self._post(call, pb.CreateContainerResponse(container_id=cid))
        return cid

    def update(self, cid: str, cpus: str, **fields) -> H.Call:
        req = pb.UpdateContainerResourcesRequest(container_id=cid)
        req.linux.cpuset_cpus = cpus
        for k, v in fields.items():
            setattr(req.linux, k, v)
        c = self.containers[cid]
        call = self._run(H.Call(H.UPDATE_CONTAINER_RESOURCES, req, pod=self.pods[c.sandbox_id], container=c))
        # containerd applies non-empty cpuset fields
        if call.request.linux.cpuset_cpus:
            c.resources.cpuset_cpus = call.request.linux.cpuset_cpus
        if call.request.linux.cpuset_mems:
            c.resources.cpuset_mems = call.request.linux.cpuset_mems
        self._post(call, pb.UpdateContainerResourcesResponse())
        return call

    def remove_container(self, cid: str) -> None:
        c = self.containers[cid]
        call = self._run(H.Call(H.REMOVE_CONTAINER, pb.RemoveContainerRequest(container_id=cid),
                                pod=self.pods.get(c.sandbox_id), container=c))
        del self.containers[cid]
        self._post(call, pb.RemoveContainerResponse())

    def remove_pod(self, pod: PodRecord) -> None:
        for method, msg, rep in ((H.STOP_POD_SANDBOX, pb.StopPodSandboxRequest, pb.StopPodSandboxResponse),
                                 (H.REMOVE_POD_SANDBOX, pb.RemovePodSandboxRequest, pb.RemovePodSandboxResponse)):
            call = self._run(H.Call(method, msg(pod_sandbox_id=pod.sandbox_id), pod=pod))
            if method == H.REMOVE_POD_SANDBOX:
                for cid in [c for c, rec in self.containers.items() if rec.sandbox_id == pod.sandbox_id]:
                    del self.containers[cid]
                self.pods.pop(pod.sandbox_id, None)
            self._post(call, rep())
        self.entries.pop(pod.uid, None)

    def restart(self) -> None:
        """kill -9 and start again: a new hook from the state directory, then resync."""
        self.hook.close()
        self.hook = NumaHook(self.config, self.paths, self.topology)
        self.hook.resync(list(self.pods.values()), list(self.containers.values()))

    # ------------------------------------------------------------------ observations
    def cpus_of(self, cid: str) -> CpuSet:
        return CpuSet.parse(self.containers[cid].resources.cpuset_cpus)

    def mems_of(self, cid: str) -> str:
        return self.containers[cid].resources.cpuset_mems

    def saved(self) -> dict:
        with open(os.path.join(self.paths.state_dir, "numa.json")) as f:
            return json.load(f)


@pytest.fixture
def seed(tmp_path):
    return FakeNode(str(tmp_path), F.seed_16cpu())


def kunpeng_static(tmp_path, **cfg) -> FakeNode:
    node = FakeNode(str(tmp_path), F.kunpeng920(), NumaConfig(enabled=True, namespaces=["batch"], **cfg),
                    kubelet_policy="static")
    return node


# ====================================================================== balance through the hook
def test_seed_scenario_four_pods_without_resources(seed):
    pods = [seed.run_pod(f"p{i}") for i in range(4)]
    cids = [seed.create(p, "app") for p in pods]
    assert [str(seed.cpus_of(c)) for c in cids] == ["0-3", "4-7", "8-11", "12-15"]
    assert [seed.mems_of(c) for c in cids] == ["0", "1", "2", "3"]
    assert "placed on node 3 cpus 12-15" in seed.last_call.notes["numa"]


def test_every_container_of_a_pod_gets_the_same_cpuset(seed):
    seed.run_pod("other")
    pod = seed.run_pod("web")
    cids = [seed.create(pod, n, request=500) for n in ("app", "sidecar", "log")]
    assert len({str(seed.cpus_of(c)) for c in cids}) == 1
    assert len({seed.mems_of(c) for c in cids}) == 1
    assert seed.hook.placement.ledger.get(pod.uid).demand_millicpu() == 1500


def test_unmanaged_and_opted_out_pods_are_untouched(seed):
    for pod in (seed.run_pod("x", namespace="default"), seed.run_pod("y", annotations={SKIP_KEY: "true"})):
        seed.create(pod, "app", request=1000)
        assert not seed.last_call.modified and "numa" not in seed.last_call.notes
    assert len(seed.hook.placement.ledger) == 0
    assert not os.path.exists(os.path.join(seed.paths.state_dir, "numa.json"))


def test_pod_level_resources_count_from_the_first_container(seed):
    big = seed.run_pod("big", pod_millicpu=3000)
    seed.create(big, "tiny", request=100)
    assert seed.hook.placement.ledger.get(big.uid).demand_millicpu() == 3000
    small = seed.run_pod("small")
    seed.create(small, "app", request=100)
    assert seed.hook.placement.ledger.get(small.uid).nodes != seed.hook.placement.ledger.get(big.uid).nodes


def test_memory_limit_widens_memory_nodes(seed):
    pod = seed.run_pod("mem")
    cid = seed.create(pod, "app", request=1000, memory=12 * GIB)
    assert str(seed.cpus_of(cid)) == "0-3" and seed.mems_of(cid) == "0-1"


def test_disabled_hook_serves_nothing(tmp_path):
    node = FakeNode(str(tmp_path), F.seed_16cpu(), NumaConfig(enabled=False, namespaces=["batch"]))
    assert node.hook.methods == frozenset()
    pod = node.run_pod("p")
    node.create(pod, "app")
    assert not node.last_call.modified


# ====================================================================== kubelet static CPU manager
DESIGN_ENTRIES = {"52e08695-1b3d-43c4-bc3d-8020a27a876f": {"specjbb-container2": "1-20"},
                  "88ee6d1e-f436-45ca-a8ae-3db9d2309358": {"specjb-container": "32-33"},
                  "b6d7cfab-8f71-4e52-ace3-6c62b4f3cbef": {"specjbb-container": "21-22"}}


def test_design_example_exclusive_containers_are_left_alone(tmp_path):
    node = kunpeng_static(tmp_path)
    node.default, node.entries = CpuSet.parse("0,23-31,34-127"), DESIGN_ENTRIES
    node._write_state()
    guaranteed = node.run_pod("specjb", uid="88ee6d1e-f436-45ca-a8ae-3db9d2309358")
    cid = node.create(guaranteed, "specjb-container", request=2000, limit=2000)
    assert not node.last_call.modified and str(node.cpus_of(cid)) == "32-33"
    assert "kubelet-exclusive" in node.last_call.notes["numa"]
    shared = [node.run_pod(f"s{i}") for i in range(3)]
    cids = [node.create(p, "app", request=4000) for p in shared]
    assert [str(node.cpus_of(c)) for c in cids] == ["64-95", "96-127", "34-63"]
    assert all(node.cpus_of(c).isdisjoint(node.exclusive()) for c in cids)


def test_unknown_cpus_outside_the_pool_are_treated_as_exclusive(tmp_path):
    node = kunpeng_static(tmp_path)
    node.default = CpuSet.parse("0-3,8-127")
    node._write_state()
    pod = node.run_pod("g")
    cid = node.create(pod, "app", request=4000, limit=4000, kubelet_cpus="4-7")   # not in entries yet
    assert str(node.cpus_of(cid)) == "4-7" and not node.last_call.modified


def test_kubelet_update_is_merged_not_swallowed(tmp_path):
    node = kunpeng_static(tmp_path)
    pod = node.run_pod("web")
    cid = node.create(pod, "app", request=1000)
    assert str(node.cpus_of(cid)) == "0-31"
    # the kubelet gives 0-7 to a guaranteed pod and re-sends the shrunken pool to everyone
    g = node.run_pod("g", namespace="default")
    node.entries = {g.uid: {"app": "0-7"}}
    node.default = CpuSet.parse("8-127")
    node._write_state()
    gid = node.create(g, "app", request=8000, limit=8000)
    call = node.update(cid, "8-127")
    assert call.modified and call.request.linux.cpuset_cpus == "8-31"
    assert "merged kubelet cpuset 8-127 -> 8-31" in call.notes["numa"]
    assert str(node.cpus_of(gid)) == "0-7"
    # the pool grows back: so does the pod, within its node
    node.set_kubelet_state("0-127", {})
    assert str(node.cpus_of(cid)) == "0-31"


def test_pod_follows_the_pool_when_it_leaves_the_pods_node(tmp_path):
    node = kunpeng_static(tmp_path)
    pod = node.run_pod("web")
    a = node.create(pod, "app", request=1000)
    b = node.create(pod, "side", request=1000)
    assert str(node.cpus_of(a)) == "0-31"
    g = node.run_pod("g", namespace="default")
    node.create(g, "app", request=32000, limit=32000, kubelet_cpus="0-31")
    with capture_logs() as logs:
        node.set_kubelet_state("32-127", {g.uid: {"app": "0-31"}})
    assert str(node.cpus_of(a)) == str(node.cpus_of(b)) == "32-63"     # node 1: nearest to node 0
    assert node.mems_of(a) == node.mems_of(b) == "1"
    assert node.hook.placement.ledger.get(pod.uid).nodes == (1,)
    assert any("re-placed" in e["event"] for e in logs)


def test_update_without_cpuset_keeps_our_pinning_and_resizes(seed):
    pod = seed.run_pod("web")
    cid = seed.create(pod, "app", request=1000)
    call = seed.update(cid, "", cpu_shares=2048, cpu_period=PERIOD, cpu_quota=-1)
    assert call.request.linux.cpuset_cpus == "0-3"
    assert seed.hook.placement.ledger.get(pod.uid).demand_millicpu() == 2000


def test_kubelet_state_file_is_watched(tmp_path):
    node = kunpeng_static(tmp_path, poll_interval_seconds=0.05)
    watcher = next(c for c in node.hook.controllers(lambda timeout: None) if c.name == "numa-watch")
    watcher.start()
    try:
        node.default = CpuSet.parse("4-127")
        node.entries = {"u": {"c": "0-3"}}
        node._write_state()
        wait_until(lambda: str(node.hook.placement.shared_pool) == "4-127",
                   "the watcher to take the kubelet's new shared pool")
    finally:
        watcher.stop()


# ====================================================================== rules
def test_config_pin_wins_over_balance(tmp_path):
    cfg = NumaConfig(enabled=True, namespaces=["batch"],
                     pins=(PinSpec("default", "db-*", (3,), "numa.pin[0]"), PinSpec("*", "x", (9,), "numa.pin[1]")))
    with capture_logs() as logs:
        node = FakeNode(str(tmp_path), F.seed_16cpu(), cfg)
    assert any("numa.pin[1]" in str(e.get("problem")) for e in logs)
    pod = node.run_pod("db-0", namespace="default")        # managed because a rule names it
    cid = node.create(pod, "app", request=1000)
    assert str(node.cpus_of(cid)) == "12-15" and "rule" in node.last_call.notes["numa"]


def test_oenuma_rules_dir_with_a_bad_file(tmp_path):
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "10-good.yaml").write_text("""
apiVersion: resource.sop.huawei.com/v1alpha1
kind: Oenuma
metadata: {name: plan, namespace: default}
spec:
  node:
  - name: worker-1
    numa: [{numaNum: 2, cpuset: "8-9", memset: "2"}]
    podAffinity:
    - {namespace: default, podName: nginx, numaNum: 2}
    - {namespace: default, podName: ghost, numaNum: 12}
""")
    (rules / "20-bad.yaml").write_text("apiVersion: resource.sop.huawei.com/v1alpha1\nkind: Oenuma\nspec: [\n")
    (rules / "README.txt").write_text("not a rule file")
    cfg = NumaConfig(enabled=True, node_name="worker-1", rules_dir=str(rules))
    with capture_logs() as logs:
        node = FakeNode(str(tmp_path), F.seed_16cpu(), cfg)
    problems = [e["problem"] for e in logs if "problem" in e]
    assert any("20-bad.yaml" in p for p in problems)
    assert any("numaNum 12" in p for p in problems)
    pod = node.run_pod("nginx", namespace="default")
    cid = node.create(pod, "app")
    assert str(node.cpus_of(cid)) == "8-9" and node.mems_of(cid) == "2"
    # editing the directory is picked up by the poller's check
    (rules / "20-bad.yaml").write_text("""
apiVersion: resource.sop.huawei.com/v1alpha1
kind: Oenuma
spec: {node: [{name: WORKER-1, podAffinity: [{namespace: default, podName: wrk, numaNum: 1}]}]}
""")
    node.hook.placement.reload_rules()
    wrk = node.run_pod("wrk", namespace="default")
    assert str(node.cpus_of(node.create(wrk, "app"))) == "4-7"


# ====================================================================== release, restart, resync
def test_release_returns_capacity_idempotently(seed):
    pod = seed.run_pod("p")
    a = seed.create(pod, "a", request=1000)
    seed.create(pod, "b", request=1000)
    assert seed.hook.placement.ledger.loads()[0].millicpu == 2000
    seed.remove_container(a)
    assert seed.hook.placement.ledger.loads()[0].millicpu == 1000
    seed.remove_pod(pod)
    assert all(load.millicpu == 0 and load.pods == 0 for load in seed.hook.placement.ledger.loads().values())
    seed.remove_pod(pod)      # the kubelet retries: nothing happens
    assert seed.saved()["allocations"] == []


def test_what_the_reaper_says_is_gone_is_released_and_persisted(seed):
    """A teardown that never passed the proxy: the ledger holds the pod until it is told."""
    p = seed.hook.placement
    pod, other = seed.run_pod("p"), seed.run_pod("q")
    a = seed.create(pod, "a", request=1000)
    b = seed.create(other, "b", request=1000)
    assert seed.hook.holders() == [p]
    assert p.held() == PodKeys.of([pod.uid, other.uid], [pod.sandbox_id, other.sandbox_id], [a, b])
    assert p.structures() == {"allocations": 2, "containers": 2, "pending_repins": 0, "moves_in_flight": 0,
                              "moved_pods": 0}
    p.forget(PodGone.of_ids("resync", container_ids=[b]))
    assert p.held().container_ids == {a}
    p.forget(PodGone.of_ids("resync", [pod.uid, other.uid]))
    assert p.structures() == {"allocations": 0, "containers": 0, "pending_repins": 0, "moves_in_flight": 0,
                              "moved_pods": 0}
    assert seed.saved()["allocations"] == []
    assert all(load.millicpu == 0 for load in p.ledger.loads().values())


def test_without_the_writer_thread_a_decision_is_on_disk_before_the_request_goes_on(seed):
    """(The daemon runs the writer thread: then the decision is written behind the call, and
    tests/hooks/test_numa_crash_windows.py shows what a crash before the write leaves.)"""
    pod = seed.run_pod("p")
    seed.create(pod, "app", request=1000, post=False)      # crash after forwarding, before the reply
    saved = seed.saved()["allocations"]
    assert saved[0]["pod_uid"] == pod.uid and saved[0]["home"] == "0-3" and "app" in saved[0]["pending"]


def test_restart_restores_and_resync_reconciles(seed):
    keep = seed.run_pod("keep")
    k1 = seed.create(keep, "app", request=1000)
    gone = seed.run_pod("gone")
    seed.create(gone, "app", request=1000)
    crashed = seed.run_pod("crashed")
    c1 = seed.create(crashed, "app", request=1000, post=False)   # reply never seen
    # while we were down: "gone" disappeared
    del seed.pods[gone.sandbox_id]
    seed.containers = {k: v for k, v in seed.containers.items() if v.sandbox_id != gone.sandbox_id}
    seed.restart()
    ledger = seed.hook.placement.ledger
    assert gone.uid not in ledger and keep.uid in ledger
    assert ledger.by_container(k1).pod_uid == keep.uid and ledger.by_container(c1).pod_uid == crashed.uid
    assert ledger.get(crashed.uid).pending == {}
    assert ledger.loads() == ledger.recomputed_loads()
    assert sum(load.millicpu for load in ledger.loads().values()) == 2000


def test_a_later_resync_drops_what_vanished_but_never_what_calls_named(seed):
    """The periodic resync (no restart): a pod whose removal the proxy never saw is
    released, a container created behind its back is counted, and a pod or container a
    call named since the listing (``fresh``) is left as the calls made it."""
    seed.hook.resync(list(seed.pods.values()), list(seed.containers.values()))   # the start-up one
    lost = seed.run_pod("lost")
    seed.create(lost, "app", request=1000)
    busy = seed.run_pod("busy")
    seed.create(busy, "app", request=1000)
    grows = seed.run_pod("grows")
    seed.create(grows, "app", request=1000)
    late = seed.create(grows, "late", request=500, post=False)     # in flight: its reply not seen yet
    pods, containers = list(seed.pods.values()), [c for c in seed.containers.values() if c.container_id != late]
    # the listing: "lost" was removed without us; "busy" too, but a call is still on it
    pods = [p for p in pods if p.sandbox_id not in (lost.sandbox_id, busy.sandbox_id)]
    containers = [c for c in containers if c.sandbox_id in {p.sandbox_id for p in pods}]
    extra = hexid()
    containers.append(ContainerRecord(extra, grows.sandbox_id, "sidecar", resources=ContainerResources(
        cpu_period=PERIOD, cpu_quota=50000, cpu_shares=512, cpuset_cpus="0-15")))
    seed.hook.resync(pods, containers, frozenset({busy.uid}))
    ledger = seed.hook.placement.ledger
    assert lost.uid not in ledger and busy.uid in ledger
    assert ledger.by_container(extra).pod_uid == grows.uid          # counted under its pod...
    alloc = ledger.get(grows.uid)
    assert seed.hook.placement.pending_updates() == [(extra, str(alloc.cpus(ledger.pool)), str(alloc.mems))]
    assert set(ledger.get(grows.uid).pending) == {"late"}              # a later resync keeps creates in flight
    assert ledger.loads() == ledger.recomputed_loads()
    assert sum(load.millicpu for load in ledger.loads().values()) == 3000
    assert {a["pod_uid"] for a in seed.saved()["allocations"]} == {busy.uid, grows.uid}


def test_corrupt_state_is_rebuilt_from_containerd(seed):
    pods = [seed.run_pod(f"p{i}") for i in range(3)]
    cids = [seed.create(p, "app", request=1000) for p in pods]
    before = {p.uid: seed.hook.placement.ledger.get(p.uid).nodes for p in pods}
    with open(os.path.join(seed.paths.state_dir, "numa.json"), "w") as f:
        f.write("{garbage")
    with capture_logs() as logs:
        seed.restart()
    assert any("corrupt" in e["event"] for e in logs)
    after = {p.uid: seed.hook.placement.ledger.get(p.uid).nodes for p in pods}
    assert after == before
    assert all(seed.hook.placement.ledger.get(p.uid).source == "adopted" for p in pods)
    assert seed.hook.placement.pending_updates() == []
    # a new pod still avoids the occupied nodes
    new = seed.run_pod("new")
    assert str(seed.cpus_of(seed.create(new, "app", request=1000))) == "12-15"
    assert len({str(seed.cpus_of(c)) for c in cids}) == 3


def test_resync_adopts_unpinned_containers_and_lists_them_for_update(seed):
    pod = seed.run_pod("late")
    # created while the proxy was down: no cpuset
    cid = hexid()
    seed.containers[cid] = ContainerRecord(cid, pod.sandbox_id, "app", resources=ContainerResources(
        cpu_period=PERIOD, cpu_quota=-1, cpu_shares=1024))
    seed.restart()
    alloc = seed.hook.placement.ledger.get(pod.uid)
    assert alloc is not None and seed.hook.placement.ledger.knows_container(cid)
    assert seed.hook.placement.pending_updates() == [(cid, str(alloc.cpus(seed.hook.placement.shared_pool)), str(alloc.mems))]
    seed.hook.placement.mark_applied(cid)
    assert seed.hook.placement.pending_updates() == []


def test_new_sandbox_releases_the_old_placement(seed):
    pod = seed.run_pod("p", uid="11111111-2222-3333-4444-555555555555")
    seed.create(pod, "app", request=3000)
    again = seed.run_pod("p", uid=pod.uid)                # sandbox recreated by the kubelet
    assert pod.uid not in seed.hook.placement.ledger
    seed.create(again, "app", request=3000)
    assert seed.hook.placement.ledger.get(pod.uid).sandbox_id == again.sandbox_id
    assert sum(load.millicpu for load in seed.hook.placement.ledger.loads().values()) == 3000


def test_failed_pre_hook_edit_is_listed_for_the_reconciler(seed, monkeypatch):
    pod = seed.run_pod("p")
    original = FakeNode._run

    def drop_edit(self, call, reply=None):
        out = original(self, call, reply)
        if call.method == H.CREATE_CONTAINER:
            out.request.config.linux.resources.cpuset_cpus = ""       # as if the edit was discarded
        return out

    monkeypatch.setattr(FakeNode, "_run", drop_edit)
    cid = seed.create(pod, "app")
    assert seed.hook.placement.pending_updates() == [(cid, "0-3", "0")]


def test_update_claims_a_container_whose_create_reply_was_lost(tmp_path):
    node = kunpeng_static(tmp_path)
    pod = node.run_pod("p")
    cid = node.create(pod, "app", request=1000, post=False)
    assert not node.hook.placement.ledger.knows_container(cid)
    call = node.update(cid, "8-127")
    assert call.request.linux.cpuset_cpus == "8-31"
    assert node.hook.placement.ledger.by_container(cid).pod_uid == pod.uid
    assert node.hook.placement.ledger.get(pod.uid).pending == {}


def test_topology_is_read_from_sys_root_when_not_given(tmp_path):
    sys_root = F.with_cpuless_node().write(str(tmp_path / "sys"))
    paths = PathsConfig(sys_root=sys_root, state_dir=str(tmp_path / "state"),
                        kubelet_cpu_manager_state=str(tmp_path / "cpu_manager_state"))
    hook = NumaHook(NumaConfig(enabled=True), paths)
    assert hook.placement.topology.node_ids == (0, 1, 2) and str(hook.placement.shared_pool) == "0-15"
    assert hook.methods == {H.RUN_POD_SANDBOX, H.CREATE_CONTAINER, H.UPDATE_CONTAINER_RESOURCES,
                            H.STOP_POD_SANDBOX, H.REMOVE_POD_SANDBOX, H.REMOVE_CONTAINER}


# ====================================================================== concurrency
def test_concurrent_creates_are_decided_consistently(tmp_path):
    node = FakeNode(str(tmp_path), F.kunpeng920())
    pods = [node.run_pod(f"p{i}") for i in range(32)]
    barrier = threading.Barrier(8)
    errors: List[BaseException] = []

    def worker(chunk):
        try:
            barrier.wait()
            for p in chunk:
                node.create(p, "app", request=2000)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(pods[i::8],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    loads = node.hook.placement.ledger.loads()
    assert [loads[i].millicpu for i in range(4)] == [16000] * 4
    assert loads == node.hook.placement.ledger.recomputed_loads()
    assert len(node.saved()["allocations"]) == 32


# ====================================================================== properties
class NumaLifecycle(RuleBasedStateMachine):
    """Random create / remove / kubelet update / restart sequences."""

    @initialize(spec=st.sampled_from([F.seed_16cpu, F.with_cpuless_node, F.with_offline_cpus]))
    def setup(self, spec):
        import tempfile
        self.dir = tempfile.mkdtemp(prefix="numa-prop-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        self.node = FakeNode(self.dir, spec(), NumaConfig(enabled=True, namespaces=["batch"]), kubelet_policy="static")
        self.n = 0
        self.expected: Dict[str, int] = {}    # pod uid -> pod-level demand

    def teardown(self):
        import shutil
        if hasattr(self, "node"):
            self.node.hook.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    def _live_pods(self):
        return sorted(self.node.pods.values(), key=lambda p: p.name)

    @rule(request=st.sampled_from([0, 0, 500, 1000, 2500, 6000]), containers=st.integers(1, 3),
          managed=st.booleans(), post=st.booleans())
    def create_pod(self, request, containers, managed, post):
        self.n += 1
        pod = self.node.run_pod(f"p{self.n}", namespace="batch" if managed else "default")
        for i in range(containers):
            self.node.create(pod, f"c{i}", request=request, post=post or i > 0)

    @precondition(lambda self: self.node.pods)
    @rule(data=st.data())
    def remove_pod(self, data):
        pod = data.draw(st.sampled_from(self._live_pods()))
        self.node.remove_pod(pod)
        if pod.uid in self.node.entries:
            self.node.entries.pop(pod.uid)

    @precondition(lambda self: self.node.containers)
    @rule(data=st.data())
    def remove_container(self, data):
        cid = data.draw(st.sampled_from(sorted(self.node.containers)))
        c = self.node.containers[cid]
        uid = self.node.pods[c.sandbox_id].uid
        if c.name in self.node.entries.get(uid, {}):
            return
        self.node.remove_container(cid)

    @rule(cpus=st.integers(1, 4), managed=st.booleans())
    def guaranteed_pod(self, cpus, managed):
        """The kubelet's static policy gives a new pod exclusive CPUs (lowest free first) and
        re-sends the shrunken pool to every shared container."""
        free = list(self.node.default)
        if len(free) <= cpus + 1:
            return
        self.n += 1
        pod = self.node.run_pod(f"g{self.n}", namespace="batch" if managed else "default")
        mine = CpuSet(free[:cpus])
        entries = dict(self.node.entries)
        entries[pod.uid] = {"app": str(mine)}
        self.node.entries = entries
        self.node.default = self.node.default - mine
        self.node._write_state()
        self.node.create(pod, "app", request=cpus * 1000, limit=cpus * 1000, kubelet_cpus=str(mine))
        self.node.kubelet_reconcile()

    @precondition(lambda self: self.node.entries)
    @rule(data=st.data())
    def release_guaranteed(self, data):
        uid = data.draw(st.sampled_from(sorted(self.node.entries)))
        pod = next(p for p in self.node.pods.values() if p.uid == uid)
        freed = CpuSet()
        for cpus in self.node.entries[uid].values():
            freed = freed | CpuSet.parse(cpus)
        self.node.remove_pod(pod)
        self.node.default = self.node.default | freed
        self.node._write_state()
        self.node.kubelet_reconcile()

    @rule()
    def restart(self):
        self.node.restart()

    @rule()
    def restart_with_lost_state(self):
        """The state file is gone (or was corrupt): everything is rebuilt from containerd."""
        try:
            os.unlink(os.path.join(self.node.paths.state_dir, "numa.json"))
        except FileNotFoundError:
            pass
        self.restart()   # (however a subclass restarts: test_numa_crash_windows.py kills -9)

    # ---------------------------------------------------------------- invariants
    @invariant()
    def exclusive_cpus_belong_to_one_container(self):
        node = self.node
        owners: Dict[int, str] = {}
        for uid, containers in node.entries.items():
            for name, cpus in containers.items():
                for cpu in CpuSet.parse(cpus):
                    assert cpu not in owners, f"CPU {cpu} exclusive twice"
                    owners[cpu] = f"{uid}/{name}"
        exclusive = CpuSet(owners)
        for cid, c in node.containers.items():
            uid = node.pods[c.sandbox_id].uid
            if c.name in node.entries.get(uid, {}):
                assert c.resources.cpuset_cpus == node.entries[uid][c.name]
            else:
                assert CpuSet.parse(c.resources.cpuset_cpus).isdisjoint(exclusive), (cid, c.resources.cpuset_cpus)

    @invariant()
    def managed_containers_stay_in_their_nodes_and_the_pool(self):
        node = self.node
        ledger = node.hook.placement.ledger
        pending = {cid for cid, _, _ in node.hook.placement.pending_updates()}
        for cid, c in node.containers.items():
            alloc = ledger.by_container(cid)
            if alloc is None or cid in pending:
                continue
            cpus = CpuSet.parse(c.resources.cpuset_cpus)
            assert cpus, cid
            assert cpus.issubset(node.topology.cpus_of(alloc.nodes)), (cpus, alloc.nodes)
            assert cpus.issubset(node.default), (cpus, node.default)
            if alloc.mems and c.resources.cpuset_mems:
                assert CpuSet.parse(c.resources.cpuset_mems) == alloc.mems

    @invariant()
    def capacity_matches_the_live_pods(self):
        node = self.node
        ledger = node.hook.placement.ledger
        assert ledger.loads() == ledger.recomputed_loads()
        live = {p.uid for p in node.pods.values()}
        assert {a.pod_uid for a in ledger} <= live
        for alloc in ledger:
            for cid in alloc.containers:
                assert cid in node.containers
        expected = 0
        for alloc in ledger:
            containers = [c for c in node.containers.values()
                          if c.sandbox_id == alloc.sandbox_id and node.hook.placement.ledger.by_container(c.container_id) is alloc]
            total = sum(millicpu_of(c.resources.cpu_period, c.resources.cpu_quota, c.resources.cpu_shares)
                        for c in containers) + sum(s.millicpu for s in alloc.pending.values())
            expected += max(alloc.pod_millicpu, total)
        assert sum(load.millicpu for load in ledger.loads().values()) == expected
        if not node.pods:
            assert all(load.millicpu == 0 and load.pods == 0 for load in ledger.loads().values())

    @invariant()
    def saved_state_is_what_is_in_memory(self):
        path = os.path.join(self.node.paths.state_dir, "numa.json")
        if os.path.exists(path):
            assert self.node.saved()["allocations"] == self.node.hook.placement.ledger.to_json()


NumaLifecycle.TestCase.settings = settings(max_examples=25, stateful_step_count=20, deadline=None,
                                           suppress_health_check=[HealthCheck.too_slow])
TestNumaLifecycle = NumaLifecycle.TestCase


def test_in_nri_mode_numa_alone_is_not_sent_start_or_stop_container(tmp_path, nri_subscription):
    """containerd waits on a subscribed plugin: NUMA placement has nothing to do when a
    container starts or stops, so with it alone those events are not asked for."""
    sys_root = F.with_cpuless_node().write(str(tmp_path / "sys"))
    paths = PathsConfig(sys_root=sys_root, state_dir=str(tmp_path / "state"),
                        kubelet_cpu_manager_state=str(tmp_path / "cpu_manager_state"))
    events = nri_subscription([NumaHook(NumaConfig(enabled=True), paths)])
    assert events == {"RUN_POD_SANDBOX", "CREATE_CONTAINER", "UPDATE_CONTAINER", "STOP_POD_SANDBOX",
                      "REMOVE_POD_SANDBOX", "REMOVE_CONTAINER"}
