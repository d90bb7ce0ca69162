"""With ``[kubernetes]`` off (the default) the metrics endpoint has no ``anolisnuma_cluster_``
family at all: no zero-filled series for a link that does not exist (the families with
the link on are checked against a real API server in
tests/cluster/test_decision_events_live.py)."""

from __future__ import annotations

from test_metrics import scrape


def test_no_cluster_family_without_an_api_server(node):
    node.kubelet.run_started("web-0")
    samples = scrape(node)
    assert any(name.startswith("anolisnuma_numa_") for name, _ in samples)   # (the scrape has the rest)
    assert not [name for name, _ in samples if name.startswith("anolisnuma_cluster_")]
