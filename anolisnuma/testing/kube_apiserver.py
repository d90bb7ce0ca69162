"""A private, real Kubernetes control plane for tests: etcd and kube-apiserver on loopback.

``PrivateControlPlane`` starts Debian's ``etcd`` and the ``kube-apiserver`` of
``../shared/k8s`` (found relative to the repository, or ``$ANOLISNUMA_K8S_DIR``) on free
loopback ports with their own data dirs and certificates (made with ``openssl``: a CA, the
server's certificate for 127.0.0.1, an admin client certificate in ``system:masters``, the
service-account key pair), with RBAC authorization, so what a ClusterRole does not grant
is refused as it would be on a real cluster, and ValidatingAdmissionPolicy on (alpha in
v1.26: its feature gate and API version), so deploy/'s node policy is enforced. :meth:`~PrivateControlPlane.stop_apiserver` /
:meth:`~PrivateControlPlane.start_apiserver` restart the API server on the same port and
etcd data (an API server outage); :meth:`~PrivateControlPlane.close` stops both and removes
everything.

    with PrivateControlPlane.start_new() as cp:
        cp.kubectl("apply", "-f", "deploy/crd.yaml")
        cp.request("GET", "/apis/resource.sop.huawei.com/v1alpha1/oenumas")

:func:`missing` says why a control plane cannot run here (for a test's skip reason).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from typing import Any, Dict, List, Optional

from anolisnuma.testing.proxy import REPO_ROOT

APISERVER = "kube-apiserver"
KUBECTL = "kubectl"
START_TIMEOUT = 60.0


def k8s_dir() -> str:
    """Where kube-apiserver and kubectl are: ``$ANOLISNUMA_K8S_DIR``, else
    ``<repo>/../shared/k8s`` (CI's layout), else ``/work/shared/k8s``."""
    env = os.environ.get("ANOLISNUMA_K8S_DIR")
    if env:
        return env
    beside = os.path.normpath(os.path.join(REPO_ROOT, "..", "shared", "k8s"))
    if os.path.isdir(beside):
        return beside
    return "/work/shared/k8s"


def missing() -> Optional[str]:
    """Why a private control plane cannot run on this machine; None when it can."""
    where = k8s_dir()
    for name in (APISERVER, KUBECTL):
        if not os.access(os.path.join(where, name), os.X_OK):
            return f"{name} not found in {where} (set ANOLISNUMA_K8S_DIR to the Kubernetes v1.26 binaries)"
    if shutil.which("etcd") is None:
        return "etcd not found: apt-get install etcd-server (scripts/install-deps.sh)"
    if shutil.which("openssl") is None:
        return "openssl not found: apt-get install openssl (scripts/install-deps.sh)"
    return None


def free_port() -> int:
    """A loopback TCP port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _openssl(*args: str, cwd: str) -> None:
    subprocess.run(["openssl"] + list(args), cwd=cwd, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.PIPE, timeout=60)


def make_certificates(d: str) -> None:
    """``ca.crt/key``, ``server.crt/key`` (127.0.0.1, localhost), ``admin.crt/key``
    (``O=system:masters``), ``sa.key``/``sa.pub`` in ``d``; EC keys: they are made at once."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "3",
             "-subj", "/CN=anolisnuma-test-ca", cwd=d)
    with open(os.path.join(d, "server.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    with open(os.path.join(d, "client.ext"), "w") as f:
        f.write("extendedKeyUsage=clientAuth\n")
    for name, subject, ext in (("server", "/CN=kube-apiserver", "server.ext"),
                               ("admin", "/O=system:masters/CN=admin", "client.ext")):
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject, cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.crt", "-days", "3", "-extfile", ext, cwd=d)
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "sa.key", cwd=d)
    _openssl("ec", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)


def kubeconfig_text(server: str, ca_file: str, *, token: str = "", token_file: str = "", cert_file: str = "",
                    key_file: str = "", user: str = "user") -> str:
    """A kubeconfig (JSON is YAML) for one cluster and one user: a bearer token (inline or
    by file) or a client certificate."""
    creds: Dict[str, str] = ({"token": token} if token else {"tokenFile": token_file} if token_file
                             else {"client-certificate": cert_file, "client-key": key_file})
    return json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": server, "certificate-authority": ca_file}}],
        "users": [{"name": user, "user": creds}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": user}}],
    }, indent=1)


class PrivateControlPlane:
    """etcd + kube-apiserver under ``base_dir`` (see the module docstring)."""

    def __init__(self, base_dir: str) -> None:
        self.base_dir = base_dir
        self.bin_dir = k8s_dir()
        self.pki = os.path.join(base_dir, "pki")
        self.etcd_port = free_port()
        self.etcd_peer_port = free_port()
        self.port = free_port()
        self.etcd: Optional[subprocess.Popen] = None
        self.apiserver: Optional[subprocess.Popen] = None
        self._logs: List[Any] = []

    @classmethod
    def start_new(cls, prefix: str = "anolisnuma-k8s-", parent: str = "/tmp") -> "PrivateControlPlane":
        """Started under a new directory of ``parent`` (``/dev/shm``: etcd's writes never
        reach the disk, as when the control plane runs on other machines)."""
        cp = cls(tempfile.mkdtemp(prefix=prefix, dir=parent))
        try:
            cp.start()
        except BaseException:
            cp.close()
            raise
        return cp

    # ------------------------------------------------------------------ addresses and files
    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def ca_file(self) -> str:
        return os.path.join(self.pki, "ca.crt")

    @property
    def admin_kubeconfig(self) -> str:
        return os.path.join(self.base_dir, "admin.kubeconfig")

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.etcd_port}"

    def log_path(self, name: str) -> str:
        return os.path.join(self.base_dir, f"{name}.log")

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        os.makedirs(self.pki, exist_ok=True)
        make_certificates(self.pki)
        with open(self.admin_kubeconfig, "w") as f:
            f.write(kubeconfig_text(self.server, self.ca_file, cert_file=os.path.join(self.pki, "admin.crt"),
                                    key_file=os.path.join(self.pki, "admin.key"), user="admin"))
        self._start_etcd()
        self.start_apiserver()

    def _spawn(self, name: str, argv: List[str]) -> subprocess.Popen:
        log = open(self.log_path(name), "ab")
        self._logs.append(log)
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=self.base_dir, start_new_session=True)

    def _start_etcd(self) -> None:
        self.etcd = self._spawn("etcd", [
            "etcd", "--name", "test", "--data-dir", os.path.join(self.base_dir, "etcd"),
            "--listen-client-urls", self.etcd_url, "--advertise-client-urls", self.etcd_url,
            "--listen-peer-urls", f"http://127.0.0.1:{self.etcd_peer_port}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.etcd_peer_port}",
            "--initial-cluster", f"test=http://127.0.0.1:{self.etcd_peer_port}",
            "--log-level", "error", "--logger", "zap"])
        self._wait(lambda: _http_ok(self.etcd_url + "/health"), self.etcd, "etcd")

    def start_apiserver(self) -> None:
        """Start (again) the API server on its port, over the same etcd."""
        p = self.pki
        self.apiserver = self._spawn("kube-apiserver", [
            os.path.join(self.bin_dir, APISERVER),
            f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={self.port}",
            f"--tls-cert-file={p}/server.crt", f"--tls-private-key-file={p}/server.key",
            f"--client-ca-file={p}/ca.crt",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={p}/sa.pub", f"--service-account-signing-key-file={p}/sa.key",
            "--service-cluster-ip-range=10.96.0.0/24",
            "--authorization-mode=RBAC",
            # ValidatingAdmissionPolicy is alpha in v1.26: on, so that deploy/'s node policy
            # (deploy/node-policy-v1alpha1.yaml) is enforced here as on a cluster that runs it
            "--feature-gates=ValidatingAdmissionPolicy=true",
            "--runtime-config=admissionregistration.k8s.io/v1alpha1=true",
            f"--cert-dir={self.base_dir}/apiserver-certs",
            "--profiling=false", "--enable-priority-and-fairness=false",
            "--v=0"])
        self._wait(self.ready, self.apiserver, "kube-apiserver")

    def stop_apiserver(self) -> None:
        """Stop the API server (SIGTERM, then SIGKILL); etcd and its data stay."""
        self._stop(self.apiserver)
        self.apiserver = None

    def kill_apiserver(self) -> None:
        """SIGKILL the API server: connections are cut without a word."""
        proc, self.apiserver = self.apiserver, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)

    def close(self) -> None:
        """Stop both processes and remove every file."""
        self._stop(self.apiserver)
        self._stop(self.etcd)
        self.apiserver = self.etcd = None
        for log in self._logs:
            log.close()
        self._logs = []
        shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> "PrivateControlPlane":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def _stop(proc: Optional[subprocess.Popen], timeout: float = 15.0) -> None:
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)

    def _wait(self, ready: Any, proc: subprocess.Popen, name: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while not ready():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}: {self._tail(name)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} not ready within {START_TIMEOUT:g}s: {self._tail(name)}")
            time.sleep(0.1)

    def _tail(self, name: str) -> str:
        try:
            with open(self.log_path(name), "rb") as f:
                return f.read()[-2000:].decode(errors="replace")
        except OSError:
            return ""

    # ------------------------------------------------------------------ talking to it
    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.ca_file)
        ctx.load_cert_chain(os.path.join(self.pki, "admin.crt"), os.path.join(self.pki, "admin.key"))
        return ctx

    def ready(self) -> bool:
        try:
            return self.request("GET", "/readyz", timeout=2.0) == "ok"
        except (OSError, ValueError, urllib.error.URLError):
            return False

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
                timeout: float = 10.0) -> Any:
        """One admin request; the decoded JSON reply (text when not JSON). HTTP errors raise
        ``urllib.error.HTTPError``."""
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        req = urllib.request.Request(self.server + path, data=data, method=method,
                                     headers={"Content-Type": content_type, "Accept": "application/json"})
        with urllib.request.urlopen(req, context=self.ssl_context(), timeout=timeout) as reply:
            text = reply.read().decode()
        try:
            return json.loads(text)
        except ValueError:
            return text

    def kubectl(self, *args: str, input: Optional[str] = None, kubeconfig: Optional[str] = None,
                check: bool = True, timeout: float = 60.0) -> subprocess.CompletedProcess:
        """``kubectl --kubeconfig <admin> ARGS`` (text in and out)."""
        argv = [os.path.join(self.bin_dir, KUBECTL), "--kubeconfig", kubeconfig or self.admin_kubeconfig] + list(args)
        done = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
        return done

    def kubectl_json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json").stdout)


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as reply:
            return reply.status == 200
    except (OSError, ValueError, urllib.error.URLError):
        return False
