"""Persistence of NUMA allocations."""

import json
import os

from anolisnuma.state.numa_state import AllocationRecord, ContainerShareRecord, NumaStateFile


def record(uid="u1"):
    return AllocationRecord(pod_uid=uid, namespace="ns", name="p", sandbox_id="s" * 64, nodes=[2], home="64-95",
                            mems="2", pod_millicpu=1500,
                            containers={"c" * 64: ContainerShareRecord("app", 1000, 1 << 30)},
                            pending={"side": ContainerShareRecord("side", 500)}, source="balance")


def test_round_trip(tmp_path):
    f = NumaStateFile(str(tmp_path / "state"))
    assert f.load() is None                              # nothing saved yet
    f.save([record("b"), record("a")])
    loaded = f.load()
    assert [r.pod_uid for r in loaded] == ["a", "b"]
    assert loaded[0] == record("a")
    assert [n for n in os.listdir(tmp_path / "state") if n != "numa.json"] == []   # no temp files left


def test_corrupt_file_is_moved_aside(tmp_path):
    f = NumaStateFile(str(tmp_path))
    (tmp_path / "numa.json").write_text('{"version": 1, "allocations": [')
    assert f.load() is None
    assert not (tmp_path / "numa.json").exists()
    assert any(n.startswith("numa.json.corrupt-") for n in os.listdir(tmp_path))


def test_unexpected_content_is_moved_aside(tmp_path):
    f = NumaStateFile(str(tmp_path))
    # (a newer version is refused and kept instead: tests/state/test_format_versions.py)
    for content in ({"version": 0, "allocations": []}, {"version": 1, "allocations": [{"nodes": [0]}]},
                    {"version": 1, "allocations": [{"pod_uid": "u", "nodes": ["0"]}]},
                    {"version": 1, "allocations": [{"pod_uid": "u", "containers": {"c": {"millicpu": 1}}}]}, []):
        (tmp_path / "numa.json").write_text(json.dumps(content))
        assert f.load() is None
        assert not (tmp_path / "numa.json").exists()


def test_unknown_fields_are_ignored_for_forward_compatibility(tmp_path):
    f = NumaStateFile(str(tmp_path))
    data = {"version": 1, "allocations": [dict(record().to_json(), future_field=1)]}
    (tmp_path / "numa.json").write_text(json.dumps(data))
    assert f.load() == [record()]
