"""One CR's failure is its own (issue 33, H2, L1, L5): whatever a CR makes the parser do,
that CR is marked malformed and nothing else changes; the caps are computed from the CRs in
force, shared fairly among untrusted namespaces; trusted CRs come first whatever the
names; only what parsed is saved, and the file read back at start goes through the same
code, never taking the link down.

The rules loop is the real one with the NUMA hook's placement service on a fake sysfs
topology (test_cr_bounds.py's harness); the API server's side is test_cr_hostile_live.py."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List

import pytest

from anolisnuma.cluster import node_caps
from anolisnuma.cluster.cr_events import CrPodEvents
from anolisnuma.cluster.oenumas import CrRules, RulesFile
from anolisnuma.cluster.status import node_entry
from anolisnuma.cluster.sync import ClusterSync
from anolisnuma.policies.numa import oenuma_cr
from anolisnuma.policies.numa.cpuset import CpuSet
from anolisnuma.policies.numa.ledger import Allocation
from anolisnuma.policies.numa.rules import PinRule
from test_cr_bounds import NODE, cr, make, pods

# H2's string: before, MemoryError / OverflowError out of the parser, through the pass
HUGE_GROUP = "0-0:18446744073709551616/18446744073709551616"


def by_name(sync: ClusterSync) -> Dict[str, Any]:
    return {c.key[1]: c for c in sync.current}


def saved(tmp_path: Any) -> List[str]:
    with open(os.path.join(str(tmp_path / "state"), "cluster-oenumas.json")) as f:
        return [o["metadata"]["name"] for o in json.load(f)["objects"]]


@pytest.mark.parametrize("error", [MemoryError, OverflowError, RecursionError, KeyError, ZeroDivisionError])
def test_any_exception_in_one_crs_parse_marks_that_cr_alone(tmp_path: Any, monkeypatch: Any, error: type) -> None:
    # given three CRs, the middle one making the parser raise what is not the parser's own
    crs, sync, applies, events = make(tmp_path)
    real = oenuma_cr.parse_cr

    def parse(obj: Any, *args: Any, **kwargs: Any) -> Any:
        if obj["metadata"]["name"] == "b-poison":
            raise error("boom")
        return real(obj, *args, **kwargs)

    monkeypatch.setattr("anolisnuma.cluster.oenumas.parse_cr", parse)
    crs.replace([cr("a-good", pods(3)), cr("b-poison", pods(3)), cr("c-good", pods(2))])
    # when the rules loop passes
    sync.run_once()
    # then the poisoned one is malformed, said by its status entry and a Warning event,
    # and the others are in force and saved
    got = by_name(sync)
    assert got["b-poison"].error == f"could not be parsed ({error.__name__})"
    assert not got["a-good"].error and not got["c-good"].error
    assert len(got["a-good"].rules) == 3 and len(got["c-good"].rules) == 2
    assert applies.entries[("batch", "b-poison")]["conditions"][0]["reason"] == "Malformed"
    assert [e.reason for e in events.about("b-poison")] == ["OenumaMalformed"]
    assert saved(tmp_path) == ["a-good", "c-good"]


def test_a_trusted_cr_with_the_h2_string_is_malformed_and_the_other_changes_apply(tmp_path: Any) -> None:
    crs, sync, applies, events = make(tmp_path, trusted=("admin",))
    crs.replace([cr("keep", pods(2))])
    sync.run_once()
    # when, in one pass, a trusted CR brings H2's string and another CR changes
    crs.replace([cr("keep", pods(3), generation=2),
                 cr("poison", pods(1, "x"), namespace="admin", numa=[{"numaNum": 0, "cpuset": HUGE_GROUP}])])
    sync.run_once()
    got = by_name(sync)
    assert "refused, not parsed" in got["poison"].error and "A-B:U/G" in got["poison"].error
    assert len(got["keep"].rules) == 3
    assert saved(tmp_path) == ["keep"]


def test_caps_are_computed_from_the_crs_in_force_and_do_not_drift(tmp_path: Any, monkeypatch: Any) -> None:
    # given a namespace at its cap, whose CRs' parse fails halfway (H2: a running count
    # drifted, 1,280 rules in force in a namespace capped at 512) and then succeeds, often
    crs, sync, applies, events = make(tmp_path)
    real = oenuma_cr.parse_cr
    failing = {"on": False}

    def parse(*args: Any, **kwargs: Any) -> Any:
        if failing["on"]:
            raise MemoryError()
        return real(*args, **kwargs)

    monkeypatch.setattr("anolisnuma.cluster.oenumas.parse_cr", parse)
    for round_ in range(5):
        failing["on"] = True
        crs.replace([cr(f"c{i}", pods(256, f"c{i}"), generation=2 * round_ + 1) for i in range(3)])
        sync.run_once()
        failing["on"] = False
        crs.replace([cr(f"c{i}", pods(256, f"c{i}"), generation=2 * round_ + 2) for i in range(3)])
        sync.run_once()
    # then the namespace holds its 512 entries, and the third CR is past its cap
    got = by_name(sync)
    assert sum(len(c.rules) for c in sync.current) == node_caps.MAX_NAMESPACE_ENTRIES
    assert "past 512" in got["c2"].error


def test_trusted_crs_win_over_untrusted_ones_whatever_the_namespace_names(tmp_path: Any) -> None:
    # given a tenant namespace that sorts before the administrator's, both pinning one pod
    crs, sync, applies, events = make(tmp_path, trusted=("zz-admin",))
    crs.replace([cr("tenant", [{"podName": "web", "numaNum": 3}], namespace="batch"),
                 cr("admin", [{"podName": "web", "namespace": "batch", "numaNum": 1}], namespace="zz-admin")])
    sync.run_once()
    # then the administrator's rule comes first
    rules = sync.rules_in_order()
    assert [(r.namespace, r.name, r.nodes) for r in rules] == [("batch", "web", (1,)), ("batch", "web", (3,))]
    assert sync.placement._selector.select("batch", "web", {}, {}).rule.nodes == (1,)


def test_four_tenants_at_their_cap_leave_room_for_a_fifth(tmp_path: Any) -> None:
    # given four namespaces with two CRs of 256 entries each (their cap of 512), and a
    # fifth, later in name order, with one
    crs, sync, applies, events = make(tmp_path)
    objects = [cr(f"{ns}-{i}", pods(256, f"{ns}{i}"), namespace=ns) for ns in ("a", "b", "c", "d") for i in range(2)]
    crs.replace(objects + [cr("e-0", pods(256, "e0"), namespace="e")])
    sync.run_once()
    got = by_name(sync)
    # then the fifth gets its CR, and the node's cap holds
    assert not got["e-0"].error
    assert sum(len(c.rules) for c in sync.current) == node_caps.MAX_NODE_ENTRIES
    refused = sorted(k for k, c in got.items() if c.error)
    assert len(refused) == 1 and "the node's past 2048" in got[refused[0]].error


def test_a_saved_file_with_a_poisoned_cr_starts_the_link_with_the_good_ones(tmp_path: Any, monkeypatch: Any) -> None:
    # given a rules file an older daemon saved, with H2's CR among good ones
    state = tmp_path / "state"
    state.mkdir()
    poison = cr("poison", pods(1), namespace="admin", numa=[{"numaNum": 0, "cpuset": HUGE_GROUP}])
    (state / "cluster-oenumas.json").write_text(json.dumps(
        {"version": 1, "node_name": NODE, "saved_at": 0, "objects": [poison, cr("good", pods(2))]}))
    crs, sync, applies, events = make(tmp_path, trusted=("admin",))
    # when it is read back as the link does at start
    crs.replace(RulesFile(str(state)).load(NODE) or [])
    sync.use_rules(persist=False)
    # then the good CR's rules are in force and the poisoned one is reported, alone
    got = by_name(sync)
    assert len(got["good"].rules) == 2 and got["poison"].error


ROOTS_RULE = PinRule(namespace="batch", name="web*", nodes=(0,), source="/etc/anolisnuma/rules.d/secret-plan.yaml")


def status_of(trusted: bool, source: str, failure: str) -> Dict[str, Any]:
    mine = PinRule(namespace="batch", name="web", nodes=(3,), source="apiserver batch/plan", from_cluster=True,
                   selects=trusted)
    cr_rules = CrRules(key=("batch", "plan"), generation=1, uid="u", rules=[mine], trusted=trusted)
    pod = Allocation("uid-web", "batch", "web", "sb", (0,), CpuSet.parse("0-1"), CpuSet.parse("0"), source=source)
    winner = ROOTS_RULE if source == "rule" else mine
    return node_entry(NODE, cr_rules, [pod], CpuSet.parse("0-7"), lambda a: winner, set(), lambda uid: failure)


@pytest.mark.parametrize("source, failure", [("rule", ""), ("balance", "kube-system/secret-db 88123 B/s")])
def test_an_untrusted_crs_status_tells_nothing_of_roots_rules_or_other_pods(source: str, failure: str) -> None:
    # given a pod of an untrusted CR overridden by root's rule file, or failed for a reason
    # naming another namespace's pod
    told = json.dumps(status_of(False, source, failure))
    # then its status entry names neither; a trusted CR's tells the operator both
    assert "secret" not in told and "/etc/" not in told
    assert "secret" in json.dumps(status_of(True, source, failure))


def test_an_untrusted_crs_released_pod_is_not_told_roots_rule() -> None:
    events: List[Any] = []

    class Recorder:
        def record(self, event: Any) -> bool:
            events.append(event)
            return True

    for trusted in (False, True):
        told = CrPodEvents(Recorder(), NODE)   # type: ignore[arg-type]
        cr_rules = CrRules(key=("batch", "plan"), generation=1, uid="u", trusted=trusted)
        told.entry(cr_rules, {"pods": [{"namespace": "batch", "name": "web", "state": "Pinned", "uid": "uid-web",
                                        "numaNodes": [3], "cpuset": "6-7", "memset": "3"}]})
        told.gone(("batch", "plan"), trusted=trusted)
        pod = Allocation("uid-web", "batch", "web", "sb", (0,), CpuSet.parse("0-1"), CpuSet.parse("0"), source="rule")
        told.announce([pod], set(), CpuSet.parse("0-7"), lambda a: ROOTS_RULE, lambda uid: "")
    untrusted, trusted_ = [e.note for e in events if e.reason == "NumaReleased"]
    assert "/etc/" not in untrusted and "another rule" in untrusted
    assert "/etc/anolisnuma/rules.d/secret-plan.yaml" in trusted_


def test_a_cr_at_the_bounds_costs_what_docs_cluster_md_says() -> None:
    """docs/cluster.md, "Bounded by construction": a CR at every bound, of a trusted
    namespace, kept (trimmed) and parsed into its 256 rules costs under 200 kB (measured
    180 kB); its decoded object is held only while its watch event is taken."""
    import tracemalloc

    from anolisnuma.cluster.oenumas import RuleBook, trim
    from anolisnuma.policies.numa import oenuma_bounds as b
    from anolisnuma.policies.numa.topology import NumaTopology

    topology = NumaTopology.build({i: f"{16 * i}-{16 * i + 15}" for i in range(b.MAX_NUMA)})
    cpus = ",".join(str(c) for c in range(0, 1024, 2))[:b.MAX_CPU_LIST].rstrip(",")

    def at_the_bounds(i: int) -> Dict[str, Any]:
        entry = {"name": NODE,
                 "podAffinity": [{"namespace": "n" * (b.MAX_NAMESPACE - 5) + f"{j % 8:05d}",
                                  "podName": "p" * (b.MAX_NAME - 8) + f"{j:08d}", "numaNum": j % b.MAX_NUMA}
                                 for j in range(b.MAX_AFFINITY)],
                 "numa": [{"numaNum": j, "cpuset": cpus, "memset": f"0-{b.MAX_NUMA - 1}"} for j in range(b.MAX_NUMA)]}
        return {"apiVersion": "resource.sop.huawei.com/v1alpha1", "kind": "Oenuma",
                "metadata": {"name": f"cr-{i}" + "x" * 240, "namespace": "admin", "uid": "u" * 36, "generation": 1},
                "spec": {"node": [entry]}}

    decoded = [json.loads(json.dumps(at_the_bounds(i))) for i in range(10)]
    book = RuleBook(NODE, topology, ["admin"])
    tracemalloc.start()
    try:
        kept = []
        for obj in decoded:
            trimmed = trim(obj, NODE)
            kept.append((trimmed, book.parse(("admin", obj["metadata"]["name"]), trimmed)))
        per_cr = tracemalloc.get_traced_memory()[0] / len(decoded)
    finally:
        tracemalloc.stop()
    assert all(len(cr.rules) == b.MAX_AFFINITY and not cr.problems for _, cr in kept)
    assert per_cr < 200 * 1024, per_cr
