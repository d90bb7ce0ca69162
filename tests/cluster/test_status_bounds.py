"""The bounds of an Oenuma's status: the CRD's status schema (deploy/crd-oenuma.yaml) is at
or above what a node's daemon writes (anolisnuma/cluster/status.py), whatever it is fed,
and an entry at the schema's bounds is a bounded share of what etcd stores of a CR. (No
API server: tests/cluster/test_status_policy_live.py sends these to the real one.)"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Tuple

import yaml

from anolisnuma.cluster import status as st
from anolisnuma.cluster.oenumas import CrRules
from anolisnuma.policies.numa import oenuma_bounds as bounds
from anolisnuma.policies.numa.cpuset import CpuSet
from anolisnuma.policies.numa.ledger import Allocation
from anolisnuma.policies.numa.rules import OENUMA_API_VERSION, OENUMA_KIND, PinRule
from anolisnuma.testing.proxy import REPO_ROOT

ETCD_MAX_OBJECT = 1536 * 1024     # etcd's default --max-request-bytes


def status_schema() -> Dict[str, Any]:
    with open(os.path.join(REPO_ROOT, "deploy", "crd-oenuma.yaml")) as f:
        crd = yaml.safe_load(f)
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]


def violations(value: Any, schema: Dict[str, Any], path: str = "status") -> List[str]:
    """What of ``value`` the schema's bounds refuse (maxItems, maxLength, minimum,
    maximum, enum, required), as the API server checks them."""
    out: List[str] = []
    kind = schema.get("type")
    if kind == "object":
        out += [f"{path}.{k}: required" for k in schema.get("required", []) if k not in value]
        for k, v in value.items():
            if k in schema.get("properties", {}):
                out += violations(v, schema["properties"][k], f"{path}.{k}")
    elif kind == "array":
        if len(value) > schema.get("maxItems", len(value)):
            out.append(f"{path}: {len(value)} items, more than {schema['maxItems']}")
        for i, v in enumerate(value):
            out += violations(v, schema["items"], f"{path}[{i}]")
    elif kind == "string":
        if len(value) > schema.get("maxLength", len(value)):
            out.append(f"{path}: {len(value)} characters, more than {schema['maxLength']}")
        if "enum" in schema and value not in schema["enum"]:
            out.append(f"{path}: {value!r} not in {schema['enum']}")
    elif kind == "integer":
        if not schema.get("minimum", value) <= value <= schema.get("maximum", value):
            out.append(f"{path}: {value} out of range")
    return out


def largest(schema: Dict[str, Any]) -> Any:
    """A value as large as the schema's bounds let it be (an int64 of 19 digits)."""
    kind = schema.get("type")
    if kind == "object":
        return {k: largest(v) for k, v in schema.get("properties", {}).items()}
    if kind == "array":
        return [largest(schema["items"])] * schema["maxItems"]
    if kind == "string":
        return max(schema["enum"], key=len) if "enum" in schema else "x" * schema["maxLength"]
    return schema.get("maximum", 2 ** 63 - 1)


def forged_entry(node: str) -> Dict[str, Any]:
    """``node``'s entry as large as the schema lets anyone make it, and valid: every list
    at its maxItems (map keys told apart), every string at its maxLength (times as they
    are: a date-time's format bounds it)."""
    out = largest(status_schema()["properties"]["nodes"]["items"])
    out["name"] = node
    out["pods"] = [dict(p, name=f"{i:05d}{p['name'][5:]}") for i, p in enumerate(out["pods"])]
    out["conditions"] = [dict(c, type=f"{i:02d}{c['type'][2:]}") for i, c in enumerate(out["conditions"])]
    out["lastUpdateTime"] = "2026-12-02T00:26:01Z"
    for c in out["conditions"]:
        c["lastTransitionTime"] = "2026-12-02T00:26:01Z"
    return out


def hostile_entry(node: str = "n" * bounds.MAX_NAME) -> Tuple[str, Dict[str, Any]]:
    """The entry status.py makes for ``node`` of inputs at or past every size they can
    have: 300 pods of the longest names, each on 1,024 NUMA nodes with the odd CPUs of
    4,096, a UID of 100 characters, reasons of 5,000; 30 problems of 5,000. Returns (the
    top-level summary, the entry)."""
    ns = "s" * bounds.MAX_NAMESPACE
    everything = PinRule(ns, "*", (0,), source="apiserver " + "r" * 5000, from_cluster=True)
    absent = [PinRule(ns, f"{'a' * 248}{i:05d}", (1,), source="apiserver", from_cluster=True) for i in range(50)]
    pods = [Allocation(pod_uid=f"{i:05d}" + "u" * 95, namespace=ns, name=f"{'p' * 248}{i:05d}", sandbox_id="s",
                       nodes=tuple(range(1024)), home=CpuSet(range(1, 4096, 2)), mems=CpuSet(range(0, 1024, 2)),
                       source="rule" if i % 3 else "balance") for i in range(300)]
    cr = CrRules(key=(ns, "c" * bounds.MAX_NAME), generation=2 ** 63 - 1, uid="u", rules=[everything, *absent],
                 problems=["p" * 5000] * 30, refusals=["r" * 5000] * 5)
    entry = st.node_entry(node, cr, pods, CpuSet(range(4096)),
                          rule_of=lambda a: everything if int(a.name[-5:]) % 2 else absent[0],
                          pending={p.pod_uid for p in pods[::7]}, failure=lambda uid: "f" * 5000)
    entry["conditions"][0]["lastTransitionTime"] = "2026-12-02T00:26:01Z"
    body = st.apply_body(cr, entry, node, "2026-12-02T00:26:01Z", OENUMA_API_VERSION, OENUMA_KIND)
    return body["status"]["summary"], body["status"]["nodes"][0]


def test_what_status_py_writes_from_the_largest_inputs_is_within_the_crds_status_schema() -> None:
    summary, entry = hostile_entry()
    schema = status_schema()
    assert violations({"summary": summary, "nodes": [entry]}, schema) == []
    # (and it is at the writer's own bounds: every one of them was reached)
    pod_states = {p["state"] for p in entry["pods"]}
    assert len(entry["pods"]) == st.MAX_PODS and {"Pinned", "Pending", "Failed", "Overridden"} <= pod_states
    assert len(entry["problems"]) == st.MAX_PROBLEMS and max(map(len, entry["problems"])) == st.MAX_TEXT
    assert max(len(p.get("reason", "")) for p in entry["pods"]) == st.MAX_REASON
    assert max(len(p.get("cpuset", "")) for p in entry["pods"]) == st.MAX_SET
    assert max(len(p.get("numaNodes", [])) for p in entry["pods"]) == st.MAX_NUMA_LISTED
    assert len(entry["conditions"][0]["message"]) <= st.MAX_TEXT


def test_the_crds_status_bounds_are_at_or_above_status_pys_and_the_specs() -> None:
    """As tests/policies/numa/test_oenuma_bounds.py does for the spec: one number each,
    read from the two files."""
    status = status_schema()["properties"]
    nodes = status["nodes"]
    entry = nodes["items"]["properties"]
    pod = entry["pods"]["items"]["properties"]
    condition = entry["conditions"]["items"]["properties"]
    assert nodes["maxItems"] == bounds.MAX_NODES            # (one entry per node a CR may name)
    assert entry["name"]["maxLength"] == bounds.MAX_NAME    # (a node's name; its ServiceAccount's)
    assert entry["pods"]["maxItems"] >= st.MAX_PODS
    assert entry["problems"]["maxItems"] >= st.MAX_PROBLEMS
    assert entry["problems"]["items"]["maxLength"] >= st.MAX_TEXT and condition["message"]["maxLength"] >= st.MAX_TEXT
    assert pod["reason"]["maxLength"] >= st.MAX_REASON
    assert pod["cpuset"]["maxLength"] >= st.MAX_SET and pod["memset"]["maxLength"] >= st.MAX_SET
    assert pod["numaNodes"]["maxItems"] >= st.MAX_NUMA_LISTED
    assert pod["numaNodes"]["items"]["maximum"] == bounds.MAX_NUMA_NUM
    assert pod["uid"]["maxLength"] >= st.MAX_UID
    # a pod's keys are what a rule names (the spec's bounds) or a pod's own (Kubernetes')
    assert pod["namespace"]["maxLength"] == bounds.MAX_NAMESPACE and pod["name"]["maxLength"] == bounds.MAX_NAME


def test_an_entry_at_the_schemas_bounds_is_under_a_third_of_what_etcd_stores() -> None:
    """One node's entry, forged at every bound, leaves room for the entries of the other
    nodes a CR names (its field manager's record of the pods' keys comes on top:
    test_status_policy_live.py measures the two as stored)."""
    size = len(json.dumps(forged_entry("n" * bounds.MAX_NAME), separators=(",", ":")))
    assert violations({"nodes": [forged_entry("n")]}, status_schema()) == []
    assert size < ETCD_MAX_OBJECT / 3, size
