"""The ``[kubernetes]`` section: whether and how the daemon talks to the API server.

```toml
[kubernetes]
kubeconfig = ""                    # the node's credentials for anolisnuma; "" = no API server
node_name = ""                     # this node's name; "" = what [numa] node_name resolves to
request_timeout_seconds = 10.0     # every request but a watch: connect, send, whole reply
watch_timeout_seconds = 300.0      # a watch is re-made after this long (the server ends it)
backoff_max_seconds = 60.0         # reconnect delays double from 0.5 s up to this (+-20 %)
write_status = true                # report what this node did in each CR's status
events = true                      # events on pods (placed, moved, re-pinned, QoS) and malformed CRs
topology = false                   # publish this node's NUMA zones as a NodeResourceTopology
topology_interval_seconds = 10.0   # looked at this often; published only when changed
topology_manager_policy = "none"   # the kubelet's --topology-manager-policy, published for the scheduler
topology_manager_scope = "container"   # the kubelet's --topology-manager-scope (container, pod)
trusted_namespaces = []            # Oenumas here may name any namespace, give numa[] tables, select pods
```

``trusted_namespaces`` is empty by default: a CR may then only pin pods of its own
namespace that ``[numa]`` already manages (``policies/numa/oenuma_cr.py``). A namespace
named here must be one where only cluster administrators may create Oenumas
(docs/cluster.md, "Who may move which pods"): names, not patterns, so that no namespace
made later is trusted by accident.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import List, Tuple

from anolisnuma.configfile import Table, shown

TOPOLOGY_MANAGER_POLICIES: Tuple[str, ...] = ("none", "best-effort", "restricted", "single-numa-node")
TOPOLOGY_MANAGER_SCOPES: Tuple[str, ...] = ("container", "pod")
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")   # a DNS label, as Kubernetes names namespaces


@dataclass
class KubernetesConfig:
    kubeconfig: str = ""
    node_name: str = ""
    request_timeout_seconds: float = 10.0
    watch_timeout_seconds: float = 300.0
    backoff_max_seconds: float = 60.0
    write_status: bool = True
    events: bool = True
    topology: bool = False
    topology_interval_seconds: float = 10.0
    topology_manager_policy: str = "none"
    topology_manager_scope: str = "container"
    trusted_namespaces: List[str] = field(default_factory=list)

    @property
    def enabled(self) -> bool:
        return bool(self.kubeconfig)

    @classmethod
    def from_table(cls, t: Table) -> "KubernetesConfig":
        kubeconfig = t.str("kubeconfig", "")
        if kubeconfig and not kubeconfig.startswith("/"):
            kubeconfig = t.invalid("kubeconfig", f"must be an absolute path or empty; got {shown(kubeconfig)}", "")
        node_name = t.str("node_name", "")
        if node_name != node_name.strip():
            node_name = t.invalid("node_name", "must not start or end with whitespace", "")
        cfg = cls(
            kubeconfig=kubeconfig,
            node_name=node_name,
            request_timeout_seconds=t.float("request_timeout_seconds", 10.0, min=0.1, max=600),
            watch_timeout_seconds=t.float("watch_timeout_seconds", 300.0, min=1, max=3600),
            backoff_max_seconds=t.float("backoff_max_seconds", 60.0, min=0.5, max=3600),
            write_status=t.bool("write_status", True),
            events=t.bool("events", True),
            topology=t.bool("topology", False),
            topology_interval_seconds=t.float("topology_interval_seconds", 10.0, min=1, max=3600),
            topology_manager_policy=t.str("topology_manager_policy", "none", choices=TOPOLOGY_MANAGER_POLICIES),
            topology_manager_scope=t.str("topology_manager_scope", "container", choices=TOPOLOGY_MANAGER_SCOPES),
            trusted_namespaces=_namespaces(t, "trusted_namespaces"),
        )
        t.finish()
        return cfg


def _namespaces(t: Table, key: str) -> List[str]:
    names = t.str_list(key, [])
    wrong = [name for name in names if not _NAMESPACE.match(name)]
    if wrong:   # one error for the list (a list of a thousand wrong names is one mistake)
        t.invalid(key, f"{shown(wrong[0])} is not a namespace name (a DNS label: lowercase letters, digits and "
                       "'-', at most 63; no patterns)" + (f"; nor are {len(wrong) - 1} more" if len(wrong) > 1 else ""))
    return sorted(set(names) - set(wrong))
