"""What a node's kubelet and the cluster's controller-manager do for a walk-through, reduced
to the calls the daemon sees: for a test whose cluster is a bare API server
(:class:`~anolisnuma.testing.kube_apiserver.PrivateControlPlane`) and whose node is a daemon
in front of FakeCri.

:class:`StandInKubelet` follows the pods bound to its node (``spec.nodeName``) on the API
server: each new one is run through the CRI endpoint as the kubelet runs it
(RunPodSandbox with its namespace, name, UID, QoS cgroup parent and CPU resources, then
CreateContainer and StartContainer per container) and reported ``Running`` and ``Ready``
in its status; and, as the controller-manager's ServiceAccount controller does, it gives
every namespace its ``default`` ServiceAccount (the API server admits no pod without it).
It does no more: no restarts, no deletions, no probes. The real kubelet's lab is
``kubelet_node.py`` (root, containerd, slower).

    with StandInKubelet(cp, "worker-1", "unix:///run/anolisnuma.sock"):
        cp.kubectl("apply", "-f", "pod.yaml")   # pod.spec.nodeName: worker-1
"""

from __future__ import annotations

import threading
import time
import urllib.error
from typing import Any, Dict, Optional, Set

from anolisnuma.testing.kube_apiserver import PrivateControlPlane
from anolisnuma.testing.kubelet_client import PERIOD, Kubelet
from cri_proto import api_pb2 as pb

PASS_SECONDS = 0.1
UNITS = {"": 1, "k": 10 ** 3, "M": 10 ** 6, "G": 10 ** 9, "Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30}


def millicpu(quantity: Optional[str]) -> int:
    """``"1"``, ``"500m"``, ``"1.5"`` as millicores (0 for none)."""
    if not quantity:
        return 0
    return int(quantity[:-1]) if quantity.endswith("m") else int(float(quantity) * 1000)


def memory_bytes(quantity: Optional[str]) -> int:
    if not quantity:
        return 0
    number = quantity.rstrip("kMGKi")
    return int(float(number) * UNITS[quantity[len(number):]])


def cgroup_parent(pod: Dict[str, Any]) -> str:
    """The kubelet's cgroupfs layout for the pod's QoS class."""
    uid = pod["metadata"]["uid"]
    qos = (pod.get("status") or {}).get("qosClass", "BestEffort")
    return f"/kubepods/pod{uid}" if qos == "Guaranteed" else f"/kubepods/{qos.lower()}/pod{uid}"


def linux_resources(resources: Dict[str, Any]) -> Any:
    limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
    limit, request = millicpu(limits.get("cpu")), millicpu(requests.get("cpu") or limits.get("cpu"))
    return pb.LinuxContainerResources(cpu_period=PERIOD, cpu_quota=limit * PERIOD // 1000 if limit else 0,
                                      cpu_shares=max(2, request * 1024 // 1000),
                                      memory_limit_in_bytes=memory_bytes(limits.get("memory")))


class StandInKubelet:
    """``StandInKubelet(cp, node, cri_address)``: :meth:`start`, :meth:`stop` (or ``with``)."""

    def __init__(self, cp: PrivateControlPlane, node: str, cri_address: str) -> None:
        self.cp = cp
        self.node = node
        self.kubelet = Kubelet(cri_address)
        self.ran: Set[str] = set()            # pod UIDs run through the CRI endpoint
        self._namespaces: Set[str] = set()    # namespace UIDs given their default ServiceAccount
        self.errors = 0
        self.last_error = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"stand-in-kubelet-{node}", daemon=True)

    def __enter__(self) -> "StandInKubelet":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> "StandInKubelet":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self.kubelet.close()

    def _loop(self) -> None:
        # (a pass every PASS_SECONDS, as a kubelet's sync loop: what is new is run at the next)
        while not self._stop.wait(PASS_SECONDS):
            try:
                self.pass_once()
            except Exception as e:   # (the daemon restarting, the API server busy: the next pass)
                self.errors += 1
                self.last_error = f"{type(e).__name__}: {e}"[:300]

    def pass_once(self) -> None:
        for ns in self.cp.request("GET", "/api/v1/namespaces")["items"]:
            if ns["metadata"]["uid"] not in self._namespaces:
                self._default_service_account(ns["metadata"]["name"])
                self._namespaces.add(ns["metadata"]["uid"])
        pods = self.cp.request("GET", f"/api/v1/pods?fieldSelector=spec.nodeName%3D{self.node}")["items"]
        for pod in pods:
            if pod["metadata"]["uid"] not in self.ran and not pod["metadata"].get("deletionTimestamp"):
                self._run(pod)

    def _default_service_account(self, namespace: str) -> None:
        try:
            self.cp.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts",
                            {"metadata": {"name": "default"}})
        except urllib.error.HTTPError as e:
            if e.code not in (403, 409):   # (AlreadyExists; a namespace being deleted)
                raise

    def _run(self, pod: Dict[str, Any]) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        sandbox_resources = pb.LinuxContainerResources(cpu_period=PERIOD)
        containers = spec["containers"]
        quota = sum(linux_resources(c.get("resources") or {}).cpu_quota for c in containers)
        if all(linux_resources(c.get("resources") or {}).cpu_quota for c in containers):
            sandbox_resources.cpu_quota = quota
        config = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"]),
            labels={"io.kubernetes.pod.name": meta["name"], "io.kubernetes.pod.namespace": meta["namespace"],
                    "io.kubernetes.pod.uid": meta["uid"]},
            linux=pb.LinuxPodSandboxConfig(cgroup_parent=cgroup_parent(pod), resources=sandbox_resources))
        sid = self.kubelet.call("RunPodSandbox", pb.RunPodSandboxRequest(config=config),
                                pb.RunPodSandboxResponse).pod_sandbox_id
        statuses = []
        for c in containers:
            created = self.kubelet.call("CreateContainer", pb.CreateContainerRequest(
                pod_sandbox_id=sid, sandbox_config=config, config=pb.ContainerConfig(
                    metadata=pb.ContainerMetadata(name=c["name"]), image=pb.ImageSpec(image=c["image"]),
                    linux=pb.LinuxContainerConfig(resources=linux_resources(c.get("resources") or {})))),
                pb.CreateContainerResponse).container_id
            self.kubelet.call("StartContainer", pb.StartContainerRequest(container_id=created),
                              pb.StartContainerResponse)
            statuses.append({"name": c["name"], "image": c["image"], "imageID": "", "ready": True,
                             "started": True, "restartCount": 0, "containerID": f"containerd://{created}",
                             "state": {"running": {"startedAt": _now()}}})
        self.ran.add(meta["uid"])
        now = _now()
        conditions = [{"type": t, "status": "True", "lastTransitionTime": now}
                      for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")]
        self.cp.request("PATCH", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
                        {"status": {"phase": "Running", "conditions": conditions, "startTime": now,
                                    "containerStatuses": statuses}},
                        content_type="application/strategic-merge-patch+json")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


__all__ = ["StandInKubelet", "cgroup_parent", "linux_resources", "millicpu"]
