"""The shipped CRD's bounds on the real API server: the CRs of the findings (a 6,000-character
pattern, 10,000 entries) and others the daemon would refuse are refused at the door; every
Oenuma manifest the project shows (docs, README, the tests' operator-format example) passes.
(The daemon's own check of the same bounds: tests/policies/numa/test_oenuma_bounds.py.)"""

from __future__ import annotations

import ast
import copy
import glob
import json
import os
import re
from typing import Any, Dict, List

import pytest
import yaml
from cluster_helpers import Cluster

from anolisnuma.testing.proxy import REPO_ROOT

GOOD: Dict[str, Any] = {"apiVersion": "resource.sop.huawei.com/v1alpha1", "kind": "Oenuma",
                        "metadata": {"name": "bounded", "namespace": "batch"},
                        "spec": {"node": [{"name": "worker-1", "podAffinity": [{"podName": "web-*", "numaNum": 1}],
                                           "numa": [{"numaNum": 1, "cpuset": "2-3", "memset": "1"}]}]}}


def with_entry(**changes: Any) -> Dict[str, Any]:
    doc = copy.deepcopy(GOOD)
    doc["spec"]["node"][0].update(changes)
    return doc


def server_says(cluster: Cluster, doc: Dict[str, Any]) -> str:
    """"" when the API server takes ``doc`` (a dry run), else its refusal."""
    done = cluster.cp.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(doc), check=False)
    return "" if done.returncode == 0 else done.stderr


@pytest.mark.parametrize("doc, why", [
    (with_entry(podAffinity=[{"podName": "[" * 6000, "numaNum": 0}]), "may not be longer than 253"),
    (with_entry(podAffinity=[{"podName": f"p-{i}", "numaNum": i % 4} for i in range(10000)]),
     "must have at most 256 items"),
    (with_entry(podAffinity=[{"podName": "web-[0-9]", "numaNum": 0}]), "should match"),
    (with_entry(podAffinity=[{"podName": "*a" * 9, "numaNum": 0}]), "should match"),
    (with_entry(podAffinity=[{"podName": "w", "namespace": "kube-*", "numaNum": -1}]), "greater than or equal to 0"),
    (with_entry(numa=[{"numaNum": 0, "cpuset": "all of them"}]), "should match"),
    (with_entry(numa=[{"numaNum": 0, "cpuset": "0," * 600}]), "may not be longer than 1024"),
])
def test_the_api_server_refuses_crs_over_the_bounds(cluster: Cluster, doc: Dict[str, Any], why: str) -> None:
    assert server_says(cluster, GOOD) == ""
    said = server_says(cluster, doc)
    assert said and why in said, said[:500]


def shown_manifests() -> List[Any]:
    """Every Oenuma of the docs and README (as written, after a ``$ cat x.yaml``, or in a
    here-document), and
    the operator-format example the rule tests parse."""
    found: List[Any] = []
    pages = ["README.md"] + sorted(os.path.relpath(p, REPO_ROOT) for p in glob.glob(os.path.join(REPO_ROOT, "docs", "*.md")))
    for rel in pages:
        with open(os.path.join(REPO_ROOT, rel)) as f:
            text = f.read()
        for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
            start = block.find("apiVersion: resource.sop.huawei.com/")
            if start < 0:
                continue
            # up to the next command, or the end of a here-document (`<<'EOF'` ... `EOF`)
            body = re.split(r"^(?:\$ |EOF$)", block[start:], flags=re.M)[0]
            found.extend(d for d in yaml.safe_load_all(body) if isinstance(d, dict) and d.get("kind") == "Oenuma")
    with open(os.path.join(REPO_ROOT, "tests", "policies", "numa", "test_numa_rules.py")) as f:
        tree = ast.parse(f.read())
    example = next(n.value.value for n in tree.body if isinstance(n, ast.Assign)
                   and getattr(n.targets[0], "id", "") == "OENUMA")
    found.append(yaml.safe_load(example))
    return found


def test_every_manifest_the_project_shows_passes_the_bounds(cluster: Cluster) -> None:
    manifests = shown_manifests()
    assert len(manifests) >= 3   # docs/cluster.md's, docs/numa.md's, the rule tests' at least
    for doc in manifests:
        doc = copy.deepcopy(doc)
        doc["metadata"]["namespace"] = "batch"   # (theirs need not exist here)
        assert server_says(cluster, doc) == "", (doc["metadata"]["name"], server_says(cluster, doc)[:500])
