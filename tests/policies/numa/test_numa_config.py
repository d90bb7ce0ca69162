"""The [numa] configuration section."""

import pytest

from anolisnuma.configfile import ConfigError, Table
from anolisnuma.policies.numa.config import NumaConfig


def read(data):
    return NumaConfig.from_table(Table(data, "numa"))


def test_defaults_are_off_and_empty():
    cfg = read({})
    assert cfg.enabled is False and cfg.namespaces == [] and cfg.pins == ()
    assert cfg.memory_pinning == "widen" and cfg.poll_interval_seconds == 1.0 and cfg.rules_dir == ""
    assert cfg.effective_node_name()


def test_full_section():
    cfg = read({
        "enabled": True, "namespaces": ["batch"], "pod_name_patterns": ["specjbb-*", "prod/api-*"],
        "node_name": "worker-1", "rules_dir": "/etc/anolisnuma/numa.d/", "memory_pinning": "strict",
        "poll_interval_seconds": 2,
        "pin": [{"namespace": "default", "name": "web-*", "nodes": [3, 2]}, {"name": "db", "nodes": [0]}],
    })
    assert cfg.enabled and cfg.rules_dir == "/etc/anolisnuma/numa.d" and cfg.effective_node_name() == "worker-1"
    assert cfg.poll_interval_seconds == 2.0
    assert cfg.pins[0].nodes == (2, 3) and cfg.pins[0].key == "numa.pin[0]"
    assert cfg.pins[1].namespace == "*"


@pytest.mark.parametrize("data,key", [
    ({"enable": True}, "numa.enable"),
    ({"enabled": "yes"}, "numa.enabled"),
    ({"namespaces": "batch"}, "numa.namespaces"),
    ({"namespaces": [""]}, "numa.namespaces[0]"),
    ({"rules_dir": "relative/dir"}, "numa.rules_dir"),
    ({"memory_pinning": "loose"}, "numa.memory_pinning"),
    ({"poll_interval_seconds": 0}, "numa.poll_interval_seconds"),
    ({"node_name": " x"}, "numa.node_name"),
    ({"pin": {"name": "x"}}, "numa.pin"),
    ({"pin": ["x"]}, "numa.pin[0]"),
    ({"pin": [{"nodes": [0]}]}, "numa.pin[0].name"),
    ({"pin": [{"name": "x"}]}, "numa.pin[0].nodes"),
    ({"pin": [{"name": "x", "nodes": []}]}, "numa.pin[0].nodes"),
    ({"pin": [{"name": "x", "nodes": [True]}]}, "numa.pin[0].nodes"),
    ({"pin": [{"name": "x", "nodes": [-1]}]}, "numa.pin[0].nodes"),
    ({"pin": [{"name": "x", "nodes": [1, 1]}]}, "numa.pin[0].nodes"),
    ({"pin": [{"name": "x", "nodes": [1], "cpus": "0-3"}]}, "numa.pin[0].cpus"),
])
def test_bad_values_name_the_dotted_key(data, key):
    with pytest.raises(ConfigError) as err:
        read(data)
    assert err.value.key == key
