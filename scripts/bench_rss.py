#!/usr/bin/env python3
"""The daemon's RSS with every feature on, at rest and over 10,000 pod starts (issue 34).

    .venv/bin/python scripts/bench_rss.py              # 10,000 pods, VmRSS every 1,000 (~3-8 min)
    .venv/bin/python scripts/bench_rss.py --quick      # 500 pods, every 100 (CI smoke, ~30-60 s)
    .venv/bin/python scripts/bench_rss.py --pods N --every K --json FILE

The daemon runs as a subprocess (``SubprocessProxy``, with the systemd unit's malloc
environment) in front of ``FakeCri`` standing in for containerd (10,000 real pods would
take hours on 2 CPUs; what the daemon keeps per pod is the same), with:

- QoS on a fake kernel tree (``FakeKernel``: cgroup v1 with the Anolis knobs, /proc,
  resctrl); the fake pod and container cgroups are made and removed around the calls, as
  the kubelet and runc make the real ones; the pods' QoS levels rotate BE / LS / LSR / LSE;
- NUMA over a fake 2-node topology of this machine's CPUs, traffic affinity every second;
- the cluster link to a private API server (``PrivateControlPlane`` with deploy/'s CRDs,
  RBAC and node policy, the node's own ServiceAccount; Oenuma rules, status and events)
  when kube-apiserver and etcd are here (``--no-cluster`` leaves it off);
- the metrics endpoint and the admin socket;
- NRI (``[nri] enabled``) registered with the fake NRI runtime
  (``anolisnuma.testing.nri_runtime.FakeNriRuntime``, which speaks and reads as containerd
  2.2 does), configured and synchronized.

With NRI on the proxy relays every CRI call unchanged and the policies act on NRI's events
only, so the pods are NRI events then, as containerd sends them (RunPodSandbox,
CreateContainer, StartContainer, StopContainer, RemoveContainer, StopPodSandbox,
RemovePodSandbox); ``--no-nri`` leaves NRI off and sends the pods through the proxy as CRI
calls (RunPodSandbox, CreateContainer, StartContainer, StopContainer, RemoveContainer,
StopPodSandbox, RemovePodSandbox on one shared connection). ``--callers`` (default 2) run
the lifecycles. Printed: VmRSS (/proc/<pid>/status) at rest (after
start-up and the first resync), every ``--every`` pods, at the end and after a few seconds
of rest; its growth from the first checkpoint to the end; the verdict against the target
(<= 48 MB and flat: at most 2 MB of growth after the first checkpoint; informative), and
the load (load average, other processes' CPU share). Exit status 0 whatever the figures,
1 when it cannot run, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from typing import Any, Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _p in (HERE, os.path.join(HERE, "scripts"), os.path.join(HERE, "tests", "e2e")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from bench_nri import cpu_sample, free_port, machine, other_cpu_percent  # noqa: E402
from bench_proxy import PROXY_ENV, log, numa_nodes  # noqa: E402

NS = "bench-rss"                      # the namespace NUMA manages
NODE = "bench-rss-node"
QOS_LEVELS = ("BE", "LS", "LSR", "LSE")
FULL = {"pods": 10_000, "every": 1_000}
QUICK = {"pods": 500, "every": 100}
T_RSS_MB = 48.0
T_GROWTH_MB = 2.0                     # "flat": at most this much from the first checkpoint to the end
REST_S = 5.0                          # rest after the last pod before the last reading
PERIOD = 100_000


# --------------------------------------------------------------------------- pure parts

def vmrss_mb(status_text: str) -> float:
    """VmRSS of a /proc/<pid>/status text, in MB (2^20 bytes); nan when absent."""
    for line in status_text.splitlines():
        if line.startswith("VmRSS:"):
            parts = line.split()
            return int(parts[1]) * 1024 / 2 ** 20
    return float("nan")


def checkpoints(pods: int, every: int) -> List[int]:
    """The pod counts at which RSS is read: every ``every`` and the last one."""
    marks = list(range(every, pods + 1, every)) if every > 0 else []
    if not marks or marks[-1] != pods:
        marks.append(pods)
    return marks


def rss_verdict(samples: Sequence[Tuple[str, int, float]]) -> Dict[str, Any]:
    """From (label, pods, MB) readings in order: the peak, the growth from the first
    checkpoint after pods began (the allocator's and the caches' warm-up are before it) to
    the end, and whether the target (<= T_RSS_MB, growth <= T_GROWTH_MB) is met."""
    counted = [s for s in samples if s[1] > 0]
    peak = max((s[2] for s in samples), default=float("nan"))
    growth = counted[-1][2] - counted[0][2] if len(counted) >= 2 else float("nan")
    ok = peak <= T_RSS_MB and (growth != growth or growth <= T_GROWTH_MB)
    return {"peak_mb": peak, "growth_mb": growth, "met": ok,
            "text": f"{'met' if ok else 'missed'}: peak {peak:.1f} MB (target <= {T_RSS_MB:g}), "
                    f"growth {growth:+.2f} MB from {counted[0][1] if counted else '-'} pods to the end "
                    f"(flat: <= {T_GROWTH_MB:g})"}


def render(r: Dict[str, Any]) -> str:
    m = r["machine"]
    L = [f"bench_rss ({r['mode']}): {m['host']}, {m['nproc']} vCPU {m['cpu']}, Linux {m['kernel']}, "
         f"Python {m['python']}; command: {r['command']}",
         f"on: {', '.join(r['on'])}; off: {', '.join(r['off']) or '-'}",
         f"{r['pods']} pod lifecycles by {r['callers']} callers, "
         f"{'as NRI events of the fake runtime' if r.get('nri', True) else 'through the proxy'}, "
         f"FakeCri as containerd's CRI", "",
         "| when | pods | VmRSS, MB | pods/s since the previous | load average |", "|---|---:|---:|---:|---|"]
    for s in r["samples"]:
        rate = "-" if s.get("rate") is None else f"{s['rate']:.0f}"
        L.append(f"| {s['label']} | {s['pods']} | {s['mb']:.2f} | {rate} | {s['loadavg']} |")
    L.append("")
    ld = r.get("load") or {}
    if ld:
        L.append(f"other load: processes other than the daemon, FakeCri and this script (etcd and "
                 f"kube-apiserver included) used "
                 f"{ld['other']:.0f} % of all CPUs during the pods (busy {ld['busy']:.0f} %, steal {ld['steal']:.0f} %)")
    if r.get("nri", True) and "nri_placed" in r:
        L.append(f"NRI CreateContainer answered with a cpuset (placed by NUMA): {r['nri_placed']} of {r['pods']}; "
                 f"failed pods: {r.get('failed_pods', 0)}")
    L.append(f"RSS <= {T_RSS_MB:g} MB, flat: {r['verdict']['text']}")
    if r.get("problems"):
        L.append("problems: " + "; ".join(r["problems"][:10]))
    L.append(f"run took {r['elapsed_s']:.0f} s")
    return "\n".join(L)


# --------------------------------------------------------------------------- the run

class Bench:
    """FakeCri, the fake host, the control plane (if any), the daemon; ``close`` removes all."""

    def __init__(self, cluster: bool, nri: bool = True) -> None:
        self.work = tempfile.mkdtemp(prefix="anolisnuma-bench-rss-")
        self.want_cluster = cluster
        self.nri = nri
        self.runtime: Any = None             # the fake NRI runtime
        self.on: List[str] = []
        self.off: List[str] = [] if nri else ["NRI (--no-nri: the pods go through the proxy)"]
        self.problems: List[str] = []
        self.kernel: Any = None
        self.fake: Any = None
        self.cp: Any = None
        self.daemon: Any = None
        self.pid = 0
        self._lock = threading.Lock()
        self._next = 0
        self.done = 0
        self.placed = 0                      # NRI creates answered with a cpuset (NUMA placed them)

    def start(self) -> None:
        from anolisnuma.testing.fake_cri import FakeCri
        from anolisnuma.testing.fake_kernel import FakeKernel
        from anolisnuma.testing.fake_sysfs import GIB, FakeTopology
        from anolisnuma.testing.proxy import SubprocessProxy, config_dict

        self.kernel = FakeKernel(os.path.join(self.work, "host"), cgroup_version=1, vendor="intel", resctrl={})
        FakeTopology(name="2n-bench-rss", node_cpus=numa_nodes(), distances=[[10, 20], [20, 10]],
                     memory_bytes={0: 2 * GIB, 1: 2 * GIB}).write(self.kernel.paths.sys_root)
        self.fake = FakeCri(os.path.join(self.work, "containerd.sock"), containers=0, sandboxes=0).start()
        extra: Dict[str, Any] = {
            "log": {"stderr": False},
            "paths": self.kernel.paths_table(),
            "runtime": {"resync_interval_seconds": 0.0},   # FakeCri lists nothing: a resync would drop live pods
            "qos": {"enabled": True},
            "numa": {"enabled": True, "namespaces": [NS], "node_name": NODE, "memory_pinning": "off",
                     "poll_interval_seconds": 1.0, "affinity": {"enabled": True, "interval_seconds": 1.0}},
            "admin": {"socket": os.path.join(self.work, "admin.sock")},
            "metrics": {"listen": f"127.0.0.1:{free_port()}"},
        }
        self.on = ["QoS (fake kernel, rotating levels)", "NUMA (fake 2 nodes) with traffic affinity",
                   "metrics endpoint", "admin socket"]
        if self.nri:
            from anolisnuma.testing.nri_runtime import FakeNriRuntime
            nri_socket = os.path.join(self.work, "nri.sock")
            self.runtime = FakeNriRuntime(nri_socket).start()
            extra["nri"] = {"enabled": True, "socket": nri_socket, "reconnect_max_seconds": 1.0}
        kubeconfig = self.start_cluster()
        if kubeconfig:
            extra["kubernetes"] = {"kubeconfig": kubeconfig, "node_name": NODE, "request_timeout_seconds": 5.0,
                                   "backoff_max_seconds": 2.0}
        data = config_dict(os.path.join(self.work, "daemon"), self.fake.socket_path,
                           listen=os.path.join(self.work, "cri.sock"), extra=extra)
        os.makedirs(os.path.join(self.work, "daemon"), exist_ok=True)
        self.daemon = SubprocessProxy(data, os.path.join(self.work, "daemon"), env=PROXY_ENV, name="daemon")
        self.daemon.start(timeout=60)
        self.pid = self.daemon.proc.pid
        if self.nri:
            self.nri_handshake()

    def nri_handshake(self) -> None:
        """Registration, Configure and an empty Synchronize, as containerd 2.2 does them."""
        from nri_proto import api_pb2 as nri

        if not self.runtime.registered.wait(60):
            raise RuntimeError(f"the daemon did not register with the fake NRI runtime: {self.daemon.stderr[-1500:]}")
        self.runtime.call_plugin("Configure", nri.ConfigureRequest(
            runtime_name="containerd", runtime_version="v2.2.7", registration_timeout=5000, request_timeout=2000),
            nri.ConfigureResponse)
        self.runtime.call_plugin("Synchronize", nri.SynchronizeRequest(), nri.SynchronizeResponse)
        self.on.append("NRI (fake runtime; the pods are its events)")
    def start_cluster(self) -> str:
        """A private control plane with deploy/'s objects and this node's identity; "" (and
        the link said to be off) when it cannot run here or was not wanted."""
        from anolisnuma.testing import kube_apiserver

        why = None if self.want_cluster else "--no-cluster"
        why = why or kube_apiserver.missing()
        if why:
            self.off.append(f"cluster link ({why})")
            return ""
        sys.path.insert(0, os.path.join(HERE, "tests", "cluster"))
        import cluster_helpers

        log("starting a private control plane (etcd, kube-apiserver) for the cluster link")
        self.cp = kube_apiserver.PrivateControlPlane.start_new(prefix="anolisnuma-bench-rss-k8s-")
        cluster_helpers.install(self.cp, NS)
        self.on.append("cluster link (private kube-apiserver, Oenuma CRD, events, status)")
        return cluster_helpers.node_kubeconfig(self.cp, NODE)

    def rss(self) -> float:
        with open(f"/proc/{self.pid}/status") as f:
            return vmrss_mb(f.read())

    def close(self) -> None:
        if self.daemon is not None:
            code = self.daemon.stop()
            if code not in (0, None):
                self.problems.append(f"daemon exited with {code}: {self.daemon.stderr[-500:]}")
        if self.runtime is not None:
            self.runtime.close()
        if self.fake is not None:
            self.fake.stop(0)
        if self.cp is not None:
            self.cp.close()
        if self.kernel is not None:
            self.kernel.close()
        shutil.rmtree(self.work, ignore_errors=True)

    # ---- the pods
    def run(self, pods: int, every: int, callers: int, samples: List[Dict[str, Any]]) -> None:
        import grpc
        from cri_api.v1 import api_pb2_grpc as pbg

        marks = checkpoints(pods, every)
        channel = grpc.insecure_channel(f"unix://{self.daemon.socket_path}")
        rt = pbg.RuntimeServiceStub(channel)
        last = [time.monotonic(), 0]

        def reading(label: str, n: int) -> None:
            now = time.monotonic()
            rate = (n - last[1]) / (now - last[0]) if n > last[1] else None
            last[:] = [now, n]
            samples.append({"label": label, "pods": n, "mb": self.rss(), "rate": rate,
                            "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg())})
            log(f"{label}: {n} pods, VmRSS {samples[-1]['mb']:.2f} MB")

        def caller() -> None:
            while True:
                with self._lock:
                    i = self._next
                    if i >= pods:
                        return
                    self._next += 1
                try:
                    if self.nri:
                        self.nri_lifecycle(i)
                    else:
                        self.lifecycle(i, rt)
                except Exception as e:   # counted; the run goes on
                    with self._lock:
                        self.problems.append(f"pod {i}: {e!r}"[:300])
                with self._lock:
                    self.done += 1
                    if marks and self.done >= marks[0]:
                        marks.pop(0)
                        reading("checkpoint", self.done)

        threads = [threading.Thread(target=caller, name=f"caller-{k}") for k in range(callers)]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            channel.close()

    def lifecycle(self, i: int, rt: Any) -> None:
        """One pod as the kubelet runs it, the fake cgroups made and removed around it."""
        from cri_api.v1 import api_pb2 as pb

        uid = str(uuid.uuid4())
        parent = f"/kubepods/burstable/pod{uid}"
        pod_rel = self.kernel.make_pod(parent).rel
        res = pb.LinuxContainerResources(cpu_period=PERIOD, cpu_quota=PERIOD * 50 // 1000, cpu_shares=51)
        cfg = pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(name=f"rss-{i}", namespace=NS, uid=uid),
                                  annotations={"anolisbox.sh/qoslevel": QOS_LEVELS[i % len(QOS_LEVELS)]},
                                  linux=pb.LinuxPodSandboxConfig(cgroup_parent=parent, resources=res))
        try:
            sid = rt.RunPodSandbox(pb.RunPodSandboxRequest(config=cfg), timeout=30).pod_sandbox_id
            ccfg = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="app"),
                                      linux=pb.LinuxContainerConfig(resources=res))
            cid = rt.CreateContainer(pb.CreateContainerRequest(pod_sandbox_id=sid, config=ccfg, sandbox_config=cfg),
                                     timeout=30).container_id
            ctr_rel = self.kernel.make_container(parent, cid)
            rt.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=30)
            rt.StopContainer(pb.StopContainerRequest(container_id=cid, timeout=2), timeout=30)
            self.kernel.cgroup.remove(ctr_rel)
            rt.RemoveContainer(pb.RemoveContainerRequest(container_id=cid), timeout=30)
            rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid), timeout=30)
            rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid), timeout=30)
        finally:
            self.kernel.cgroup.remove(pod_rel)

    def nri_lifecycle(self, i: int) -> None:
        """One pod as containerd's NRI events, the fake cgroups made and removed around it
        as the kubelet and runc make the real ones."""
        from nri_proto import api_pb2 as nri

        call = self.runtime.call_plugin
        uid = str(uuid.uuid4())
        parent = f"/kubepods/burstable/pod{uid}"
        pod_rel = self.kernel.make_pod(parent).rel
        sid, cid = uuid.uuid4().hex * 2, uuid.uuid4().hex * 2
        cpu = nri.LinuxCPU(shares=nri.OptionalUInt64(value=51), quota=nri.OptionalInt64(value=PERIOD * 50 // 1000),
                           period=nri.OptionalUInt64(value=PERIOD))
        pod = nri.PodSandbox(id=sid, name=f"rss-{i}", uid=uid, namespace=NS,
                             annotations={"anolisbox.sh/qoslevel": QOS_LEVELS[i % len(QOS_LEVELS)]},
                             linux=nri.LinuxPodSandbox(cgroup_parent=parent,
                                                       pod_resources=nri.LinuxResources(cpu=cpu)))
        ctr = nri.Container(id=cid, pod_sandbox_id=sid, name="app",
                            linux=nri.LinuxContainer(resources=nri.LinuxResources(cpu=cpu)))
        try:
            call("StateChange", nri.StateChangeEvent(event=nri.RUN_POD_SANDBOX, pod=pod), nri.Empty)
            reply = call("CreateContainer", nri.CreateContainerRequest(pod=pod, container=ctr),
                         nri.CreateContainerResponse)
            if reply.adjust.linux.resources.cpu.cpus:   # the NUMA hook's cpuset came back
                with self._lock:
                    self.placed += 1
            ctr_rel = self.kernel.make_container(parent, cid)
            call("StateChange", nri.StateChangeEvent(event=nri.START_CONTAINER, pod=pod, container=ctr), nri.Empty)
            call("StopContainer", nri.StopContainerRequest(pod=pod, container=ctr), nri.StopContainerResponse)
            self.kernel.cgroup.remove(ctr_rel)
            call("StateChange", nri.StateChangeEvent(event=nri.REMOVE_CONTAINER, pod=pod, container=ctr), nri.Empty)
            for event in (nri.STOP_POD_SANDBOX, nri.REMOVE_POD_SANDBOX):
                call("StateChange", nri.StateChangeEvent(event=event, pod=pod), nri.Empty)
        finally:
            self.kernel.cgroup.remove(pod_rel)


class _Ours:
    """CPU ticks of this process (FakeCri and the callers are its threads) and the daemon."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def ticks(self) -> int:
        from bench_nri import _ticks
        t = os.times()
        return int((t.user + t.system) * os.sysconf("SC_CLK_TCK")) + _ticks(self.pid)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help=f"{QUICK['pods']} pods, RSS every {QUICK['every']}")
    ap.add_argument("--pods", type=int, help=f"pod lifecycles (default {FULL['pods']})")
    ap.add_argument("--every", type=int, help=f"read RSS every N pods (default {FULL['every']})")
    ap.add_argument("--callers", type=int, default=2, help="callers on the shared connection (default 2)")
    ap.add_argument("--no-cluster", action="store_true", help="leave the cluster link off")
    ap.add_argument("--no-nri", action="store_true", help="leave NRI off; the pods go through the proxy")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON to FILE")
    args = ap.parse_args(argv)
    cfg = dict(QUICK if args.quick else FULL)
    cfg.update({k: v for k, v in (("pods", args.pods), ("every", args.every)) if v})
    try:
        import cri_api.v1.api_pb2  # noqa: F401
    except ImportError as e:
        print(f"bench_rss: needs the CRI stubs (container-runtime-interface-api): {e}", file=sys.stderr)
        return 1

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    t0 = time.monotonic()
    bench = Bench(cluster=not args.no_cluster, nri=not args.no_nri)
    samples: List[Dict[str, Any]] = []
    result: Dict[str, Any] = {"mode": "quick" if args.quick else "full", "machine": machine(), "pods": cfg["pods"],
                              "callers": args.callers, "nri": not args.no_nri,
                              "command": " ".join(["scripts/bench_rss.py"] + (argv if argv is not None else sys.argv[1:]))}
    rc = 0
    load: Dict[str, float] = {}
    try:
        bench.start()
        time.sleep(REST_S)   # the start-up resync and the first affinity passes
        samples.append({"label": "at rest", "pods": 0, "mb": bench.rss(), "rate": None,
                        "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg())})
        log(f"at rest: VmRSS {samples[-1]['mb']:.2f} MB; on: {', '.join(bench.on)}")
        ours = _Ours(bench.pid)
        before = cpu_sample(ours)   # type: ignore[arg-type]
        bench.run(cfg["pods"], cfg["every"], args.callers, samples)
        load = other_cpu_percent(before, cpu_sample(ours))   # type: ignore[arg-type]
        time.sleep(REST_S)
        samples.append({"label": f"after {REST_S:g} s of rest", "pods": bench.done, "mb": bench.rss(), "rate": None,
                        "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg())})
    except KeyboardInterrupt:
        log("interrupted; cleaning up")
        rc = 130
    except Exception as e:
        log(f"benchmark failed: {e!r}")
        if bench.daemon is not None:
            log(f"daemon stderr tail:\n{bench.daemon.stderr[-2000:]}")
        bench.problems.append(f"benchmark failed: {e!r}")
        rc = 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        bench.close()
    errors = len([p for p in bench.problems if p.startswith("pod ")])
    result.update(samples=samples, on=bench.on, nri_placed=bench.placed, off=bench.off, problems=bench.problems, load=load,
                  failed_pods=errors, elapsed_s=time.monotonic() - t0,
                  verdict=rss_verdict([(s["label"], s["pods"], s["mb"]) for s in samples]) if samples else {})
    if rc == 0:
        print(render(result))
    else:
        print("\n".join(bench.problems), file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, sort_keys=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
