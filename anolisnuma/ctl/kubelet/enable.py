"""``kubelet enable``: with anolisnuma answering, plan the smallest edit, record the
originals, then replace the files (one run per root, under its lock).
"""

from __future__ import annotations

import os
import time
from typing import Optional, Tuple

from anolisnuma.ctl.kubelet.backups import Backups, merge_entry
from anolisnuma.ctl.kubelet.endpoints import same_socket
from anolisnuma.ctl.kubelet.names import BACKUP_DIR, MANIFEST_FORMAT
from anolisnuma.ctl.kubelet.node_root import Root
from anolisnuma.ctl.kubelet.node_writes import atomic_write, locked, makedirs
from anolisnuma.ctl.kubelet.outcome import EXIT_OK, PROG, CtlError, Outcome
from anolisnuma.ctl.kubelet.plan import plan_enable
from anolisnuma.ctl.kubelet.probe import detect_kubelet_version, probe_socket
from anolisnuma.ctl.kubelet.view import inspect


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
    with locked(root):
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
                for d in makedirs(root, os.path.dirname(edit.path)):
                    manifest["created_dirs"].append(d)
            merge_entry(manifest, backups, edit)
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
