"""The rules loop takes again only the CRs that changed (the watch's CPU per event does not
grow with the CRs a node has): one CR changed among many is parsed alone, its status entry
is the only one looked at, the rules go to the placement service only when some CR's rules
differ, and adds, removals and malformed CRs keep ``current`` in namespace/name order.

The placement service is the real one (the NUMA hook's, on a fake sysfs topology); the
status requests go to a recorder (the API server's side is tests/cluster's live tests)."""

from __future__ import annotations

import copy
from typing import Any, Dict, List, Optional, Tuple

from anolisnuma.cluster.oenumas import OenumaSet, RuleBook, RulesFile
from anolisnuma.cluster.report import StatusReporter
from anolisnuma.cluster.sync import ClusterSync
from anolisnuma.config import PathsConfig
from anolisnuma.hooks.numa import NumaHook
from anolisnuma.policies.numa.config import NumaConfig
from cluster_helpers import TOPOLOGY

NODE = "worker-1"


def cr(i: int, numa: Any = 0, replicas: int = 1, node: str = NODE) -> Dict[str, Any]:
    entry: Dict[str, Any] = {"name": node, "podAffinity": [{"podName": f"p-{i}", "numaNum": numa}]}
    return {"apiVersion": "resource.sop.huawei.com/v1alpha1", "kind": "Oenuma",
            "metadata": {"name": f"cr-{i:03d}", "namespace": "batch", "uid": f"u{i}", "generation": replicas,
                         "resourceVersion": str(replicas)},
            "spec": {"replicas": replicas, "node": [entry]}}


class Applies:
    """The status client: what would have been applied, by CR."""

    def __init__(self) -> None:
        self.made: List[Tuple[str, str, Optional[int]]] = []

    def apply_oenuma_status(self, namespace: str, name: str, body: Dict[str, Any], manager: str) -> None:
        nodes = body.get("status", {}).get("nodes")   # (no status: the entry taken away)
        self.made.append((namespace, name, nodes[0]["observedGeneration"] if nodes else None))


class CountingBook(RuleBook):
    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.parsed: List[str] = []

    def parse(self, key: Any, obj: Dict[str, Any]) -> Any:
        self.parsed.append(key[1])
        return super().parse(key, obj)


def make(tmp_path: Any) -> Tuple[OenumaSet, ClusterSync, CountingBook, Applies]:
    sys_root = TOPOLOGY.write(str(tmp_path / "sys"))
    paths = PathsConfig(sys_root=sys_root, state_dir=str(tmp_path / "state"),
                        kubelet_cpu_manager_state=str(tmp_path / "cpu_manager_state"))
    placement = NumaHook(NumaConfig(enabled=True, node_name=NODE), paths).placement
    crs = OenumaSet(NODE)
    book = CountingBook(NODE, placement.topology)
    applies = Applies()
    reporter = StatusReporter(applies, NODE)   # type: ignore[arg-type]
    sync = ClusterSync(placement, crs, book, RulesFile(paths.state_dir), lambda: None, reporter)
    return crs, sync, book, applies


def test_one_cr_changed_among_many_is_taken_alone(tmp_path: Any) -> None:
    crs, sync, book, applies = make(tmp_path)
    crs.replace([cr(i, i % 4) for i in range(50)])
    sync.run_once()
    assert len(book.parsed) == 50 and len(applies.made) == 50 and sync.rule_changes == 1
    first = list(sync.current)
    assert [c.key[1] for c in first] == [f"cr-{i:03d}" for i in range(50)]

    # a field the rules do not read: that CR alone parsed and reported, the rules as they were
    book.parsed.clear()
    applies.made.clear()
    for replicas in (2, 3, 4):
        crs.upsert(cr(7, 3, replicas))
        sync.run_once()
    assert book.parsed == ["cr-007"] * 3 and applies.made == [("batch", "cr-007", g) for g in (2, 3, 4)]
    assert sync.rule_changes == 1
    assert [c is f for c, f in zip(sync.current, first)].count(False) == 1 and sync.current[7].generation == 4

    # its rule changed: the placement service has it
    crs.upsert(cr(7, 1, 5))
    sync.run_once()
    assert sync.rule_changes == 2 and sync.current[7].rules[0].describe().endswith("batch/p-7 -> node 1")

    # a listing with nothing new takes nothing again
    book.parsed.clear()
    applies.made.clear()
    crs.replace([cr(i, i % 4) if i != 7 else cr(7, 1, 5) for i in range(50)])
    sync.run_once()
    assert book.parsed == [] and applies.made == []


def test_adds_removals_and_malformed_crs_keep_the_order_and_the_counts(tmp_path: Any) -> None:
    crs, sync, book, applies = make(tmp_path)
    crs.replace([cr(i) for i in (1, 3, 5)])
    sync.run_once()
    applies.made.clear()
    crs.upsert(cr(2, numa="zero"))          # malformed
    crs.upsert(cr(4))
    sync.run_once()
    assert [c.key[1] for c in sync.current] == ["cr-001", "cr-002", "cr-003", "cr-004", "cr-005"]
    assert sync.skipped_crs == 1 and sync.current[1].error
    assert sorted(n for _, n, _ in applies.made) == ["cr-002", "cr-004"]

    applies.made.clear()
    crs.delete(cr(2))
    crs.upsert(cr(3, node="worker-2"))    # no longer names this node: its entry is taken away
    sync.run_once()
    assert [c.key[1] for c in sync.current] == ["cr-001", "cr-004", "cr-005"] and sync.skipped_crs == 0
    assert sorted(applies.made) == [("batch", "cr-002", None), ("batch", "cr-003", None)]
    assert sync.rule_changes == 3


def test_an_entry_that_failed_is_written_at_the_next_pass_without_a_change(tmp_path: Any) -> None:
    from anolisnuma.cluster.kube_client import ApiError

    crs, sync, book, applies = make(tmp_path)
    crs.replace([cr(i) for i in range(3)])
    failing = {"cr-001"}
    record = applies.apply_oenuma_status

    def flaky(namespace: str, name: str, body: Dict[str, Any], manager: str) -> None:
        if name in failing:
            raise ApiError(0, "Timeout", "slow")
        record(namespace, name, body, manager)
    applies.apply_oenuma_status = flaky   # type: ignore[method-assign]
    sync.run_once()
    assert sorted(n for _, n, _ in applies.made) == ["cr-000", "cr-002"]
    failing.clear()
    applies.made.clear()
    sync.run_once()   # nothing changed on the watch
    assert applies.made == [("batch", "cr-001", 1)]
    applies.made.clear()
    sync.run_once()
    assert applies.made == [] and copy.copy(sync.reporter.counts())["status_failures"] == 1
