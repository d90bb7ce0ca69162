"""``kubelet disable``: undo what the manifest records. A file unchanged since ``enable``
gets its original back byte for byte; one changed since (by kubeadm, by hand) gets our
edit undone in place, or is left and named when our edit is no longer found; created
files are removed; the backup goes once nothing is left.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

from anolisnuma.ctl.kubelet.backups import Backups
from anolisnuma.ctl.kubelet.config_yaml import restore_endpoint
from anolisnuma.ctl.kubelet.endpoints import same_socket
from anolisnuma.ctl.kubelet.flag_text import restore_flag_values
from anolisnuma.ctl.kubelet.names import MANIFEST
from anolisnuma.ctl.kubelet.node_root import Root
from anolisnuma.ctl.kubelet.node_writes import atomic_write, fsync_dir, locked
from anolisnuma.ctl.kubelet.ours import DEFAULT_SOCKET
from anolisnuma.ctl.kubelet.outcome import EXIT_FAIL, EXIT_OK, PROG, CtlError, Outcome
from anolisnuma.ctl.kubelet.text import as_bytes, as_text, sha256_hex
from anolisnuma.ctl.kubelet.view import inspect


def _undo_in_place(text: str, entry: Dict[str, Any], endpoint: str) -> Optional[str]:
    """Undo our edit in a file changed since: the text, or None when our edit is not found."""
    undo = entry.get("undo") or {}
    kind = undo.get("kind")
    if kind == "flag":
        return restore_flag_values(text, list(undo.get("previous") or []), endpoint)
    if kind in ("flag-added", "yaml-added"):
        added = undo.get("text", "")
        i = text.rfind(added) if added else -1
        return None if i < 0 else text[:i] + text[i + len(added):]
    if kind == "yaml-value":
        return restore_endpoint(text, list(undo.get("previous") or []), endpoint)
    return None


def disable(root: Root, socket: Optional[str] = None) -> Outcome:
    """Undo ``enable``: originals back byte for byte, created files removed, backup dropped.

    Without a backup there is nothing to undo; when the kubelet points at anolisnuma
    (``socket``, or the default) all the same, that was done by hand: refused.
    """
    with locked(root):
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
            cur_sha = sha256_hex(current)
            if entry.get("created"):
                if current is None:
                    continue
                if cur_sha == entry.get("written_sha256"):
                    os.unlink(root.host(path))
                    fsync_dir(os.path.dirname(root.host(path)))
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
                    and sha256_hex(original) == entry.get("original_sha256"):
                atomic_write(root.host(path), original)
                lines.append(f"restored {path}")
            else:
                undone = _undo_in_place(as_text(current), entry, endpoint)
                if undone is None:
                    if endpoint and endpoint.split("://")[-1] in as_text(current):
                        lines.append(f"left {path}: changed since enable and still names {endpoint}; "
                                     f"the original is {entry.get('backup')}")
                        left.append(entry)
                    else:
                        lines.append(f"left {path}: changed since enable, no longer names {endpoint}")
                    continue
                atomic_write(root.host(path), as_bytes(undone))
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
