"""``[nri]``: defaults, and what root could get wrong in the file (a clear error naming the
key, nothing started)."""

from __future__ import annotations

import pytest

from anolisnuma.config import Config
from anolisnuma.configfile import ConfigError
from anolisnuma.nri.config import NriConfig


def load(nri: dict) -> Config:
    return Config.from_dict({"nri": nri})


def test_defaults_leave_nri_off_on_containerds_socket():
    cfg = load({}).nri
    assert cfg == NriConfig()
    assert (cfg.enabled, cfg.socket, cfg.plugin_name, cfg.plugin_index) == (False, "/var/run/nri/nri.sock",
                                                                           "anolisnuma", "50")


def test_unix_prefix_is_taken_and_values_kept():
    cfg = load({"enabled": True, "socket": "unix:///run/nri/other.sock", "plugin_index": "07",
                "plugin_name": "numa.qos-1", "reconnect_max_seconds": 2}).nri
    assert (cfg.enabled, cfg.socket, cfg.plugin_index, cfg.plugin_name, cfg.reconnect_max_seconds) == (
        True, "/run/nri/other.sock", "07", "numa.qos-1", 2.0)


@pytest.mark.parametrize("nri, key", [
    ({"socket": "nri.sock"}, "nri.socket"),
    ({"plugin_index": "5"}, "nri.plugin_index"),
    ({"plugin_index": "100"}, "nri.plugin_index"),
    ({"plugin_index": "a1"}, "nri.plugin_index"),
    ({"plugin_index": "\u0661\u0662"}, "nri.plugin_index"),   # Arabic-Indic digits: not [0-9]
    ({"plugin_index": 50}, "nri.plugin_index"),
    ({"plugin_name": ""}, "nri.plugin_name"),
    ({"plugin_name": "../x"}, "nri.plugin_name"),
    ({"plugin_name": "a" * 64}, "nri.plugin_name"),
    ({"plugin_name": "na\u00efve"}, "nri.plugin_name"),
    ({"enabled": "yes"}, "nri.enabled"),
    ({"reconnect_max_seconds": 0}, "nri.reconnect_max_seconds"),
    ({"reconnect_max_seconds": 1e9}, "nri.reconnect_max_seconds"),
    ({"sockets": "/x"}, "nri.sockets"),
])
def test_bad_values_name_the_key(nri, key):
    with pytest.raises(ConfigError) as e:
        load(nri)
    assert key in str(e.value)
