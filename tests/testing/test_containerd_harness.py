"""The private-containerd harness pieces that need neither root nor a running containerd."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile

import pytest

from anolisnuma.testing import containerd as harness
from anolisnuma.testing import containerd_builds, images
from anolisnuma.testing.containerd_builds import ContainerdBuild

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

needs_busybox = pytest.mark.skipif(not os.path.exists(images.DEFAULT_BUSYBOX),
                                   reason="static busybox (busybox-static) not installed")


def _members(data: bytes) -> dict:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: (m, tar.extractfile(m).read() if m.isfile() else None)
                for m in tar.getmembers()}


def test_layer_has_busybox_applet_links_and_a_pause_script():
    # given a fake busybox binary and two applets
    layer = images.build_layer(b"\x7fELF fake", ["sh", "sleep"])
    # then the layer holds them with fixed owners and times
    m = _members(layer)
    assert m["bin/busybox"][1] == b"\x7fELF fake"
    assert m["bin/sh"][0].issym() and m["bin/sh"][0].linkname == "busybox"
    pause, body = m["pause"]
    assert pause.mode == 0o755 and b"trap 'exit 0' TERM INT" in body
    assert m["tmp"][0].mode == 0o1777
    assert all(i.uid == 0 and i.gid == 0 and i.mtime == 0 for i, _ in m.values())


def test_archive_is_deterministic_and_tags_both_images():
    a = images.build_archive_bytes(b"bb", ["sh"])
    assert a == images.build_archive_bytes(b"bb", ["sh"])
    m = _members(a)
    manifest = json.loads(m["manifest.json"][1])
    assert [e["RepoTags"] for e in manifest] == [[images.PAUSE_IMAGE], [images.BUSYBOX_IMAGE]]
    pause_cfg = json.loads(m[manifest[0]["Config"]][1])
    busybox_cfg = json.loads(m[manifest[1]["Config"]][1])
    assert pause_cfg["config"]["Entrypoint"] == ["/pause"]
    assert busybox_cfg["config"]["Cmd"] == ["sh"]
    layer_name = manifest[0]["Layers"][0]
    assert layer_name == manifest[1]["Layers"][0]
    import hashlib
    assert pause_cfg["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(m[layer_name][1]).hexdigest()]


@needs_busybox
def test_archive_file_is_cached_by_content(tmp_path):
    first = images.build_image_archive(str(tmp_path))
    mtime = os.stat(first).st_mtime_ns
    assert images.build_image_archive(str(tmp_path)) == first
    assert os.stat(first).st_mtime_ns == mtime
    assert "sh" in images.busybox_applets()


def test_config_has_private_paths_and_the_settings_this_vm_needs(tmp_path):
    pc = harness.PrivateContainerd(str(tmp_path / "base"), str(tmp_path / "run"), cni=True)
    with open(pc.write_config(), "rb") as f:
        cfg = tomllib.load(f)
    assert cfg["root"] == str(tmp_path / "base" / "root")
    assert cfg["state"] == str(tmp_path / "run" / "state")
    assert cfg["grpc"]["address"] == pc.socket
    cri = cfg["plugins"]["io.containerd.grpc.v1.cri"]
    for key in ("disable_apparmor", "disable_hugetlb_controller", "tolerate_missing_hugetlb_controller",
                "netns_mounts_under_state_dir"):
        assert cri[key] is True, key
    # (these VMs lack CAP_SYS_RESOURCE: true here; false where lowering oom_score_adj works)
    assert cri["restrict_oom_score_adj"] is harness.oom_score_adj_restricted()
    assert cri["systemd_cgroup"] is False
    assert cri["sandbox_image"] == images.PAUSE_IMAGE
    assert (cri["stream_server_address"], cri["stream_server_port"]) == ("127.0.0.1", "0")
    runc = cri["containerd"]["runtimes"]["runc"]["options"]
    assert runc["SystemdCgroup"] is False and runc["Root"] == pc.runc_root
    assert cri["cni"]["conf_dir"] == pc.cni_conf_dir
    # and the CNI network stays on a private bridge
    with open(os.path.join(pc.cni_conf_dir, "10-anolisnuma.conflist")) as f:
        bridge = json.load(f)["plugins"][0]
    assert bridge["bridge"] == pc.bridge and pc.bridge.startswith("anbr")
    assert bridge["isGateway"] is False and bridge["ipMasq"] is False
    assert bridge["ipam"]["dataDir"].startswith(str(tmp_path / "base"))
    assert pc.subnet.startswith("10.254.") and pc.subnet.endswith(".0/24")


def test_state_survives_a_new_process_view(tmp_path):
    # given an instance that chose its bridge
    pc = harness.PrivateContainerd(str(tmp_path / "b"), str(tmp_path / "r"), cni=True)
    pc.write_config()
    # then another object for the same dirs (e.g. `private-containerd stop`) sees it
    again = harness.PrivateContainerd(str(tmp_path / "b"), str(tmp_path / "r"))
    assert (again.bridge, again.subnet) == (pc.bridge, pc.subnet)
    assert again.pid is None and not again.is_running()


@pytest.mark.parametrize("bad", ["kubepods/x", "/kubepods/../etc", "/a//b", "/a b", "/", ""])
def test_pod_cgroup_paths_must_be_plain_absolute(bad):
    with pytest.raises(ValueError):
        harness.make_pod_cgroup(bad)


def test_cleanup_of_a_never_started_instance_only_removes_its_dirs(tmp_path):
    base, run = tmp_path / "base", tmp_path / "run"
    base.mkdir()
    run.mkdir()
    (base / "containerd.pid").write_text("1\n")  # stale pidfile pointing at an unrelated pid
    pc = harness.PrivateContainerd(str(base), str(run))
    assert pc.pid is None
    assert pc.cleanup() == []
    assert not base.exists() and not run.exists()
    assert pc.cleanup() == []  # idempotent


def test_a_2x_instance_serves_nri_on_a_socket_of_its_own_and_runs_its_own_shim(tmp_path):
    build = ContainerdBuild("2.2", str(tmp_path / "bin"))
    pc = harness.PrivateContainerd(str(tmp_path / "base"), str(tmp_path / "run"), build=build)
    with open(pc.write_config(), "rb") as f:
        cfg = tomllib.load(f)
    nri = cfg["plugins"]["io.containerd.nri.v1.nri"]
    assert nri["socket_path"] == pc.nri_socket and pc.nri_socket.startswith(str(tmp_path / "run"))
    assert pc.containerd_bin == str(tmp_path / "bin" / "containerd")
    assert build.path_env("/usr/bin").split(":")[0] == str(tmp_path / "bin")   # its shim first
    assert nri["disable"] is False and pc.nri
    # Debian's 1.6 has no NRI: its configuration says nothing of it, and asking for it is refused
    old = harness.PrivateContainerd(str(tmp_path / "b16"), str(tmp_path / "r16"))
    with open(old.write_config(), "rb") as f:
        assert "io.containerd.nri.v1.nri" not in tomllib.load(f)["plugins"]
    assert not old.nri
    with pytest.raises(ValueError, match="containerd 1.6 has no NRI"):
        harness.PrivateContainerd(str(tmp_path / "b16"), str(tmp_path / "r16"), nri=True)


def _nri_section(pc):
    with open(pc.write_config(), "rb") as f:
        return tomllib.load(f)["plugins"]["io.containerd.nri.v1.nri"]


def test_a_17_instance_keeps_nri_off_as_17_ships_it_unless_asked_and_then_on_a_socket_of_its_own(tmp_path):
    """containerd 1.7 ships NRI disabled; asked for, it is on, on the instance's own socket
    (never /var/run/nri/nri.sock, which the node's containerd may hold)."""
    build = ContainerdBuild("1.7", str(tmp_path / "bin"))
    assert build.has_nri and not build.nri_by_default and build.release == (1, 7)
    default = harness.PrivateContainerd(str(tmp_path / "b"), str(tmp_path / "r"), build=build)
    section = _nri_section(default)
    assert section["disable"] is True and not default.nri
    asked = harness.PrivateContainerd(str(tmp_path / "b2"), str(tmp_path / "r2"), build=build, nri=True)
    section = _nri_section(asked)
    assert section["disable"] is False and asked.nri
    assert section["socket_path"] == asked.nri_socket and asked.nri_socket.startswith(str(tmp_path / "r2"))
    for key in ("plugin_path", "plugin_config_path"):
        assert section[key].startswith(str(tmp_path / "b2"))
    # go-toml v1.9.5 (1.7's) reads durations as strings
    assert section["plugin_registration_timeout"] == "5s"
    # and 2.2 turned off when told so
    off = harness.PrivateContainerd(str(tmp_path / "b3"), str(tmp_path / "r3"),
                                    build=ContainerdBuild("2.2", str(tmp_path / "bin")), nri=False)
    assert _nri_section(off)["disable"] is True and not off.nri


def test_the_builds_the_tests_run_are_the_ones_asked_for(monkeypatch, tmp_path):
    monkeypatch.setenv(containerd_builds.ENV_22_DIR, str(tmp_path))
    monkeypatch.setenv(containerd_builds.ENV_BUILDS, "2.2")
    with pytest.raises(RuntimeError, match="containerd 2.2: containerd not found in " + str(tmp_path)):
        containerd_builds.builds_for_tests()   # asked for and absent: a failure, not a skip
    for name in containerd_builds.BINARIES:
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(0o755)
    (build,) = containerd_builds.builds_for_tests()
    assert build.bin_dir == str(tmp_path) and build.missing() is None
    monkeypatch.setenv(containerd_builds.ENV_17_DIR, str(tmp_path))
    monkeypatch.setenv(containerd_builds.ENV_BUILDS, "1.7, 2.2")
    assert [b.name for b in containerd_builds.builds_for_tests()] == ["1.7", "2.2"]
    assert containerd_builds.build_named("1.7").bin_dir == str(tmp_path)
    monkeypatch.setenv(containerd_builds.ENV_BUILDS, "1.8")
    with pytest.raises(ValueError, match="known: 1.6, 1.7, 2.2"):
        containerd_builds.builds_for_tests()


def test_instances_of_dead_runs_are_found_by_pid_with_or_without_a_build_suffix(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    for name in (f"e2e-{dead.pid}", f"e2e-{dead.pid}-22", f"e2e-{os.getpid()}-16", "e2e-x1", f"e2e-{dead.pid}-a.b"):
        (tmp_path / name).mkdir(exist_ok=True)
    cleaned = harness.cleanup_dead_instances(str(tmp_path / "e2e-"), str(tmp_path / "run-e2e-"))
    assert sorted(cleaned) == [str(tmp_path / f"e2e-{dead.pid}"), str(tmp_path / f"e2e-{dead.pid}-22")]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["e2e-x1", f"e2e-{os.getpid()}-16",
                                                                 f"e2e-{dead.pid}-a.b"])


def test_a_module_runs_on_1_7_only_when_it_names_it():
    """1.6 and 2.2 run every containerd test; 1.7 the modules whose CONTAINERD_BUILDS name it
    (CI's time budget: containerd_builds.py)."""
    assert [b for b in ("1.6", "1.7", "2.2") if containerd_builds.runs_on(b, None)] == ["1.6", "2.2"]
    assert [b for b in ("1.6", "1.7", "2.2") if containerd_builds.runs_on(b, ("1.7", "2.2"))] == ["1.7", "2.2"]
    assert not containerd_builds.runs_on("2.2", ("1.6",))


def test_cleanup_leaves_new_cgroups_alone_while_another_instance_runs(tmp_path, monkeypatch):
    """An empty cgroup under /kubepods* that is new since an instance started may be another
    instance's, one its runc has just made and not yet put a process in: cleanup sweeps such
    dirs only when no other instance holds HOST_LOCK (a sweep had failed another run's
    StartContainer with "openat2 .../cgroup.procs: no such file or directory"). (Only the
    refusal is tried here: a sweep of the real tree from a test could take a concurrent
    run's cgroups, the very bug; every instance's cleanup makes one when alone.)"""
    import fcntl
    import uuid

    monkeypatch.setattr(harness, "HOST_LOCK", str(tmp_path / "host.lock"))   # a lock world of our own
    hierarchies = [m for m, ctrls in harness.cgroup_hierarchies() if "cpu" in ctrls]
    if not hierarchies:
        pytest.skip("no cgroup v1 cpu hierarchy here")
    pc = harness.PrivateContainerd(str(tmp_path / "base"), str(tmp_path / "run"))
    pc.write_config()   # records what exists now under /kubepods*
    fresh = os.path.join(hierarchies[0], "kubepods", f"anolisnuma-sweep-test-{uuid.uuid4().hex[:8]}", "ctr")
    other = harness._host_lock(fcntl.LOCK_SH)   # another instance, running
    try:
        assert other is not None
        os.makedirs(fresh)
        assert pc.cleanup() == []
        assert os.path.isdir(fresh), "swept another instance's new cgroup"
        assert harness._host_lock(fcntl.LOCK_EX) is None   # (the lock is what held it back)
    finally:
        if other is not None:
            os.close(other)
        for d in (fresh, os.path.dirname(fresh)):
            try:
                os.rmdir(d)
            except OSError:
                pass
