"""How the kubelet on a node will be started, and the CRI endpoint it will use:
:func:`inspect` reads its unit, drop-ins, environment and config files into a
:class:`KubeletView`, the sources of the endpoint strongest first.

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

Nothing here writes: the planner inspects a root with its edits overlaid to check them,
and the daemon reads the kubelet's cgroup settings from the same view.
"""

from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from anolisnuma.ctl.kubelet.config_yaml import load_yaml
from anolisnuma.ctl.kubelet.env_file import parse_env_file
from anolisnuma.ctl.kubelet.names import (
    CONFIG_DIR_FLAG, CONFIG_FLAG, DEFAULT_ENDPOINT, DEFAULT_KUBELET_CONFIG, FLAG, KEY, UNIT_DIRS, UNIT_NAME)
from anolisnuma.ctl.kubelet.node_root import Root
from anolisnuma.ctl.kubelet.systemd_unit import (
    NAME, VAR_REF, VAR_WORD, Origin, Setting, Word, flag_values, parse_unit, split_words)


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
        m = VAR_WORD.fullmatch(w)
        if m:
            if m.group(1) in env:
                value, var_origin = env[m.group(1)]
                words.extend(Word(x, var_origin) for x in split_words(value))
            continue  # an unset $VAR disappears
        text = VAR_REF.sub(lambda r: "$" if r.group(0) == "$$" else env.get(r.group(1), ("", None))[0], w)
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
                    if re.fullmatch(NAME, k):
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
    view.flags = [FlagHit(v, o) for v, o in flag_values(view.words, FLAG)]

    configs = flag_values(view.words, CONFIG_FLAG)
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
                view.config_data = load_yaml(view.config_text)
            except Exception as e:
                view.config_error = f"unreadable: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
        if view.config_error:
            view.notes.append(f"kubelet config file {view.config_path} is {view.config_error}")
    config_dirs = flag_values(view.words, CONFIG_DIR_FLAG)
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
                view.config_dir_files.append((path, load_yaml(text)))
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
