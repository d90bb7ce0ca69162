"""docs/cluster.md's RBAC examples ("Who may move which pods") apply as written, and the API
server then lets each group do what the doc says, and nothing more: a tenant creates
Oenumas in its own namespace only, the NUMA administrators in the trusted one only, and
no role that aggregates into the built-in ``edit`` and ``admin`` gives Oenumas."""

from __future__ import annotations

import os
import re
from typing import List

from cluster_helpers import Cluster

from anolisnuma.testing.proxy import REPO_ROOT

TRUSTED = "anolisnuma-system"


def examples() -> List[str]:
    with open(os.path.join(REPO_ROOT, "docs", "cluster.md")) as f:
        text = f.read()
    section = text.split("## Who may move which pods", 1)[1].split("\n## ", 1)[0]
    return [b for b in re.findall(r"```yaml\n(.*?)```", section, re.S) if "rbac.authorization.k8s.io" in b]


def can(cluster: Cluster, user: str, group: str, namespace: str) -> bool:
    done = cluster.cp.kubectl("auth", "can-i", "create", "oenumas.resource.sop.huawei.com", "-n", namespace,
                              "--as", user, "--as-group", group, check=False)
    return done.stdout.strip() == "yes"


def test_the_docs_rbac_examples_grant_what_they_say(cluster: Cluster) -> None:
    tenant, admins = examples()
    assert "kind: ResourceQuota" in tenant and "kind: RoleBinding" in admins and "ClusterRoleBinding" not in admins
    for ns in ("team-a", "team-b"):   # (team-b: a tenant the examples give nothing)
        if cluster.cp.kubectl("get", "namespace", ns, check=False).returncode != 0:
            cluster.cp.kubectl("create", "namespace", ns)
    cluster.apply(tenant)
    cluster.apply(admins)

    assert can(cluster, "alice", "team-a", "team-a")
    assert not can(cluster, "alice", "team-a", TRUSTED) and not can(cluster, "alice", "team-a", "team-b")
    assert can(cluster, "bob", "numa-admins", TRUSTED)
    assert not can(cluster, "bob", "numa-admins", "team-a")
    quota = cluster.cp.kubectl_json("get", "resourcequota", "oenumas", "-n", "team-a")
    assert quota["spec"]["hard"] == {"count/oenumas.resource.sop.huawei.com": "16"}

    # the doc's claim: the built-in edit and admin roles do not give Oenumas. They are made
    # of the ClusterRoles labelled to aggregate into them (by the controller-manager, which
    # this private control plane does not run): none of those names Oenumas
    for role in ("edit", "admin"):
        labelled = cluster.cp.kubectl_json("get", "clusterroles", "-l",
                                           f"rbac.authorization.k8s.io/aggregate-to-{role}=true")["items"]
        assert not [r["metadata"]["name"] for r in labelled
                    if any("oenumas" in (rule.get("resources") or []) or "*" in (rule.get("resources") or [])
                           for rule in r.get("rules") or [])]
