"""The backup directory, /var/lib/anolisnuma/kubelet-backup: the originals of the files
``enable`` changes and ``manifest.json``.

``manifest.json`` records each path, the original's and the written file's sha256 and how
to undo the edit, before a file is replaced atomically (same mode and owner). ``disable``
puts an unchanged file back byte for byte; a file changed since (by kubeadm, by hand) gets
the edit undone in place; created files are removed; then the backup goes.

The manifest is written before any file changes, so an interrupted ``enable`` leaves a full
record; a second ``enable`` over our own edit keeps the first original.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Dict, List, Optional

from anolisnuma.ctl.kubelet.names import BACKUP_DIR, MANIFEST, MANIFEST_FORMAT
from anolisnuma.ctl.kubelet.node_root import Root
from anolisnuma.ctl.kubelet.node_writes import atomic_write, makedirs
from anolisnuma.ctl.kubelet.outcome import CtlError
from anolisnuma.ctl.kubelet.plan import Edit
from anolisnuma.ctl.kubelet.text import as_bytes, sha256_hex


class Backups:
    """The backup directory: original files and ``manifest.json``."""

    def __init__(self, root: Root) -> None:
        self.root = root
        self.created: List[str] = []   # directories made by this run, outside the backup dir

    def _ensure(self, directory: str) -> None:
        for d in makedirs(self.root, directory, 0o700):
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
        atomic_write(self.root.host(MANIFEST), as_bytes(json.dumps(manifest, indent=2, sort_keys=True) + "\n"), 0o600)

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


def merge_entry(manifest: Dict[str, Any], backups: Backups, edit: Edit) -> None:
    entries: List[Dict[str, Any]] = manifest.setdefault("files", [])
    old = next((e for e in entries if e["path"] == edit.path), None)
    if old is not None and sha256_hex(edit.before) == old.get("written_sha256"):
        old["written_sha256"] = sha256_hex(edit.after)   # our own earlier edit: the original stays
        old["unit"] = old.get("unit", False) or edit.unit
        return
    if old is not None:
        entries.remove(old)  # changed since: what is there now is the original to restore
    entry: Dict[str, Any] = {
        "path": edit.path,
        "created": edit.before is None,
        "original_sha256": sha256_hex(edit.before),
        "written_sha256": sha256_hex(edit.after),
        "unit": edit.unit,
        "what": edit.what,
        "undo": edit.undo,
        "backup": None,
    }
    if edit.before is not None:
        entry["backup"] = backups.store(edit.path, edit.before)
    entries.append(entry)
