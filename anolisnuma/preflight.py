"""Host paths the configuration names, checked before the daemon starts.

A directory that cannot be created or written would otherwise surface as a Python
traceback from deep inside the start-up (the log set-up, the state store); here it is one
line naming the key, like every other configuration error (exit 2).

The daemon runs as root and trusts what it finds in its directories: the configuration
it re-reads on SIGHUP, the state it restores at start, the sockets it serves (the CRI
socket reaches containerd's root API), the log it appends to. Whoever may write in one of
them, or in a directory above it, may swap any of these for a file, a FIFO or a symbolic
link of their choosing. So each of them must be changeable by root (or the daemon's own
user) alone: owned by it, writable by no group but root's, by nobody else; a directory
above may be writable by all only with the sticky bit (``/tmp``), where nobody may rename
what is not theirs.
"""

from __future__ import annotations

import os
import stat
from typing import Iterator, List, Optional, Tuple

from anolisnuma.config import Config
from anolisnuma.configfile import ConfigError


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
    the daemon's user may change, with the command that fixes it."""
    guarded = list(_directories(config))
    if config.source:
        guarded += [("configuration file", config.source), ("configuration file", os.path.dirname(config.source))]
    for key, path in guarded:
        for at, above in _chain(path):
            try:
                problem = _unsafe(at, above)
            except OSError as e:
                raise ConfigError(key, f"cannot check who may change {at}: {e.strerror}") from None
            if problem is not None:
                what, fix = problem
                where = f"{at} (above {path})" if above else at
                raise ConfigError(key, f"{where} is {what}: whoever may write there may swap what the daemon "
                                       f"reads and writes as root; fix: {fix} {at}")


def _directories(config: Config) -> List[Tuple[str, str]]:
    """(key, directory) of each directory the daemon creates files in."""
    out = [("server.listen", os.path.dirname(config.server.listen)), ("paths.state_dir", config.paths.state_dir)]
    if config.admin.socket:
        out.append(("admin.socket", os.path.dirname(config.admin.socket)))
    if config.log.file:
        out.append(("log.file", os.path.dirname(config.log.file)))
    return out


def _chain(path: str) -> Iterator[Tuple[str, bool]]:
    """``(path, False)``, then ``(directory, True)`` for each directory above it, up to
    ``/``: on the path as written and on the path it resolves to, since a symbolic link
    on the way leads elsewhere (``/var/run`` -> ``/run``)."""
    seen = set()
    for start in (os.path.abspath(path), os.path.realpath(path)):
        at, above = start, False
        while at not in seen:
            seen.add(at)
            yield at, above
            at, above = os.path.dirname(at), True


def _unsafe(path: str, above: bool) -> Optional[Tuple[str, str]]:
    """(what is wrong, the command that fixes it), or None when only root or the daemon's
    user may change ``path``."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None   # made later, in a directory checked here
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid not in (0, os.geteuid()):
        return f"owned by uid {st.st_uid}, not root", "chown root"
    if above and mode & stat.S_ISVTX:
        return None
    if mode & stat.S_IWOTH or (mode & stat.S_IWGRP and st.st_gid != 0):
        who = "every user" if mode & stat.S_IWOTH else f"group {st.st_gid}"
        return f"writable by {who} (mode {mode:04o})", "chmod go-w"
    return None
