"""CRs over the bounds, past the node's caps, or asking for more than their namespace's
trust: refused, told in the CR's status entry and by a Warning event on the CR, never
parsed further, never kept, never saved (and so never read again at start).

The rules loop is the real one with the NUMA hook's placement service on a fake sysfs
topology; the status requests and the events go to recorders (the API server's side:
test_cr_trust_live.py)."""

from __future__ import annotations

import json
import os
import time
from typing import Any, Dict, List, Optional, Tuple

from anolisnuma.cluster import node_caps
from anolisnuma.cluster.oenumas import RULES_FILE_MAX_BYTES, OenumaSet, RuleBook, RulesFile
from anolisnuma.cluster.report import StatusReporter
from anolisnuma.cluster.sync import ClusterSync
from anolisnuma.config import PathsConfig
from anolisnuma.hooks.numa import NumaHook
from anolisnuma.policies.numa.config import NumaConfig
from cluster_helpers import TOPOLOGY

NODE = "worker-1"


def cr(name: str, affinity: List[Dict[str, Any]], namespace: str = "batch", numa: Any = None,
       generation: int = 1) -> Dict[str, Any]:
    entry: Dict[str, Any] = {"name": NODE, "podAffinity": affinity}
    if numa is not None:
        entry["numa"] = numa
    return {"apiVersion": "resource.sop.huawei.com/v1alpha1", "kind": "Oenuma",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "generation": generation,
                         "resourceVersion": "1"},
            "spec": {"node": [{"name": "worker-2", "podAffinity": [{"podName": "x" * 200, "numaNum": 0}] * 50},
                              entry]}}


def pods(n: int, prefix: str = "p") -> List[Dict[str, Any]]:
    return [{"podName": f"{prefix}-{i}", "numaNum": i % 4} for i in range(n)]


HOSTILE = [cr("many", pods(10000)), cr("brackets", [{"podName": "[" * 6000, "numaNum": 0}])]


class Applies:
    def __init__(self) -> None:
        self.entries: Dict[Tuple[str, str], Optional[Dict[str, Any]]] = {}

    def apply_oenuma_status(self, namespace: str, name: str, body: Dict[str, Any], manager: str) -> None:
        nodes = (body.get("status") or {}).get("nodes")   # no status: the last entry was removed
        self.entries[(namespace, name)] = nodes[0] if nodes else None


class Events:
    def __init__(self) -> None:
        self.recorded: List[Any] = []

    def record(self, event: Any) -> bool:
        self.recorded.append(event)
        return True

    def about(self, name: str) -> List[Any]:
        return [e for e in self.recorded if e.regarding.name == name]


def make(tmp_path: Any, trusted: Tuple[str, ...] = ()) -> Tuple[OenumaSet, ClusterSync, Applies, Events]:
    sys_root = TOPOLOGY.write(str(tmp_path / "sys"))
    paths = PathsConfig(sys_root=sys_root, state_dir=str(tmp_path / "state"),
                        kubelet_cpu_manager_state=str(tmp_path / "cpu_manager_state"))
    placement = NumaHook(NumaConfig(enabled=True, node_name=NODE, namespaces=["batch"]), paths).placement
    crs = OenumaSet(NODE)
    applies, events = Applies(), Events()
    reporter = StatusReporter(applies, NODE)   # type: ignore[arg-type]
    sync = ClusterSync(placement, crs, RuleBook(NODE, placement.topology, trusted), RulesFile(paths.state_dir),
                       lambda: None, reporter, events=events)  # type: ignore[arg-type]
    return crs, sync, applies, events


def test_crs_over_the_bounds_are_refused_reported_and_cost_less_than_one_at_the_caps(tmp_path: Any) -> None:
    """The findings: 6,000 `[` cost 1.26 s of CPU in fnmatch.translate; 10,000 entries 4 s
    to parse and 9 MB. Measured against a CR at the bounds, in the same test."""
    crs, sync, applies, events = make(tmp_path)
    t = time.perf_counter()
    crs.replace([cr("at-caps", pods(256, "w" * 200))])
    sync.use_rules()   # (the pass's work; run_once spaces passes out with a sleep)
    at_caps = time.perf_counter() - t
    assert len(sync.current[0].rules) == 256

    t = time.perf_counter()
    for obj in HOSTILE:
        crs.upsert(obj)
    sync.use_rules()
    hostile = time.perf_counter() - t
    assert hostile < 2 * at_caps, (at_caps, hostile)
    sync.run_once()

    _, kept = crs.mine()
    stubs = [o for o in kept if o["metadata"]["name"] != "at-caps"]
    assert [o.get("spec") for o in stubs] == [None, None] and all(len(json.dumps(o)) < 400 for o in stubs)
    assert len(json.dumps(kept)) < 100_000   # (another node's entries are not kept either)
    by_name = {c.key[1]: c for c in sync.current}
    assert by_name["many"].refused and "10000 entries for this node, more than the 256" in by_name["many"].error
    assert "podName: 6000 characters, more than 253" in by_name["brackets"].error
    for name in ("many", "brackets"):
        entry = applies.entries[("batch", name)]
        assert entry["summary"] == "refused, skipped" and entry["pods"] == []
        assert entry["conditions"][0]["reason"] == "Refused" and "refused, not parsed" in entry["problems"][0]
        (event,) = events.about(name)
        assert event.type == "Warning" and event.reason == "OenumaRefused" and event.note.startswith(NODE)
        assert len(event.note) < 300
    saved = json.load(open(os.path.join(str(tmp_path / "state"), "cluster-oenumas.json")))
    assert [o["metadata"]["name"] for o in saved["objects"]] == ["at-caps"]


def test_parts_an_untrusted_namespace_may_not_ask_for_are_refused_and_told(tmp_path: Any) -> None:
    crs, sync, applies, events = make(tmp_path)
    crs.replace([cr("wide", [{"namespace": "kube-system", "podName": "*", "numaNum": 0},
                             {"namespace": "*", "podName": "*", "numaNum": 0}, {"podName": "web-*", "numaNum": 1}],
                    namespace="tenant-a", numa=[{"numaNum": 3, "cpuset": "7", "memset": "0"}])])
    sync.run_once()
    (mine,) = sync.current
    assert [r.describe() for r in mine.rules] == [
        "apiserver tenant-a/wide (Oenuma wide) [pods [numa] manages only]: tenant-a/web-* -> node 1"]
    entry = applies.entries[("tenant-a", "wide")]
    assert entry["conditions"][0]["status"] == "False" and entry["conditions"][0]["reason"] == "Refused"
    assert len(entry["problems"]) == 3 and all("refused" in p for p in entry["problems"])
    assert [p["namespace"] for p in entry["pods"]] == ["tenant-a"]   # no other namespace's pods listed
    assert "[numa] selection manages" in entry["pods"][0]["reason"]
    (event,) = events.about("wide")
    assert event.reason == "OenumaRefused" and "parts refused" in event.note and "kube-system" in event.note


def test_a_trusted_namespace_is_not_refused_and_comes_first_under_the_caps(tmp_path: Any) -> None:
    crs, sync, applies, events = make(tmp_path, trusted=("zz-admin",))
    tenant = [cr(f"t{i}", pods(256, f"t{i}")) for i in range(3)]
    admin = cr("all", pods(255, "a") + [{"namespace": "*", "podName": "x", "numaNum": 0}], namespace="zz-admin",
               numa=[{"numaNum": 0, "cpuset": "0"}])
    crs.replace(tenant + [admin])
    sync.run_once()
    by_name = {c.key[1]: c for c in sync.current}
    assert not by_name["all"].error and not by_name["all"].refusals and len(by_name["all"].rules) == 256
    assert not by_name["t0"].error and not by_name["t1"].error
    assert "namespace batch's past 512 (it has 512" in by_name["t2"].error
    assert applies.entries[("batch", "t2")]["conditions"][0]["reason"] == "Refused"
    assert [e.reason for e in events.about("t2")] == ["OenumaRefused"]

    crs.delete(tenant[0])   # room again: the next one in order gets in
    sync.run_once()
    by_name = {c.key[1]: c for c in sync.current}
    assert not by_name["t2"].error and len(by_name["t2"].rules) == 256
    assert applies.entries[("batch", "t2")]["conditions"][0]["reason"] != "Refused"


def test_an_untrusted_namespace_has_few_pod_name_patterns(tmp_path: Any) -> None:
    """A pattern is tried against every pod of its namespace at each lookup."""
    crs, sync, applies, events = make(tmp_path)
    crs.replace([cr("a", [{"podName": f"*a?a?a?c{i}*", "numaNum": 0} for i in range(14)]),
                 cr("b", [{"podName": f"*b{i}*", "numaNum": 0} for i in range(3)] + pods(100))])
    sync.run_once()
    assert not sync.current[0].error
    assert "its 3 pod-name patterns for this node would take namespace batch's past 16" in sync.current[1].error


def test_the_node_cap_holds_whatever_the_namespaces(tmp_path: Any) -> None:
    crs, sync, applies, events = make(tmp_path)
    crs.replace([cr(f"c{i}", pods(256), namespace=f"ns-{i}") for i in range(10)])
    sync.run_once()
    refused = [c.key[1] for c in sync.current if c.error]
    assert refused == ["c8", "c9"] and "the node's past 2048" in sync.current[8].error
    assert sum(len(c.rules) for c in sync.current) == node_caps.MAX_NODE_ENTRIES
    assert sync.skipped_crs == 2


def test_a_saved_file_from_an_older_daemon_is_bounded_again_and_a_huge_one_not_read(tmp_path: Any) -> None:
    state = tmp_path / "state"
    state.mkdir()
    path = state / "cluster-oenumas.json"
    path.write_text(json.dumps({"version": 1, "node_name": NODE, "saved_at": 0,
                                "objects": HOSTILE + [cr("good", pods(2))]}))
    crs, sync, applies, events = make(tmp_path)
    crs.replace(RulesFile(str(state)).load(NODE) or [])
    sync.use_rules(persist=False)
    assert [c.key[1] for c in sync.current if not c.error] == ["good"] and len(sync.current) == 3

    path.write_text(json.dumps({"version": 1, "node_name": NODE, "saved_at": 0,
                                "objects": [cr(f"c{i}", pods(256, "p" * 200)) for i in range(300)]}))
    assert os.path.getsize(path) > RULES_FILE_MAX_BYTES
    assert RulesFile(str(state)).load(NODE) is None and not path.exists()   # moved aside, not read


def test_a_file_at_the_node_caps_fits_what_is_read_at_start(tmp_path: Any) -> None:
    """The largest file the caps let the node write: every CR in force counts one entry at
    least, and may name the node as often as the bounds allow, with the longest names."""
    crs, sync, applies, events = make(tmp_path, trusted=("admin",))
    biggest = []
    for i in range(node_caps.MAX_NODE_ENTRIES):
        obj = cr(f"{i:04d}-" + "n" * 240, [{"podName": "p" * 253, "namespace": "x" * 63, "numaNum": 1023}],
                 namespace="admin")
        obj["metadata"]["uid"] = "u" * 36
        obj["spec"]["node"] = [{"name": NODE.upper() + " " * 200}] * 15 + [obj["spec"]["node"][1]]
        biggest.append(obj)
    crs.replace(biggest)
    sync.run_once()
    assert not any(c.error for c in sync.current)
    size = os.path.getsize(os.path.join(str(tmp_path / "state"), "cluster-oenumas.json"))
    assert size < RULES_FILE_MAX_BYTES, size
