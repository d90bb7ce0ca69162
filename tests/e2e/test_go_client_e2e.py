"""A Go gRPC client through the proxy: containerd's own `ctr`.

The kubelet speaks grpc-go's HTTP/2 (its HPACK encoder, its flow control, its frame sizes);
`ctr` is built on the same stack. It also calls containerd's native services, which the
proxy has never heard of, with client and server streams of megabytes (content upload and
download): all of it must pass exactly as it does direct.
"""

from __future__ import annotations

import os
import subprocess
from typing import List

import pytest

IMAGE = "docker.io/library/busybox:anolisnuma"
SCRATCH_NS = "anolisnuma-go-client"


def ctr(socket: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ctr", "-a", socket, *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args", [
    ["version"],
    ["namespaces", "ls"],
    ["-n", "k8s.io", "images", "ls", "-q"],
    ["-n", "k8s.io", "content", "ls", "-q"],  # -q: ctr prints labels from a Go map, in random order
    ["-n", "k8s.io", "containers", "ls", "-q"],
    ["plugins", "ls"],
])
def test_native_containerd_services_answer_as_direct(proxy, containerd, args: List[str]):
    direct = ctr(containerd.socket, *args)
    via = ctr(proxy.socket, *args)
    assert direct.returncode == 0, direct.stderr
    assert via.returncode == 0, via.stderr
    assert sorted(via.stdout.splitlines()) == sorted(direct.stdout.splitlines())


def test_image_export_and_import_stream_megabytes_both_ways(proxy, containerd, tmp_path):
    archive = str(tmp_path / "image.tar")
    out = ctr(proxy.socket, "-n", "k8s.io", "images", "export", archive, IMAGE)
    assert out.returncode == 0, out.stderr
    assert os.path.getsize(archive) > 1 << 20  # a server stream of over a MiB came through
    try:
        imp = ctr(proxy.socket, "-n", SCRATCH_NS, "images", "import", archive)  # client streams up
        assert imp.returncode == 0, imp.stderr
        listed = ctr(containerd.socket, "-n", SCRATCH_NS, "images", "ls", "-q")
        assert listed.stdout.split() == [IMAGE]
        # what arrived is byte for byte what was exported
        again = str(tmp_path / "again.tar")
        assert ctr(containerd.socket, "-n", SCRATCH_NS, "images", "export", again, IMAGE).returncode == 0
        assert open(again, "rb").read() == open(archive, "rb").read()
    finally:
        ctr(containerd.socket, "-n", SCRATCH_NS, "images", "rm", "--sync", IMAGE)
        ctr(containerd.socket, "namespaces", "rm", SCRATCH_NS)


def test_errors_from_native_services_are_the_same(proxy, containerd):
    args = ("-n", "k8s.io", "containers", "info", "no-such-container")
    direct, via = ctr(containerd.socket, *args), ctr(proxy.socket, *args)
    assert direct.returncode != 0 and "not found" in direct.stderr
    assert via.returncode == direct.returncode and via.stderr == direct.stderr
