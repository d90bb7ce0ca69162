"""``kubelet status``: which endpoint the kubelet will use and from where, whether that is
anolisnuma's answering socket, what ``enable`` changed, and the kubelet's cgroup settings;
as a mapping (``-o json``) or as aligned lines.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from anolisnuma.ctl.kubelet.backups import Backups
from anolisnuma.ctl.kubelet.cgroups import cgroup_settings
from anolisnuma.ctl.kubelet.endpoints import same_socket
from anolisnuma.ctl.kubelet.names import BACKUP_DIR, UNIT_NAME
from anolisnuma.ctl.kubelet.node_root import Root
from anolisnuma.ctl.kubelet.probe import probe_socket
from anolisnuma.ctl.kubelet.view import inspect


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
