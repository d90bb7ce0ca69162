"""What the kubelet's CPU manager tells us: exclusive CPUs and the shared pool.

With the kubelet's ``static`` policy, containers of Guaranteed pods with integer CPU
requests own CPUs exclusively (``entries``); every other container shares
``defaultCpuSet``. anolisnuma never pins anything onto an exclusive CPU and never touches
the containers that own them; the shared pool is the budget balance placement works
within. With the ``none`` policy (or no checkpoint at all) the shared pool is every online
CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Mapping

from anolisnuma.policies.numa.cpuset import EMPTY, CpuSet, CpuSetError, union_all


class CpuManagerStateError(ValueError):
    """A CPU list in the checkpoint is garbled."""


@dataclass(frozen=True)
class KubeletCpuState:
    policy: str = "none"
    default_cpus: CpuSet = EMPTY
    entries: Mapping[str, Mapping[str, CpuSet]] = field(default_factory=dict)
    present: bool = False

    @classmethod
    def from_raw(cls, raw: Any) -> "KubeletCpuState":
        """Interpret a :class:`anolisnuma.system.kubelet_state.RawCpuManagerState`; raises
        :class:`CpuManagerStateError` when a CPU list does not parse."""
        try:
            default = CpuSet.parse(raw.default_cpuset)
            entries: Dict[str, Dict[str, CpuSet]] = {
                uid: {name: CpuSet.parse(cpus) for name, cpus in containers.items()}
                for uid, containers in raw.entries.items()}
        except CpuSetError as e:
            raise CpuManagerStateError(str(e)) from e
        return cls(policy=raw.policy_name, default_cpus=default, entries=entries, present=raw.present)

    @property
    def is_static(self) -> bool:
        return self.policy == "static"

    @property
    def exclusive_cpus(self) -> CpuSet:
        """Every CPU some container owns exclusively."""
        if not self.is_static:
            return EMPTY
        return union_all(cpus for containers in self.entries.values() for cpus in containers.values())

    def is_exclusive(self, pod_uid: str, container_name: str) -> bool:
        """True when the kubelet gave this container exclusive CPUs (leave it alone)."""
        if not self.is_static:
            return False
        return container_name in self.entries.get(pod_uid, {})

    def has_exclusive(self, pod_uid: str) -> bool:
        return self.is_static and bool(self.entries.get(pod_uid))

    def shared_pool(self, online: CpuSet) -> CpuSet:
        """The CPUs shared containers may run on: ``defaultCpuSet`` (every online CPU when
        the policy is not static or the set is empty), minus every exclusive CPU, within
        ``online``."""
        if not self.is_static:
            return online
        base = self.default_cpus & online if self.default_cpus else online
        return base - self.exclusive_cpus
