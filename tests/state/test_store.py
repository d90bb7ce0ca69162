"""The store of pods and containers: records, persistence, corrupt files, restart."""

from __future__ import annotations

import dataclasses
import json
import os

from anolisnuma.state.records import ContainerRecord, ContainerResources, PodRecord
from anolisnuma.state.store import STORE_FILE, Store


def pod(n: int = 1) -> PodRecord:
    return PodRecord(sandbox_id=f"{n:064x}", uid=f"uid-{n}", name=f"web-{n}", namespace="prod",
                     cgroup_parent=f"/kubepods/burstable/poduid-{n}", labels={"app": "web"},
                     annotations={"anolisbox.sh/qoslevel": "LS"}, runtime_handler="runc")


def container(n: int = 1, sandbox: int = 1) -> ContainerRecord:
    return ContainerRecord(container_id=f"{n:064x}"[::-1], sandbox_id=f"{sandbox:064x}", name=f"c{n}",
                           labels={"l": "v"}, annotations={"a": "b"},
                           resources=ContainerResources(cpu_period=100000, cpu_quota=50000, cpu_shares=512,
                                                        memory_limit_in_bytes=1 << 30, cpuset_cpus="0-3",
                                                        cpuset_mems="0"))


def test_records_round_trip_every_field():
    for record in (pod(), container()):
        data = record.to_json()
        assert set(data) == {f.name for f in dataclasses.fields(record)}
        assert type(record).from_json(json.loads(json.dumps(data))) == record


def test_records_ignore_unknown_fields_from_a_newer_version():
    data = dict(container().to_json(), future=1)
    data["resources"] = dict(data["resources"], future=2)
    assert ContainerRecord.from_json(data) == container()


def test_store_survives_a_restart(tmp_path):
    s = Store(str(tmp_path))
    s.start()
    s.put_pod(pod(1))
    s.put_pod(pod(2))
    s.put_container(container(1, 1))
    s.put_container(container(2, 2))
    s.remove_pod(pod(2).sandbox_id)  # takes its container with it
    s.close()

    again = Store(str(tmp_path))
    assert again.load()
    assert again.pods() == [pod(1)]
    assert again.containers() == [container(1, 1)]
    assert again.container(container(2, 2).container_id) is None


def test_a_corrupt_state_file_is_moved_aside_and_the_store_starts_empty(tmp_path):
    path = tmp_path / STORE_FILE
    path.write_text('{"version": 1, "pods": [')
    s = Store(str(tmp_path))
    assert not s.load()
    assert s.pods() == [] and not path.exists()
    assert any(name.startswith(STORE_FILE + ".corrupt-") for name in os.listdir(tmp_path))


def test_flush_writes_everything_changed_so_far(tmp_path):
    s = Store(str(tmp_path))
    s.start()
    for n in range(50):
        s.put_pod(pod(n))
    assert s.flush()
    data = json.loads((tmp_path / STORE_FILE).read_text())
    assert len(data["pods"]) == 50 and data["version"] == 1
    s.close()


def test_a_cpuset_the_daemon_applied_is_recorded():
    from anolisnuma.state.records import ContainerRecord, ContainerResources

    store = Store()
    store.put_container(ContainerRecord("c1", "s1", "app", resources=ContainerResources(
        cpu_shares=512, cpuset_cpus="0-15", cpuset_mems="0-3")))
    store.set_cpuset("c1", "4-7", "1")
    store.set_cpuset("unknown", "0", "0")                 # nothing to record
    r = store.container("c1").resources
    assert (r.cpuset_cpus, r.cpuset_mems, r.cpu_shares) == ("4-7", "1", 512)
    store.set_cpuset("c1", "0-3", "")                      # memory not pinned: the record keeps its mems
    assert store.container("c1").resources.cpuset_mems == "1"
    assert store.container("unknown") is None
