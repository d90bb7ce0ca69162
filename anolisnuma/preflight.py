"""Host paths the configuration names, checked before the daemon starts.

A directory that cannot be created or written would otherwise surface as a Python
traceback from deep inside the start-up (the log set-up, the state store); here it is one
line naming the key, like every other configuration error (exit 2).
"""

from __future__ import annotations

import os

from anolisnuma.config import Config
from anolisnuma.configfile import ConfigError


def check_writable_paths(config: Config) -> None:
    """Create the directories the daemon writes to; ConfigError naming the key of the
    first that cannot be created or written."""
    wanted = [("server.listen", os.path.dirname(config.server.listen)),
              ("paths.state_dir", config.paths.state_dir)]
    if config.log.file:
        wanted.append(("log.file", os.path.dirname(config.log.file)))
    for key, directory in wanted:
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
