"""The ``[kubernetes]`` section and the node's kubeconfig (no API server needed)."""

from __future__ import annotations

import base64
import os

import pytest

from anolisnuma.cluster.config import KubernetesConfig
from anolisnuma.cluster.kubeconfig import KubeconfigError, load_kubeconfig, parse_kubeconfig, render_kubeconfig
from anolisnuma.config import Config
from anolisnuma.configfile import ConfigError, Table

CA = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def test_off_by_default_and_strict() -> None:
    cfg = Config.from_dict({})
    assert not cfg.kubernetes.enabled and cfg.kubernetes.write_status
    on = KubernetesConfig.from_table(Table({"kubeconfig": "/etc/anolisnuma/kubeconfig", "node_name": "w1"},
                                           "kubernetes"))
    assert on.enabled and on.node_name == "w1" and on.request_timeout_seconds == 10.0
    for bad, key in (({"kubeconfig": "rel/path"}, "kubernetes.kubeconfig"),
                     ({"watch_timeout_seconds": 0}, "kubernetes.watch_timeout_seconds"),
                     ({"node_name": " w1"}, "kubernetes.node_name"), ({"nope": 1}, "kubernetes.nope")):
        with pytest.raises(ConfigError) as e:
            Config.from_dict({"kubernetes": bad})
        assert e.value.key == key


def test_token_file_relative_to_the_kubeconfig_read_by_us_and_never_by_lightkube(tmp_path) -> None:
    (tmp_path / "token").write_text("one\n")
    path = tmp_path / "kubeconfig"
    path.write_text(render_kubeconfig("https://10.0.0.1:6443", CA, token_file="token"))
    kc = load_kubeconfig(str(path))
    assert kc.server == "https://10.0.0.1:6443" and kc.token_file == str(tmp_path / "token") and kc.token == "one"
    single = kc.lightkube_config()      # lightkube's own parse of what we checked
    # (lightkube would read the file with a plain open and quote it in errors: token_auth.py reads it)
    assert single.cluster.server == "https://10.0.0.1:6443" and single.user.token_file is None
    assert single.user.token is None
    assert base64.b64decode(single.cluster.certificate_auth_data).decode() == CA


def test_a_ca_that_is_no_certificate_is_refused_when_the_client_is_made(tmp_path) -> None:
    from anolisnuma.cluster.kube_client import KubeClient

    path = tmp_path / "kubeconfig"
    path.write_text(render_kubeconfig("https://10.0.0.1:6443", "not a certificate", token="t"))
    with pytest.raises(KubeconfigError) as e:
        KubeClient(load_kubeconfig(str(path)))
    assert "the CA or the client certificate cannot be used" in str(e.value) and str(path) in str(e.value)


@pytest.mark.parametrize("user, cluster, problem", [
    ({"exec": {"command": "aws"}}, {}, "user.exec is not supported"),
    ({"token": "t"}, {"insecure-skip-tls-verify": True}, "insecure-skip-tls-verify is refused"),
    ({"token": "t"}, {"server": "http://10.0.0.1"}, "must be an https:// URL"),
    ({}, {}, "no token, tokenFile or client certificate"),
    ({"client-certificate-data": base64.b64encode(b"x").decode()}, {}, "both client-certificate and client-key"),
    ({"token": "t"}, {"certificate-authority": "missing.crt"}, "certificate-authority"),
])
def test_unusable_kubeconfigs_are_refused_naming_the_key(tmp_path, user, cluster, problem) -> None:
    doc = {"current-context": "c", "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
           "clusters": [{"name": "k", "cluster": dict({"server": "https://10.0.0.1"}, **cluster)}],
           "users": [{"name": "u", "user": user}]}
    with pytest.raises(KubeconfigError) as e:
        parse_kubeconfig(doc, str(tmp_path / "kubeconfig"))
    assert problem in str(e.value)


def test_garbage_files(tmp_path) -> None:
    for text, problem in (("[", "not YAML"), ("- 1", "not a mapping"), ("{}", "no contexts"),
                          ('{"contexts": [{"name": "a", "context": {}}, {"name": "b", "context": {}}]}',
                           "several contexts and no current-context"),
                          ('{"current-context": "x", "contexts": [{"name": "a", "context": {}}]}',
                           "current-context 'x' is not among the contexts")):
        p = tmp_path / "k"
        p.write_text(text)
        with pytest.raises(KubeconfigError) as e:
            load_kubeconfig(str(p))
        assert problem in str(e.value)
    with pytest.raises(KubeconfigError) as e:
        load_kubeconfig(os.path.join(str(tmp_path), "absent"))
    assert "No such file or directory" in str(e.value)
