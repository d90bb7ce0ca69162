"""``scripts/bench_cluster.py --hostile``: Oenuma CRs at the node's caps and over them, against
a daemon (subprocess, FakeCri as containerd, the private kube-apiserver, NUMA on a fake
4-node topology, ``[kubernetes] trusted_namespaces`` empty: every CR is a tenant's).

1. baseline: Version through the proxy (p50/p99) and the kubelet's CreateContainer for pods
   of ``bench`` (the namespace ``[numa]`` manages) with names of 240 characters, before
   any CR;
2. the shipped CRD: a CR with a 6,000-character pattern and one with 10,000 entries are
   sent to the API server, which refuses them;
3. the CRD is replaced by one without bounds (operator-numaadj's own: a cluster that has
   not applied ours), and CRs are created: at the caps (``bench``: 16 pod-name patterns
   shaped to cost the most against those names, each found in part at every place of them,
   and 494 exact names of 253 characters; three other namespaces of 512 entries; with a
   sixth's two, the node's 2,048), and over them (a fifth namespace past the node's cap,
   ``bench`` past its namespace's, 10,000 entries, 6,000 ``[``, and in the sixth another
   namespace's pods and a numa[] table: refused parts);
   then for ``--hostile-seconds`` every CR is sent again, changed, round after round (each
   one parsed again by the daemon) while Version and CreateContainer are measured, on the
   daemon and on one with ``[kubernetes]`` off beside it;
4. once the daemon has them in force, the same again, with nothing changing.

On a node the API server, etcd and whoever writes the CRs run elsewhere. Here they share
the machine: with two CPUs or more, they (and the CR writer, a process of its own) are
pinned to the last CPU and the node's side (the daemons, the fake containerd, the
measuring clients) to the others, so that what is measured is what the daemon's own work on
the CRs costs the relay, not the control plane's (``--no-pin`` measures all of it together).
"""

from __future__ import annotations

import copy
import json
import multiprocessing
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Tuple

import yaml

from anolisnuma.testing.kubelet_client import PERIOD, Kubelet
from anolisnuma.testing.waiting import wait_until
from cri_proto import api_pb2 as pb

G, V = "resource.sop.huawei.com", "v1alpha1"
NODE = "bench-node"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TENANTS = ["bench", "h-1", "h-2", "h-3"]
BOUNDS = ("maxItems", "maxLength", "pattern", "minimum", "maximum")
POD_PREFIX = "hx-" + "a" * 230   # (+ "-<n>"): what the patterns below nearly match everywhere
# The node's 2,048 entries: bench 510 (+10 past its namespace's 512), h-1..h-3 512 each,
# h-5 2 (both refused parts: no rule); h-4's 256 past the node's cap.
RULES_AT_CAPS = 2046


def pct(values: List[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def oenuma(namespace: str, name: str, affinity: List[Dict[str, Any]], **entry: Any) -> Dict[str, Any]:
    return {"apiVersion": f"{G}/{V}", "kind": "Oenuma", "metadata": {"name": name, "namespace": namespace},
            "spec": {"node": [dict({"name": NODE, "podAffinity": affinity}, **entry)]}}


def exact(n: int, tag: str) -> List[Dict[str, Any]]:
    return [{"podName": f"{tag}-{i:04d}-" + "x" * 243, "numaNum": i % 4} for i in range(n)]


def worst_patterns(n: int) -> List[Dict[str, Any]]:
    """Patterns that pass the anchored ends for every name of POD_PREFIX and whose middle
    segment (with `?`) is found in part at every place of it: the most a match costs."""
    a = "a" * 40
    return [{"podName": f"*{a}?{a}?{a}?{a}?{a}c{k:02d}*", "numaNum": k % 4} for k in range(n)]


def at_caps() -> List[Dict[str, Any]]:
    crs = [oenuma("bench", "caps-patterns", worst_patterns(16)),
           oenuma("bench", "caps-a", exact(256, "ba")), oenuma("bench", "caps-b", exact(238, "bb"))]
    for ns in TENANTS[1:]:
        crs += [oenuma(ns, "caps-a", exact(256, f"{ns}a")), oenuma(ns, "caps-b", exact(256, f"{ns}b"))]
    return crs


def over_caps() -> List[Dict[str, Any]]:
    return [oenuma("h-4", "past-node", exact(256, "h4")),
            oenuma("bench", "past-namespace", exact(10, "bc")),
            oenuma("h-1", "many", [{"podName": f"p-{i}", "numaNum": i % 4} for i in range(10000)]),
            oenuma("h-2", "brackets", [{"podName": "[" * 6000, "numaNum": 0}]),
            oenuma("h-5", "wide", [{"namespace": "*", "podName": "*", "numaNum": 0}],
                   numa=[{"numaNum": 0, "cpuset": "0", "memset": "1"}])]


def unbounded_crd() -> str:
    """The shipped CRD without its bounds: what a cluster with operator-numaadj's has."""
    with open(os.path.join(REPO, "deploy", "crd-oenuma.yaml")) as f:
        crd = yaml.safe_load(f)

    def strip(node: Any) -> None:
        if isinstance(node, dict):
            for key in BOUNDS:
                node.pop(key, None)
            for value in node.values():
                strip(value)
        elif isinstance(node, list):
            for value in node:
                strip(value)
    strip(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"])
    return json.dumps(crd)


class Pods:
    """The kubelet's calls for pods of ``bench``: RunPodSandbox, a timed CreateContainer,
    then the pod removed (the ledger stays the size it was)."""

    def __init__(self, kubelet: Kubelet) -> None:
        self.kubelet = kubelet
        self.made = 0

    def create_container(self) -> float:
        self.made += 1
        uid = str(uuid.uuid4())
        res = pb.LinuxContainerResources(cpu_period=PERIOD, cpu_quota=PERIOD // 10)
        config = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=f"{POD_PREFIX}-{self.made}", namespace="bench", uid=uid),
            linux=pb.LinuxPodSandboxConfig(cgroup_parent=f"/kubepods/burstable/pod{uid}", resources=res))
        sid = self.kubelet.call("RunPodSandbox", pb.RunPodSandboxRequest(config=config),
                                pb.RunPodSandboxResponse).pod_sandbox_id
        req = pb.CreateContainerRequest(pod_sandbox_id=sid, sandbox_config=config, config=pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name="c0"), linux=pb.LinuxContainerConfig(resources=res)))
        t = time.perf_counter()
        self.kubelet.call("CreateContainer", req, pb.CreateContainerResponse)
        took = (time.perf_counter() - t) * 1e6
        self.kubelet.call("StopPodSandbox", pb.StopPodSandboxRequest(pod_sandbox_id=sid), pb.StopPodSandboxResponse)
        self.kubelet.call("RemovePodSandbox", pb.RemovePodSandboxRequest(pod_sandbox_id=sid),
                          pb.RemovePodSandboxResponse)
        return took


Sample = Dict[str, List[float]]


def measure(daemons: Dict[str, Any], pods: Dict[str, Pods], until: Callable[[], bool], least: int) -> Sample:
    """Version (10 calls) and one CreateContainer, alternately on each daemon, until
    ``until()`` and at least ``least`` rounds."""
    out: Sample = {f"{k}.{what}": [] for k in daemons for what in ("version", "create")}
    rounds = 0
    while rounds < least or not until():
        for name, d in daemons.items():
            out[f"{name}.version"].extend(d.version_latencies(10))
            out[f"{name}.create"].append(pods[name].create_container())
        rounds += 1
    return out


def line(what: str, sample: Sample, base: Sample) -> str:
    """p50/p99 of each call on each daemon, the ratio of p99 to the baseline's, and for the
    daemon with [kubernetes] on, the ratio to the one with it off in the same phase (the
    machine's load falls on both)."""
    parts = []
    for call in ("version", "create"):
        on, off = sample[f"on.{call}"], sample[f"off.{call}"]
        parts.append(f"{call} p50/p99 {pct(on, 50):.0f}/{pct(on, 99):.0f} us, p99 {pct(on, 99) / pct(base[f'on.{call}'], 99):.2f}x "
                     f"the baseline, {pct(on, 99) / pct(off, 99):.2f}x the [kubernetes]-off daemon's "
                     f"({pct(off, 50):.0f}/{pct(off, 99):.0f} us, {pct(off, 99) / pct(base[f'off.{call}'], 99):.2f}x its "
                     "baseline)")
    return f"{what} ({len(sample['on.create'])} creates, {len(sample['on.version'])} Versions each): " + "; ".join(parts)


def cpu_share(cpu_seconds: Callable[[int], float], pid: int, since: Tuple[float, float]) -> str:
    """The daemon's CPU since ``since`` (its CPU seconds, the time), in % of one CPU."""
    return f"{100 * (cpu_seconds(pid) - since[0]) / (time.monotonic() - since[1]):.0f}%"


def run_hostile(cp: Any, fake: Any, args: Any, base: str, plain: Any, daemon_class: Any,
                cpu_seconds: Callable[[int], float]) -> None:
    for ns in TENANTS[1:] + ["h-4", "h-5"]:
        cp.kubectl("create", "namespace", ns)
    d = daemon_class(os.path.join(base, "on"), fake, cp.admin_kubeconfig)
    try:
        wait_until(lambda: d.cluster().get("state") == "synced", "the daemon's link", 120)
        control_cpu = None
        if args.pin:
            print(pin_apart(cp, [d.pid, plain.pid]))
            control_cpu = {sorted(os.sched_getaffinity(cp.apiserver.pid))[-1]} if cp.apiserver else None
        daemons = {"on": d, "off": plain}
        pods = {k: Pods(v.kubelet) for k, v in daemons.items()}
        measure(daemons, pods, lambda: True, 20)   # (warm: the first calls of each path)
        since = cpu_seconds(d.pid), time.monotonic()
        baseline = measure(daemons, pods, lambda: True, args.hostile_rounds)
        print(line("baseline, no CR", baseline, baseline) + f"; daemon CPU {cpu_share(cpu_seconds, d.pid, since)}")
        refusals = api_server_refusals(cp)
        print(f"shipped CRD: the API server refused {len(refusals)} of 2 CRs over the bounds: "
              + "; ".join(r[:160] for r in refusals))
        cp.kubectl("apply", "-f", "-", input=unbounded_crd())
        cp.kubectl("wait", "--for=condition=Established", f"crd/oenumas.{G}")
        crs = at_caps() + over_caps()
        since = cpu_seconds(d.pid), time.monotonic()
        during, rounds = applying(cp, crs, daemons, pods, args.hostile_seconds, control_cpu)
        print(line(f"while {len(crs)} CRs are applied, {rounds} rounds of them in {args.hostile_seconds:g} s",
                   during, baseline) + f"; daemon CPU {cpu_share(cpu_seconds, d.pid, since)}")
        c = wait_until(lambda: _settled(d), "the CRs in force", 300)
        since = cpu_seconds(d.pid), time.monotonic()
        after = measure(daemons, pods, lambda: True, args.hostile_rounds)
        print(line("once they are in force", after, baseline) + f"; daemon CPU {cpu_share(cpu_seconds, d.pid, since)}")
        print(f"daemon: {len(c['rules'])} rules in force from {c['crs_naming_node']} CRs naming the node; "
              f"{len(c['crs_skipped'])} refused whole: {', '.join(sorted(c['crs_skipped']))}")
    finally:
        d.stop()


def _settled(d: Any) -> Any:
    c = d.cluster()
    return len(c.get("rules") or []) == RULES_AT_CAPS and len(c.get("crs_skipped") or []) == 4 and c


def api_server_refusals(cp: Any) -> List[str]:
    out = []
    for doc in (oenuma("bench", "long", [{"podName": "[" * 6000, "numaNum": 0}]),
                oenuma("bench", "many", [{"podName": f"p-{i}", "numaNum": i % 4} for i in range(10000)])):
        done = cp.kubectl("apply", "-f", "-", input=json.dumps(doc), check=False)
        if done.returncode != 0:
            out.append(" ".join(done.stderr.split()))
    return out


def pin_apart(cp: Any, node_pids: List[int]) -> str:
    """The control plane on the last CPU, the node's side on the others; what was done."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return "not pinned (one CPU)"
    control, node = {cpus[-1]}, set(cpus[:-1])
    for proc in (cp.etcd, cp.apiserver):
        if proc is not None:
            os.sched_setaffinity(proc.pid, control)
    for pid in node_pids + [0]:   # 0: this process, the fake containerd's and the clients'
        os.sched_setaffinity(pid, node)
    return f"control plane and CR writer on CPU {cpus[-1]}, the node's side on {sorted(node)}"


def applying(cp: Any, crs: List[Dict[str, Any]], daemons: Dict[str, Any], pods: Dict[str, Pods],
             seconds: float, control_cpu: Any = None) -> Tuple[Sample, int]:
    """Every CR created, then sent again changed (each entry's NUMA node turned), round
    after round for ``seconds``, while the calls are measured. The writer is a process of
    its own (forked), so that encoding megabytes of CRs never holds this process's
    interpreter lock, which the fake containerd and the measuring clients need."""
    ctx = multiprocessing.get_context("fork")
    stop, rounds = ctx.Event(), ctx.Value("i", 0)
    writer = ctx.Process(target=_write_rounds, args=(cp, crs, stop, rounds, control_cpu), daemon=True)
    writer.start()
    deadline = time.monotonic() + seconds
    sample = measure(daemons, pods, lambda: time.monotonic() > deadline, 20)
    stop.set()
    writer.join(300)
    return sample, rounds.value


def _write_rounds(cp: Any, crs: List[Dict[str, Any]], stop: Any, rounds: Any, control_cpu: Any) -> None:
    if control_cpu is not None:
        os.sched_setaffinity(0, control_cpu)
    path = f"/apis/{G}/{V}/namespaces/%s/oenumas"

    def send(doc: Dict[str, Any], first: bool) -> None:
        ns, name = doc["metadata"]["namespace"], doc["metadata"]["name"]
        if first:
            cp.request("POST", path % ns, doc, timeout=120)
        else:
            cp.request("PATCH", f"{path % ns}/{name}", {"spec": doc["spec"]},
                       content_type="application/merge-patch+json", timeout=120)

    docs = copy.deepcopy(crs)
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda doc: send(doc, True), docs))
        while not stop.is_set():
            with rounds.get_lock():
                rounds.value += 1
            for doc in docs:
                for item in doc["spec"]["node"][0]["podAffinity"]:
                    item["numaNum"] = (item["numaNum"] + 1) % 4
            list(pool.map(lambda doc: send(doc, False), docs))
