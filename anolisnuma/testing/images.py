"""Container images for tests, built locally without a registry.

``build_image_archive()`` writes a docker-archive tarball (the format ``docker save``
produces and ``ctr images import`` reads) with one layer: the static busybox binary, a
symlink per applet, ``/etc/passwd`` / ``/etc/group`` and a ``/pause`` script. The same layer
is tagged twice with different image configs:

* ``registry.k8s.io/pause:3.6`` -- Entrypoint ``["/pause"]``, a shell loop that exits 0 on
  SIGTERM/SIGINT; used as containerd's ``sandbox_image`` (it is never pulled).
* ``docker.io/library/busybox:anolisnuma`` -- Cmd ``["sh"]``, for workload containers.

The archive is deterministic (fixed mtimes, owners and member order), so its name is the
hash of its inputs and a second call returns the cached file immediately.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import subprocess
import tarfile
from typing import Dict, List, Optional, Tuple

from anolisnuma.state.persist import atomic_write_bytes

PAUSE_IMAGE = "registry.k8s.io/pause:3.6"
BUSYBOX_IMAGE = "docker.io/library/busybox:anolisnuma"
IMAGES: Tuple[str, ...] = (PAUSE_IMAGE, BUSYBOX_IMAGE)

DEFAULT_BUSYBOX = "/bin/busybox"
# Bump when the archive layout changes, so stale cached tarballs are not reused.
_FORMAT_VERSION = "1"

# Exits 0 on TERM/INT. ``sleep & wait`` rather than a plain ``sleep`` so the trap runs at
# once instead of after the current sleep ends.
PAUSE_SCRIPT = b"""#!/bin/sh
trap 'exit 0' TERM INT
while :; do
  sleep 3600 &
  wait $!
done
"""
PASSWD = b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
GROUP = b"root:x:0:\nnogroup:x:65534:\n"
_PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_EPOCH = "1970-01-01T00:00:00Z"


class ImageBuildError(RuntimeError):
    """The busybox binary is missing or unusable."""


def default_cache_dir() -> str:
    """``$ANOLISNUMA_IMAGE_CACHE``, else ``$XDG_CACHE_HOME/anolisnuma/images``, else
    ``~/.cache/anolisnuma/images``."""
    env = os.environ.get("ANOLISNUMA_IMAGE_CACHE")
    if env:
        return env
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(xdg, "anolisnuma", "images")


def _go_arch() -> str:
    machine = platform.machine().lower()
    return {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64",
            "ppc64le": "ppc64le", "s390x": "s390x", "riscv64": "riscv64"}.get(machine, machine)


def busybox_applets(busybox: str = DEFAULT_BUSYBOX) -> List[str]:
    """Applet names the binary provides (``busybox --list``), sorted, without ``busybox``."""
    try:
        out = subprocess.run([busybox, "--list"], check=True, capture_output=True,
                             timeout=10).stdout.decode()
    except (OSError, subprocess.SubprocessError) as e:
        raise ImageBuildError(f"cannot list applets of {busybox}: {e}") from e
    names = {n.strip() for n in out.split() if n.strip()}
    names.discard("busybox")
    # Applet names are plain file names; refuse anything that would escape /bin.
    return sorted(n for n in names if "/" not in n and n not in (".", ".."))


def tar_add(tar: tarfile.TarFile, name: str, kind: bytes, mode: int,
             data: Optional[bytes] = None, link: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    if link:  # a symbolic or a hard link's target
        info.linkname = link
    if data is not None:
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    else:
        tar.addfile(info)


def build_layer(busybox_bytes: bytes, applets: List[str]) -> bytes:
    """The root filesystem layer as an uncompressed tar, byte-for-byte reproducible."""
    entries: List[Tuple[str, bytes, int, Optional[bytes], str]] = []
    for d, mode in (("bin", 0o755), ("dev", 0o755), ("etc", 0o755), ("proc", 0o555),
                    ("root", 0o700), ("sys", 0o555), ("tmp", 0o1777), ("var", 0o755),
                    ("var/run", 0o755)):
        entries.append((d, tarfile.DIRTYPE, mode, None, ""))
    entries.append(("bin/busybox", tarfile.REGTYPE, 0o755, busybox_bytes, ""))
    for a in applets:
        entries.append((f"bin/{a}", tarfile.SYMTYPE, 0o777, None, "busybox"))
    entries.append(("etc/group", tarfile.REGTYPE, 0o644, GROUP, ""))
    entries.append(("etc/passwd", tarfile.REGTYPE, 0o644, PASSWD, ""))
    entries.append(("pause", tarfile.REGTYPE, 0o755, PAUSE_SCRIPT, ""))
    entries.sort(key=lambda e: e[0])
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, kind, mode, data, link in entries:
            tar_add(tar, name, kind, mode, data, link)
    return buf.getvalue()


def _image_config(layer_digest: str, entrypoint: Optional[List[str]],
                  cmd: Optional[List[str]]) -> bytes:
    cfg = {
        "architecture": _go_arch(),
        "os": "linux",
        "created": _EPOCH,
        "config": {"Env": [_PATH_ENV], "Entrypoint": entrypoint, "Cmd": cmd, "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_digest}"]},
        "history": [{"created": _EPOCH, "created_by": "anolisnuma.testing.images busybox layer"}],
    }
    return json.dumps(cfg, sort_keys=True, separators=(",", ":")).encode()


def build_archive_bytes(busybox_bytes: bytes, applets: List[str]) -> bytes:
    """The whole docker-archive (manifest.json, two configs, one layer) as bytes."""
    layer = build_layer(busybox_bytes, applets)
    layer_digest = hashlib.sha256(layer).hexdigest()
    configs: Dict[str, bytes] = {
        PAUSE_IMAGE: _image_config(layer_digest, ["/pause"], None),
        BUSYBOX_IMAGE: _image_config(layer_digest, None, ["sh"]),
    }
    files: Dict[str, bytes] = {f"{layer_digest}/layer.tar": layer}
    manifest = []
    for tag in IMAGES:
        cfg_name = hashlib.sha256(configs[tag]).hexdigest() + ".json"
        files[cfg_name] = configs[tag]
        manifest.append({"Config": cfg_name, "RepoTags": [tag],
                         "Layers": [f"{layer_digest}/layer.tar"]})
    files["manifest.json"] = json.dumps(manifest, separators=(",", ":")).encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        tar_add(tar, layer_digest, tarfile.DIRTYPE, 0o755)
        for name in sorted(files):
            tar_add(tar, name, tarfile.REGTYPE, 0o644, files[name])
    return buf.getvalue()


def build_image_archive(cache_dir: Optional[str] = None,
                        busybox: str = DEFAULT_BUSYBOX) -> str:
    """Path of the docker-archive tarball with both test images, building it if needed.

    The file name is a hash of the busybox binary, its applet list and the archive format, so
    a cached file is reused only when it would be identical. Raises ``ImageBuildError`` when
    ``busybox`` is missing (install the ``busybox-static`` package).
    """
    cache_dir = cache_dir or default_cache_dir()
    try:
        with open(busybox, "rb") as f:
            bb = f.read()
    except OSError as e:
        raise ImageBuildError(f"static busybox not readable at {busybox}: {e}") from e
    applets = busybox_applets(busybox)
    key = hashlib.sha256()
    key.update(_FORMAT_VERSION.encode() + b"\0" + _go_arch().encode() + b"\0")
    key.update(hashlib.sha256(bb).digest())
    key.update("\n".join(applets).encode())
    path = os.path.join(cache_dir, f"busybox-images-{key.hexdigest()[:24]}.tar")
    if os.path.isfile(path):
        return path
    data = build_archive_bytes(bb, applets)
    atomic_write_bytes(path, data, 0o644)  # concurrent builders write identical bytes
    return path
