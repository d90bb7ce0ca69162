"""``anolisnuma-ctl kubelet enable|disable|status``: point the kubelet at anolisnuma and back.

Where the kubelet takes its CRI endpoint from, strongest first
--------------------------------------------------------------
1. ``--container-runtime-endpoint`` on its command line. Under systemd the command line is
   the ``ExecStart=`` of ``kubelet.service`` after its drop-ins, with ``$VAR`` and ``${VAR}``
   taken from ``Environment=`` and ``EnvironmentFile=``. A value from an environment file
   overrides ``Environment=`` whatever their order, so a drop-in that only sets
   ``Environment=KUBELET_EXTRA_ARGS=...`` does nothing on a kubeadm node (10-kubeadm.conf
   reads ``KUBELET_EXTRA_ARGS`` from /etc/sysconfig/kubelet). When the flag is given twice
   the last one wins. kubeadm nodes carry the flag in /var/lib/kubelet/kubeadm-flags.env
   (``KUBELET_KUBEADM_ARGS``), rpm kubelets in /etc/sysconfig/kubelet,
   /etc/kubernetes/kubelet (``KUBELET_ARGS``) or in the unit itself.
2. ``containerRuntimeEndpoint`` in a file of ``--config-dir`` (the last file setting it).
3. ``containerRuntimeEndpoint`` in the ``--config`` file (read by kubelets >= 1.27); a
   kubelet started without ``--config`` reads no config file at all. Only when no
   kubelet.service is found at all is /var/lib/kubelet/config.yaml assumed.
4. The kubelet's built-in default, unix:///run/containerd/containerd.sock.

What ``enable`` changes, and why
--------------------------------
It changes the source that wins, where it stands, and nothing else:

- a flag in a file that belongs to the node (an environment file such as kubeadm-flags.env
  or /etc/sysconfig/kubelet, a unit or drop-in under /etc/systemd/system): every
  occurrence of its value is rewritten in place, so no question of order is left;
- no flag: the key in the config-dir file or config file that sets it is rewritten, or the
  key is added to the config file when the kubelet is known to read it (kubelet >= 1.27,
  detected from the binary on a live node, or ``--kubelet-version``);
- otherwise the flag is appended to the last ``$VAR`` of ``ExecStart=`` whose value comes
  from an editable environment file (``KUBELET_EXTRA_ARGS`` in /etc/sysconfig/kubelet);
- last resort, when the flag sits in a packaged file under /usr (an rpm update would undo
  an edit there) or nothing else is editable: the drop-in
  /etc/systemd/system/kubelet.service.d/99-anolisnuma-endpoint.conf, which resets
  ``ExecStart=`` and repeats the effective command line with the endpoint replaced or
  appended (the last flag on a command line wins).

Why not always a drop-in that wins over kubeadm-flags.env: a drop-in cannot change one
flag inside ``KUBELET_KUBEADM_ARGS`` (an ``Environment=`` loses to the environment file),
only a new ``ExecStart=`` can, and that freezes a copy of kubeadm's command line: a later
kubeadm package that changes 10-kubeadm.conf would be shadowed without a word, and the
node would carry two contradicting endpoints (kubeadm-flags.env and ``ps`` would still
name containerd). An edit in place keeps one truth on the node and is undone byte for
byte. Its cost: ``kubeadm init/join/upgrade`` may rewrite kubeadm-flags.env or config.yaml
and put containerd back; ``status`` then says the switch was undone and ``enable`` can be
run again.

Every edit is minimal and textual (one flag value, one YAML line; comments, order and
every other byte stay), checked before anything is written: the node is inspected again
as if the edits were made, and the kubelet must then use our socket with every other
argument and config value unchanged. Originals go to /var/lib/anolisnuma/kubelet-backup/
(``manifest.json`` records each path, the original's and the written file's sha256 and
how to undo the edit) before a file is replaced atomically (same mode and owner).
``disable`` puts an unchanged file back byte for byte; a file changed since (by kubeadm, by
hand) gets the edit undone in place; created files are removed; then the backup goes.

``enable`` refuses while our socket does not answer CRI ``Version``. Everything works
under ``--root DIR`` (default ``/``): paths are the node's, read and written below DIR.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import fnmatch
import hashlib
import json
import os
import re
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, NamedTuple, Optional, Sequence, TextIO, Tuple

try:
    from anolisnuma.config import ServerConfig as _ServerConfig
    DEFAULT_SOCKET = str(_ServerConfig.listen)
except Exception:  # pragma: no cover - the module must work even if the config moves
    DEFAULT_SOCKET = "/var/run/anolisnuma/anolisnuma.sock"

FLAG = "--container-runtime-endpoint"
CONFIG_FLAG = "--config"
CONFIG_DIR_FLAG = "--config-dir"
KEY = "containerRuntimeEndpoint"
DEFAULT_ENDPOINT = "unix:///run/containerd/containerd.sock"
DEFAULT_KUBELET_CONFIG = "/var/lib/kubelet/config.yaml"
DEFAULT_ANOLISNUMA_CONFIG = "/etc/anolisnuma/config.toml"
BACKUP_DIR = "/var/lib/anolisnuma/kubelet-backup"
MANIFEST = BACKUP_DIR + "/manifest.json"
DROPIN = "/etc/systemd/system/kubelet.service.d/99-anolisnuma-endpoint.conf"
UNIT_NAME = "kubelet.service"
# systemd's unit search path, highest priority first.
UNIT_DIRS = (
    "/etc/systemd/system",
    "/run/systemd/system",
    "/usr/local/lib/systemd/system",
    "/usr/lib/systemd/system",
    "/lib/systemd/system",
)
# Files a package update (or, for /run, a reboot) would overwrite: never edited in place.
PACKAGED_PREFIXES = ("/usr/", "/lib/", "/run/")
MIN_CONFIG_KEY_VERSION = (1, 27)
MANIFEST_FORMAT = 1
PROG = "anolisnuma-ctl kubelet"
EXIT_OK = 0
EXIT_FAIL = 1

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_VAR_WORD = re.compile(r"\$(" + _NAME + r")")
_VAR_REF = re.compile(r"\$\$|\$\{(" + _NAME + r")\}")
_FLAG_VALUE = re.compile(
    r"(?P<flag>" + re.escape(FLAG) + r")(?P<sep>=|[ \t]+)"
    r"(?P<val>\"[^\"\n]*\"|'[^'\n]*'|[^\s\"'\\]+)")


class CtlError(Exception):
    """A condition reported to the operator as one line; the command exits non-zero."""


# -- the node's files, below a root ----------------------------------------------------


class Root:
    """The node's file system below ``root``, optionally with planned contents overlaid.

    Paths given to it are the node's (absolute, ``/etc/...``); symlinks are resolved
    inside the root, as in a chroot. ``overlay`` maps resolved host paths to the bytes a
    file would have (``None``: would not exist): how an edit is checked before it is made.
    """

    def __init__(self, root: str = "/", overlay: Optional[Dict[str, Optional[bytes]]] = None) -> None:
        self.root = os.path.abspath(root)
        self.overlay: Dict[str, Optional[bytes]] = dict(overlay or {})

    def with_overlay(self, overlay: Dict[str, Optional[bytes]]) -> "Root":
        merged = dict(self.overlay)
        merged.update(overlay)
        return Root(self.root, merged)

    def host(self, path: str) -> str:
        """The path on this machine of the node's ``path``, symlinks resolved inside the root."""
        parts = [p for p in path.split("/") if p]
        resolved: List[str] = []
        hops = 0
        while parts:
            name = parts.pop(0)
            if name == ".":
                continue
            if name == "..":
                if resolved:
                    resolved.pop()
                continue
            candidate = os.path.join(self.root, *resolved, name)
            if os.path.islink(candidate):
                hops += 1
                if hops > 40:
                    raise OSError(errno.ELOOP, "too many levels of symbolic links", path)
                target = os.readlink(candidate)
                if target.startswith("/"):
                    resolved = []
                parts = [p for p in target.split("/") if p] + parts
                continue
            resolved.append(name)
        return os.path.join(self.root, *resolved)

    def read(self, path: str) -> Optional[bytes]:
        """The bytes of a regular file, or None when it is missing (or not a file)."""
        host = self.host(path)
        if host in self.overlay:
            return self.overlay[host]
        try:
            with open(host, "rb") as f:
                if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    return None
                return f.read()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None

    def read_text(self, path: str) -> Optional[str]:
        data = self.read(path)
        return None if data is None else data.decode("utf-8", "surrogateescape")

    def listdir(self, path: str) -> List[str]:
        host = self.host(path)
        try:
            names = set(os.listdir(host))
        except (FileNotFoundError, NotADirectoryError):
            names = set()
        for h, data in self.overlay.items():
            if os.path.dirname(h) == host:
                if data is None:
                    names.discard(os.path.basename(h))
                else:
                    names.add(os.path.basename(h))
        return sorted(names)

    def is_masked(self, path: str) -> bool:
        """A unit symlinked to /dev/null."""
        host = os.path.join(self.root, path.lstrip("/"))
        return os.path.islink(host) and os.readlink(host) == "/dev/null"


def _text(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


def _bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def _sha(data: Optional[bytes]) -> Optional[str]:
    return None if data is None else hashlib.sha256(data).hexdigest()


def _packaged(path: str) -> bool:
    return path.startswith(PACKAGED_PREFIXES)


# -- systemd unit and environment files ------------------------------------------------


class Setting(NamedTuple):
    """One ``[Service]`` assignment of a unit file and its raw span in that file."""

    key: str
    value: str
    path: str
    start: int
    end: int


class Origin(NamedTuple):
    """Where a word of the kubelet's command line was written: the span to edit."""

    kind: str            # "ExecStart" | "Environment" | "EnvironmentFile"
    path: str
    var: Optional[str]
    start: int
    end: int

    def describe(self) -> str:
        if self.kind == "ExecStart":
            return f"ExecStart= in {self.path}"
        if self.kind == "Environment":
            return f"{self.var} (Environment=) in {self.path}"
        return f"{self.var} in {self.path}"


class Word(NamedTuple):
    text: str
    origin: Origin


def _lines(text: str) -> Iterator[Tuple[int, str, int]]:
    """(start, line without its newline, end after the newline) for every line."""
    pos = 0
    n = len(text)
    while pos < n:
        nl = text.find("\n", pos)
        end = n if nl < 0 else nl + 1
        yield pos, text[pos:end].rstrip("\n"), end
        pos = end


def parse_unit(text: str, path: str) -> List[Setting]:
    """The ``[Service]`` settings of a unit file or drop-in, as systemd reads them.

    Comment lines start with ``#`` or ``;``; a line ending in a backslash continues on the
    next one (the backslash becomes a space; comment lines in between are skipped).
    """
    lines = list(_lines(text))
    out: List[Setting] = []
    section = ""
    i = 0
    while i < len(lines):
        start, line, end = lines[i]
        i += 1
        stripped = line.strip()
        if not stripped or stripped[0] in "#;":
            continue
        if stripped.startswith("[") and "]" in stripped:
            section = stripped[1:stripped.index("]")]
            continue
        body = line.rstrip()
        while body.endswith("\\") and i < len(lines):
            body = body[:-1] + " "
            while i < len(lines):
                _, nxt, end = lines[i]
                i += 1
                if nxt.strip()[:1] in ("#", ";"):
                    continue
                body += nxt.rstrip()
                break
        if section != "Service" or "=" not in body:
            continue
        key, value = body.split("=", 1)
        out.append(Setting(key.strip(), value.strip(), path, start, end))
    return out


def split_words(s: str) -> List[str]:
    """Split a command line or ``Environment=`` value the way systemd does (quotes, escapes)."""
    words: List[str] = []
    cur: List[str] = []
    in_word = False
    i = 0
    n = len(s)
    while i < n:
        c = s[i]
        if c in " \t\r\n":
            if in_word:
                words.append("".join(cur))
                cur = []
                in_word = False
            i += 1
            continue
        in_word = True
        if c == "\\" and i + 1 < n:
            cur.append(s[i + 1])
            i += 2
            continue
        if c in "'\"":
            i += 1
            while i < n and s[i] != c:
                if c == '"' and s[i] == "\\" and i + 1 < n:
                    cur.append(s[i + 1])
                    i += 2
                    continue
                cur.append(s[i])
                i += 1
            i += 1
            continue
        cur.append(c)
        i += 1
    if in_word:
        words.append("".join(cur))
    return words


class EnvAssignment(NamedTuple):
    key: str
    value: str
    start: int   # the key's first character
    end: int     # the newline (or end of file) that ends the value


def parse_env_file(text: str) -> List[EnvAssignment]:
    """The assignments of an ``EnvironmentFile=``, with systemd's rules.

    ``KEY=value`` per line; ``#``/``;`` comments; single quotes literal; double quotes with
    backslash escapes and newlines inside; quoted parts concatenate (so Fedora's triple quotes work);
    a backslash-newline continues an unquoted value; unquoted trailing blanks are dropped.
    """
    out: List[EnvAssignment] = []
    n = len(text)
    i = 0
    while i < n:
        c = text[i]
        if c in " \t\r\n":
            i += 1
            continue
        if c in "#;":
            while i < n and text[i] != "\n":
                i += 2 if text[i] == "\\" else 1
            continue
        start = i
        while i < n and text[i] not in "=\n":
            i += 1
        if i >= n or text[i] == "\n":
            continue  # a line without '=' is ignored
        key = text[start:i].strip()
        i += 1
        value: List[str] = []
        keep = 0          # length of value without unquoted trailing blanks
        state = "pre"     # "pre": before a (next) part; "plain": inside an unquoted part
        while i < n:
            c = text[i]
            if c == "\n":
                break
            if c == "\\":
                if i + 1 < n and text[i + 1] == "\n":
                    i += 2
                    continue
                if i + 1 < n:
                    value.append(text[i + 1])
                    keep = len(value)
                i += 2
                state = "plain"
                continue
            if state == "pre" and c in " \t\r":
                i += 1
                continue
            if state == "pre" and c == "'":
                j = text.find("'", i + 1)
                j = n if j < 0 else j
                value.append(text[i + 1:j])
                keep = len(value)
                i = j + 1
                continue
            if state == "pre" and c == '"':
                i += 1
                while i < n and text[i] != '"':
                    if text[i] == "\\" and i + 1 < n:
                        nxt = text[i + 1]
                        if nxt != "\n":
                            value.append(nxt if nxt in '"\\`$' else "\\" + nxt)
                        i += 2
                        continue
                    value.append(text[i])
                    i += 1
                i += 1
                keep = len(value)
                continue
            state = "plain"
            value.append(c)
            if c not in " \t\r":
                keep = len(value)
            i += 1
        if re.fullmatch(_NAME, key):
            out.append(EnvAssignment(key, "".join(value[:keep]), start, i))
    return out


# -- what the kubelet will use ---------------------------------------------------------


@dataclass
class Source:
    """One place that sets the endpoint."""

    kind: str                  # "flag" | "config-dir" | "config" | "default"
    endpoint: str
    path: Optional[str] = None
    detail: str = ""

    def describe(self) -> str:
        if self.kind == "flag":
            return f"flag {FLAG} in {self.detail}"
        if self.kind in ("config", "config-dir"):
            what = "config file" if self.kind == "config" else "config drop-in"
            return f"{KEY} in {what} {self.path}"
        return "the kubelet's built-in default"

    def as_dict(self) -> Dict[str, Any]:
        return {"kind": self.kind, "endpoint": self.endpoint, "path": self.path,
                "detail": self.describe()}


@dataclass
class FlagHit:
    value: str
    origin: Origin


@dataclass
class KubeletView:
    """How the kubelet on a node will be started, and the endpoint it will use."""

    unit: Optional[str] = None
    masked: bool = False
    dropins: List[str] = field(default_factory=list)
    exec_start: Optional[Setting] = None
    env: Dict[str, Tuple[str, Origin]] = field(default_factory=dict)
    env_files: List[str] = field(default_factory=list)
    words: List[Word] = field(default_factory=list)
    flags: List[FlagHit] = field(default_factory=list)
    config_path: Optional[str] = None
    config_note: str = ""
    config_text: Optional[str] = None
    config_data: Optional[Dict[str, Any]] = None
    config_error: Optional[str] = None
    config_dir: Optional[str] = None
    config_dir_files: List[Tuple[str, Dict[str, Any]]] = field(default_factory=list)
    sources: List[Source] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)

    @property
    def effective(self) -> Source:
        return self.sources[0]

    def args_without_endpoint(self) -> List[str]:
        """The command line without the endpoint flag and its value."""
        out: List[str] = []
        skip = False
        for w in self.words:
            if skip:
                skip = False
                continue
            if w.text == FLAG:
                skip = True
                continue
            if w.text.startswith(FLAG + "="):
                continue
            out.append(w.text)
        return out


def _flag_values(words: Sequence[Word], name: str) -> List[Tuple[str, Origin]]:
    """Every value given to ``name`` (``--name=v`` or ``--name v``), in command-line order."""
    out: List[Tuple[str, Origin]] = []
    i = 1  # words[0] is the program
    while i < len(words):
        text = words[i].text
        if text == "--":
            break
        if text == name and i + 1 < len(words):
            out.append((words[i + 1].text, words[i].origin))
            i += 2
            continue
        if text.startswith(name + "="):
            out.append((text[len(name) + 1:], words[i].origin))
        i += 1
    return out


def _load_yaml(text: str) -> Dict[str, Any]:
    import yaml  # a dependency of the package; imported late to keep `--help` fast

    data = yaml.safe_load(text)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError("not a mapping")
    return data


def _find_unit(root: Root) -> Tuple[Optional[str], bool]:
    for d in UNIT_DIRS:
        path = f"{d}/{UNIT_NAME}"
        if root.is_masked(path):
            return None, True
        if root.read(path) is not None:
            return path, False
    return None, False


def _find_dropins(root: Root) -> List[str]:
    chosen: Dict[str, str] = {}
    for d in reversed(UNIT_DIRS):  # a higher-priority directory replaces a same-named file
        for name in root.listdir(f"{d}/{UNIT_NAME}.d"):
            if name.endswith(".conf"):
                chosen[name] = f"{d}/{UNIT_NAME}.d/{name}"
    return [chosen[n] for n in sorted(chosen)]


def _env_file_paths(root: Root, pattern: str) -> List[str]:
    if not any(c in pattern for c in "*?["):
        return [pattern]
    d, base = os.path.split(pattern)
    return [f"{d}/{n}" for n in root.listdir(d) if fnmatch.fnmatchcase(n, base)]


def _expand(exec_start: Setting, env: Dict[str, Tuple[str, Origin]]) -> List[Word]:
    origin = Origin("ExecStart", exec_start.path, None, exec_start.start, exec_start.end)
    words: List[Word] = []
    for w in split_words(exec_start.value.lstrip("-@:+!")):
        m = _VAR_WORD.fullmatch(w)
        if m:
            if m.group(1) in env:
                value, var_origin = env[m.group(1)]
                words.extend(Word(x, var_origin) for x in split_words(value))
            continue  # an unset $VAR disappears
        text = _VAR_REF.sub(lambda r: "$" if r.group(0) == "$$" else env.get(r.group(1), ("", None))[0], w)
        words.append(Word(text, origin))
    return words


def inspect(root: Root) -> KubeletView:
    """Read the kubelet's unit, drop-ins, environment and config files below ``root``."""
    view = KubeletView()
    view.unit, view.masked = _find_unit(root)
    if view.masked:
        view.notes.append(f"{UNIT_NAME} is masked")
    settings: List[Setting] = []
    if view.unit is not None:
        view.dropins = _find_dropins(root)
        for path in [view.unit] + view.dropins:
            text = root.read_text(path)
            if text is not None:
                settings.extend(parse_unit(text, path))
    environment: Dict[str, Tuple[str, Origin]] = {}
    env_files: List[str] = []
    for st in settings:
        if st.key == "ExecStart":
            view.exec_start = st if st.value else None
        elif st.key == "Environment":
            if not st.value:
                environment.clear()
            for word in split_words(st.value):
                if "=" in word:
                    k, v = word.split("=", 1)
                    if re.fullmatch(_NAME, k):
                        environment[k] = (v, Origin("Environment", st.path, k, st.start, st.end))
        elif st.key == "EnvironmentFile":
            if not st.value:
                env_files = []
            else:
                env_files.extend(_env_file_paths(root, st.value.lstrip("-")))
    view.env_files = env_files
    env = dict(environment)
    for path in env_files:  # an environment file overrides Environment=, later files earlier ones
        text = root.read_text(path)
        if text is None:
            continue
        for a in parse_env_file(text):
            env[a.key] = (a.value, Origin("EnvironmentFile", path, a.key, a.start, a.end))
    view.env = env
    if view.exec_start is not None:
        view.words = _expand(view.exec_start, env)
    view.flags = [FlagHit(v, o) for v, o in _flag_values(view.words, FLAG)]

    configs = _flag_values(view.words, CONFIG_FLAG)
    if configs:
        view.config_path = configs[-1][0]
        view.config_note = f"{CONFIG_FLAG} in {configs[-1][1].describe()}"
    elif view.unit is None and root.read(DEFAULT_KUBELET_CONFIG) is not None:
        view.config_path = DEFAULT_KUBELET_CONFIG
        view.config_note = f"no {UNIT_NAME} found: assumed the kubeadm default"
    if view.config_path is not None:
        view.config_text = root.read_text(view.config_path)
        if view.config_text is None:
            view.config_error = "missing"
        else:
            try:
                view.config_data = _load_yaml(view.config_text)
            except Exception as e:
                view.config_error = f"unreadable: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
        if view.config_error:
            view.notes.append(f"kubelet config file {view.config_path} is {view.config_error}")
    config_dirs = _flag_values(view.words, CONFIG_DIR_FLAG)
    if config_dirs:
        view.config_dir = config_dirs[-1][0].rstrip("/") or "/"
        for name in root.listdir(view.config_dir):
            if not name.endswith(".conf"):
                continue
            path = f"{view.config_dir}/{name}"
            text = root.read_text(path)
            if text is None:
                continue
            try:
                view.config_dir_files.append((path, _load_yaml(text)))
            except Exception:
                view.notes.append(f"kubelet config drop-in {path} is unreadable")

    for hit in reversed(view.flags):
        view.sources.append(Source("flag", hit.value, hit.origin.path, hit.origin.describe()))
    for path, data in reversed(view.config_dir_files):
        if isinstance(data.get(KEY), str):
            view.sources.append(Source("config-dir", data[KEY], path))
    if view.config_data is not None and isinstance(view.config_data.get(KEY), str):
        view.sources.append(Source("config", view.config_data[KEY], view.config_path))
    view.sources.append(Source("default", DEFAULT_ENDPOINT))
    return view


@dataclass
class CgroupSetting:
    """One of the kubelet's cgroup settings (``cgroupRoot``, ``cgroupDriver``): its value,
    or ``None`` when nothing sets it (the kubelet's default applies), and where it came from."""

    value: Optional[str]
    origin: str


def cgroup_settings(view: KubeletView) -> Dict[str, CgroupSetting]:
    """``{"root": ..., "driver": ...}`` as the kubelet will take them: a flag
    (``--cgroup-root``, ``--cgroup-driver``, the last one given) over the last
    ``--config-dir`` file that sets the key, over the ``--config`` file; ``None`` values
    when none sets it (kubelet defaults: root ``/``, driver ``cgroupfs``)."""
    out: Dict[str, CgroupSetting] = {}
    for what, flag, key in (("root", "--cgroup-root", "cgroupRoot"), ("driver", "--cgroup-driver", "cgroupDriver")):
        hits = _flag_values(view.words, flag)
        if hits:
            out[what] = CgroupSetting(hits[-1][0], f"flag {flag} in {hits[-1][1].describe()}")
            continue
        found = None
        for path, data in reversed(view.config_dir_files):
            if isinstance(data.get(key), str):
                found = CgroupSetting(data[key], f"{key} in config drop-in {path}")
                break
        if found is None and view.config_data is not None and isinstance(view.config_data.get(key), str):
            found = CgroupSetting(view.config_data[key], f"{key} in config file {view.config_path}")
        out[what] = found or CgroupSetting(None, "the kubelet's built-in default")
    return out


def socket_of(endpoint: str) -> Optional[str]:
    """The unix socket path of an endpoint, normalised (``/var/run`` is ``/run``)."""
    e = endpoint.strip()
    if e.startswith("unix://"):
        e = e[len("unix://"):]
    elif "://" in e:
        return None
    if not e.startswith("/"):
        return None
    e = os.path.normpath(e)
    if e == "/var/run" or e.startswith("/var/run/"):
        e = e[len("/var"):]
    return e


def same_socket(endpoint: str, socket_path: str) -> bool:
    a, b = socket_of(endpoint), socket_of(socket_path)
    return a is not None and a == b


# -- probing our socket, the kubelet binary ---------------------------------------------


def probe_socket(path: str, timeout: float = 3.0) -> Tuple[bool, str]:
    """(answers, detail): whether a CRI ``Version`` call on the unix socket succeeds."""
    try:
        st = os.stat(path)
    except OSError as e:
        return False, f"no socket at {path} ({e.strerror})"
    if not stat.S_ISSOCK(st.st_mode):
        return False, f"{path} is not a socket"
    from anolisnuma.cri.client import CallError, CriClient

    try:
        with CriClient(path, timeout_seconds=timeout) as client:
            reply = client.version()
    except CallError as e:
        return False, f"Version failed: {e.code().name}: {e.details()}"
    return True, f"{reply.runtime_name} {reply.runtime_version} (CRI {reply.runtime_api_version})"


def parse_version(text: str) -> Optional[Tuple[int, int]]:
    m = re.search(r"v?(\d+)\.(\d+)", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def detect_kubelet_version(root: Root, view: KubeletView) -> Optional[Tuple[int, int]]:
    """The kubelet's minor version from ``kubelet --version``, on a live node only."""
    if root.root != "/":
        return None
    binary = "/usr/bin/kubelet"
    if view.words and os.path.basename(view.words[0].text) == "kubelet" and view.words[0].text.startswith("/"):
        binary = view.words[0].text
    if not os.access(binary, os.X_OK):
        return None
    try:
        proc = subprocess.run([binary, "--version"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              universal_newlines=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"Kubernetes v(\d+)\.(\d+)", proc.stdout)
    return (int(m.group(1)), int(m.group(2))) if m else None


# -- planning edits --------------------------------------------------------------------


@dataclass
class Edit:
    """One file as ``enable`` would write it."""

    path: str
    before: Optional[bytes]
    after: bytes
    what: str
    unit: bool = False
    undo: Dict[str, Any] = field(default_factory=dict)


def _unquote(v: str) -> str:
    return v[1:-1] if len(v) >= 2 and v[0] == v[-1] and v[0] in "\"'" else v


def _rewrite_flag_values(text: str, spans: Sequence[Tuple[int, int]], new: str) -> Tuple[str, List[str]]:
    """Replace every endpoint flag value inside the spans; the old values, in order."""
    previous: List[str] = []
    for start, end in sorted(set(spans), reverse=True):
        found: List[str] = []

        def sub(m: "re.Match[str]") -> str:
            value = m.group("val")
            quote = value[0] if value[0] in "\"'" else ""
            found.append(_unquote(value))
            return m.group("flag") + m.group("sep") + quote + new + quote

        text = text[:start] + _FLAG_VALUE.sub(sub, text[start:end]) + text[end:]
        previous = found + previous
    return text, previous


def _plan_flag_rewrite(root: Root, view: KubeletView, endpoint: str) -> Optional[List[Edit]]:
    by_path: Dict[str, List[FlagHit]] = {}
    for hit in view.flags:
        if _packaged(hit.origin.path):
            return None
        by_path.setdefault(hit.origin.path, []).append(hit)
    edits = []
    for path, hits in by_path.items():
        before = root.read(path)
        if before is None:
            return None
        after, previous = _rewrite_flag_values(_text(before), [(h.origin.start, h.origin.end) for h in hits], endpoint)
        if not previous:
            return None
        where = ", ".join(sorted({h.origin.describe() for h in hits}))
        old = ", ".join(dict.fromkeys(previous))
        edits.append(Edit(path, before, _bytes(after), f"{FLAG} in {where}: {old} -> {endpoint}",
                          unit=any(h.origin.kind != "EnvironmentFile" for h in hits),
                          undo={"kind": "flag", "previous": previous}))
    return edits


def _yaml_value_span(line: str, colon: int) -> Tuple[int, int, str]:
    """(start, end, quote) of the scalar after ``key:`` on a YAML line; an empty span if none."""
    i = colon + 1
    while i < len(line) and line[i] in " \t":
        i += 1
    if i >= len(line) or line[i] == "#":
        return i, i, ""
    q = line[i]
    if q in "\"'":
        j = i + 1
        while j < len(line):
            if q == '"' and line[j] == "\\":
                j += 2
                continue
            if line[j] == q:
                if q == "'" and j + 1 < len(line) and line[j + 1] == "'":
                    j += 2
                    continue
                return i, j + 1, q
            j += 1
        return i, len(line), q
    m = re.search(r"[ \t]#", line[i:])
    end = i + (m.start() if m else len(line) - i)
    while end > i and line[end - 1] in " \t\r":
        end -= 1
    return i, end, ""


def _plan_yaml(root: Root, path: str, endpoint: str, add: bool) -> Optional[List[Edit]]:
    """Set ``containerRuntimeEndpoint`` with a one-line textual edit, checked with PyYAML."""
    if _packaged(path):
        return None
    before = root.read(path)
    if before is None:
        return None
    text = _text(before)
    try:
        old_data = _load_yaml(text)
    except Exception:
        return None
    key_lines = [(s, line, e) for s, line, e in _lines(text) if re.match(re.escape(KEY) + r"[ \t]*:", line)]
    if key_lines:
        previous: List[str] = []
        for s, line, e in reversed(key_lines):
            colon = line.index(":")
            a, b, quote = _yaml_value_span(line, colon)
            previous.insert(0, line[a:b])
            value = quote + endpoint + quote
            if a == b:
                value = (" " if a == colon + 1 else "") + value + (" " if a < len(line) else "")
            text = text[:s] + line[:a] + value + line[b:] + text[s + len(line):]
        undo: Dict[str, Any] = {"kind": "yaml-value", "previous": previous}
        what = f"{KEY} in {path}: {', '.join(_unquote(p) for p in previous)} -> {endpoint}"
    elif add:
        newline = "\r\n" if "\r\n" in text else "\n"
        added = f"{KEY}: {endpoint}{newline}"
        if text and not text.endswith("\n"):
            added = newline + added
        text += added
        undo = {"kind": "yaml-added", "text": added}
        what = f"{KEY} in {path}: added {endpoint}"
    else:
        return None
    try:
        new_data = _load_yaml(text)
    except Exception:
        return None
    expected = dict(old_data)
    expected[KEY] = endpoint
    if new_data != expected:
        return None
    return [Edit(path, before, _bytes(text), what, undo=undo)]


def _plan_env_append(root: Root, view: KubeletView, endpoint: str) -> Optional[List[Edit]]:
    """Append the flag to the last ``$VAR`` of ExecStart= set in an editable environment file."""
    if view.exec_start is None:
        return None
    names = [m.group(1) for m in (_VAR_WORD.fullmatch(w) for w in split_words(view.exec_start.value)) if m]
    for name in reversed(names):
        if name not in view.env:
            continue
        _, origin = view.env[name]
        if origin.kind != "EnvironmentFile" or _packaged(origin.path):
            continue
        before = root.read(origin.path)
        if before is None:
            continue
        text = _text(before)
        body = text[origin.start:origin.end].rstrip(" \t\r")
        # Inside the value's last quoted part when it ends with one, else after the value.
        at = len(body) - 1 if body[-1:] in ("\"", "'") and body[-2:-1] != "\\" else len(body)
        inserted = ("" if view.env[name][0] == "" else " ") + f"{FLAG}={endpoint}"
        pos = origin.start + at
        after = text[:pos] + inserted + text[pos:]
        return [Edit(origin.path, before, _bytes(after), f"{FLAG} in {name} in {origin.path}: added {endpoint}",
                     undo={"kind": "flag-added", "text": inserted})]
    return None


def _plan_dropin(root: Root, view: KubeletView, endpoint: str) -> Optional[List[Edit]]:
    """A drop-in that repeats ExecStart= with the endpoint replaced or appended."""
    if view.exec_start is None:
        return None
    raw = view.exec_start.value
    new_raw, previous = _rewrite_flag_values(raw, [(0, len(raw))], endpoint)
    if not previous:
        new_raw = raw.rstrip() + f" {FLAG}={endpoint}"
    content = (
        "# Written by `anolisnuma-ctl kubelet enable`, removed by `anolisnuma-ctl kubelet disable`.\n"
        f"# The kubelet's command line from {view.exec_start.path}, its CRI endpoint pointed at\n"
        "# anolisnuma (when a flag is given twice, the last one wins).\n"
        "[Service]\n"
        "ExecStart=\n"
        f"ExecStart={new_raw}\n")
    before = root.read(DROPIN)
    return [Edit(DROPIN, before, _bytes(content), f"drop-in {DROPIN}: ExecStart= with {FLAG}={endpoint}",
                 unit=True, undo={"kind": "created" if before is None else "replaced"})]


def _config_values(root: Root, view: KubeletView) -> Dict[str, Dict[str, Any]]:
    out: Dict[str, Dict[str, Any]] = {}
    if view.config_path and view.config_data is not None:
        out[view.config_path] = {k: v for k, v in view.config_data.items() if k != KEY}
    for path, data in view.config_dir_files:
        out[path] = {k: v for k, v in data.items() if k != KEY}
    return out


def _check(root: Root, view: KubeletView, edits: List[Edit], endpoint: str) -> Optional[str]:
    """Why the edits would not do exactly the switch (None: they would)."""
    after = inspect(root.with_overlay({root.host(e.path): e.after for e in edits}))
    if not same_socket(after.effective.endpoint, endpoint):
        return f"the kubelet would still use {after.effective.endpoint} ({after.effective.describe()})"
    if after.args_without_endpoint() != view.args_without_endpoint():
        return "the kubelet's other arguments would change"
    if _config_values(root, after) != _config_values(root, view):
        return "the kubelet's other config values would change"
    return None


def plan_enable(root: Root, view: KubeletView, endpoint: str,
                kubelet_version: Optional[Tuple[int, int]]) -> Tuple[str, List[Edit]]:
    """(method, edits): the smallest change that makes the kubelet use ``endpoint``."""
    candidates: List[Tuple[str, Any]] = []
    if view.flags:
        candidates.append(("flag", lambda: _plan_flag_rewrite(root, view, endpoint)))
    else:
        setters = [p for p, data in view.config_dir_files if isinstance(data.get(KEY), str)]
        if setters:
            candidates.append(("config-dir", lambda: _plan_yaml(root, setters[-1], endpoint, add=False)))
        elif view.config_path and view.config_data is not None:
            knows_key = (KEY in view.config_data
                         or (kubelet_version is not None and kubelet_version >= MIN_CONFIG_KEY_VERSION))
            candidates.append(("config", lambda: _plan_yaml(root, view.config_path, endpoint, add=knows_key)))
    candidates.append(("env-append", lambda: _plan_env_append(root, view, endpoint)))
    candidates.append(("dropin", lambda: _plan_dropin(root, view, endpoint)))
    reasons = []
    for method, make in candidates:
        edits = make()
        if not edits:
            continue
        problem = _check(root, view, edits, endpoint)
        if problem is None:
            return method, edits
        reasons.append(f"{method}: {problem}")
    detail = "; ".join(reasons) if reasons else f"no {UNIT_NAME} with ExecStart= and no kubelet config file found"
    raise CtlError(f"cannot find a safe way to point the kubelet at {endpoint} ({detail}); "
                   f"set {FLAG} or {KEY} by hand")


# -- writing ---------------------------------------------------------------------------


def atomic_write(host_path: str, data: bytes, mode: Optional[int] = None) -> None:
    """Replace a file atomically, keeping the mode and owner of the file it replaces."""
    directory = os.path.dirname(host_path)
    try:
        old: Optional[os.stat_result] = os.stat(host_path)
    except FileNotFoundError:
        old = None
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(host_path) + ".", suffix=".anolisnuma-tmp",
                               dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if old is not None:
                os.fchmod(f.fileno(), stat.S_IMODE(old.st_mode) if mode is None else mode)
                with contextlib.suppress(PermissionError):
                    os.fchown(f.fileno(), old.st_uid, old.st_gid)
            else:
                os.fchmod(f.fileno(), 0o644 if mode is None else mode)
            os.fsync(f.fileno())
        os.replace(tmp, host_path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(directory)


def _fsync_dir(directory: str) -> None:
    with contextlib.suppress(OSError):
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def _makedirs(root: Root, path: str, mode: int = 0o755) -> List[str]:
    """Create a node directory (``mode``) and its missing parents (0755); the node paths created."""
    missing: List[str] = []
    p = path.rstrip("/")
    while p and not os.path.isdir(root.host(p)):
        missing.append(p)
        p = os.path.dirname(p)
    created: List[str] = []
    for p in reversed(missing):
        os.mkdir(root.host(p), mode if p == path.rstrip("/") else 0o755)
        created.append(p)
    return created


@contextlib.contextmanager
def _locked(root: Root, wait: float = 10.0) -> Iterator[None]:
    """One ``anolisnuma-ctl kubelet`` changing a root at a time (flock on the root itself)."""
    fd = os.open(root.root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise CtlError("another anolisnuma-ctl kubelet is changing this node; try again")
                time.sleep(0.1)
        yield
    finally:
        os.close(fd)


class Backups:
    """The backup directory: original files and ``manifest.json``."""

    def __init__(self, root: Root) -> None:
        self.root = root
        self.created: List[str] = []   # directories made by this run, outside the backup dir

    def _ensure(self, directory: str) -> None:
        for d in _makedirs(self.root, directory, 0o700):
            if not (d + "/").startswith(BACKUP_DIR + "/"):
                self.created.append(d)

    def load(self) -> Optional[Dict[str, Any]]:
        data = self.root.read(MANIFEST)
        if data is None:
            return None
        try:
            manifest = json.loads(data.decode("utf-8"))
        except ValueError:
            raise CtlError(f"{MANIFEST} is not valid JSON; restore the files it lists by hand")
        if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
            raise CtlError(f"{MANIFEST} has an unknown format")
        return manifest

    def save(self, manifest: Dict[str, Any]) -> None:
        self._ensure(BACKUP_DIR)
        dirs = manifest.setdefault("created_dirs", [])
        dirs.extend(d for d in self.created if d not in dirs)
        atomic_write(self.root.host(MANIFEST), _bytes(json.dumps(manifest, indent=2, sort_keys=True) + "\n"), 0o600)

    def store(self, path: str, data: bytes) -> str:
        backup = BACKUP_DIR + "/files" + path
        self._ensure(os.path.dirname(backup))
        atomic_write(self.root.host(backup), data, 0o600)
        return backup

    def remove(self, manifest: Dict[str, Any]) -> None:
        host = self.root.host(BACKUP_DIR)
        for dirpath, dirnames, filenames in os.walk(host, topdown=False):
            for name in filenames:
                os.unlink(os.path.join(dirpath, name))
            for name in dirnames:
                os.rmdir(os.path.join(dirpath, name))
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(host)
        for d in sorted(manifest.get("created_dirs", []), key=len, reverse=True):
            with contextlib.suppress(OSError):
                os.rmdir(self.root.host(d))


# -- the three commands ----------------------------------------------------------------


@dataclass
class Outcome:
    code: int
    lines: List[str]
    changed: List[str] = field(default_factory=list)
    unit_changed: bool = False


@dataclass
class Ours:
    """anolisnuma as the switch sees it: its socket and, when its config was read, the
    runtime socket it forwards to."""

    socket: str
    runtime: Optional[str] = None
    config: Optional[str] = None


def resolve_ours(root: Root, socket: Optional[str] = None, anolisnuma_config: Optional[str] = None) -> Ours:
    """Our socket: ``--socket``, else ``server.listen`` of the anolisnuma config (``--anolisnuma-config``,
    else /etc/anolisnuma/config.toml below the root when present), else the default."""
    path: Optional[str] = None
    if socket:
        path = socket[len("unix://"):] if socket.startswith("unix://") else socket
        if not path.startswith("/"):
            raise CtlError(f"--socket must be an absolute unix socket path; got {socket!r}")
    config = anolisnuma_config
    if config is None and os.path.isfile(root.host(DEFAULT_ANOLISNUMA_CONFIG)):
        config = root.host(DEFAULT_ANOLISNUMA_CONFIG)
    if config is None:
        return Ours(path or DEFAULT_SOCKET)
    try:
        from anolisnuma.config import Config

        cfg = Config.load(config)
    except Exception as e:
        if path is not None and anolisnuma_config is None:
            return Ours(path)  # the socket was given; the config was only a hint
        raise CtlError(f"cannot read the anolisnuma config {config}: {e}"
                       + ("" if path else "; pass --socket"))
    return Ours(path or str(cfg.server.listen), str(cfg.runtime.endpoint), config)


def status(root: Root, socket: str, timeout: float = 3.0, runtime: Optional[str] = None) -> Dict[str, Any]:
    """What the kubelet will use, from where, and whether that is our answering socket."""
    view = inspect(root)
    eff = view.effective
    answers, detail = probe_socket(socket, timeout)
    manifest = Backups(root).load()
    ours = same_socket(eff.endpoint, socket)
    warnings = list(view.notes)
    if view.unit is None and not view.masked:
        warnings.append(f"no {UNIT_NAME} found below {root.root}")
    if manifest is not None and not ours:
        warnings.append("switched by `enable` but the kubelet no longer points at anolisnuma (a file was "
                        "rewritten since, e.g. by kubeadm upgrade): run `enable` again")
    if runtime is not None and not ours and not same_socket(eff.endpoint, runtime):
        warnings.append(f"anolisnuma forwards to {runtime}, not to the kubelet's runtime: "
                        f"`enable` refuses until runtime.endpoint matches")
    if ours and not answers:
        warnings.append("the kubelet points at anolisnuma but anolisnuma does not answer: "
                        "the kubelet's CRI calls fail")
    return {
        "endpoint": eff.endpoint,
        "source": eff.as_dict(),
        "ours": ours,
        "socket": socket,
        "socket_answers": answers,
        "socket_detail": detail,
        "runtime": runtime,
        "overridden": [s.as_dict() for s in view.sources[1:] if s.kind != "default"],
        "unit": view.unit,
        "dropins": view.dropins,
        "environment_files": view.env_files,
        "config_file": view.config_path,
        "config_file_note": view.config_note,
        "config_dir": view.config_dir,
        "switched": manifest is not None,
        "backup_dir": BACKUP_DIR if manifest is not None else None,
        "switched_files": [e["path"] for e in manifest.get("files", [])] if manifest else [],
        "cgroups": {k: {"value": v.value, "origin": v.origin} for k, v in cgroup_settings(view).items()},
        "warnings": warnings,
    }


def render_status(st: Dict[str, Any]) -> str:
    rows = [
        ("endpoint", st["endpoint"]),
        ("source", st["source"]["detail"]),
        ("ours", ("yes" if st["ours"] else "no") + f" (anolisnuma listens on {st['socket']})"),
        ("our socket", ("answers " if st["socket_answers"] else "does not answer: ") + st["socket_detail"]),
    ]
    if st.get("runtime"):
        rows.append(("forwards to", st["runtime"]))
    for s in st["overridden"]:
        rows.append(("overridden", f"{s['endpoint']} ({s['detail']})"))
    rows.append(("unit", " + ".join([st["unit"]] + st["dropins"]) if st["unit"] else "none found"))
    if st["config_file"]:
        rows.append(("config file", f"{st['config_file']} ({st['config_file_note']})"))
    if st["config_dir"]:
        rows.append(("config dir", st["config_dir"]))
    rows.append(("switched", f"yes, backup in {st['backup_dir']}: " + ", ".join(st["switched_files"])
                 if st["switched"] else "no"))
    for what, default in (("root", "/"), ("driver", "cgroupfs")):
        c = (st.get("cgroups") or {}).get(what) or {}
        rows.append((f"cgroup {what}", f"{c.get('value') or default} ({c.get('origin')})"))
    for w in st["warnings"]:
        rows.append(("warning", w))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def _merge_entry(manifest: Dict[str, Any], backups: Backups, edit: Edit) -> None:
    entries: List[Dict[str, Any]] = manifest.setdefault("files", [])
    old = next((e for e in entries if e["path"] == edit.path), None)
    if old is not None and _sha(edit.before) == old.get("written_sha256"):
        old["written_sha256"] = _sha(edit.after)   # our own earlier edit: the original stays
        old["unit"] = old.get("unit", False) or edit.unit
        return
    if old is not None:
        entries.remove(old)  # changed since: what is there now is the original to restore
    entry: Dict[str, Any] = {
        "path": edit.path,
        "created": edit.before is None,
        "original_sha256": _sha(edit.before),
        "written_sha256": _sha(edit.after),
        "unit": edit.unit,
        "what": edit.what,
        "undo": edit.undo,
        "backup": None,
    }
    if edit.before is not None:
        entry["backup"] = backups.store(edit.path, edit.before)
    entries.append(entry)


def enable(root: Root, socket: str, timeout: float = 3.0,
           kubelet_version: Optional[Tuple[int, int]] = None, runtime: Optional[str] = None) -> Outcome:
    """Point the kubelet at ``socket``; refuses while the socket does not answer Version.

    ``runtime`` is the socket anolisnuma forwards to (its ``runtime.endpoint``), when known:
    a kubelet that uses another runtime today is not switched (its pods would be lost).
    """
    answers, detail = probe_socket(socket, timeout)
    if not answers:
        raise CtlError(f"refusing to switch the kubelet: anolisnuma's socket {socket} does not answer "
                       f"CRI Version ({detail}); start anolisnuma first")
    endpoint = "unix://" + socket
    with _locked(root):
        view = inspect(root)
        if same_socket(view.effective.endpoint, socket):
            return Outcome(EXIT_OK, [f"the kubelet already uses {view.effective.endpoint} "
                                     f"({view.effective.describe()}); nothing changed"])
        if runtime is not None and not same_socket(view.effective.endpoint, runtime):
            raise CtlError(f"the kubelet uses {view.effective.endpoint} ({view.effective.describe()}) but "
                           f"anolisnuma forwards to {runtime}: switching would move the kubelet to another "
                           f"runtime; set runtime.endpoint in anolisnuma's config first")
        if kubelet_version is None:
            kubelet_version = detect_kubelet_version(root, view)
        method, edits = plan_enable(root, view, endpoint, kubelet_version)
        backups = Backups(root)
        manifest = backups.load() or {"format": MANIFEST_FORMAT, "files": [], "created_dirs": [],
                                      "previous": view.effective.as_dict()}
        manifest["endpoint"] = endpoint
        manifest["enabled_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        for edit in edits:
            if edit.before is None:
                for d in _makedirs(root, os.path.dirname(edit.path)):
                    manifest["created_dirs"].append(d)
            _merge_entry(manifest, backups, edit)
        backups.save(manifest)          # before any file changes: a crash leaves a full record
        for edit in edits:
            atomic_write(root.host(edit.path), edit.after)
    lines = [f"anolisnuma answers on {socket}: {detail}"]
    lines += [f"changed {e.what}" for e in edits]
    lines.append(f"previous endpoint {view.effective.endpoint} ({view.effective.describe()}); "
                 f"originals in {BACKUP_DIR}, `{PROG} disable` restores them")
    unit = any(e.unit for e in edits)
    lines.append("the kubelet uses the new endpoint once restarted: "
                 + ("systemctl daemon-reload && " if unit else "") + "systemctl restart kubelet")
    return Outcome(EXIT_OK, lines, [e.path for e in edits], unit)


def _undo_in_place(text: str, entry: Dict[str, Any], endpoint: str) -> Optional[str]:
    """Undo our edit in a file changed since: the text, or None when our edit is not found."""
    undo = entry.get("undo") or {}
    kind = undo.get("kind")
    if kind == "flag":
        previous = list(undo.get("previous") or [])
        if not previous:
            return None
        count = [0]

        def sub(m: "re.Match[str]") -> str:
            value = _unquote(m.group("val"))
            if not same_socket(value, endpoint):
                return m.group(0)
            old = previous[min(count[0], len(previous) - 1)]
            count[0] += 1
            quote = m.group("val")[0] if m.group("val")[0] in "\"'" else ""
            return m.group("flag") + m.group("sep") + quote + old + quote

        new = _FLAG_VALUE.sub(sub, text)
        return new if count[0] else None
    if kind in ("flag-added", "yaml-added"):
        added = undo.get("text", "")
        i = text.rfind(added) if added else -1
        return None if i < 0 else text[:i] + text[i + len(added):]
    if kind == "yaml-value":
        previous = list(undo.get("previous") or [])
        out = []
        done = 0
        for s, line, e in _lines(text):
            newline = text[s + len(line):e]
            if previous and re.match(re.escape(KEY) + r"[ \t]*:", line):
                a, b, _ = _yaml_value_span(line, line.index(":"))
                if same_socket(_unquote(line[a:b]), endpoint):
                    line = line[:a] + previous[min(done, len(previous) - 1)] + line[b:]
                    done += 1
            out.append(line + newline)
        return "".join(out) if done else None
    return None


def disable(root: Root, socket: Optional[str] = None) -> Outcome:
    """Undo ``enable``: originals back byte for byte, created files removed, backup dropped.

    Without a backup there is nothing to undo; when the kubelet points at anolisnuma
    (``socket``, or the default) all the same, that was done by hand: refused.
    """
    with _locked(root):
        backups = Backups(root)
        manifest = backups.load()
        if manifest is None:
            view = inspect(root)
            eff = view.effective
            if same_socket(eff.endpoint, socket or DEFAULT_SOCKET) or same_socket(eff.endpoint, DEFAULT_SOCKET):
                raise CtlError(f"the kubelet uses {eff.endpoint} ({eff.describe()}), not set by `{PROG} enable` "
                               f"(no {MANIFEST}); change it by hand")
            return Outcome(EXIT_OK, [f"nothing to restore: the kubelet uses {eff.endpoint} ({eff.describe()})"])
        endpoint = manifest.get("endpoint", "")
        lines: List[str] = []
        left: List[Dict[str, Any]] = []
        changed: List[str] = []
        unit = False
        for entry in reversed(manifest.get("files", [])):
            path = entry["path"]
            current = root.read(path)
            cur_sha = _sha(current)
            if entry.get("created"):
                if current is None:
                    continue
                if cur_sha == entry.get("written_sha256"):
                    os.unlink(root.host(path))
                    _fsync_dir(os.path.dirname(root.host(path)))
                    lines.append(f"removed {path}")
                    changed.append(path)
                    unit = unit or entry.get("unit", False)
                else:
                    lines.append(f"left {path}: changed since enable; remove it by hand")
                    left.append(entry)
                continue
            if current is None:
                lines.append(f"skipped {path}: it no longer exists")
                continue
            if cur_sha == entry.get("original_sha256"):
                continue  # never written (an interrupted enable) or already restored
            original = root.read(entry["backup"]) if entry.get("backup") else None
            if cur_sha == entry.get("written_sha256") and original is not None \
                    and _sha(original) == entry.get("original_sha256"):
                atomic_write(root.host(path), original)
                lines.append(f"restored {path}")
            else:
                undone = _undo_in_place(_text(current), entry, endpoint)
                if undone is None:
                    if endpoint and endpoint.split("://")[-1] in _text(current):
                        lines.append(f"left {path}: changed since enable and still names {endpoint}; "
                                     f"the original is {entry.get('backup')}")
                        left.append(entry)
                    else:
                        lines.append(f"left {path}: changed since enable, no longer names {endpoint}")
                    continue
                atomic_write(root.host(path), _bytes(undone))
                lines.append(f"undid the edit in {path} (it changed since enable, so it is not the "
                             f"byte-for-byte original)")
            changed.append(path)
            unit = unit or entry.get("unit", False)
        if left:
            manifest["files"] = [e for e in manifest["files"] if e in left]
            backups.save(manifest)
            lines.append(f"kept {MANIFEST} for what is left")
            return Outcome(EXIT_FAIL, lines, changed, unit)
        backups.remove(manifest)
        view = inspect(root)
    lines.append(f"the kubelet will use {view.effective.endpoint} ({view.effective.describe()})")
    if changed:
        lines.append("the kubelet uses it once restarted: "
                     + ("systemctl daemon-reload && " if unit else "") + "systemctl restart kubelet")
    return Outcome(EXIT_OK, lines, changed, unit)


# -- command line ----------------------------------------------------------------------


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``kubelet enable|disable|status`` on the main CLI's subparsers.

    The parser's default ``func`` is :func:`run` (``args.func(args)`` returns the exit code).
    """
    parser = subparsers.add_parser(
        "kubelet", help="point the kubelet at anolisnuma and back",
        description="Switch the kubelet's CRI endpoint to anolisnuma (enable), back (disable), "
                    "or show which endpoint it will use (status).")
    sub = parser.add_subparsers(dest="kubelet_command", metavar="{enable,disable,status}")
    sub.required = True

    def common(p: argparse.ArgumentParser, socket: bool) -> None:
        p.add_argument("--root", default="/", metavar="DIR",
                       help="the node's file system root (default /)")
        if socket:
            p.add_argument("--socket", metavar="PATH", dest="kubelet_socket", default=None,
                           help=f"anolisnuma's CRI socket (default: server.listen of "
                                f"{DEFAULT_ANOLISNUMA_CONFIG}, else {DEFAULT_SOCKET})")
            p.add_argument("--anolisnuma-config", metavar="FILE", dest="kubelet_anolisnuma_config", default=None,
                           help="read server.listen (our socket) and runtime.endpoint from this "
                                "anolisnuma config")
            p.add_argument("--timeout", type=float, default=3.0, dest="kubelet_timeout", metavar="SECONDS",
                           help="seconds to wait for the Version answer (default 3)")

    p = sub.add_parser("enable", help="point the kubelet at anolisnuma's socket")
    common(p, True)
    p.add_argument("--kubelet-version", metavar="X.Y", dest="kubelet_version", default=None,
                   help="the kubelet's version when it cannot be run here (>= 1.27 reads "
                        f"{KEY} from its config file)")
    p.add_argument("--restart", action="store_true", dest="kubelet_restart",
                   help="run systemctl daemon-reload/restart kubelet afterwards")
    p = sub.add_parser("disable", help="restore the kubelet's previous endpoint")
    common(p, True)
    p.add_argument("--restart", action="store_true", dest="kubelet_restart",
                   help="run systemctl daemon-reload/restart kubelet afterwards")
    p = sub.add_parser("status", help="which endpoint the kubelet will use, and from where")
    common(p, True)
    p.add_argument("-o", "--output", choices=("table", "json"), default=argparse.SUPPRESS,
                   help="table (default) or json")
    parser.set_defaults(func=run)
    return parser


def _restart(root: Root, unit_changed: bool, err: TextIO) -> int:
    if root.root != "/":
        print(f"{PROG}: --restart only works with --root /", file=err)
        return EXIT_FAIL
    commands = ([["systemctl", "daemon-reload"]] if unit_changed else []) + [["systemctl", "restart", "kubelet"]]
    for cmd in commands:
        try:
            proc = subprocess.run(cmd, timeout=120)
        except (OSError, subprocess.SubprocessError) as e:
            print(f"{PROG}: {' '.join(cmd)} failed: {e}", file=err)
            return EXIT_FAIL
        if proc.returncode != 0:
            print(f"{PROG}: {' '.join(cmd)} exited with {proc.returncode}", file=err)
            return EXIT_FAIL
    return EXIT_OK


def run(args: argparse.Namespace, out: Optional[TextIO] = None, err: Optional[TextIO] = None) -> int:
    """Run ``kubelet enable|disable|status``; the exit code."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        if not os.path.isdir(args.root):
            raise CtlError(f"--root {args.root} is not a directory")
        root = Root(args.root)
        command = args.kubelet_command
        if command == "status":
            ours = resolve_ours(root, args.kubelet_socket, args.kubelet_anolisnuma_config)
            st = status(root, ours.socket, args.kubelet_timeout, ours.runtime)
            if getattr(args, "output", "table") == "json":
                print(json.dumps(st, indent=2, sort_keys=True), file=out)
            else:
                print(render_status(st), file=out)
            return EXIT_OK
        if command == "enable":
            version = None
            if args.kubelet_version:
                version = parse_version(args.kubelet_version)
                if version is None:
                    raise CtlError(f"--kubelet-version must look like 1.29; got {args.kubelet_version!r}")
            ours = resolve_ours(root, args.kubelet_socket, args.kubelet_anolisnuma_config)
            outcome = enable(root, ours.socket, args.kubelet_timeout, version, ours.runtime)
        elif command == "disable":
            outcome = disable(root, resolve_ours(root, args.kubelet_socket, args.kubelet_anolisnuma_config).socket)
        else:  # pragma: no cover - argparse refuses others
            raise CtlError(f"unknown command {command!r}")
    except CtlError as e:
        print(f"{PROG}: {e}", file=err)
        return EXIT_FAIL
    except OSError as e:
        print(f"{PROG}: {e.filename or ''}{': ' if e.filename else ''}{e.strerror or e}", file=err)
        return EXIT_FAIL
    for line in outcome.lines:
        print(line, file=out)
    if outcome.code == EXIT_OK and outcome.changed and getattr(args, "kubelet_restart", False):
        return _restart(root, outcome.unit_changed, err)
    return outcome.code


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Standalone entry point: ``python -m anolisnuma.ctl.kubelet kubelet status``."""
    parser = argparse.ArgumentParser(prog="anolisnuma-ctl")
    add_parser(parser.add_subparsers(dest="command", metavar="kubelet"))
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_usage(sys.stderr)
        return 2
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
