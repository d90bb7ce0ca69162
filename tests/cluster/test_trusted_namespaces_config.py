"""``[kubernetes] trusted_namespaces``: empty by default (no CR may reach past its own
namespace), exact namespace names only (no pattern trusts a namespace made later)."""

from __future__ import annotations

import pytest

from anolisnuma.config import Config
from anolisnuma.configfile import ConfigError


def test_no_namespace_is_trusted_by_default() -> None:
    assert Config.from_dict({"kubernetes": {"kubeconfig": "/etc/anolisnuma/kubeconfig"}}).kubernetes \
        .trusted_namespaces == []


def test_namespaces_are_names() -> None:
    cfg = Config.from_dict({"kubernetes": {"trusted_namespaces": ["numa-admin", "anolisnuma-system", "numa-admin"]}})
    assert cfg.kubernetes.trusted_namespaces == ["anolisnuma-system", "numa-admin"]
    for bad in (["kube-*"], ["*"], [""], ["Admin"], ["a" * 64], "numa-admin", [1]):
        with pytest.raises(ConfigError) as e:
            Config.from_dict({"kubernetes": {"trusted_namespaces": bad}})
        assert e.value.key == "kubernetes.trusted_namespaces"
