"""The smallest change that points the kubelet at anolisnuma, found and checked before
anything is written.

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
argument and config value unchanged (:func:`plan_enable` tries each way in turn and keeps
the first that passes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from anolisnuma.ctl.kubelet.config_yaml import set_endpoint
from anolisnuma.ctl.kubelet.endpoints import same_socket
from anolisnuma.ctl.kubelet.flag_text import rewrite_flag_values
from anolisnuma.ctl.kubelet.names import DROPIN, FLAG, KEY, UNIT_NAME
from anolisnuma.ctl.kubelet.node_root import Root, is_packaged
from anolisnuma.ctl.kubelet.outcome import CtlError
from anolisnuma.ctl.kubelet.systemd_unit import VAR_WORD, split_words
from anolisnuma.ctl.kubelet.text import as_bytes, as_text
from anolisnuma.ctl.kubelet.view import FlagHit, KubeletView, inspect

MIN_CONFIG_KEY_VERSION = (1, 27)


@dataclass
class Edit:
    """One file as ``enable`` would write it."""

    path: str
    before: Optional[bytes]
    after: bytes
    what: str
    unit: bool = False
    undo: Dict[str, Any] = field(default_factory=dict)


def _plan_flag_rewrite(root: Root, view: KubeletView, endpoint: str) -> Optional[List[Edit]]:
    by_path: Dict[str, List[FlagHit]] = {}
    for hit in view.flags:
        if is_packaged(hit.origin.path):
            return None
        by_path.setdefault(hit.origin.path, []).append(hit)
    edits = []
    for path, hits in by_path.items():
        before = root.read(path)
        if before is None:
            return None
        after, previous = rewrite_flag_values(as_text(before), [(h.origin.start, h.origin.end) for h in hits], endpoint)
        if not previous:
            return None
        where = ", ".join(sorted({h.origin.describe() for h in hits}))
        old = ", ".join(dict.fromkeys(previous))
        edits.append(Edit(path, before, as_bytes(after), f"{FLAG} in {where}: {old} -> {endpoint}",
                          unit=any(h.origin.kind != "EnvironmentFile" for h in hits),
                          undo={"kind": "flag", "previous": previous}))
    return edits


def _plan_yaml(root: Root, path: str, endpoint: str, add: bool) -> Optional[List[Edit]]:
    """Set ``containerRuntimeEndpoint`` in a config file with a one-line textual edit."""
    if is_packaged(path):
        return None
    before = root.read(path)
    if before is None:
        return None
    edited = set_endpoint(as_text(before), endpoint, add)
    if edited is None:
        return None
    return [Edit(path, before, as_bytes(edited.text), f"{KEY} in {path}: {edited.change}", undo=edited.undo)]


def _plan_env_append(root: Root, view: KubeletView, endpoint: str) -> Optional[List[Edit]]:
    """Append the flag to the last ``$VAR`` of ExecStart= set in an editable environment file."""
    if view.exec_start is None:
        return None
    names = [m.group(1) for m in (VAR_WORD.fullmatch(w) for w in split_words(view.exec_start.value)) if m]
    for name in reversed(names):
        if name not in view.env:
            continue
        _, origin = view.env[name]
        if origin.kind != "EnvironmentFile" or is_packaged(origin.path):
            continue
        before = root.read(origin.path)
        if before is None:
            continue
        text = as_text(before)
        body = text[origin.start:origin.end].rstrip(" \t\r")
        # Inside the value's last quoted part when it ends with one, else after the value.
        at = len(body) - 1 if body[-1:] in ("\"", "'") and body[-2:-1] != "\\" else len(body)
        inserted = ("" if view.env[name][0] == "" else " ") + f"{FLAG}={endpoint}"
        pos = origin.start + at
        after = text[:pos] + inserted + text[pos:]
        return [Edit(origin.path, before, as_bytes(after), f"{FLAG} in {name} in {origin.path}: added {endpoint}",
                     undo={"kind": "flag-added", "text": inserted})]
    return None


def _plan_dropin(root: Root, view: KubeletView, endpoint: str) -> Optional[List[Edit]]:
    """A drop-in that repeats ExecStart= with the endpoint replaced or appended."""
    if view.exec_start is None:
        return None
    raw = view.exec_start.value
    new_raw, previous = rewrite_flag_values(raw, [(0, len(raw))], endpoint)
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
    return [Edit(DROPIN, before, as_bytes(content), f"drop-in {DROPIN}: ExecStart= with {FLAG}={endpoint}",
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
