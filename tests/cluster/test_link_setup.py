"""A link to the API server that cannot be set up leaves the node running without it."""

from __future__ import annotations

from structlog.testing import capture_logs

from anolisnuma.cluster import link as link_mod
from anolisnuma.cluster.config import KubernetesConfig
from anolisnuma.state.persist import StateFormatTooNew


def test_a_rules_file_of_a_newer_anolisnuma_leaves_the_node_running_without_the_link(tmp_path, monkeypatch):
    path = str(tmp_path / "cluster-oenumas.json")

    def newer(*args, **kwargs):
        raise StateFormatTooNew(path, 9, 1)

    monkeypatch.setattr(link_mod, "ClusterLink", newer)
    with capture_logs() as logs:
        got = link_mod.cluster_link(KubernetesConfig(kubeconfig=str(tmp_path / "kubeconfig")), None,
                                    str(tmp_path), "node-a")
    assert got is None
    (line,) = [e for e in logs if e["log_level"] == "error"]
    assert "runs without it" in line["event"] and "state format version 9" in line["error"]
    assert line["error_type"] == "StateFormatTooNew"
