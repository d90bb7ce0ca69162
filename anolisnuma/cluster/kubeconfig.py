"""The node's credentials for the API server, read from a kubeconfig file.

The daemon reads the subset a node's credentials file needs: the current context's
cluster (``server``, ``certificate-authority`` or ``-data``) and user (``token``,
``tokenFile``, or ``client-certificate``/``client-key`` and their ``-data``). Exec plugins
and auth providers would run commands or reach identity providers from the CRI proxy:
they are refused, naming the key, as is ``insecure-skip-tls-verify``. A ``tokenFile`` is
read again for every connection, so a rotated token is picked up without a restart.

Relative file names are resolved against the kubeconfig's directory, as kubectl does.
"""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
import urllib.parse
from dataclasses import dataclass
from typing import Any, Dict

import yaml

MAX_FILE = 1 << 20


class KubeconfigError(ValueError):
    """The kubeconfig cannot be used; the message names the file and the key."""


@dataclass(frozen=True)
class Credentials:
    """Where the API server is and how to prove who we are."""

    host: str
    port: int
    ca_pem: str                 # "" = the system's trust store
    token: str = ""
    token_file: str = ""
    cert_pem: str = ""
    key_pem: str = ""
    source: str = ""

    @property
    def server(self) -> str:
        return f"https://{self.host}:{self.port}"

    def bearer(self) -> str:
        """The token to send ("" for a client certificate); a token file is read now."""
        if self.token_file:
            try:
                with open(self.token_file) as f:
                    return f.read(MAX_FILE).strip()
            except OSError as e:
                raise KubeconfigError(f"{self.source}: tokenFile {self.token_file}: {e.strerror}") from e
        return self.token

    def ssl_context(self) -> ssl.SSLContext:
        """A TLS client context that checks the server against the CA (and host name)."""
        # (with a CA given, only it is trusted; else the system's store)
        ctx = ssl.create_default_context(cadata=self.ca_pem or None)
        if self.cert_pem:
            # load_cert_chain reads files only: a private temporary file, removed at once
            with tempfile.NamedTemporaryFile("w", prefix="anolisnuma-kube-", suffix=".pem") as f:
                os.chmod(f.name, 0o600)
                f.write(self.cert_pem + "\n" + self.key_pem + "\n")
                f.flush()
                ctx.load_cert_chain(f.name)
        return ctx


def load_kubeconfig(path: str) -> Credentials:
    """The credentials of ``path``'s current context; raises :class:`KubeconfigError`."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE + 1)
    except OSError as e:
        raise KubeconfigError(f"{path}: {e.strerror}") from e
    if len(data) > MAX_FILE:
        raise KubeconfigError(f"{path}: larger than {MAX_FILE} bytes")
    try:
        doc = yaml.safe_load(data.decode("utf-8"))
    except (ValueError, yaml.YAMLError) as e:
        raise KubeconfigError(f"{path}: not YAML: {' '.join(str(e).split())[:300]}") from e
    return parse_kubeconfig(doc, path)


def parse_kubeconfig(doc: Any, path: str) -> Credentials:
    base = os.path.dirname(os.path.abspath(path))
    if not isinstance(doc, dict):
        raise KubeconfigError(f"{path}: not a mapping")
    context_name = doc.get("current-context")
    contexts = _named(doc, "contexts", path)
    if not contexts:
        raise KubeconfigError(f"{path}: no contexts")
    if context_name:
        if context_name not in contexts:
            raise KubeconfigError(f"{path}: current-context {context_name!r} is not among the contexts")
        context = contexts[context_name]
    elif len(contexts) == 1:
        context = next(iter(contexts.values()))
    else:
        raise KubeconfigError(f"{path}: several contexts and no current-context")
    clusters, users = _named(doc, "clusters", path), _named(doc, "users", path)
    cluster = clusters.get(context.get("cluster"))
    if cluster is None:
        raise KubeconfigError(f"{path}: context's cluster {context.get('cluster')!r} is not among the clusters")
    user = users.get(context.get("user"), {}) if context.get("user") else {}
    if cluster.get("insecure-skip-tls-verify"):
        raise KubeconfigError(f"{path}: clusters[].cluster.insecure-skip-tls-verify is refused: "
                              "give the API server's CA (certificate-authority)")
    for key in ("exec", "auth-provider", "username", "password"):
        if user.get(key):
            raise KubeconfigError(f"{path}: users[].user.{key} is not supported: use a token, tokenFile "
                                  "or client certificate (docs/cluster.md)")
    server = cluster.get("server")
    if not isinstance(server, str):
        raise KubeconfigError(f"{path}: clusters[].cluster.server is missing")
    url = urllib.parse.urlsplit(server)
    if url.scheme != "https" or not url.hostname:
        raise KubeconfigError(f"{path}: clusters[].cluster.server must be an https:// URL; got {server!r}")
    if url.path not in ("", "/"):
        raise KubeconfigError(f"{path}: clusters[].cluster.server with a path is not supported; got {server!r}")
    ca = _pem(cluster, "certificate-authority", base, path)
    cert = _pem(user, "client-certificate", base, path)
    key = _pem(user, "client-key", base, path)
    if bool(cert) != bool(key):
        raise KubeconfigError(f"{path}: users[].user needs both client-certificate and client-key")
    token = user.get("token") or ""
    token_file = user.get("tokenFile") or ""
    if not isinstance(token, str) or not isinstance(token_file, str):
        raise KubeconfigError(f"{path}: users[].user.token and tokenFile must be strings")
    if token_file and not os.path.isabs(token_file):
        token_file = os.path.join(base, token_file)
    if not (token or token_file or cert):
        raise KubeconfigError(f"{path}: the context's user has no token, tokenFile or client certificate")
    return Credentials(host=url.hostname, port=url.port or 443, ca_pem=ca, token=token, token_file=token_file,
                       cert_pem=cert, key_pem=key, source=path)


def _named(doc: Dict[str, Any], key: str, path: str) -> Dict[str, Dict[str, Any]]:
    items = doc.get(key) or []
    if not isinstance(items, list):
        raise KubeconfigError(f"{path}: {key} is not a list")
    inner = key[:-1]
    out = {}
    for item in items:
        if isinstance(item, dict) and isinstance(item.get("name"), str) and isinstance(item.get(inner), dict):
            out[item["name"]] = item[inner]
    return out


def _pem(section: Dict[str, Any], key: str, base: str, path: str) -> str:
    data = section.get(f"{key}-data")
    if data:
        try:
            return base64.b64decode(data, validate=True).decode("ascii")
        except (ValueError, TypeError) as e:
            raise KubeconfigError(f"{path}: {key}-data is not base64 PEM") from e
    name = section.get(key)
    if not name:
        return ""
    if not isinstance(name, str):
        raise KubeconfigError(f"{path}: {key} must be a file name")
    if not os.path.isabs(name):
        name = os.path.join(base, name)
    try:
        with open(name) as f:
            return f.read(MAX_FILE)
    except (OSError, UnicodeDecodeError) as e:
        raise KubeconfigError(f"{path}: {key} {name}: {getattr(e, 'strerror', None) or e}") from e


def render_kubeconfig(server: str, ca_pem: str, token_file: str = "", token: str = "",
                      user: str = "anolisnuma") -> str:
    """A kubeconfig for the daemon: the CA embedded, the token by file (or inline)."""
    creds: Dict[str, str] = {"tokenFile": token_file} if token_file else {"token": token}
    doc = {
        "apiVersion": "v1", "kind": "Config", "current-context": "anolisnuma",
        "clusters": [{"name": "cluster", "cluster": {
            "server": server, "certificate-authority-data": base64.b64encode(ca_pem.encode()).decode()}}],
        "users": [{"name": user, "user": creds}],
        "contexts": [{"name": "anolisnuma", "context": {"cluster": "cluster", "user": user}}],
    }
    return yaml.safe_dump(doc, sort_keys=False)
