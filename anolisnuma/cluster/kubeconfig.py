"""The node's credentials for the API server, read from a kubeconfig file.

lightkube parses the kubeconfig (``KubeConfig``) and makes the TLS context and the
credentials from it (``kube_client.py``); this module reads the file first and checks what
an operator must be told about in words, naming the file and the key: a missing or garbage
file, no usable context, a server that is not ``https://``, and what the daemon refuses
although lightkube would take it. Exec plugins and auth providers would run commands or
reach identity providers from the CRI proxy, and ``insecure-skip-tls-verify`` would trust
any server: they are refused, naming the key.

The kubeconfig and every file it names (``certificate-authority``, ``client-certificate``,
``client-key``, ``tokenFile``) are read like the configuration, by
:func:`anolisnuma.trusted_file.read_trusted_file`: a regular file only (a FIFO there
cannot block the start), of bounded size, that only root may change, along its path too,
and reached through no symbolic link another user owns (one another user may write or
point elsewhere is refused: whoever may decides where the node's token goes, or which file
is sent as one); checked and read in one walk, without a moment in between for a swap. A file holding a secret (a token, a private
key; the kubeconfig when one is inline) that others may read is used, with a warning
naming it (:attr:`Kubeconfig.warnings`, logged by the link). No message carries a byte of
a secret: a YAML error says where, not what was there; a token is described, never quoted
(``token_file.py``).

Relative file names are resolved against the kubeconfig's directory, as kubectl does. A
``tokenFile`` is never handed to lightkube: it is read by ``token_file.py`` at start and
by ``token_auth.py`` at the first request and again whenever the API server answers 401,
so a rotated token is picked up without a restart.

Importing this module does not import lightkube (``anolisnuma-ctl kubeconfig`` renders
with it); :meth:`Kubeconfig.lightkube_config` does.
"""

from __future__ import annotations

import base64
import os
import urllib.parse
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Tuple

import yaml

from anolisnuma.cluster.token_file import TokenError, read_token_file, token_problem
from anolisnuma.trusted_file import read_trusted_or

MAX_FILE = 1 << 20
MAX_PEM_FILE = 1 << 20     # a CA bundle, a certificate chain, a key


class KubeconfigError(ValueError):
    """The kubeconfig cannot be used; the message names the file and the key."""


@dataclass(frozen=True)
class Kubeconfig:
    """A checked kubeconfig: its current context only, relative paths made absolute."""

    server: str                  # https://host:port
    source: str                  # the file it came from
    doc: Dict[str, Any] = field(repr=False, compare=False)
    token_file: str = ""
    token: str = field(default="", repr=False, compare=False)   # the tokenFile's, as read at the check
    warnings: Tuple[str, ...] = ()   # secrets others may read, each naming its file

    def lightkube_config(self) -> Any:
        """lightkube's ``SingleConfig`` of the current context; raises :class:`KubeconfigError`."""
        from lightkube.config.kubeconfig import KubeConfig
        from lightkube.core.exceptions import ConfigError

        try:
            return KubeConfig.from_dict(self.doc, fname=self.source).get()
        except (ConfigError, KeyError, TypeError, ValueError) as e:
            raise KubeconfigError(f"{self.source}: {e}") from e


def load_kubeconfig(path: str) -> Kubeconfig:
    """The checked kubeconfig of ``path``; raises :class:`KubeconfigError`."""
    read = read_trusted_or(path, MAX_FILE, KubeconfigError)
    doc = decode_kubeconfig(read.data, path)
    kubeconfig = parse_kubeconfig(doc, path)
    if read.readers and _holds_secret(kubeconfig.doc):
        kubeconfig = replace(kubeconfig, warnings=(_readable(path, read.readers),) + kubeconfig.warnings)
    return kubeconfig


def decode_kubeconfig(data: bytes, path: str) -> Any:
    """The YAML document of a kubeconfig's bytes; raises :class:`KubeconfigError` saying
    where it is not YAML, never quoting it (an inline token may be on that line)."""
    try:
        return yaml.safe_load(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise KubeconfigError(f"{path}: not UTF-8 (byte {e.start + 1})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise KubeconfigError(f"{path}: not YAML{where}: {getattr(e, 'problem', None) or type(e).__name__}") \
            from None
    except ValueError as e:   # (PyYAML's own, e.g. a timestamp out of range)
        raise KubeconfigError(f"{path}: not YAML: {type(e).__name__}") from None
    except RecursionError:   # (nested past the YAML reader's recursion: no kubeconfig is)
        raise KubeconfigError(f"{path}: not YAML: nested too deep") from None


def parse_kubeconfig(doc: Any, path: str) -> Kubeconfig:
    """The checks of the module docstring on a decoded kubeconfig (the files it names are
    read and checked too)."""
    path = os.path.abspath(path)
    warnings: List[str] = []
    base = os.path.dirname(path)
    if not isinstance(doc, dict):
        raise KubeconfigError(f"{path}: not a mapping")
    context_name = doc.get("current-context")
    if context_name is not None and not isinstance(context_name, str):
        raise KubeconfigError(f"{path}: current-context must be a string")
    contexts = _named(doc, "contexts", path)
    if not contexts:
        raise KubeconfigError(f"{path}: no contexts")
    if context_name:
        if context_name not in contexts:
            raise KubeconfigError(f"{path}: current-context {context_name!r} is not among the contexts")
    elif len(contexts) == 1:
        context_name = next(iter(contexts))
    else:
        raise KubeconfigError(f"{path}: several contexts and no current-context")
    context = contexts[context_name]
    clusters, users = _named(doc, "clusters", path), _named(doc, "users", path)
    for key in ("cluster", "user"):
        if not isinstance(context.get(key), str):
            raise KubeconfigError(f"{path}: the context's {key} must be a name")
    cluster = clusters.get(context.get("cluster"))
    if cluster is None:
        raise KubeconfigError(f"{path}: context's cluster {context.get('cluster')!r} is not among the clusters")
    if not context.get("user") or context["user"] not in users:
        raise KubeconfigError(f"{path}: context's user {context.get('user')!r} is not among the users")
    user = dict(users[context["user"]])
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
    try:
        url = urllib.parse.urlsplit(server)
        hostname = url.hostname   # (it parses the host: a bracketed one that is no IPv6 address raises)
    except ValueError:
        raise KubeconfigError(f"{path}: clusters[].cluster.server is not a URL; got {server[:200]!r}") from None
    if url.scheme != "https" or not hostname:
        raise KubeconfigError(f"{path}: clusters[].cluster.server must be an https:// URL; got {server!r}")
    if url.path not in ("", "/"):
        raise KubeconfigError(f"{path}: clusters[].cluster.server with a path is not supported; got {server!r}")
    cluster = dict(cluster)
    _check_file(cluster, "certificate-authority", base, path, warnings)
    has_cert = _check_file(user, "client-certificate", base, path, warnings)
    if has_cert != _check_file(user, "client-key", base, path, warnings, secret=True):
        raise KubeconfigError(f"{path}: users[].user needs both client-certificate and client-key")
    token = user.get("token") or ""
    token_file = user.pop("tokenFile", None) or ""   # (read by us, never by lightkube: token_auth.py)
    if not isinstance(token, str) or not isinstance(token_file, str) or "\0" in token_file:
        raise KubeconfigError(f"{path}: users[].user.token and tokenFile must be strings (a file name for tokenFile)")
    if token and token_problem(token) is not None:
        raise KubeconfigError(f"{path}: users[].user.token is {token_problem(token)}")
    file_token = ""
    if token_file:
        token_file = os.path.join(base, token_file)   # (an absolute name stays as it is)
        try:
            file_token, readers = read_token_file(token_file)
        except TokenError as e:
            raise KubeconfigError(f"{path}: users[].user.{e}") from None
        if readers:
            warnings.append(_readable(token_file, readers))
        user.pop("token", None)   # (as kubectl: the file wins)
    if not (token or token_file or has_cert):
        raise KubeconfigError(f"{path}: the context's user has no token, tokenFile or client certificate")
    # what lightkube gets: the current context, its cluster and its user, nothing else
    one = {"current-context": context_name,
           "contexts": [{"name": context_name, "context": {"cluster": context["cluster"], "user": context["user"]}}],
           "clusters": [{"name": context["cluster"], "cluster": cluster}],
           "users": [{"name": context["user"], "user": user}]}
    return Kubeconfig(server=f"https://{url.netloc}", source=path, doc=one, token_file=token_file,
                      token=file_token, warnings=tuple(warnings))


def _holds_secret(doc: Dict[str, Any]) -> bool:
    user = doc["users"][0]["user"]
    return bool(user.get("token") or user.get("client-key-data"))


def _readable(path: str, readers: str) -> str:
    return (f"{path} holds a credential and is readable by {readers}: whoever reads it may act as this node "
            f"on the API server; fix: chmod go-r {path} (and remove the ACL entry, if one grants it)")


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


def _check_file(section: Dict[str, Any], key: str, base: str, path: str, warnings: List[str],
                secret: bool = False) -> bool:
    """Whether ``key`` (a file name) or ``key-data`` (base64) is given; a file that cannot
    be read or trusted, or data that is not base64, is refused here, where the message can
    name it; a ``secret`` file others may read adds a warning. The name handed to lightkube
    is made absolute (``section`` is the caller's copy)."""
    data = section.get(f"{key}-data")
    if data:
        try:
            base64.b64decode(data, validate=True)
        except (ValueError, TypeError) as e:
            raise KubeconfigError(f"{path}: {key}-data is not base64 PEM") from e
        return True
    name = section.get(key)
    if not name:
        return False
    if not isinstance(name, str) or "\0" in name:
        raise KubeconfigError(f"{path}: {key} must be a file name")
    name = section[key] = os.path.join(base, name)
    read = read_trusted_or(name, MAX_PEM_FILE, lambda problem: KubeconfigError(f"{path}: {key} {problem}"))
    if secret and read.readers:
        warnings.append(_readable(name, read.readers))
    return True


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
