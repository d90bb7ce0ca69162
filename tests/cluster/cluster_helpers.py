"""Helpers of the cluster tests: the control plane handle (with each node's own identity,
:meth:`Cluster.node_kubeconfig`), a kubelet-like CRI client, a daemon on a fake 4-node
topology with FakeCri as containerd and ``[kubernetes]`` on (with a whole fake host for the
QoS knobs, :func:`fake_host_node`), and Oenuma manifests."""

from __future__ import annotations

import contextlib
import json
import os
import ssl
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Tuple

from prometheus_client.parser import text_string_to_metric_families

from anolisnuma.config import Config
from anolisnuma.testing.fake_cri import FakeCri
from anolisnuma.testing.fake_kernel import FakeKernel
from anolisnuma.testing.fake_sysfs import GIB, FakeTopology
from anolisnuma.testing.kubelet_client import PERIOD, Kubelet, Pod, sent_cpusets
from anolisnuma.testing.kube_apiserver import PrivateControlPlane, kubeconfig_text
from anolisnuma.testing.proxy import REPO_ROOT, InProcessProxy, config_dict, write_config
from anolisnuma.testing.waiting import wait_until
from cri_proto import api_pb2 as pb

DEPLOY = os.path.join(REPO_ROOT, "deploy")
NODES_NAMESPACE = "anolisnuma-nodes"     # one ServiceAccount per node (deploy/rbac.yaml)
# what the API server of tests/cluster (v1.26) is given of deploy/, in this order
INSTALL = ("crd-oenuma.yaml", "crd-noderesourcetopology.yaml", "rbac.yaml", "node-policy-v1alpha1.yaml")
# 4 NUMA nodes of 2 CPUs each
TOPOLOGY = FakeTopology(name="4x2", node_cpus={0: "0-1", 1: "2-3", 2: "4-5", 3: "6-7"},
                        distances=[[10, 20, 20, 20], [20, 10, 20, 20], [20, 20, 10, 20], [20, 20, 20, 10]],
                        memory_bytes={n: 4 * GIB for n in range(4)})


@dataclass
class Cluster:
    cp: PrivateControlPlane

    def node_kubeconfig(self, node: str) -> str:
        """A kubeconfig of ``node``'s own identity, as docs/cluster.md installs it: the
        ServiceAccount named after the node in anolisnuma-nodes (made if absent) and a
        token of the TokenRequest API, by ``tokenFile``."""
        return node_kubeconfig(self.cp, node)

    def apply(self, doc: str) -> None:
        self.cp.kubectl("apply", "-f", "-", input=doc)

    def oenuma(self, namespace: str, name: str) -> Any:
        return self.cp.request("GET", f"/apis/resource.sop.huawei.com/v1alpha1/namespaces/{namespace}/oenumas/{name}")


@dataclass
class Node:
    """One daemon: its in-process proxy, its FakeCri, a kubelet client."""

    name: str
    proxy: InProcessProxy
    fake: FakeCri
    kubelet: Kubelet
    base: str

    @property
    def admin_socket(self) -> str:
        return self.proxy.config.admin.socket

    @property
    def placement(self) -> Any:
        from anolisnuma.admin.views import placement

        return placement(self.proxy.daemon)

    @property
    def link(self) -> Any:
        return self.proxy.daemon.cluster

    def nodes_of(self, pod: Pod) -> Optional[tuple]:
        alloc = self.placement.ledger.get(pod.uid)
        return None if alloc is None else tuple(alloc.nodes)

    def repinned(self, container_id: str) -> List[str]:
        """The cpusets containerd was sent for ``container_id`` by the re-pinner, in order."""
        return sent_cpusets(self.fake, container_id)

    def settled(self, pod: Pod, nodes: tuple) -> bool:
        """The pod's allocation is on ``nodes`` and containerd got every container's cpuset."""
        if self.nodes_of(pod) != nodes:
            return False
        want = str(self.placement.ledger.get(pod.uid).cpus(self.placement.shared_pool))
        return all(self.repinned(cid)[-1:] == [want] for cid in pod.containers.values()) \
            and not self.placement.pending_updates()


def node_kubeconfig(cp: PrivateControlPlane, node: str, hours: int = 4) -> str:
    """See :meth:`Cluster.node_kubeconfig`; the files are in the control plane's directory."""
    accounts = f"/api/v1/namespaces/{NODES_NAMESPACE}/serviceaccounts"
    try:
        cp.request("POST", accounts, {"metadata": {"name": node}})
    except urllib.error.HTTPError as e:
        if e.code != 409:   # (AlreadyExists: a node started again)
            raise
    token = cp.request("POST", f"{accounts}/{node}/token",
                       {"spec": {"expirationSeconds": hours * 3600}})["status"]["token"]
    token_file = os.path.join(cp.base_dir, f"{node}.token")
    with open(token_file, "w") as f:
        f.write(token + "\n")
    path = os.path.join(cp.base_dir, f"{node}.kubeconfig")
    with open(path, "w") as f:
        f.write(kubeconfig_text(cp.server, cp.ca_file, token_file=token_file, user=node))
    return path


def node_request(cp: PrivateControlPlane, node: str, method: str, path: str, body: Any,
                 content_type: str = "application/json") -> Tuple[int, str]:
    """One request with ``node``'s own token (its ServiceAccount, made by
    :func:`node_kubeconfig`): (HTTP status, the API server's message)."""
    with open(os.path.join(cp.base_dir, f"{node}.token")) as f:
        token = f.read().strip()
    req = urllib.request.Request(cp.server + path, data=json.dumps(body).encode(), method=method, headers={
        "Content-Type": content_type, "Accept": "application/json", "Authorization": f"Bearer {token}"})
    ctx = ssl.create_default_context(cafile=cp.ca_file)
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as reply:
            return reply.status, ""
    except urllib.error.HTTPError as e:
        text = e.read().decode(errors="replace")
        try:
            return e.code, json.loads(text).get("message", text)
        except ValueError:
            return e.code, text


def wait_node_policy(cp: PrivateControlPlane) -> None:
    """deploy/node-policy*.yaml enforced: a policy takes effect a moment after it is made
    (the API server's informers see it), so a node's write of another node's topology
    object is tried (a dry run) until it is refused."""
    node_kubeconfig(cp, "policy-probe")
    body = {"apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
            "metadata": {"name": "not-policy-probe"}, "zones": [], "topologyPolicies": ["None"]}
    wait_until(lambda: node_request(cp, "policy-probe", "POST",
                                    "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies?dryRun=All",
                                    body)[0] == 403, "the node policy enforced")


def install(cp: PrivateControlPlane, namespace: str) -> None:
    """deploy/'s CRDs, RBAC and node policy on a fresh control plane, the policy enforced,
    and ``namespace`` made for the CRs."""
    cp.kubectl("apply", *(a for name in INSTALL for a in ("-f", os.path.join(DEPLOY, name))))
    cp.kubectl("wait", "--for=condition=Established", "crd/oenumas.resource.sop.huawei.com",
               "crd/noderesourcetopologies.topology.node.k8s.io")
    cp.kubectl("create", "namespace", namespace)
    wait_node_policy(cp)


def start_node(base: str, sockdir: str, kubeconfig: str, name: str, **kubernetes: Any) -> Node:
    fake = FakeCri(os.path.join(sockdir, f"containerd-{name[-6:]}.sock"), containers=0, sandboxes=0).start()
    data = config_dict(base, fake.socket_path, listen=os.path.join(sockdir, f"cri-{name[-6:]}.sock"), extra={
        "log": {"stderr": False},
        "admin": {"socket": os.path.join(sockdir, f"admin-{name[-6:]}.sock")},
        "runtime": {"resync_interval_seconds": 0.0},
        "numa": {"enabled": True, "namespaces": ["batch"], "node_name": name, "memory_pinning": "strict",
                 "poll_interval_seconds": 0.1},
        "kubernetes": dict({"kubeconfig": kubeconfig, "request_timeout_seconds": 3.0,
                            "watch_timeout_seconds": 30.0, "backoff_max_seconds": 1.0}, **kubernetes),
    })
    TOPOLOGY.write(data["paths"]["sys_root"])
    path = write_config(os.path.join(base, "config.toml"), data)
    proxy = InProcessProxy(Config.load(path)).start()
    proxy.wait_resynced()
    return Node(name, proxy, fake, Kubelet(proxy.address), base)


@dataclass
class FakeHostNode:
    """A daemon on a whole fake host (:class:`FakeKernel`: cgroups with the Anolis QoS knobs,
    the 4-node topology) with FakeCri as containerd; see :func:`fake_host_node`."""

    name: str
    proxy: InProcessProxy
    fake: FakeCri
    kubelet: Kubelet
    kernel: FakeKernel

    @property
    def link(self) -> Any:
        return self.proxy.daemon.cluster

    def run_pod(self, name: str, annotations: Dict[str, str], millicpu: int = 10) -> Tuple[str, float]:
        """A pod of one container through the proxy (its cgroup made first, as the
        kubelet does); (its UID, the seconds the two CRI calls took)."""
        uid = str(uuid.uuid4())
        parent = f"/kubepods/burstable/pod{uid}"
        self.kernel.make_pod(parent)
        res = pb.LinuxContainerResources(cpu_period=PERIOD, cpu_quota=PERIOD * millicpu // 1000)
        config = pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(name=name, namespace="batch", uid=uid),
                                     annotations=annotations,
                                     linux=pb.LinuxPodSandboxConfig(cgroup_parent=parent, resources=res))
        t = time.perf_counter()
        sid = self.kubelet.call("RunPodSandbox", pb.RunPodSandboxRequest(config=config),
                                pb.RunPodSandboxResponse).pod_sandbox_id
        self.kubelet.call("CreateContainer", pb.CreateContainerRequest(
            pod_sandbox_id=sid, sandbox_config=config,
            config=pb.ContainerConfig(metadata=pb.ContainerMetadata(name="app"),
                                      linux=pb.LinuxContainerConfig(resources=res))), pb.CreateContainerResponse)
        return uid, time.perf_counter() - t

    def metrics(self) -> Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float]:
        """The metrics endpoint's samples, (name, labels) -> value, scraped now."""
        metrics = self.proxy.daemon.admin.metrics
        metrics.scrapes.interval = 0.0   # (this scrape, not the last second's)
        with urllib.request.urlopen(metrics.url, timeout=10) as r:
            text = r.read().decode()
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}


@contextlib.contextmanager
def fake_host_node(base: str, sockdir: str, name: str, **sections: Any) -> Iterator[FakeHostNode]:
    """A :class:`FakeHostNode` whose config is ``sections`` (e.g. ``qos=``, ``numa=``,
    ``kubernetes=``) over a quiet log, the fake host's paths and no periodic resync;
    stopped and removed on exit."""
    kernel = FakeKernel.temporary(sched_core=0)
    TOPOLOGY.write(kernel.paths.sys_root)
    fake = FakeCri(os.path.join(sockdir, "containerd.sock"), containers=0, sandboxes=0).start()
    data = config_dict(base, fake.socket_path, listen=os.path.join(sockdir, "cri.sock"), extra=dict({
        "log": {"stderr": False},
        "paths": kernel.paths_table(),
        "runtime": {"resync_interval_seconds": 0.0},
    }, **sections))
    proxy = InProcessProxy(Config.load(write_config(os.path.join(base, "config.toml"), data))).start()
    kubelet = Kubelet(proxy.address)
    try:
        proxy.wait_resynced()
        yield FakeHostNode(name, proxy, fake, kubelet, kernel)
    finally:
        kubelet.close()
        proxy.stop()
        fake.stop(0)
        kernel.close()


def events_about(cluster: Cluster, namespace: str, name: str) -> List[Any]:
    """The events.k8s.io events of ``namespace`` regarding an object called ``name``."""
    items = cluster.cp.request("GET", f"/apis/events.k8s.io/v1/namespaces/{namespace}/events")["items"]
    return [e for e in items if e["regarding"]["name"] == name]


def pod_events(cluster: Cluster, name: str) -> List[Any]:
    """The events regarding the pod ``name`` of namespace batch."""
    return [e for e in events_about(cluster, "batch", name) if e["regarding"]["kind"] == "Pod"]


def ctl(*args: str) -> Tuple[int, str, str]:
    """``anolisnuma-ctl ARGS`` in this process: (exit code, stdout, stderr)."""
    import contextlib
    import io

    from anolisnuma.ctl import main as ctl_main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = ctl_main.main(list(args))
        except SystemExit as e:   # argparse
            code = int(e.code or 0)
    return code, out.getvalue(), err.getvalue()


def stop_node(node: Node) -> None:
    node.kubelet.close()
    node.proxy.stop()
    node.fake.stop(0)


def oenuma(name: str, node: str, pins: Dict[str, int], namespace: str = "batch",
           numa: Optional[List[Dict[str, Any]]] = None) -> str:
    """An Oenuma manifest pinning each pod name of ``pins`` to its NUMA node on ``node``."""
    entry: Dict[str, Any] = {"name": node, "podAffinity": [{"podName": p, "numaNum": n} for p, n in pins.items()]}
    if numa is not None:
        entry["numa"] = numa
    return json.dumps({"apiVersion": "resource.sop.huawei.com/v1alpha1", "kind": "Oenuma",
                       "metadata": {"name": name, "namespace": namespace}, "spec": {"node": [entry]}})
