"""The bounds of an Oenuma: what the daemon checks before parsing, the same as the shipped
CRD carries (the API server refuses the same CRs: tests/cluster/test_cr_bounds_live.py)."""

from __future__ import annotations

import os
import re
from typing import Any, Dict, List

import pytest
import yaml

from anolisnuma.policies.numa import oenuma_bounds as b
from anolisnuma.policies.numa.cpuset import CpuSet
from anolisnuma.policies.numa.oenuma_bounds import entries_for_node

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
NODE = "worker-1"


def cr(entry: Dict[str, Any], *others: Dict[str, Any]) -> Dict[str, Any]:
    return {"apiVersion": "resource.sop.huawei.com/v1alpha1", "kind": "Oenuma",
            "metadata": {"name": "x", "namespace": "t"}, "spec": {"node": [*others, dict(entry, name=NODE)]}}


def affinity(n: int, pod: str = "p") -> List[Dict[str, Any]]:
    return [{"podName": f"{pod}-{i}", "numaNum": 0} for i in range(n)]


def test_a_cr_within_the_bounds_gives_this_nodes_entries() -> None:
    at, why = entries_for_node(cr({"podAffinity": affinity(b.MAX_AFFINITY, "a" * 240)},
                                  {"name": "worker-2", "podAffinity": affinity(3)}), NODE)
    assert at == [1] and why == ""
    assert entries_for_node(cr({}), "worker-9") == (None, "")


@pytest.mark.parametrize("entry, found", [
    ({"podAffinity": affinity(10000)}, "podAffinity: 10000 entries for this node, more than the 256"),
    ({"podAffinity": [{"podName": "[" * 6000, "numaNum": 0}]}, "podName: 6000 characters, more than 253"),
    ({"podAffinity": [{"podName": "web-[0-9]", "numaNum": 0}]}, "podName: characters other than"),
    ({"podAffinity": [{"podName": "*a" * 9, "numaNum": 0}]}, "podName: 9 wildcards, more than 8"),
    ({"podAffinity": [{"podName": "w", "namespace": "n" * 64, "numaNum": 0}]}, "namespace: 64 characters"),
    ({"podAffinity": [{"podName": "w", "namespace": "kube.system", "numaNum": 0}]}, "namespace: characters"),
    ({"podAffinity": [{"podName": "w", "numaNum": 5000}]}, "numaNum: outside 0-1023"),
    ({"numa": [{"numaNum": i} for i in range(65)]}, "numa: 65 entries for this node, more than the 64"),
    ({"numa": [{"numaNum": 0, "cpuset": "0," * 600}]}, "cpuset: 1200 characters, more than 1024"),
    ({"numa": [{"numaNum": 0, "memset": "zero"}]}, "memset: not a list of CPU numbers"),
    # (issue 33, H1: the kernel's grouped form, whose parse cost gigabytes, is no CR's)
    ({"numa": [{"numaNum": 0, "cpuset": "0-0:2147483648/2147483648"}]}, "cpuset: not a list of CPU numbers"),
    ({"numa": [{"numaNum": 0, "cpuset": "0-0:18446744073709551616/18446744073709551616"}]},
     "cpuset: not a list of CPU numbers"),
    ({"numa": [{"numaNum": 0, "cpuset": ",".join(["0-65535:1/1"] * 85)}]}, "cpuset: not a list of CPU numbers"),
    ({"numa": [{"numaNum": 0, "memset": "65536"}]}, "memset: not a list of CPU numbers"),
])
def test_a_cr_over_a_bound_is_refused_naming_it_by_size_not_text(entry: Dict[str, Any], found: str) -> None:
    at, why = entries_for_node(cr(entry), NODE)
    assert at == [] and found in why
    assert "[[[" not in why and len(why) < 200


def test_entries_for_this_node_are_counted_together_and_the_list_of_nodes_is_bounded() -> None:
    split = cr({"podAffinity": affinity(200)}, {"name": NODE, "podAffinity": affinity(100)})
    assert "300 entries for this node" in entries_for_node(split, NODE)[1]
    many = cr({}, *({"name": NODE} for _ in range(b.MAX_SAME_NODE)))
    assert "names this node 17 times" in entries_for_node(many, NODE)[1]
    huge = cr({}, *({"name": f"n{i}"} for i in range(b.MAX_NODES)))
    assert "spec.node has 5001 entries" in entries_for_node(huge, NODE)[1]
    # another node's entries are that node's to check
    assert entries_for_node(cr({}, {"name": "worker-2", "podAffinity": affinity(10000)}), NODE)[1] == ""


def _crd_spec() -> Dict[str, Any]:
    with open(os.path.join(REPO, "deploy", "crd-oenuma.yaml")) as f:
        crd = yaml.safe_load(f)
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]


def test_the_shipped_crd_carries_the_same_bounds() -> None:
    node = _crd_spec()["node"]
    assert node["maxItems"] == b.MAX_NODES
    entry = node["items"]["properties"]
    assert entry["name"]["maxLength"] == b.MAX_NAME
    assert entry["podAffinity"]["maxItems"] == b.MAX_AFFINITY and entry["numa"]["maxItems"] == b.MAX_NUMA
    pod = entry["podAffinity"]["items"]["properties"]
    assert pod["podName"]["maxLength"] == b.MAX_NAME and pod["podName"]["pattern"] == b.POD_NAME_PATTERN
    assert pod["namespace"]["maxLength"] == b.MAX_NAMESPACE and pod["namespace"]["pattern"] == b.NAMESPACE_PATTERN
    numa = entry["numa"]["items"]["properties"]
    for key in ("cpuset", "memset"):
        assert numa[key]["maxLength"] == b.MAX_CPU_LIST and numa[key]["pattern"] == b.CPU_LIST_PATTERN
    for num in (pod["numaNum"], numa["numaNum"]):
        assert num["minimum"] == 0 and num["maximum"] == b.MAX_NUMA_NUM


@pytest.mark.parametrize("text", ["web-0", "web-*", "*-canary", "db-?", "a.b-c", "*a*b*c*d*e*f*g*h", "",
                                  "*a*b*c*d*e*f*g*h*i", "Web-0", "web-[0-9]", "web_0", "web 0", "a/b"])
def test_the_crds_pattern_and_the_daemons_check_agree(text: str) -> None:
    crd = re.fullmatch(b.POD_NAME_PATTERN.strip("^$"), text) is not None
    daemon = b._check_name(text, "podName", b.MAX_NAME, b.POD_NAME_CHARS) == ""
    assert crd == daemon, text
    crd = re.fullmatch(b.NAMESPACE_PATTERN.strip("^$"), text) is not None
    daemon = b._check_name(text, "namespace", b.MAX_NAMESPACE, b.NAMESPACE_CHARS) == ""
    assert crd == daemon, text


@pytest.mark.parametrize("text", ["0-3", " 0-3 , 8,10-11 ", "", "65535", "0-65535", "65536", "99999", "0-3:1/2",
                                  "0-3,", ",0", "0 - 3", "0-3\n", "1-2-3", "0x3", "9" * 30, "3-1"])
def test_the_crds_cpu_list_pattern_is_what_the_daemon_reads(text: str) -> None:
    """What the API server lets through for a cpuset (Go's RE2 and Python's re read the
    pattern alike), the daemon's bound takes, and CpuSet parses unless it is a reversed
    range (which the rule reader reports as malformed); what it refuses, the bound refuses."""
    crd = re.fullmatch(b.CPU_LIST_PATTERN[1:-1], text) is not None
    daemon = b._check_numa({"cpuset": text}, "numa[0]") == ""
    assert crd == daemon, text
    if crd and text != "3-1":
        CpuSet.parse(text)
