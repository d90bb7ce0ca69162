"""A state file written by a newer anolisnuma (a downgrade, a rolled-back upgrade): the
daemon still relays (the node keeps its runtime), says which file and why, does not use
it, and leaves it byte for byte as it was: the newer version finds it again."""

from __future__ import annotations

import json
import os

import grpc

from anolisnuma.testing.daemon_probes import wait_until
from anolisnuma.testing.fake_cri import FakeCri
from anolisnuma.testing.fake_sysfs import GIB, FakeTopology
from anolisnuma.testing.proxy import SubprocessProxy, config_dict, read_log


def test_newer_state_files_are_refused_and_left_untouched(tmp_path):
    fake = FakeCri(str(tmp_path / "cri.sock")).start()
    data = config_dict(str(tmp_path), fake.socket_path, extra={
        "log": {"stderr": False},
        "numa": {"enabled": True, "namespaces": ["default"], "memory_pinning": "off"}})
    FakeTopology(name="2n", node_cpus={0: "0", 1: "1"}, distances=[[10, 20], [20, 10]],
                 memory_bytes={0: GIB, 1: GIB}).write(data["paths"]["sys_root"])
    state = data["paths"]["state_dir"]
    os.makedirs(state)
    files = {}
    for name, body in (("store.json", {"version": 7, "pods": [], "containers": [], "new_field": 1}),
                       ("numa.json", {"version": 3, "allocations": [{"pod_uid": "x", "what": "new"}]})):
        files[name] = json.dumps(body).encode()
        with open(os.path.join(state, name), "wb") as f:
            f.write(files[name])
    proxy = SubprocessProxy(data, str(tmp_path)).start()
    try:
        with grpc.insecure_channel(proxy.address) as ch:
            call = ch.unary_unary("/runtime.v1.RuntimeService/Version")
            assert call(b"", timeout=10) is not None   # the node keeps its runtime
        log_path = data["log"]["file"]
        wait_until(lambda: any(e.get("message") == "hooks ready" for e in read_log(log_path)), "hooks ready", 20)
    finally:
        assert proxy.stop() == 0
        fake.stop(0)
    log = read_log(data["log"]["file"])
    store_line = [e for e in log if e.get("message", "").startswith("state file of a newer anolisnuma")]
    assert store_line and "store.json has state format version 7, newer than the version 1" in store_line[0]["error"]
    hook_line = [e for e in log if e.get("message") == "hook cannot start; running without it"]
    assert hook_line and "numa.json has state format version 3" in hook_line[0]["error"]
    for name, body in files.items():
        with open(os.path.join(state, name), "rb") as f:
            assert f.read() == body, name
    assert sorted(os.listdir(state)) == ["numa.json", "store.json"]   # nothing moved aside or added
