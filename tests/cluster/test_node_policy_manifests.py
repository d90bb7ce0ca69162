"""deploy/'s install gives each node an identity of its own and nothing shared: the node
policy for Kubernetes >= 1.30 (v1) says what the one for 1.26 (v1alpha1, enforced in
tests/cluster) says, and no manifest makes one credential for every node. (No API server:
these read the files.)"""

from __future__ import annotations

import os
from typing import Any, Dict, List

import yaml
from cluster_helpers import DEPLOY


def docs(name: str) -> List[Dict[str, Any]]:
    with open(os.path.join(DEPLOY, name)) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def test_the_v1_node_policy_is_the_tested_v1alpha1_one_with_deny_spelled_out() -> None:
    alpha, ga = docs("node-policy-v1alpha1.yaml"), docs("node-policy.yaml")
    assert {d["apiVersion"] for d in alpha} == {"admissionregistration.k8s.io/v1alpha1"}
    assert {d["apiVersion"] for d in ga} == {"admissionregistration.k8s.io/v1"}
    assert [(d["kind"], d["metadata"]) for d in ga] == [(d["kind"], d["metadata"]) for d in alpha]
    for a, g in zip(alpha, ga):
        if a["kind"] == "ValidatingAdmissionPolicy":
            assert g["spec"] == a["spec"] and g["spec"]["failurePolicy"] == "Fail"
        else:   # (1.26's binding has no validationActions: it denies; v1 requires the field)
            assert g["spec"] == dict(a["spec"], validationActions=["Deny"])
    policies = {d["metadata"]["name"] for d in alpha if d["kind"] == "ValidatingAdmissionPolicy"}
    assert policies == {d["spec"]["policyName"] for d in alpha if d["kind"] == "ValidatingAdmissionPolicyBinding"}
    assert policies == {"anolisnuma-node-status", "anolisnuma-node-topology", "anolisnuma-node-events"}


def test_every_validation_lets_anyone_but_a_node_identity_through_first() -> None:
    """The policies bind cluster-wide: a request of an admin, the kubelet or the scheduler
    must never depend on the rest of an expression."""
    for d in docs("node-policy-v1alpha1.yaml"):
        for v in d["spec"].get("validations", []):
            assert v["expression"].startswith(
                "!request.userInfo.username.startsWith('system:serviceaccount:anolisnuma-nodes:') ||"), v
            assert v["reason"] == "Forbidden" and v["message"]


def test_the_install_binds_the_node_role_to_the_nodes_namespace_only_and_ships_no_shared_token() -> None:
    rbac = {d["kind"]: d for d in docs("rbac.yaml")}
    assert rbac["ClusterRoleBinding"]["subjects"] == [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:serviceaccounts:anolisnuma-nodes"}]
    assert "ServiceAccount" not in rbac and rbac["Namespace"]["metadata"]["name"] == "anolisnuma-nodes"
    verbs = {(g, r): sorted(rule["verbs"]) for rule in rbac["ClusterRole"]["rules"]
             for g in rule["apiGroups"] for r in rule["resources"]}
    assert verbs == {("resource.sop.huawei.com", "oenumas"): ["list", "watch"],
                     ("resource.sop.huawei.com", "oenumas/status"): ["patch"],
                     ("events.k8s.io", "events"): ["create", "patch"],
                     ("topology.node.k8s.io", "noderesourcetopologies"): ["create", "patch"]}
    for name in os.listdir(DEPLOY):
        for d in docs(name):
            assert d.get("type") != "kubernetes.io/service-account-token", name
