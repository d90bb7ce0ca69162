"""Placement rules (config pins, Oenuma files) and pod selection."""

import pytest
import yaml

from anolisnuma.policies.numa.cpuset import CpuSet
from anolisnuma.policies.numa.rules import PinRule, PinSpec, RuleFileError, parse_oenuma_documents, resolve_pins
from anolisnuma.policies.numa.selection import SKIP_KEY, PodSelector
from anolisnuma.policies.numa.topology import NumaTopology

TOPO = NumaTopology.build({0: "0-3", 1: "4-7", 2: "8-11", 3: "12-15"})

OENUMA = """
apiVersion: resource.sop.huawei.com/v1alpha1
kind: Oenuma
metadata:
  name: numa-plan
  namespace: tests
spec:
  name: plan
  replicas: 1
  node:
  - name: worker-1
    numa:
    - numaNum: 2
      cpuset: "8-9"
      memset: "2"
    - numaNum: 3
    podAffinity:
    - namespace: default
      podName: nginx
      numaNum: 2
    - podName: wrk
      numaNum: 3
    - namespace: default
      podName: big
      numaNum: 2
    - namespace: default
      podName: big
      numaNum: 3
  - name: worker-2
    podAffinity:
    - namespace: default
      podName: elsewhere
      numaNum: 0
"""


def parse(text, node="worker-1", source="plan.yaml"):
    return parse_oenuma_documents(list(yaml.safe_load_all(text)), source, node, TOPO)


def test_oenuma_rules_for_this_node():
    rules, problems = parse(OENUMA)
    assert problems == []
    by_name = {r.name: r for r in rules}
    assert set(by_name) == {"nginx", "wrk", "big"}
    assert by_name["nginx"].nodes == (2,) and by_name["nginx"].cpus == CpuSet.parse("8-9")
    assert by_name["nginx"].mems == CpuSet([2])
    assert by_name["wrk"].namespace == "tests" and by_name["wrk"].cpus is None   # CR namespace by default
    assert by_name["big"].nodes == (2, 3) and str(by_name["big"].cpus) == "8-9,12-15"
    assert "Oenuma numa-plan" in by_name["nginx"].source


def test_node_name_matching_is_case_insensitive():
    rules, _ = parse(OENUMA, node="Worker-2")
    assert [r.name for r in rules] == ["elsewhere"]
    assert parse(OENUMA, node="worker-9")[0] == []


def test_unknown_numa_nodes_are_reported_and_the_rest_applies():
    text = OENUMA.replace("numaNum: 3\n    podAffinity", "numaNum: 7\n    podAffinity").replace(
        "podName: wrk\n      numaNum: 3", "podName: wrk\n      numaNum: 9")
    rules, problems = parse(text)
    assert {r.name for r in rules} == {"nginx", "big"}
    assert any("numaNum 7" in p for p in problems) and any("numaNum 9" in p for p in problems)


def test_cpuset_outside_the_machine_disables_that_entry():
    rules, problems = parse(OENUMA.replace('cpuset: "8-9"', 'cpuset: "8-99"'))
    assert "nginx" not in {r.name for r in rules}
    assert any("8-99" in p for p in problems)


@pytest.mark.parametrize("bad", [
    "apiVersion: resource.sop.huawei.com/v2\nkind: Oenuma\nspec: {node: []}\n",
    "apiVersion: resource.sop.huawei.com/v1alpha1\nkind: Oenuma\n",
    "apiVersion: resource.sop.huawei.com/v1alpha1\nkind: Oenuma\nspec: {node: {}}\n",
    "apiVersion: resource.sop.huawei.com/v1alpha1\nkind: Oenuma\nspec: {node: [{numa: []}]}\n",
    "apiVersion: resource.sop.huawei.com/v1alpha1\nkind: Oenuma\nspec: {node: [{name: w, podAffinity: [{podName: p, numaNum: x, namespace: d}]}]}\n",
    "apiVersion: resource.sop.huawei.com/v1alpha1\nkind: Oenuma\nspec: {node: [{name: w, numa: [{numaNum: 0, cpuset: 'zz'}]}]}\n",
    "apiVersion: resource.sop.huawei.com/v1alpha1\nkind: Oenuma\nspec: {node: [{name: w, podAffinity: [{podName: p, numaNum: 1}]}]}\n",
    "- just\n- a list\n",
])
def test_malformed_oenuma_is_a_file_error(bad):
    with pytest.raises(RuleFileError):
        parse(bad)


def test_other_kinds_and_empty_documents_are_ignored():
    text = "---\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n---\n" + OENUMA
    rules, problems = parse(text)
    assert len(rules) == 3 and problems == []


def test_memset_may_be_written_as_a_number():
    text = OENUMA.replace('memset: "2"', "memset: 2")
    rules, _ = parse(text)
    assert {r.name: r for r in rules}["nginx"].mems == CpuSet([2])


def test_config_pins_naming_missing_nodes_are_dropped():
    rules, problems = resolve_pins([PinSpec("default", "web-*", (1,), "numa.pin[0]"),
                                    PinSpec("*", "db", (5,), "numa.pin[1]")], TOPO)
    assert [r.name for r in rules] == ["web-*"]
    assert problems and "numa.pin[1]" in problems[0]


def test_selection_namespaces_patterns_rules_and_opt_out():
    rule = PinRule("default", "web-*", (1,))
    sel = PodSelector(["batch", "team-*"], ["specjbb-*", "prod/api-?"], [rule])
    assert sel.select("default", "web-1", {}, {}).rule is rule
    assert sel.select("batch", "anything", {}, {}).managed
    assert sel.select("team-a", "x", {}, {}).managed
    assert sel.select("other", "specjbb-1", {}, {}).managed
    assert sel.select("prod", "api-1", {}, {}).managed
    assert not sel.select("other", "api-1", {}, {}).managed
    assert not sel.select("default", "db", {}, {}).managed
    out = sel.select("batch", "x", {SKIP_KEY: "true"}, {})
    assert not out.managed and "opted out" in out.why
    assert not sel.select("default", "web-1", {}, {SKIP_KEY: "Yes"}).managed
    assert sel.select("batch", "x", {SKIP_KEY: "false"}, {}).managed


def test_patterns_are_case_sensitive_and_whole_name():
    sel = PodSelector([], ["web"], [])
    assert sel.select("d", "web", {}, {}).managed
    assert not sel.select("d", "web-1", {}, {}).managed
    assert not sel.select("d", "WEB", {}, {}).managed
