"""Reading and watching the kubelet's cpu_manager_state."""

import json
import os

import pytest

from anolisnuma.policies.numa.cpu_manager import CpuManagerStateError, KubeletCpuState
from anolisnuma.policies.numa.cpuset import CpuSet
from anolisnuma.system.kubelet_state import (
    ABSENT, CpuManagerStateFile, KubeletStateError, parse_cpu_manager_state, read_cpu_manager_state)
from anolisnuma.testing.fake_sysfs import write_cpu_manager_state

# The example from design.md §5 (operator-numaadj's seed).
DESIGN_EXAMPLE = ('{"policyName":"static","defaultCpuSet":"0,23-31,34-127","entries":{'
                  '"52e08695-1b3d-43c4-bc3d-8020a27a876f":{"specjbb-container2":"1-20"},'
                  '"88ee6d1e-f436-45ca-a8ae-3db9d2309358":{"specjb-container":"32-33"},'
                  '"b6d7cfab-8f71-4e52-ace3-6c62b4f3cbef":{"specjbb-container":"21-22"}},'
                  '"checksum":736622555}')


def test_design_example_exclusive_cpus_and_shared_pool():
    state = KubeletCpuState.from_raw(parse_cpu_manager_state(DESIGN_EXAMPLE))
    assert state.is_static and state.present
    assert str(state.exclusive_cpus) == "1-22,32-33"
    assert state.is_exclusive("88ee6d1e-f436-45ca-a8ae-3db9d2309358", "specjb-container")
    assert not state.is_exclusive("88ee6d1e-f436-45ca-a8ae-3db9d2309358", "sidecar")
    assert str(state.shared_pool(CpuSet.range(0, 127))) == "0,23-31,34-127"


def test_none_policy_and_missing_file_share_every_cpu(tmp_path):
    online = CpuSet.parse("0-15")
    none = KubeletCpuState.from_raw(parse_cpu_manager_state('{"policyName":"none","defaultCpuSet":"","checksum":1}'))
    assert none.shared_pool(online) == online and not none.exclusive_cpus
    missing = read_cpu_manager_state(str(tmp_path / "nope"))
    assert missing is ABSENT
    assert KubeletCpuState.from_raw(missing).shared_pool(online) == online


def test_static_with_empty_default_set_means_all_but_exclusive():
    raw = parse_cpu_manager_state('{"policyName":"static","defaultCpuSet":"","entries":{"u":{"c":"2-3"}}}')
    assert str(KubeletCpuState.from_raw(raw).shared_pool(CpuSet.parse("0-7"))) == "0-1,4-7"


@pytest.mark.parametrize("text", [
    "not json", "[]", '{"defaultCpuSet":"0-3"}', '{"policyName":"static","defaultCpuSet":5}',
    '{"policyName":"static","entries":[]}', '{"policyName":"static","entries":{"u":{"c":3}}}',
    '{"policyName":"static","entries":{"u":"c"}}',
])
def test_malformed_checkpoints_are_errors(text):
    with pytest.raises(KubeletStateError):
        parse_cpu_manager_state(text)


def test_a_checkpoint_nested_past_the_decoders_recursion_is_an_error():
    # given a file of 100,000 `[` (a RecursionError out of json.loads before)
    with pytest.raises(KubeletStateError, match="nested too deeply"):
        parse_cpu_manager_state("[" * 100_000)


def test_a_checkpoint_that_is_not_utf8_is_an_error_and_the_last_good_state_stays(tmp_path):
    # given a good checkpoint read, then one with a byte that is not UTF-8 in its place
    # (a UnicodeDecodeError out of refresh() before, which caught KubeletStateError only)
    path = str(tmp_path / "cpu_manager_state")
    write_cpu_manager_state(path, default_cpuset="0-7")
    f = CpuManagerStateFile(path)
    f.refresh()
    with open(path + ".tmp", "wb") as fh:
        fh.write(b'{"policyName": "static\xff", "defaultCpuSet": "0-3"}')
    os.replace(path + ".tmp", path)
    # when it is read, then it is an error and the last good state is kept
    with pytest.raises(KubeletStateError):
        read_cpu_manager_state(path)
    assert f.refresh() is None and f.state.default_cpuset == "0-7"


def test_reading_a_small_checkpoint_takes_little_memory(tmp_path):
    # given a checkpoint of a few dozen bytes (read into a buffer of the whole 16 MiB cap
    # before, at every change of the file)
    import tracemalloc
    path = str(tmp_path / "cpu_manager_state")
    write_cpu_manager_state(path, default_cpuset="0-7")
    # when it is read, then the read allocates at most the bounded reader's 1 MiB chunk
    tracemalloc.start()
    try:
        read_cpu_manager_state(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * 1024 * 1024


def test_garbled_cpu_list_is_an_error():
    with pytest.raises(CpuManagerStateError):
        KubeletCpuState.from_raw(parse_cpu_manager_state('{"policyName":"static","defaultCpuSet":"0-x"}'))


def test_state_file_rereads_only_on_change(tmp_path):
    path = str(tmp_path / "cpu_manager_state")
    f = CpuManagerStateFile(path)
    assert f.refresh() is None and f.state is ABSENT           # absent, same as the initial state
    write_cpu_manager_state(path, default_cpuset="0-7")
    first = f.refresh()
    assert first is not None and first.default_cpuset == "0-7"
    assert f.refresh() is None                                  # unchanged: one stat, no read
    write_cpu_manager_state(path, default_cpuset="0-3", entries={"u": {"c": "4-7"}})
    assert f.refresh().entries == {"u": {"c": "4-7"}}
    os.unlink(path)
    assert f.refresh() is ABSENT


def test_state_file_keeps_last_good_state_on_garbage(tmp_path):
    path = str(tmp_path / "cpu_manager_state")
    write_cpu_manager_state(path, default_cpuset="0-7")
    f = CpuManagerStateFile(path)
    f.refresh()
    with open(path + ".tmp", "w") as fh:
        fh.write("{torn")
    os.replace(path + ".tmp", path)
    assert f.refresh() is None
    assert f.state.default_cpuset == "0-7"


def test_checkpoint_round_trip_through_writer(tmp_path):
    path = str(tmp_path / "state")
    write_cpu_manager_state(path, policy="static", default_cpuset="0,5-7", entries={"u": {"c": "1-4"}}, checksum=7)
    with open(path) as fh:
        assert json.load(fh)["checksum"] == 7
    assert read_cpu_manager_state(path).entries == {"u": {"c": "1-4"}}
