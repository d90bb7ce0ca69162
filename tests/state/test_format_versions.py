"""Format versions of the state files: a newer one is refused and left as it is; an older
or unknown one is moved aside as before (the start-up resync rebuilds it)."""

from __future__ import annotations

import json
import os

import pytest

from anolisnuma.state.numa_state import NumaStateFile
from anolisnuma.state.persist import StateFormatTooNew, load_json_state
from anolisnuma.state.store import Store


def write(path, body) -> bytes:
    raw = json.dumps(body).encode()
    with open(path, "wb") as f:
        f.write(raw)
    return raw


def test_a_newer_version_raises_and_touches_nothing(tmp_path):
    path = str(tmp_path / "x.json")
    raw = write(path, {"version": 2, "records": []})
    with pytest.raises(StateFormatTooNew) as e:
        load_json_state(path, 1, lambda d: d)
    assert "x.json has state format version 2, newer than the version 1" in str(e.value)
    assert "left untouched" in str(e.value)
    assert os.listdir(tmp_path) == ["x.json"] and open(path, "rb").read() == raw


@pytest.mark.parametrize("version", [0, "2", True, None, 1.5])
def test_an_older_or_odd_version_is_moved_aside(tmp_path, version):
    path = str(tmp_path / "x.json")
    write(path, {"version": version})
    assert load_json_state(path, 1, lambda d: d) is None
    assert not os.path.exists(path)
    assert [n for n in os.listdir(tmp_path) if n.startswith("x.json.corrupt-")]


def test_the_numa_ledger_refuses_a_newer_file(tmp_path):
    raw = write(str(tmp_path / "numa.json"), {"version": 9, "allocations": []})
    with pytest.raises(StateFormatTooNew):
        NumaStateFile(str(tmp_path)).load()
    assert open(tmp_path / "numa.json", "rb").read() == raw


def test_the_store_keeps_a_newer_file_and_runs_in_memory(tmp_path):
    raw = write(str(tmp_path / "store.json"), {"version": 5, "pods": [], "containers": []})
    store = Store(str(tmp_path))
    assert store.load() is False
    store.start()
    store.write()
    store.close()
    assert open(tmp_path / "store.json", "rb").read() == raw
    assert os.listdir(tmp_path) == ["store.json"]
