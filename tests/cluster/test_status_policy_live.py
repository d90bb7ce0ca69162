"""A node writes status only on the Oenumas that name it, within the CRD's bounds, on the
real API server (deploy/node-policy-v1alpha1.yaml, deploy/crd-oenuma.yaml; docs/cluster.md,
"One identity per node" and "Bounded by construction"). Each attempt is what root on node
A could send with A's credentials (raw JSON, ``force``), not only what the daemon sends;
node B, named beside it, keeps writing."""

from __future__ import annotations

import json
import urllib.request
from typing import Any, Dict, Tuple

from cluster_helpers import Cluster, oenuma
from test_node_identity import OENUMAS, entry, refused, status_apply, status_of, two_nodes
from test_status_bounds import ETCD_MAX_OBJECT, forged_entry, hostile_entry

POLICY = "anolisnuma-node-status"


def naming(cr: str, *nodes: str) -> str:
    """An Oenuma whose spec.node[] names ``nodes``, as written (spaces and case too)."""
    doc = json.loads(oenuma(cr, nodes[0], {"web-0": 2}))
    doc["spec"]["node"] = [dict(doc["spec"]["node"][0], name=n) for n in nodes]
    return json.dumps(doc)


def own(node: str) -> Dict[str, Any]:
    return {"summary": f"{node}, gen 1: 1/1 pods pinned", "nodes": [entry(node)]}


def stored_bytes(cluster: Cluster, cr: str) -> int:
    """The CR's bytes as the API server serves it (and etcd holds it), managedFields too."""
    req = urllib.request.Request(f"{cluster.cp.server}{OENUMAS}/{cr}", headers={"Accept": "application/json"})
    with urllib.request.urlopen(req, context=cluster.cp.ssl_context(), timeout=30) as reply:
        return len(reply.read())


def test_a_node_may_not_write_status_on_an_oenuma_that_does_not_name_it(cluster: Cluster) -> None:
    a, b = two_nodes(cluster)
    cr = f"st-{a}"
    cluster.apply(naming(cr, b))
    assert status_apply(cluster, b, cr, own(b), f"anolisnuma/{b}")[0] == 200
    before = status_of(cluster, cr)

    # when A writes its entry, or a summary alone, on B's CR: refused
    assert refused(status_apply(cluster, a, cr, own(a), f"anolisnuma/{a}"), POLICY)
    assert refused(status_apply(cluster, a, cr, {"nodes": [entry(a)]}, f"anolisnuma/{a}"), POLICY)
    assert refused(status_apply(cluster, a, cr, {"summary": f"{a}, gen 1: pwned"}, f"anolisnuma/{a}"), POLICY)
    assert status_of(cluster, cr) == before
    # and B goes on writing its own
    assert status_apply(cluster, b, cr, own(b) | {"summary": f"{b}, gen 1: again"}, f"anolisnuma/{b}")[0] == 200
    assert status_of(cluster, cr)["summary"] == f"{b}, gen 1: again"
    cluster.cp.kubectl("delete", "oenuma", "-n", "batch", cr)


def test_a_node_named_as_the_daemon_reads_names_may_write_and_may_leave(cluster: Cluster) -> None:
    """Given a CR naming A with spaces around and capitals (the daemon strips and
    lowercases), A writes its entry; when the CR stops naming A, A may no longer write it,
    and may take it away (what the daemon does then)."""
    a, b = two_nodes(cluster)
    cr = f"st-{a}"
    cluster.apply(naming(cr, f"  {a.upper()}\t", b))
    assert status_apply(cluster, a, cr, own(a), f"anolisnuma/{a}")[0] == 200
    assert status_apply(cluster, b, cr, own(b), f"anolisnuma/{b}")[0] == 200

    cluster.apply(naming(cr, b))
    assert refused(status_apply(cluster, a, cr, own(a) | {"summary": f"{a}, gen 2: 0/1"}, f"anolisnuma/{a}"),
                   POLICY)
    assert status_apply(cluster, a, cr, None, f"anolisnuma/{a}")[0] == 200      # taken away
    assert [e["name"] for e in status_of(cluster, cr)["nodes"]] == [b]
    cluster.cp.kubectl("delete", "oenuma", "-n", "batch", cr)


def too_long(reply: Tuple[int, str]) -> bool:
    """Refused by the CRD's schema (422, a bound named), not by the policy."""
    code, message = reply
    return code == 422 and ("Too long" in message or "Too many" in message)


def test_an_entry_past_the_schema_is_refused_and_one_at_its_bounds_leaves_room(cluster: Cluster) -> None:
    """Given a CR naming A and B: A's entry of 1.4 MB (one reason) and one of 201 pods
    are refused by the schema; A's entry forged at every bound of the schema is taken, and
    B's largest (what its daemon writes at most) still fits beside it, and B's ordinary
    writes go on."""
    a, b = two_nodes(cluster)
    cr = f"st-{a}"
    cluster.apply(naming(cr, a, b))
    huge = dict(entry(a), pods=[{"namespace": "batch", "name": "web-0", "state": "Failed", "reason": "x" * 1_400_000}])
    reply = status_apply(cluster, a, cr, {"nodes": [huge]}, f"anolisnuma/{a}")
    assert too_long(reply), reply
    many = dict(entry(a), pods=[{"namespace": "batch", "name": f"web-{i}", "state": "Absent"} for i in range(201)])
    reply = status_apply(cluster, a, cr, {"nodes": [many]}, f"anolisnuma/{a}")
    assert too_long(reply), reply
    assert not status_of(cluster, cr).get("nodes")

    empty = stored_bytes(cluster, cr)
    assert status_apply(cluster, a, cr, {"nodes": [forged_entry(a)]}, f"anolisnuma/{a}")[0] == 200
    forged = stored_bytes(cluster, cr) - empty
    summary, largest = hostile_entry(b)
    assert status_apply(cluster, b, cr, {"summary": summary, "nodes": [largest]}, f"anolisnuma/{b}")[0] == 200
    both = stored_bytes(cluster, cr)
    assert forged < ETCD_MAX_OBJECT * 0.4, forged     # (its field manager's record of it too)
    assert status_apply(cluster, b, cr, own(b), f"anolisnuma/{b}")[0] == 200
    cluster.cp.kubectl("delete", "oenuma", "-n", "batch", cr)
