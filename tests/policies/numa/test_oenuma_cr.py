"""Who may move which pods: an Oenuma of a namespace the node does not trust pins only pods
of its own namespace that the node manages anyway; one of a trusted namespace may do what
a rule file may. And the rules are found at CreateContainer without a scan of them all."""

from __future__ import annotations

import time
from typing import Any, Dict, List

import pytest

from anolisnuma.policies.numa.cpuset import CpuSet
from anolisnuma.policies.numa.oenuma_cr import parse_cr
from anolisnuma.policies.numa.rules import PinRule, RuleFileError
from anolisnuma.policies.numa.selection import PodSelector
from anolisnuma.policies.numa.topology import NumaTopology

TOPO = NumaTopology.build({0: "0-3", 1: "4-7", 2: "8-11", 3: "12-15"})
NODE = "worker-1"


def cr(namespace: str, affinity: List[Dict[str, Any]], numa: Any = None) -> Dict[str, Any]:
    entry: Dict[str, Any] = {"name": NODE, "podAffinity": affinity}
    if numa is not None:
        entry["numa"] = numa
    return {"apiVersion": "resource.sop.huawei.com/v1alpha1", "kind": "Oenuma",
            "metadata": {"name": "plan", "namespace": namespace}, "spec": {"node": [entry]}}


HOSTILE = cr("tenant-a", [{"namespace": "*", "podName": "*", "numaNum": 0},
                          {"namespace": "kube-system", "podName": "coredns-1", "numaNum": 0},
                          {"podName": "mine-*", "numaNum": 1}],
             numa=[{"numaNum": 0, "cpuset": "0", "memset": "1"}])


def test_an_untrusted_cr_keeps_to_its_own_namespace_and_reports_the_rest() -> None:
    out = parse_cr(HOSTILE, "apiserver tenant-a/plan", NODE, TOPO, trusted=False)
    assert [(r.namespace, r.name, r.nodes, r.cpus, r.mems) for r in out.rules] == [
        ("tenant-a", "mine-*", (1,), None, None)]
    assert not out.rules[0].selects and out.rules[0].from_cluster
    refused = " | ".join(out.refusals)
    assert len(out.refusals) == 3 and "spec.node[0].numa: a numa[] table" in refused
    assert "the namespace pattern * is not the Oenuma's own (tenant-a)" in refused
    assert "namespace kube-system is not the Oenuma's own" in refused
    assert out.entries == 4 and out.problems == []


def test_an_untrusted_crs_pods_on_a_refused_numa_entry_are_not_pinned() -> None:
    out = parse_cr(cr("t", [{"podName": "web", "numaNum": 2}], numa=[{"numaNum": 2, "cpuset": "8"}]),
                   "apiserver t/plan", NODE, TOPO, trusted=False)
    assert out.rules == [] and any("numaNum 2 has a refused numa[] entry: pod t/web not pinned" in r
                                   for r in out.refusals)


def test_an_untrusted_crs_numa_table_is_refused_before_its_cpu_lists_are_read(monkeypatch) -> None:
    # given an untrusted CR whose numa[] lists are malformed (a reversed range) and
    # whatever else (the parse of such a list was the door of issue 33's H1)
    parsed: List[str] = []
    real = CpuSet.parse
    monkeypatch.setattr(CpuSet, "parse", classmethod(lambda cls, text: parsed.append(text) or real(text)))
    hostile = cr("t", [{"podName": "web", "numaNum": 1}],
                 numa=[{"numaNum": 0, "cpuset": "9-2", "memset": "0-0:1/18446744073709551616"}])
    # when it is parsed untrusted, then the table is refused unread and the rest applies
    out = parse_cr(hostile, "apiserver t/plan", NODE, TOPO, trusted=False)
    assert parsed == []
    assert [(r.namespace, r.name, r.nodes) for r in out.rules] == [("t", "web", (1,))]
    assert any("numa[] table" in why for why in out.refusals)
    # and trusted, the same CR is malformed, said by the parser's own error
    with pytest.raises(RuleFileError, match="reversed"):
        parse_cr(hostile, "apiserver t/plan", NODE, TOPO, trusted=True)


def test_a_trusted_cr_may_do_what_a_rule_file_may() -> None:
    out = parse_cr(HOSTILE, "apiserver tenant-a/plan", NODE, TOPO, trusted=True)
    assert out.refusals == []
    by_ns = {r.namespace: r for r in out.rules}
    assert set(by_ns) == {"*", "kube-system", "tenant-a"} and all(r.selects for r in out.rules)
    assert by_ns["*"].cpus == CpuSet([0]) and by_ns["*"].mems == CpuSet([1])


def test_a_malformed_cr_is_still_an_error() -> None:
    with pytest.raises(RuleFileError):
        parse_cr(cr("t", [{"podName": "web", "numaNum": "zero"}]), "apiserver t/plan", NODE, TOPO, trusted=False)


def test_an_untrusted_rule_pins_only_pods_the_node_manages() -> None:
    tenant = PinRule("other", "web-*", (2,), source="tenant", from_cluster=True, selects=False)
    admin = PinRule("other", "web-1", (3,), source="admin", from_cluster=True, selects=True)
    sel = PodSelector(["batch"], ["prod/api-*"], [tenant])
    assert not sel.select("other", "web-0", {}, {}).managed           # [numa] leaves it alone: so does the CR
    assert PodSelector(["other"], [], [tenant]).select("other", "web-0", {}, {}).rule is tenant
    assert PodSelector([], ["other/web-*"], [tenant]).select("other", "web-0", {}, {}).rule is tenant
    # first match wins among the rules that may apply: a later trusted rule still selects
    both = PodSelector([], [], [tenant, admin])
    assert both.select("other", "web-1", {}, {}).rule is admin and not both.select("other", "web-2", {}, {}).managed
    assert PodSelector(["other"], [], [tenant, admin]).select("other", "web-1", {}, {}).rule is tenant


def test_the_first_rule_wins_across_exact_names_patterns_and_namespace_patterns() -> None:
    rules = [PinRule("*", "db-0", (0,), source="a"), PinRule("batch", "db-*", (1,), source="b", from_cluster=True),
             PinRule("batch", "db-0", (2,), source="c", from_cluster=True), PinRule("batch", "x", (3,), source="d")]
    sel = PodSelector([], [], rules)
    assert sel.select("batch", "db-0", {}, {}).rule.source == "a"
    assert sel.select("batch", "db-1", {}, {}).rule.source == "b"
    assert sel.select("batch", "x", {}, {}).rule.source == "d"
    assert PodSelector([], [], rules[2:] + rules[:2]).select("batch", "db-0", {}, {}).rule.source == "c"


def test_a_lookup_does_not_grow_with_the_rules_at_the_nodes_caps() -> None:
    """The finding: 10,000 entries added 1.8 ms to every CreateContainer (a linear scan)."""
    def cost(n: int) -> float:
        rules = [PinRule(f"ns-{i % 8}", f"pod-{i}", (i % 4,), source="cr", from_cluster=True, selects=False)
                 for i in range(n)]
        rules += [PinRule("ns-0", f"web-{i}-*", (0,), source="cr", from_cluster=True, selects=False)
                  for i in range(min(n, 64))]
        selectors = [PodSelector(["ns-*"], [], rules) for _ in range(5)]   # (each remembers what it found)
        best = float("inf")
        for sel in selectors:
            t = time.perf_counter()
            for i in range(200):
                sel.select("ns-3", f"pod-{i * 7 % n}", {}, {})
                sel.select("ns-5", f"not-named-{i}", {}, {})
            best = min(best, time.perf_counter() - t)
        return best

    one, capped = cost(64), cost(2048)
    assert capped < 3 * one, (one, capped)
