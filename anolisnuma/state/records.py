"""What the proxy remembers about pods and containers.

StartContainer, StopContainer, RemoveContainer and UpdateContainerResources carry only an
ID, so everything a hook needs later is recorded when RunPodSandbox and CreateContainer
pass through (or when the start-up resync reads it back from containerd).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict


@dataclass
class PodRecord:
    sandbox_id: str
    uid: str
    name: str
    namespace: str
    cgroup_parent: str = ""
    labels: Dict[str, str] = field(default_factory=dict)
    annotations: Dict[str, str] = field(default_factory=dict)
    runtime_handler: str = ""

    @property
    def ref(self) -> str:
        """``namespace/name`` for log lines and rule matching."""
        return f"{self.namespace}/{self.name}"

    def to_json(self) -> Dict[str, Any]:
        # By hand: dataclasses.asdict deep-copies recursively and costs ~10x more.
        return {"sandbox_id": self.sandbox_id, "uid": self.uid, "name": self.name,
                "namespace": self.namespace, "cgroup_parent": self.cgroup_parent,
                "labels": self.labels, "annotations": self.annotations,
                "runtime_handler": self.runtime_handler}

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "PodRecord":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class ContainerResources:
    """The LinuxContainerResources fields the policies read, as last sent to containerd."""

    cpu_period: int = 0
    cpu_quota: int = 0
    cpu_shares: int = 0
    memory_limit_in_bytes: int = 0
    cpuset_cpus: str = ""
    cpuset_mems: str = ""


@dataclass
class ContainerRecord:
    container_id: str
    sandbox_id: str
    name: str
    labels: Dict[str, str] = field(default_factory=dict)
    annotations: Dict[str, str] = field(default_factory=dict)
    resources: ContainerResources = field(default_factory=ContainerResources)

    def to_json(self) -> Dict[str, Any]:
        return {"container_id": self.container_id, "sandbox_id": self.sandbox_id, "name": self.name,
                "labels": self.labels, "annotations": self.annotations,
                "resources": dataclasses.asdict(self.resources)}

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "ContainerRecord":
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in names}
        res = kwargs.get("resources") or {}
        res_names = {f.name for f in dataclasses.fields(ContainerResources)}
        kwargs["resources"] = ContainerResources(**{k: v for k, v in res.items() if k in res_names})
        return cls(**kwargs)
