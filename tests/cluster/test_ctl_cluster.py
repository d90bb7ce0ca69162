"""What an operator types: ``anolisnuma-ctl kubeconfig`` from the node's ServiceAccount
token and the CA, and ``anolisnuma-ctl status`` showing the API server link."""

from __future__ import annotations

import json
import os
import stat

from cluster_helpers import Cluster, Node, ctl, oenuma

from anolisnuma.testing.waiting import wait_until


def test_ctl_kubeconfig_writes_a_working_kubeconfig(cluster: Cluster, tmp_path) -> None:
    creds = json.loads(open(cluster.node_kubeconfig("ctl-node")).read())
    token_file = creds["users"][0]["user"]["tokenFile"]
    out = str(tmp_path / "etc" / "kubeconfig")
    code, text, err = ctl("kubeconfig", "--server", cluster.cp.server, "--ca", cluster.cp.ca_file,
                          "--token-file", token_file, "--out", out, "--check")
    assert code == 0, err
    assert "check: listed Oenuma CRs" in text and stat.S_IMODE(os.stat(out).st_mode) == 0o600
    # a token the API server does not know is caught by --check
    bad = tmp_path / "bad.token"
    bad.write_text("not-a-token\n")
    code, text, err = ctl("kubeconfig", "--server", cluster.cp.server, "--ca", cluster.cp.ca_file,
                          "--token-file", str(bad), "--out", out, "--check")
    assert code == 1 and "401" in err


def test_ctl_kubeconfig_replaces_nothing_until_what_it_wrote_works(cluster: Cluster, tmp_path) -> None:
    """A token the API server refuses (with --check), a token file of two lines, a CA that
    is a FIFO: each is said, and the kubeconfig the daemon uses stays as it was."""
    token_file = json.loads(open(cluster.node_kubeconfig("ctl-node")).read())["users"][0]["user"]["tokenFile"]
    out = tmp_path / "etc" / "kubeconfig"
    args = ["kubeconfig", "--server", cluster.cp.server, "--ca", cluster.cp.ca_file, "--out", str(out)]
    code, _, err = ctl(*args, "--token-file", token_file, "--check")
    assert code == 0, err
    good = out.read_bytes()
    bad = tmp_path / "bad.token"
    bad.write_text("not-a-token\n")
    code, text, err = ctl(*args, "--token-file", str(bad), "--check")
    assert code == 1 and "401" in err and err.endswith(f"{out} left as it was\n") and "wrote" not in text
    two = tmp_path / "two.token"
    two.write_text("secret-line-one\nsecret-line-two\n")
    code, _, err = ctl(*args, "--token-file", str(two))
    assert code == 1 and f"tokenFile {two} holds 2 lines" in err and "secret-line" not in err
    fifo = tmp_path / "ca.fifo"
    os.mkfifo(fifo)
    code, _, err = ctl(*args[:4], str(fifo), *args[5:], "--token-file", token_file)
    assert code == 1 and f"{fifo} is not a regular file (a FIFO)" in err
    assert out.read_bytes() == good


def test_ctl_status_shows_the_api_server_link(cluster: Cluster, node: Node) -> None:
    cluster.apply(oenuma("status-demo", node.name, {"demo-*": 1}))
    wait_until(lambda: node.link.status()["rules"], "the CR's rules in force")
    code, text, err = ctl("--admin-socket", node.admin_socket, "status")
    assert code == 0, err
    line = next(ln for ln in text.splitlines() if ln.startswith("api server"))
    assert "synced (" + cluster.cp.server in line and "naming " + node.name in line and "from apiserver" in line
    assert "events sent" in line
    assert "batch/demo-* -> node 1" in text
    code, text, err = ctl("--admin-socket", node.admin_socket, "-o", "json", "status")
    c = json.loads(text)["cluster"]
    assert c["state"] == "synced" and c["crs_naming_node"] == 1 and c["last_sync"]
    assert {"cluster-watch", "cluster-rules"} <= set(json.loads(text)["controllers"])
    cluster.cp.kubectl("delete", "oenuma", "-n", "batch", "status-demo")


def test_a_rotated_token_file_is_picked_up_without_a_new_client(cluster: Cluster, tmp_path) -> None:
    """lightkube reads the tokenFile at the first request and again when the API server
    answers 401: a token rotated under a running daemon is used at its next request."""
    import pytest

    from anolisnuma.cluster.kube_client import ApiError, KubeClient
    from anolisnuma.cluster.kubeconfig import load_kubeconfig
    from anolisnuma.testing.kube_apiserver import kubeconfig_text

    creds = json.loads(open(cluster.node_kubeconfig("rotating-node")).read())
    good = open(creds["users"][0]["user"]["tokenFile"]).read()
    token = tmp_path / "token"
    token.write_text("expired-token\n")
    path = tmp_path / "kubeconfig"
    path.write_text(kubeconfig_text(cluster.cp.server, cluster.cp.ca_file, token_file="token"))
    client = KubeClient(load_kubeconfig(str(path)), 5.0)
    try:
        with pytest.raises(ApiError) as e:
            list(client.list_oenumas(10))
        assert e.value.status == 401
        token.write_text(good)              # rotated
        listing = client.list_oenumas(10)
        list(listing)
        assert listing.resource_version
    finally:
        client.close()
