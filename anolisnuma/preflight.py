"""Host paths the configuration names, checked before the daemon starts.

A directory that cannot be created or written would otherwise surface as a Python
traceback from deep inside the start-up (the log set-up, the state store); here it is one
line naming the key, like every other configuration error (exit 2).

The daemon runs as root and trusts what it finds in its directories: the configuration
it re-reads on SIGHUP, the state it restores at start, the sockets it serves (the CRI
socket reaches containerd's root API), the log it appends to. Whoever may write in one of
them, or in a directory above it, may swap any of these for a file, a FIFO or a symbolic
link of their choosing. So each of them must be changeable by root (or the daemon's own
user) alone: owned by it, writable by no group but root's, by nobody else, by the mode
bits and by POSIX ACLs alike (a default ACL of a directory it creates files in too: the
socket it binds there would inherit it); a directory above may be writable by all only
with the sticky bit (``/tmp``), where nobody may rename what is not theirs. The checks are
:mod:`anolisnuma.trusted_file`'s, which the credentials and rule files go through as well.
"""

from __future__ import annotations

import os
import stat
from typing import List, Tuple

from anolisnuma.config import Config
from anolisnuma.configfile import ConfigError
from anolisnuma.trusted_file import unsafe_along


def config_warnings(config: Config) -> List[str]:
    """What is valid but will not work as things stand (``--check-config`` prints them; the
    daemon starts anyway: containerd may come up after it): the runtime endpoint that does
    not exist or is not a socket."""
    out: List[str] = []
    endpoint = config.runtime.endpoint
    try:
        st = os.stat(endpoint)
    except FileNotFoundError:
        out.append(f"runtime.endpoint: {endpoint} does not exist (is containerd running, and is this its "
                   f"[grpc] address?): every kubelet call will fail with UNAVAILABLE until it does")
    except OSError as e:
        out.append(f"runtime.endpoint: cannot look at {endpoint}: {e.strerror}")
    else:
        if not stat.S_ISSOCK(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "a regular file" if stat.S_ISREG(st.st_mode) \
                else "not a socket"
            out.append(f"runtime.endpoint: {endpoint} is {kind}, not a unix socket: containerd cannot be reached there")
    return out


def credential_warnings(config: Config) -> List[str]:
    """What ``--check-config`` says of the credentials ``[kubernetes]`` names, checked by the
    code the daemon checks them with at start (``cluster/kubeconfig.py``: the kubeconfig and
    every file it names): each secret others may read, as a warning. Raises ConfigError
    (``kubernetes.kubeconfig``) for a kubeconfig the daemon would refuse (a file others may
    write, behind another user's link, missing, not one): the daemon would start, but
    without the API server link, which is what the operator asked for."""
    k = config.kubernetes
    if k is None or not k.enabled:
        return []
    from anolisnuma.cluster.kubeconfig import KubeconfigError, load_kubeconfig

    try:
        kubeconfig = load_kubeconfig(k.kubeconfig)
    except KubeconfigError as e:
        raise ConfigError("kubernetes.kubeconfig", f"unusable, the daemon would run without the API server link: "
                                                   f"{e}") from None
    return [f"kubernetes.kubeconfig: {warning}" for warning in kubeconfig.warnings]


def check_writable_paths(config: Config) -> None:
    """Create the directories the daemon writes to; ConfigError naming the key of the
    first that cannot be created or written."""
    for key, directory in _directories(config):
        try:
            os.makedirs(directory, mode=0o755, exist_ok=True)
        except OSError as e:
            raise ConfigError(key, f"cannot create {directory}: {e.strerror}") from None
        if not os.path.isdir(directory):
            raise ConfigError(key, f"{directory} is not a directory")
        if not os.access(directory, os.W_OK | os.X_OK):
            raise ConfigError(key, f"{directory} is not writable")
    if config.log.file:
        try:
            with open(config.log.file, "a"):
                pass
        except OSError as e:
            raise ConfigError("log.file", f"cannot open {config.log.file}: {e.strerror}") from None


def check_owners(config: Config) -> None:
    """ConfigError naming the key and the path of the first of the daemon's directories
    (or the configuration file, or a directory above one) that someone other than root or
    the daemon's user may change (by its mode bits or a POSIX ACL), with the command that
    fixes it."""
    guarded = [(key, path, True) for key, path in _directories(config)]
    if config.source:
        guarded += [("configuration file", config.source, False),
                    ("configuration file", os.path.dirname(config.source), False)]
    for key, path, creates in guarded:
        try:
            unsafe = unsafe_along(path, creates=creates)
        except OSError as e:
            raise ConfigError(key, f"cannot check who may change {e.filename or path}: {e.strerror}") from None
        if unsafe is not None:
            raise ConfigError(key, unsafe.describe("whoever may write there may swap what the daemon reads and "
                                                   "writes as root"))


def _directories(config: Config) -> List[Tuple[str, str]]:
    """(key, directory) of each directory the daemon creates files in."""
    out = [("server.listen", os.path.dirname(config.server.listen)), ("paths.state_dir", config.paths.state_dir)]
    if config.admin.socket:
        out.append(("admin.socket", os.path.dirname(config.admin.socket)))
    if config.log.file:
        out.append(("log.file", os.path.dirname(config.log.file)))
    return out
