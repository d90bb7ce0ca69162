"""State files read at start: the kubelet's cpu_manager_state (the kubelet writes it), and
the daemon's own store.json, numa.json and cluster-oenumas.json (the daemon writes them; an
older version, a torn write or a planted file may be there instead). The checkpoint is
read or a KubeletStateError; a state file is read, or moved aside (None), or left alone as
a newer version's (StateFormatTooNew); each written and read back is what was written."""

from __future__ import annotations

import glob
import json
import os
import shutil
import tempfile

import pytest
from hypothesis import given
from hypothesis import strategies as st
from oenuma_shapes import NODE, crs

from anolisnuma.cluster.oenumas import RulesFile, key_of
from anolisnuma.policies.numa.cpu_manager import CpuManagerStateError, KubeletCpuState
from anolisnuma.state.numa_state import AllocationRecord, ContainerShareRecord, NumaStateFile
from anolisnuma.state.persist import StateFormatTooNew
from anolisnuma.state.records import ContainerRecord, ContainerResources, PodRecord
from anolisnuma.state.store import Store
from anolisnuma.system.kubelet_state import KubeletStateError, parse_cpu_manager_state, read_cpu_manager_state
from anolisnuma.testing.fuzzing import assert_linear, fuzz_settings, outcome


@pytest.fixture(scope="module")
def state_dir():
    path = tempfile.mkdtemp(prefix="fuzz-state-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def write_then(path, data, load):
    """The file written, then loaded (each run of a measured call starts from the file:
    a load moves an unusable one aside)."""
    def run():
        with open(path, "wb") as f:
            f.write(data)
        return load()
    return run


def clean(directory):
    for aside in glob.glob(os.path.join(directory, "*.corrupt-*")):
        os.unlink(aside)


odd = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=8),
                st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


@st.composite
def maybe(draw, usual):
    return draw(odd) if draw(st.integers(0, 9)) == 5 else draw(usual)


texts = st.text(max_size=12)
string_maps = st.dictionaries(texts, texts, max_size=3)
cpu_lists = st.sampled_from(["", "0-3", "0-3,8", "4", "0-65536", "x", " 1 "])
versions = st.one_of(st.just(1), st.just(1), st.sampled_from([2, 0, -1, "1", True, 1.0, None]))

kubelet_states = st.fixed_dictionaries({"policyName": maybe(st.sampled_from(["static", "none"]))}, optional={
    "defaultCpuSet": maybe(cpu_lists), "checksum": odd,
    "entries": maybe(st.dictionaries(texts, maybe(st.dictionaries(texts, maybe(cpu_lists), max_size=3)), max_size=3))})
pods = st.fixed_dictionaries({"sandbox_id": maybe(texts), "uid": maybe(texts), "name": maybe(texts),
                              "namespace": maybe(texts)},
                             optional={"labels": maybe(string_maps), "annotations": maybe(string_maps), "x": odd})
containers = st.fixed_dictionaries({"container_id": maybe(texts), "sandbox_id": maybe(texts), "name": maybe(texts)},
                                   optional={"resources": maybe(st.fixed_dictionaries(
                                       {}, optional={"cpu_quota": maybe(st.integers()), "cpuset_cpus": maybe(texts)}))})
allocations = st.fixed_dictionaries({"pod_uid": maybe(texts)}, optional={
    "nodes": maybe(st.lists(maybe(st.integers(0, 3)), max_size=3)), "home": maybe(cpu_lists),
    "containers": maybe(st.dictionaries(texts, maybe(st.fixed_dictionaries({"name": maybe(texts)})), max_size=2))})
store_files = st.fixed_dictionaries({"version": versions}, optional={
    "pods": maybe(st.lists(maybe(pods), max_size=3)), "containers": maybe(st.lists(maybe(containers), max_size=3))})
numa_files = st.fixed_dictionaries({"version": versions, "allocations": maybe(st.lists(maybe(allocations), max_size=3))})
rules_files = st.fixed_dictionaries({"version": versions, "node_name": maybe(st.sampled_from([NODE, "other"])),
                                     "objects": maybe(st.lists(crs, max_size=2))})


def as_bytes(strategy):
    """The file as the daemon would write it, or cut short, or nested deep, or garbage."""
    return st.one_of(
        strategy.map(lambda d: json.dumps(d, default=repr).encode()),
        strategy.map(lambda d: json.dumps(d, default=repr).encode()),
        st.tuples(strategy, st.integers(0, 200)).map(lambda t: json.dumps(t[0], default=repr).encode()[:t[1]]),
        st.sampled_from([b"[" * 100_000, b'{"version": 1, "pods": ' + b"[" * 100_000, b"\xff\xfe", b"", b"null",
                         b'{"version": 1e999}', b'{"version": ' + b"9" * 5000 + b"}", b'{"version":1,"version":2}']),
        st.binary(max_size=100),
    )


@fuzz_settings(150)
@given(as_bytes(kubelet_states))
def test_a_cpu_manager_checkpoint_is_read_or_refused(state_dir, data):
    # given a cpu_manager_state of any content, when it is read and its CPU lists read
    path = os.path.join(state_dir, "cpu_manager_state")

    def read():
        return KubeletCpuState.from_raw(read_cpu_manager_state(path))
    state, _ = outcome("kubelet-state", write_then(path, data, read), (KubeletStateError, CpuManagerStateError),
                       size=len(data))
    # then it is a state or the module's error, and a state read is the file's
    if state is not None:
        assert state.present and state.policy == json.loads(data)["policyName"]


@fuzz_settings(60)
@given(kubelet_states.filter(lambda d: isinstance(d["policyName"], str) and d["policyName"]))
def test_a_checkpoint_written_reads_back_as_written(data):
    text = json.dumps(data)
    raw, error = outcome("kubelet-state", lambda: parse_cpu_manager_state(text), (KubeletStateError,),
                         size=len(text))
    if error is None:
        assert raw.policy_name == data["policyName"] and raw.entries == (data.get("entries") or {})


@fuzz_settings(100)
@given(st.sampled_from(["store", "numa", "rules"]), st.data())
def test_a_state_file_is_read_or_moved_aside_never_an_exception(state_dir, which, draw):
    # given a state file of any content, when the daemon loads it at start
    data = draw.draw(as_bytes({"store": store_files, "numa": numa_files, "rules": rules_files}[which]))
    load = {"store": lambda: Store(state_dir).load(), "numa": lambda: NumaStateFile(state_dir).load(),
            "rules": lambda: RulesFile(state_dir).load(NODE)}[which]
    path = {"store": "store.json", "numa": "numa.json", "rules": "cluster-oenumas.json"}[which]
    got, error = outcome("state-files", write_then(os.path.join(state_dir, path), data, load), (StateFormatTooNew,),
                         size=len(data))
    clean(state_dir)
    # then it is what the file holds, or nothing (moved aside), or a newer version's
    if which == "rules" and got is not None:
        assert all(isinstance(o, dict) and key_of(o) is not None for o in got)


records = st.tuples(
    st.lists(st.builds(PodRecord, sandbox_id=texts, uid=texts, name=texts, namespace=texts, labels=string_maps,
                       annotations=string_maps), max_size=3, unique_by=lambda p: p.sandbox_id),
    st.lists(st.builds(ContainerRecord, container_id=texts, sandbox_id=texts, name=texts, labels=string_maps,
                       resources=st.builds(ContainerResources, cpu_quota=st.integers(-2 ** 63, 2 ** 63),
                                           cpuset_cpus=texts)), max_size=3, unique_by=lambda c: c.container_id))
allocation_records = st.lists(st.builds(
    AllocationRecord, pod_uid=texts, nodes=st.lists(st.integers(0, 7), max_size=3), home=cpu_lists,
    containers=st.dictionaries(texts, st.builds(ContainerShareRecord, name=texts, millicpu=st.integers(0, 10 ** 6)),
                               max_size=2)), max_size=3, unique_by=lambda a: a.pod_uid)


@fuzz_settings(60)
@given(records, allocation_records, st.lists(crs, max_size=2))
def test_what_the_daemon_saves_it_loads_back(state_dir, pods_and_containers, allocations, objects):
    # given the store's records, the NUMA allocations and the CRs in force, saved
    pod_list, container_list = pods_and_containers
    store = Store(state_dir)
    for pod in pod_list:
        store.put_pod(pod)
    for container in container_list:
        store.put_container(container)
    store.write()
    NumaStateFile(state_dir).save(allocations)
    objects = [o for o in objects if key_of(o) is not None and _plain_json(o)]
    RulesFile(state_dir).save(NODE, objects)
    # when each is loaded, then it is what was saved
    loaded = Store(state_dir)
    assert loaded.load()
    assert sorted(loaded.pods(), key=lambda p: p.sandbox_id) == sorted(pod_list, key=lambda p: p.sandbox_id)
    assert (sorted(loaded.containers(), key=lambda c: c.container_id)
            == sorted(container_list, key=lambda c: c.container_id))
    assert NumaStateFile(state_dir).load() == sorted(allocations, key=lambda a: a.pod_uid)
    assert RulesFile(state_dir).load(NODE) == objects


def _plain_json(obj):
    """Whether ``obj`` reads back from JSON as itself (no NaN, no tuple)."""
    try:
        return json.loads(json.dumps(obj, allow_nan=False)) == obj
    except (TypeError, ValueError):
        return False


@fuzz_settings(2)
@given(st.sampled_from(["store", "kubelet"]))
def test_time_is_linear_in_the_records(state_dir, which):
    def make(n):
        if which == "kubelet":
            return json.dumps({"policyName": "static", "defaultCpuSet": "0-3",
                               "entries": {f"uid-{i}": {"c": "4-7"} for i in range(n)}}).encode()
        return json.dumps({"version": 1, "pods": [{"sandbox_id": f"s{i}", "uid": f"u{i}", "name": "p", "namespace": "n",
                                                   "labels": {"a": "b"}} for i in range(n)]}).encode()

    def run(data):
        if which == "kubelet":
            KubeletCpuState.from_raw(parse_cpu_manager_state(data))
        else:
            write_then(os.path.join(state_dir, "store.json"), data, lambda: Store(state_dir).load())()
    assert_linear("kubelet-state" if which == "kubelet" else "state-files", make, run, small=40)
