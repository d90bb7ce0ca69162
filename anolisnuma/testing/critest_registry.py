"""The images critest pulls, built locally, and a loopback OCI registry that serves them.

critest (sigs.k8s.io/cri-tools, ``pkg/validate`` and ``pkg/framework``) pulls its images from
``registry.k8s.io/e2e-test-images/...`` and ``gcr.io/k8s-staging-cri-tools/...`` (and, from
1.36 on, ``registry.k8s.io/pause:3.9`` and ``k8s.gcr.io/pause:3.9``). Neither is
reachable here, so :func:`critest_images` builds stand-ins from this machine's static busybox
(a base layer laid out like busybox's own image) plus one small layer per image:

==================================================  ==========================================
name                                                stand-in
==================================================  ==========================================
e2e-test-images/busybox:1.29-2                      busybox with a hard link per applet (as
                                                    busybox's own image), its /etc/passwd and
                                                    /etc/group, ``pgrep`` and ``ipcs`` scripts
                                                    (applets Debian's busybox-static lacks)
e2e-test-images/nginx:1.14-2                        a script named ``nginx`` ("master process"
                                                    in PID 1's command line, /var/run/nginx.pid)
                                                    running busybox ``httpd`` on port 80
k8s-staging-cri-tools/hostnet-nginx-<arch>          the same on port 12003
e2e-test-images/httpd:2.4.39-4                      busybox ``httpd`` on port 80, "httpd" in
                                                    its log
e2e-test-images/nonewprivs:1.3                      a set-uid root Go program printing
                                                    "Effective uid: N" (built by run.py)
k8s-staging-cri-tools/test-image-user-*             ``USER`` 1002 / www-data / 1003:1004 /
                                                    www-data:1004
k8s-staging-cri-tools/test-image-predefined-group   uid 1000 in gid 50000, ``USER 1000``
k8s-staging-cri-tools/test-image-{latest,1,2,3}     one marker file each (different ids)
k8s-staging-cri-tools/test-image-tag:{test,all}     one image, two tags
k8s-staging-cri-tools/test-image-tags:{1,2,3}       one image, three tags
registry.k8s.io/pause:3.9, k8s.gcr.io/pause:3.9     one image (a /pause script), two registries
==================================================  ==========================================

``test-image-digest@sha256:9700f9a2...`` cannot be made (a digest names exact bytes): its spec
("public image with digest should be pulled and removed") fails whichever way it is run.

:class:`Registry` answers the read-only part of the OCI distribution API (``GET``/``HEAD`` of
``/v2/``, ``/v2/<name>/manifests/<tag or digest>``, ``/v2/<name>/blobs/<digest>``) on
127.0.0.1, from memory, for every registry host at once (``name`` is the repository path
without the host; the paths of the hosts do not overlap). :func:`write_hosts_toml` points
containerd at it (``certs.d/<host>/hosts.toml`` under the CRI plugin's ``config_path``).

Python 3.9: no match statements, no ``X | Y`` types.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, List, Optional, Tuple

from anolisnuma.testing.images import DEFAULT_BUSYBOX, PAUSE_SCRIPT, _go_arch, busybox_applets, tar_add

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"

REGISTRY_HOSTS = ("registry.k8s.io", "gcr.io", "k8s.gcr.io")
E2E = "registry.k8s.io/e2e-test-images/"
STAGING = "gcr.io/k8s-staging-cri-tools/"

_PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_EPOCH = "1970-01-01T00:00:00Z"

# busybox's own image ships these (the e2e busybox image is busybox:1.29).
PASSWD = (b"root:x:0:0:root:/root:/bin/sh\n"
          b"daemon:x:1:1:daemon:/usr/sbin:/bin/false\n"
          b"bin:x:2:2:bin:/bin:/bin/false\n"
          b"sys:x:3:3:sys:/dev:/bin/false\n"
          b"sync:x:4:100:sync:/bin:/bin/sync\n"
          b"mail:x:8:8:mail:/var/spool/mail:/bin/false\n"
          b"www-data:x:33:33:www-data:/var/www:/bin/false\n"
          b"operator:x:37:37:Operator:/var:/bin/false\n"
          b"nobody:x:65534:65534:nobody:/home:/bin/false\n")
GROUP = (b"root:x:0:\ndaemon:x:1:\nbin:x:2:\nsys:x:3:\nadm:x:4:\ntty:x:5:\ndisk:x:6:\n"
         b"lp:x:7:\nmail:x:8:\nkmem:x:9:\nwheel:x:10:root\ncdrom:x:11:\ndialout:x:18:\n"
         b"floppy:x:19:\nvideo:x:28:\naudio:x:29:\ntape:x:32:\nwww-data:x:33:\noperator:x:37:\n"
         b"utmp:x:43:\nplugdev:x:46:\nstaff:x:50:\nlock:x:54:\nnetdev:x:82:\nusers:x:100:\n"
         b"nogroup:x:65534:\n")
INDEX_HTML = b"<html><body><h1>Welcome to nginx!</h1></body></html>\n"


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _tar(files: List[Tuple[str, int, Optional[bytes]]]) -> bytes:
    """An uncompressed, reproducible tar: (path, mode, data or None for a directory)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, mode, data in sorted(files, key=lambda f: f[0]):
            tar_add(tar, name, tarfile.DIRTYPE if data is None else tarfile.REGTYPE, mode, data)
    return buf.getvalue()


class Image:
    """One single-platform image: its layers, config and manifest as bytes."""

    def __init__(self, refs: List[str], layers: List[bytes], user: str = "",
                 entrypoint: Optional[List[str]] = None, cmd: Optional[List[str]] = None,
                 ports: Tuple[int, ...] = (), env: Optional[List[str]] = None) -> None:
        self.refs = list(refs)
        self.layers = list(layers)
        cfg = {"Env": [_PATH_ENV] + list(env or []), "Entrypoint": entrypoint, "Cmd": cmd, "WorkingDir": "/"}
        if user:
            cfg["User"] = user
        if ports:
            cfg["ExposedPorts"] = {f"{p}/tcp": {} for p in ports}
        self.config = json.dumps({
            "architecture": _go_arch(), "os": "linux", "created": _EPOCH, "config": cfg,
            "rootfs": {"type": "layers", "diff_ids": [_digest(layer) for layer in layers]},
            "history": [{"created": _EPOCH, "created_by": "scripts/critest/registry.py"}
                        for _ in layers],
        }, sort_keys=True, separators=(",", ":")).encode()
        self.manifest = json.dumps({
            "schemaVersion": 2, "mediaType": OCI_MANIFEST,
            "config": {"mediaType": OCI_CONFIG, "digest": _digest(self.config), "size": len(self.config)},
            "layers": [{"mediaType": OCI_LAYER, "digest": _digest(layer), "size": len(layer)}
                       for layer in layers],
        }, sort_keys=True, separators=(",", ":")).encode()

    @property
    def digest(self) -> str:
        return _digest(self.manifest)


PGREP = b"""#!/bin/sh
# stand-in for pgrep NAME (this busybox has no pgrep applet): the pids whose comm is NAME
rc=1
for d in /proc/[0-9]*; do
  read -r comm < "$d/comm" 2>/dev/null || continue
  if [ "$comm" = "$1" ]; then echo "${d#/proc/}"; rc=0; fi
done
exit $rc
"""
IPCS = b"""#!/bin/sh
# stand-in for ipcs -m (this busybox has no ipcs applet): this IPC namespace's segments
echo "------ Shared Memory Segments --------"
echo "key        shmid      owner      perms      bytes      nattch"
tail -n +2 /proc/sysvipc/shm | while read -r key shmid perms size cpid lpid nattch uid rest; do
  echo "$key $shmid $uid $perms $size $nattch"
done
"""
# nginx's stand-in: a script, so its process is named "nginx" (pidof finds it) and PID 1's
# command line shows "master process" (as nginx's process title does); it writes
# /var/run/nginx.pid, serves NGINX_ROOT on NGINX_PORT with busybox httpd, exits on TERM.
NGINX = b"""#!/bin/sh
echo $$ > /var/run/nginx.pid
trap 'kill $child 2>/dev/null; exit 0' TERM INT QUIT
httpd -f -p "${NGINX_PORT:-80}" -h "${NGINX_ROOT:-/usr/share/nginx/html}" &
child=$!
wait $child
"""
# The nonewprivs image's program (built by run.py, set-uid root in the image).
NONEWPRIVS_GO = """package main

import (
	"fmt"
	"os"
)

func main() { fmt.Printf("Effective uid: %d\\n", os.Geteuid()) }
"""


def busybox_layer(busybox: str = DEFAULT_BUSYBOX) -> bytes:
    """busybox's own image's layout: /bin/busybox and a HARD link per applet (a masked
    /bin/ls then masks that name only), busybox's /etc/passwd and /etc/group, plus pgrep
    and ipcs scripts for the applets this build lacks."""
    with open(busybox, "rb") as f:
        data = f.read()
    applets = busybox_applets(busybox)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        def add(name: str, mode: int, body: Optional[bytes] = None, kind: bytes = tarfile.REGTYPE,
                link: str = "") -> None:
            tar_add(tar, name, tarfile.DIRTYPE if body is None and kind == tarfile.REGTYPE else kind, mode,
                    body, link)
        for d, mode in (("bin", 0o755), ("dev", 0o755), ("etc", 0o755), ("home", 0o755), ("proc", 0o555),
                        ("root", 0o700), ("sys", 0o555), ("tmp", 0o1777), ("usr", 0o755), ("usr/bin", 0o755),
                        ("usr/sbin", 0o755), ("var", 0o755), ("var/run", 0o755), ("var/www", 0o755)):
            add(d, mode)
        add("bin/busybox", 0o755, data)
        for a in applets:
            add(f"bin/{a}", 0o755, kind=tarfile.LNKTYPE, link="bin/busybox")
        if "pgrep" not in applets:
            add("bin/pgrep", 0o755, PGREP)
        if "ipcs" not in applets:
            add("bin/ipcs", 0o755, IPCS)
        add("etc/group", 0o644, GROUP)
        add("etc/passwd", 0o644, PASSWD)
    return buf.getvalue()


def critest_images(busybox: str = DEFAULT_BUSYBOX, nonewprivs: Optional[str] = None) -> List[Image]:
    """The stand-ins for the images critest pulls (see the module docstring).
    ``nonewprivs``: a static program printing "Effective uid: N" (else that image is left out)."""
    base = busybox_layer(busybox)
    common = [base]

    def marker(name: str) -> bytes:
        return _tar([(name, 0o644, b"")])

    def html(root: str) -> List[Tuple[str, int, Optional[bytes]]]:
        parts = root.strip("/").split("/")
        return [("/".join(parts[:i + 1]), 0o755, None) for i in range(len(parts))] + \
            [(f"{root.strip('/')}/index.html", 0o644, INDEX_HTML)]

    nginx_layer = _tar(html("/usr/share/nginx/html") + [("usr", 0o755, None), ("usr/sbin", 0o755, None),
                                                         ("usr/sbin/nginx", 0o755, NGINX)])
    nginx_cmd = ["/usr/sbin/nginx", "-g", "daemon off; master process"]
    images: List[Image] = [
        Image([E2E + "busybox:1.29-2"], common, cmd=["sh"]),
        Image([E2E + "nginx:1.14-2"], common + [nginx_layer], cmd=nginx_cmd, ports=(80,)),
        Image([STAGING + f"hostnet-nginx-{_go_arch()}:latest"], common + [nginx_layer], cmd=nginx_cmd,
              ports=(12003,), env=["NGINX_PORT=12003"]),
        Image([E2E + "httpd:2.4.39-4"], common + [_tar(html("/usr/local/apache2/htdocs"))],
              cmd=["sh", "-c", "echo 'httpd: serving /usr/local/apache2/htdocs on port 80'; "
                               "exec httpd -f -v -p 80 -h /usr/local/apache2/htdocs"], ports=(80,)),
    ]
    for name, user in (("test-image-user-uid", "1002"), ("test-image-user-username", "www-data"),
                       ("test-image-user-uid-group", "1003:1004"),
                       ("test-image-user-username-group", "www-data:1004")):
        images.append(Image([STAGING + name + ":latest"], common, user=user, cmd=["sh"]))
    predefined = _tar([
        ("etc", 0o755, None),
        ("etc/passwd", 0o644, PASSWD + b"default-user:x:1000:1000:Linux User,,,:/home/default-user:/bin/sh\n"),
        ("etc/group", 0o644, GROUP + b"default-user:x:1000:\ngroup-defined-in-image:x:50000:default-user\n"),
        ("home", 0o755, None), ("home/default-user", 0o755, None)])
    images.append(Image([STAGING + "test-image-predefined-group:latest"], common + [predefined],
                        user="1000", cmd=["sh"]))
    for name in ("test-image-latest", "test-image-1", "test-image-2", "test-image-3"):
        images.append(Image([STAGING + name + ":latest"], common + [marker(name)], cmd=["sh"]))
    images.append(Image([STAGING + "test-image-tag:test", STAGING + "test-image-tag:all"],
                        common + [marker("test-image-tag")], cmd=["sh"]))
    images.append(Image([STAGING + f"test-image-tags:{t}" for t in (1, 2, 3)],
                        common + [marker("same-image")], cmd=["sh"]))
    # critest >= 1.36: "removing image from one registry should remove all tags from other registries"
    images.append(Image(["registry.k8s.io/pause:3.9", "k8s.gcr.io/pause:3.9"],
                        common + [_tar([("pause", 0o755, PAUSE_SCRIPT)])], entrypoint=["/pause"]))
    if nonewprivs:
        with open(nonewprivs, "rb") as f:
            prog = f.read()
        nnp = _tar([("usr", 0o755, None), ("usr/local", 0o755, None), ("usr/local/bin", 0o755, None),
                    ("usr/local/bin/nnp", 0o4755, prog)])
        images.append(Image([E2E + "nonewprivs:1.3"], common + [nnp], entrypoint=["/usr/local/bin/nnp"]))
    return images


def _split_ref(ref: str) -> Tuple[str, str, str]:
    """'gcr.io/a/b:tag' -> ('gcr.io', 'a/b', 'tag')."""
    host, _, rest = ref.partition("/")
    name, _, tag = rest.rpartition(":")
    return host, name, tag


class Registry:
    """A read-only OCI distribution endpoint on 127.0.0.1 serving ``images`` from memory."""

    _PATH = re.compile(r"^/v2/(?P<name>.+)/(?P<kind>manifests|blobs)/(?P<ref>[^/]+)$")

    def __init__(self, images: List[Image], log_path: Optional[str] = None) -> None:
        self.blobs: Dict[str, bytes] = {}
        self.manifests: Dict[Tuple[str, str], bytes] = {}
        self.hosts = set()
        for img in images:
            self.blobs[_digest(img.config)] = img.config
            for layer in img.layers:
                self.blobs[_digest(layer)] = layer
            for ref in img.refs:
                host, name, tag = _split_ref(ref)
                self.hosts.add(host)
                self.manifests[(name, tag)] = img.manifest
                self.manifests[(name, img.digest)] = img.manifest
        self.log_path = log_path
        self.requests = 0
        self._log_lock = threading.Lock()
        self._server: Optional[ThreadingHTTPServer] = None
        self._thread: Optional[threading.Thread] = None

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _log(self, line: str) -> None:
        with self._log_lock:
            self.requests += 1
            if self.log_path:
                with open(self.log_path, "a") as f:
                    f.write(line + "\n")

    def start(self) -> "Registry":
        registry = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, fmt: str, *args: object) -> None:  # noqa: D401
                pass

            def _answer(self, body: bytes) -> None:
                path = self.path.split("?", 1)[0]
                status, headers, data = 404, {"Content-Type": "application/json"}, \
                    b'{"errors":[{"code":"NAME_UNKNOWN","message":"not here"}]}'
                if path in ("/v2", "/v2/"):
                    status, data = 200, b"{}"
                else:
                    m = Registry._PATH.match(path)
                    if m and m.group("kind") == "manifests":
                        found = registry.manifests.get((m.group("name"), m.group("ref")))
                        if found is not None:
                            status, data = 200, found
                            headers = {"Content-Type": OCI_MANIFEST, "Docker-Content-Digest": _digest(found)}
                    elif m:
                        found = registry.blobs.get(m.group("ref"))
                        if found is not None:
                            status, data = 200, found
                            headers = {"Content-Type": "application/octet-stream",
                                       "Docker-Content-Digest": m.group("ref")}
                registry._log(f"{self.command} {self.path} {status}")
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Docker-Distribution-API-Version", "registry/2.0")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if body:
                    self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802
                self._answer(b"1")

            def do_HEAD(self) -> None:  # noqa: N802
                self._answer(b"")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="critest-registry",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None


def write_hosts_toml(certs_dir: str, url: str, hosts: Tuple[str, ...] = REGISTRY_HOSTS) -> List[str]:
    """``certs.d/<host>/hosts.toml`` sending every pull for ``hosts`` to ``url`` only."""
    written = []
    for host in hosts:
        d = os.path.join(certs_dir, host)
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, "hosts.toml")
        with open(path, "w") as f:
            f.write(f'# written by scripts/critest: {host} is served by a loopback registry\n'
                    f'server = "{url}"\n\n[host."{url}"]\n  capabilities = ["pull", "resolve"]\n')
        written.append(path)
    return written
