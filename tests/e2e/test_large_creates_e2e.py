"""Bursts of large CreateContainer calls from grpc-go, through the proxy, on the real containerd.

The kubelet speaks grpc-go: all CRI calls of a node share ONE HTTP/2 connection, grpc-go
writes at most one 16 KiB DATA frame per stream in turn within a 64 KiB connection window,
and a CreateContainer of a cluster with many Services carries tens of KiB (or, with service
links on and thousands of Services, a MiB) of env. A relay that holds those bodies for the
NUMA pre-hook without crediting the kubelet stalls the whole connection (issue 7: 6 of 8
calls hit their deadline, none pinned). Here ``gocri`` (grpc-go, one connection) sends the
bursts through the proxy with NUMA pinning on -- the fake 2-node topology of
``test_numa_e2e.py``: node 0 = CPU 0, node 1 = CPU 1, memory pinning off -- to the private
real containerd:

1. 64 concurrent creates with 40 KiB of env each: all complete, all pinned;
2. 16 with 1 MiB each: all complete, all pinned;
3. 64 with 1 MiB each under small budgets (16 MiB per connection, 24 MiB in all): each
   completes pinned or is refused with RESOURCE_EXHAUSTED; none waits out its deadline,
   nothing is created unpinned, and a refused container does not exist in containerd.

"Pinned" is checked on what containerd holds: containerd 1.6 creates no cgroup at
CreateContainer (runc makes it at StartContainer), so every container's OCI spec
(``linux.resources.cpu.cpus`` in ContainerStatus' verbose info) must equal its pod's NUMA
placement, its env must be what the kubelet sent, and the first container of every pod is
started to read its REAL ``cpuset.cpus`` (cgroup v1) as well. Every pod of this module's
namespace is removed afterwards through a direct client, with its cgroups.
"""

from __future__ import annotations

import contextlib
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import pytest
from cri_client import KubeletLike, Pod, pb, read_file

from anolisnuma.config import Config
from anolisnuma.daemon import build_hooks
from anolisnuma.hooks.numa import NumaHook
from anolisnuma.testing.fake_sysfs import GIB, FakeTopology
from anolisnuma.testing.kubelet_env import service_link_env
from anolisnuma.testing.goclient import build_gocri, run_gocri
from anolisnuma.testing.proxy import InProcessProxy, config_dict
from anolisnuma.testing.waiting import wait_until

# The proxy's buffers under bursts of large messages, not the runtime's behaviour: one
# build is enough.
CONTAINERD_BUILDS = ("1.6",)

CG = "/sys/fs/cgroup"
NS = "numa-large-e2e"             # managed namespace of this module only
NODE_CPU = {0: "0", 1: "1"}       # the fake topology's node -> real CPU
CREATE = "/runtime.v1.RuntimeService/CreateContainer"
OK, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED = 0, 4, 8
KIB, MIB = 1 << 10, 1 << 20
DEADLINE_S = 20.0
PODS = 8                          # sandboxes per test; containers are spread over them


# ------------------------------------------------------------------------------ helpers

def service_links(total_bytes: int, salt: str) -> List[Any]:
    """Env the way the kubelet writes service links, ``total_bytes`` of it."""
    return [pb.KeyValue(key=k, value=v) for k, v in service_link_env(total_bytes, salt)]


def numa_config(base: str, backend: str, server: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """NUMA on for ``NS`` over the fake 2-node topology (written under ``paths.sys_root``)."""
    numa = {"enabled": True, "namespaces": [NS], "memory_pinning": "off", "poll_interval_seconds": 0.1}
    data = config_dict(base, backend, extra={"numa": numa, "log": {"stderr": False}, "server": dict(server or {})})
    FakeTopology(name="2n-2c-e2e", node_cpus={0: "0", 1: "1"}, distances=[[10, 20], [20, 10]],
                 memory_bytes={0: 2 * GIB, 1: 2 * GIB}).write(data["paths"]["sys_root"])
    return data


@contextlib.contextmanager
def numa_proxy(containerd: Any, base: str, **server: Any) -> Iterator[Tuple[InProcessProxy, NumaHook, KubeletLike]]:
    """The daemon with the NUMA hook in this process; a KubeletLike (grpcio) on its socket
    for the pods."""
    config = Config.from_dict(numa_config(base, containerd.socket, server))
    for key, value in server.items():
        assert getattr(config.server, key) == value, key
    hooks = build_hooks(config)
    assert [h.name for h in hooks] == ["numa"]
    proxy = InProcessProxy(config, hooks=hooks).start()
    kl: Optional[KubeletLike] = None
    try:
        proxy.wait_resynced()
        kl = KubeletLike(proxy.socket_path, harness=containerd, timeout=20)
        yield proxy, hooks[0], kl
    finally:
        if kl is not None:
            kl.close()
        proxy.stop()


def run_pods(kl: KubeletLike, n: int) -> List[Pod]:
    """``n`` host-network sandboxes of ``NS`` through the proxy, a few at a time."""
    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(lambda i: kl.run_pod(name=f"large-{i}", namespace=NS), range(n)))


def create_body(kl: KubeletLike, pod: Pod, name: str, env_bytes: int) -> bytes:
    """A kubelet-like CreateContainerRequest (best effort: shares 2, no cpuset) with
    ``env_bytes`` of service-link env, serialized with the full CRI stubs."""
    config = kl.container_config(name, kl.resources(cpu_shares=2))
    config.envs.extend(service_links(env_bytes, name.upper().replace("-", "_")))
    return pb.CreateContainerRequest(pod_sandbox_id=pod.id, config=config,
                                     sandbox_config=pod.config).SerializeToString()


def our_sandboxes(direct: KubeletLike) -> Dict[str, Any]:
    return {s.id: s for s in direct.list_pods() if s.metadata.namespace == NS}


def our_containers(direct: KubeletLike) -> Dict[str, Any]:
    sandboxes = our_sandboxes(direct)
    return {c.id: c for c in direct.list_containers() if c.pod_sandbox_id in sandboxes}


@pytest.fixture(scope="module")
def gocri() -> str:
    return build_gocri()


@pytest.fixture
def direct(containerd):  # type: ignore[no-untyped-def]
    """A client on containerd's own socket, for the truth. Afterwards every sandbox of
    ``NS`` (whoever made it) is stopped -- which kills its containers -- and removed --
    which removes them -- and the pod cgroups go too; nothing may be left."""
    kl = KubeletLike(containerd.socket, harness=containerd, timeout=30)
    try:
        yield kl
    finally:
        errors: List[str] = []
        parents = set()
        for s in our_sandboxes(kl).values():
            parents.add(f"/kubepods/burstable/pod{s.metadata.uid}")   # run_pod's default parent
            for what, call, req in (
                    ("StopPodSandbox", kl.runtime.StopPodSandbox, pb.StopPodSandboxRequest(pod_sandbox_id=s.id)),
                    ("RemovePodSandbox", kl.runtime.RemovePodSandbox, pb.RemovePodSandboxRequest(pod_sandbox_id=s.id))):
                try:
                    call(req, timeout=30)
                except Exception as e:  # noqa: BLE001 -- collected, reported below
                    errors.append(f"{what} {s.id[:12]}: {e}")
        left = our_sandboxes(kl)
        if left:
            errors.append(f"sandboxes left: {sorted(left)}")
        kl.close()
        for parent in sorted(parents):
            errors += [f"cgroup left: {d}" for d in containerd.remove_pod_cgroup(parent)]
        assert not errors, errors


# ------------------------------------------------------------------------------ the burst

def burst(gocri: str, proxy: InProcessProxy, kl: KubeletLike, pods: Sequence[Pod], calls: int,
          env_bytes: int) -> Tuple[List[Dict[str, Any]], List[Tuple[Pod, str, bytes]], float]:
    """``calls`` CreateContainers at once over one grpc-go connection, round-robin over
    ``pods``. Returns the results (by index), what each call asked for, and the wall time."""
    asked: List[Tuple[Pod, str, bytes]] = []
    for i in range(calls):
        pod = pods[i % len(pods)]
        name = f"c-{i:02d}"
        asked.append((pod, name, create_body(kl, pod, name, env_bytes)))
    t0 = time.monotonic()
    results = run_gocri(proxy.socket_path, CREATE, [b for _, _, b in asked], deadline_s=DEADLINE_S, binary=gocri)
    return results, asked, time.monotonic() - t0


def check_pinned(direct: KubeletLike, hook: NumaHook, kl: KubeletLike, results: List[Dict[str, Any]],
                 asked: List[Tuple[Pod, str, bytes]], start_all_pods: bool) -> Dict[str, Any]:
    """What containerd has for our pods is exactly what the completed calls created, and
    every one of them is pinned to its pod's node with the env the kubelet sent; the first
    container of each pod (``start_all_pods``) or of one pod per node is started and its
    real cgroup checked. Returns figures."""
    created = {pb.CreateContainerResponse.FromString(r["reply"]).container_id: asked[r["index"]]
               for r in results if r["code"] == OK}
    assert all(created), "a completed CreateContainer without a container id"
    have = our_containers(direct)
    # nothing was created that the kubelet was not told about (a refused call made nothing)
    assert set(have) == set(created), (sorted(set(have) - set(created)), sorted(set(created) - set(have)))
    by_pod: Dict[str, List[str]] = {}
    for cid, (pod, name, _) in created.items():
        assert have[cid].pod_sandbox_id == pod.id and have[cid].metadata.name == name
        assert have[cid].state == pb.CONTAINER_CREATED
        by_pod.setdefault(pod.uid, []).append(cid)

    # the hook's ledger: one node per pod, every created container counted (the post-hook
    # runs just after the reply reached the client), nothing left pending
    def ledger_complete() -> Optional[Dict[str, Any]]:
        allocs = {a.pod_uid: a for a in hook.placement.allocations()}
        for uid, cids in by_pod.items():
            a = allocs.get(uid)
            if a is None or set(a.containers) != set(cids) or a.pending:
                return None
        return allocs
    allocs = wait_until(ledger_complete, "the NUMA ledger to count every created container", timeout=10)
    assert set(allocs) == set(by_pod), "a pod with no created container holds a placement"
    node_of = {}
    for uid, a in allocs.items():
        assert len(a.nodes) == 1 and a.sandbox_id in {p.id for p, _, _ in asked if p.uid == uid}, a
        node_of[uid] = a.nodes[0]

    # the OCI spec containerd recorded: the pod's node, and the env as sent
    def spec_of(cid: str) -> Tuple[str, Dict[str, Any]]:
        _, info = direct.container_status(cid)
        return cid, info["runtimeSpec"]

    with ThreadPoolExecutor(4) as pool:
        specs = dict(pool.map(spec_of, created))
    for cid, (pod, name, body) in created.items():
        spec = specs[cid]
        cpus = ((spec["linux"].get("resources") or {}).get("cpu") or {}).get("cpus", "")
        assert cpus == NODE_CPU[node_of[pod.uid]], (pod.name, name, cpus)
        sent = pb.CreateContainerRequest.FromString(body).config.envs
        env = set(spec["process"]["env"])
        missing = [f"{kv.key}={kv.value}" for kv in sent if f"{kv.key}={kv.value}" not in env]
        assert not missing, (name, len(missing), missing[:3])

    # the real cgroup: start the first container of each pod (runc makes the cgroup now),
    # or of one pod per node when the env is large: runc 1.1 sets each variable in its own
    # environment before exec (os.Setenv, fixed in runc 1.2), which takes ~2 s for 1 MiB
    firsts = {uid: min(cids, key=lambda c: created[c][1]) for uid, cids in sorted(by_pod.items())}
    if start_all_pods:
        first = sorted(firsts.values())
    else:
        one_per_node = {node_of[uid]: cid for uid, cid in reversed(list(firsts.items()))}
        first = sorted(one_per_node.values())

    def start_and_read(cid: str) -> Tuple[str, str, str]:
        kl.start_container(cid)
        d = f"{CG}/cpuset{specs[cid]['linux']['cgroupsPath']}"
        return cid, read_file(f"{d}/cpuset.cpus"), read_file(f"{d}/cpuset.mems")

    t0 = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        real = list(pool.map(start_and_read, first))
    started_s = time.monotonic() - t0
    for cid, cpus, mems in real:
        pod = created[cid][0]
        assert (cpus, mems) == (NODE_CPU[node_of[pod.uid]], "0"), (pod.name, created[cid][1], cpus, mems)
    per_node = [sum(1 for n in node_of.values() if n == i) for i in (0, 1)]
    return {"created": len(created), "pods_per_node": per_node, "started": len(first), "start_s": started_s}


def summary(results: List[Dict[str, Any]]) -> str:
    codes: Dict[int, int] = {}
    for r in results:
        codes[r["code"]] = codes.get(r["code"], 0) + 1
    ms = sorted(r["elapsed_ms"] for r in results)
    return f"codes {codes}, call ms p50 {ms[len(ms) // 2]:.0f} max {ms[-1]:.0f}"


# ------------------------------------------------------------------------------ tests

@pytest.mark.parametrize("calls,env_bytes", [(64, 40 * KIB), (16, MIB)], ids=["64x40KiB", "16x1MiB"])
def test_grpc_go_burst_of_large_creates_all_complete_pinned(calls, env_bytes, gocri, containerd, direct,
                                                            tmp_path):
    t0 = time.monotonic()
    with numa_proxy(containerd, str(tmp_path)) as (proxy, hook, kl):
        pods = run_pods(kl, PODS)
        t_pods = time.monotonic() - t0
        results, asked, wall = burst(gocri, proxy, kl, pods, calls, env_bytes)
        assert [r["code"] for r in results] == [OK] * calls, \
            [(r["index"], r["code"], r["message"]) for r in results if r["code"] != OK]
        figures = check_pinned(direct, hook, kl, results, asked, start_all_pods=env_bytes < MIB)
        assert figures["created"] == calls
        assert figures["pods_per_node"] == [PODS // 2, PODS // 2]   # best-effort pods alternate
    print(f"\n{calls}x{env_bytes // KIB}KiB: {PODS} pods {t_pods:.2f}s, burst {wall:.2f}s "
          f"({summary(results)}), {figures}, total {time.monotonic() - t0:.2f}s")


def test_grpc_go_burst_over_the_budget_completes_pinned_or_is_refused(gocri, containerd, direct, tmp_path):
    """64 x 1 MiB on one connection cannot all be held within 16 MiB: some calls are refused
    with RESOURCE_EXHAUSTED, none waits for its deadline, every container containerd has is
    pinned, and the refused ones do not exist."""
    t0 = time.monotonic()
    calls = 64
    with numa_proxy(containerd, str(tmp_path), buffer_bytes_per_connection=16 * MIB,
                    buffer_bytes_total=24 * MIB) as (proxy, hook, kl):
        pods = run_pods(kl, PODS)
        results, asked, wall = burst(gocri, proxy, kl, pods, calls, MIB)
        codes = [r["code"] for r in results]
        assert DEADLINE_EXCEEDED not in codes, summary(results)
        assert set(codes) <= {OK, RESOURCE_EXHAUSTED}, [(r["code"], r["message"]) for r in results if r["code"]]
        refused = [r for r in results if r["code"] == RESOURCE_EXHAUSTED]
        assert refused, f"64 x 1 MiB all fit a 16 MiB budget? {summary(results)}"
        assert all("budget" in r["message"] for r in refused), {r["message"] for r in refused}
        assert codes.count(OK) >= 4, summary(results)   # the budget holds several at once
        assert wall < DEADLINE_S / 2, summary(results)
        figures = check_pinned(direct, hook, kl, results, asked, start_all_pods=False)
        assert figures["created"] == codes.count(OK)
    print(f"\n64x1MiB over 16/24 MiB budgets: burst {wall:.2f}s ({summary(results)}), "
          f"{len(refused)} refused, {figures}, total {time.monotonic() - t0:.2f}s")
