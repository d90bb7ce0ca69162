"""State files that parse but are not what the daemon wrote, and paths that are not files.

Each is moved aside (``<name>.corrupt-<time>``) with one error line naming the path and
what is wrong, and the store (or the NUMA state) starts empty: the start-up resync
rebuilds it from containerd. Nothing may raise, and nothing may block.
"""

from __future__ import annotations

import json
import os
import threading

import pytest
from structlog.testing import capture_logs

from anolisnuma.state.numa_state import NUMA_STATE_FILE, NumaStateFile
from anolisnuma.state.records import PodRecord
from anolisnuma.state.store import STORE_FILE, Store

POD = {"sandbox_id": "s1", "uid": "u1", "name": "web", "namespace": "prod"}
CONTAINER = {"container_id": "c1", "sandbox_id": "s1", "name": "app"}


def pod(**fields):
    return dict(POD, **fields)


def container(**fields):
    return dict(CONTAINER, **fields)


@pytest.mark.parametrize("content,problem", [
    ({"version": 1, "pods": ["x"]}, "pods[0]: must be an object, not a string"),
    ({"version": 1, "pods": {"s1": POD}}, "pods: must be a list, not an object"),
    ({"version": 1, "pods": [pod(sandbox_id=["a"])]}, "pods[0].sandbox_id: must be a string, not a list"),
    ({"version": 1, "pods": [pod(uid=None)]}, "pods[0].uid: must be a string, not null"),
    ({"version": 1, "pods": [{"uid": "u1", "name": "web", "namespace": "prod"}]}, "pods[0].sandbox_id: missing"),
    ({"version": 1, "pods": [pod(labels={"app": 1})]}, "pods[0].labels.app: must be a string, not an integer"),
    ({"version": 1, "pods": [pod(annotations=["a"])]}, "pods[0].annotations: must be an object, not a list"),
    ({"version": 1, "containers": [container(resources="big")]},
     "containers[0].resources: must be an object, not a string"),
    ({"version": 1, "containers": [container(resources={"cpu_quota": "1"})]},
     "containers[0].resources.cpu_quota: must be an integer, not a string"),
    ({"version": 1, "containers": [container(resources={"cpu_shares": True})]},
     "containers[0].resources.cpu_shares: must be an integer, not true or false"),
    ({"version": 1, "containers": [container(resources={"cpuset_cpus": 3})]},
     "containers[0].resources.cpuset_cpus: must be a string, not an integer"),
    ({"version": 1, "containers": [container(name={})]}, "containers[0].name: must be a string, not an object"),
    ({"version": 1, "containers": 5}, "containers: must be a list, not an integer"),
    ({"version": "1", "pods": []}, "not a format version 1 state file (version '1')"),
    ([{"version": 1}], "not a format version 1 state file (version None)"),
])
def test_a_store_file_of_the_wrong_shape_is_moved_aside_and_the_store_starts_empty(tmp_path, content, problem):
    (tmp_path / STORE_FILE).write_text(json.dumps(content))
    store = Store(str(tmp_path))
    with capture_logs() as logs:
        assert not store.load()
    assert store.pods() == [] and store.containers() == []
    assert_moved_aside(tmp_path, STORE_FILE, logs, problem)


def test_a_store_file_nested_beyond_any_record_is_moved_aside(tmp_path):
    (tmp_path / STORE_FILE).write_text('{"version": 1, "pods": ' + "[" * 100000 + "]" * 100000 + "}")
    with capture_logs() as logs:
        assert not Store(str(tmp_path)).load()
    assert_moved_aside(tmp_path, STORE_FILE, logs, "recursion")


def test_after_moving_a_bad_file_aside_the_store_writes_a_good_one(tmp_path):
    (tmp_path / STORE_FILE).write_text(json.dumps({"version": 1, "pods": ["x"]}))
    store = Store(str(tmp_path))
    assert not store.load()
    store.put_pod(PodRecord(**POD))
    store.write()
    again = Store(str(tmp_path))
    assert again.load() and again.pods() == [PodRecord(**POD)]


@pytest.mark.parametrize("content,problem", [
    ({"version": 1, "allocations": [{"pod_uid": "u", "pod_millicpu": True}]},
     "allocations[0].pod_millicpu: must be an integer, not true or false"),
    ({"version": 1, "allocations": [{"pod_uid": "u", "containers": {"c": {"name": "a", "millicpu": True}}}]},
     "allocations[0].containers.c.millicpu: must be an integer, not true or false"),
    ({"version": 1, "allocations": [{"pod_uid": "u", "pending": None}]},
     "allocations[0].pending: must be an object, not null"),
    ({"version": 1, "allocations": [{"pod_uid": "u", "nodes": None}]},
     "allocations[0].nodes: must be a list, not null"),
    ({"version": 1}, "allocations: must be a list, not null"),
])
def test_a_numa_state_file_of_the_wrong_shape_is_moved_aside(tmp_path, content, problem):
    (tmp_path / NUMA_STATE_FILE).write_text(json.dumps(content))
    with capture_logs() as logs:
        assert NumaStateFile(str(tmp_path)).load() is None
    assert_moved_aside(tmp_path, NUMA_STATE_FILE, logs, problem)


# ---------------------------------------------------------------- what sits at the path

def fifo(path):
    os.mkfifo(path)


def link_to_a_good_file(path):
    target = path + ".elsewhere"
    with open(target, "w") as f:
        json.dump({"version": 1, "pods": [POD]}, f)
    os.symlink(target, path)


def directory(path):
    os.mkdir(path)
    open(os.path.join(path, "x"), "w").close()


def huge(path):
    with open(path, "wb") as f:   # sparse: no disk spent
        f.truncate(256 * (1 << 20) + 1)


@pytest.mark.parametrize("make,problem", [
    (fifo, "is not a regular file (a FIFO)"),
    (link_to_a_good_file, "is not a regular file (a symbolic link)"),   # the daemon only renames its own files there
    (directory, "is not a regular file (a directory)"),
    (huge, "is larger than 256 MiB"),
])
@pytest.mark.parametrize("name", [STORE_FILE, NUMA_STATE_FILE])
def test_a_state_path_that_is_not_a_plain_file_is_refused_without_blocking(tmp_path, make, problem, name):
    path = str(tmp_path / name)
    make(path)
    load = (lambda: Store(str(tmp_path)).load()) if name == STORE_FILE else NumaStateFile(str(tmp_path)).load
    with capture_logs() as logs:
        assert not load_within(load, path)
    assert_moved_aside(tmp_path, name, logs, problem)


def load_within(load, path, seconds=10.0):
    """``load()`` on a thread; AssertionError when it is still blocked after ``seconds``
    (then a writer is opened and closed on the FIFO at ``path``, so the thread ends)."""
    result = []
    thread = threading.Thread(target=lambda: result.append(load()), daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(seconds)
        raise AssertionError(f"loading {path} blocked")
    assert result, "load raised"
    return result[0]


def assert_moved_aside(directory, name, logs, problem):
    assert not os.path.lexists(directory / name)
    aside = [n for n in os.listdir(directory) if n.startswith(name + ".corrupt-")]
    assert len(aside) == 1
    errors = [e for e in logs if e["log_level"] == "error"]
    assert len(errors) == 1
    assert errors[0]["event"] == "state file is corrupt; moved aside, rebuilding from containerd"
    assert errors[0]["path"] == str(directory / name)
    assert errors[0]["moved_to"] == str(directory / aside[0])
    assert problem in errors[0]["error"]
