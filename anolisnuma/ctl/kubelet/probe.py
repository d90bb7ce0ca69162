"""Asking the live node: whether anolisnuma's socket answers CRI ``Version`` (``enable``
refuses otherwise), and the kubelet binary's minor version (kubelets >= 1.27 read the
endpoint from their config file, so the key may be added there).
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
from typing import Optional, Tuple

from anolisnuma.ctl.kubelet.node_root import Root
from anolisnuma.ctl.kubelet.view import KubeletView


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
