"""Which hooks the daemon builds, and what happens when one cannot start."""

from __future__ import annotations

import os

import pytest

from anolisnuma.config import Config, HookSettings, HooksConfig, PathsConfig
from anolisnuma.daemon import HookUnavailable, build_hooks
from anolisnuma.policies.numa.config import NumaConfig
from anolisnuma.policies.qos.config import QosConfig


def _config(tmp_path, numa_policy: str = "ignore") -> Config:
    # A sys root without any NUMA topology: the NUMA hook cannot read one.
    empty = tmp_path / "empty"
    empty.mkdir()
    paths = PathsConfig(cgroup_root=str(empty), resctrl_root=str(empty / "resctrl"), sys_root=str(empty / "nosys"),
                        proc_root=str(empty), state_dir=str(tmp_path / "state"),
                        kubelet_cpu_manager_state=str(empty / "cpu_manager_state"))
    return Config(paths=paths, qos=QosConfig(enabled=False), numa=NumaConfig(enabled=True),
                  hooks=HooksConfig(per_hook={"numa": HookSettings(failure_policy=numa_policy)}))


def test_a_hook_that_cannot_start_is_left_out_and_the_proxy_still_runs(tmp_path):
    assert not os.path.exists(tmp_path / "empty" / "nosys")
    assert build_hooks(_config(tmp_path)) == []


def test_a_fail_closed_hook_that_cannot_start_stops_the_daemon(tmp_path):
    with pytest.raises(HookUnavailable, match="numa"):
        build_hooks(_config(tmp_path, numa_policy="fail"))


def test_disabled_policies_build_no_hooks(tmp_path):
    cfg = _config(tmp_path)
    cfg.numa = NumaConfig(enabled=False)
    assert build_hooks(cfg) == []
