"""Typed, strict reading of TOML tables.

Every section of the configuration is read through a :class:`Table`, which checks the
type and range of each key, remembers which keys were read, and refuses the keys nobody
read (a typo in an operator's file must not be silently ignored). Errors name the full
dotted key, e.g. ``qos.group_identity.values.BE: must be an integer in -1..2``.
"""

from __future__ import annotations

import sys
from typing import Any, Dict, Iterable, List, Optional

from anolisnuma.fileread import MIB, RefusedFile, read_regular_file

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on the Python 3.9/3.10 nodes
    import tomli as tomllib

_MISSING = object()

# The default configuration is about 10 KiB; a file a hundred times its size is no
# configuration, and reading or parsing it must not hold the daemon up.
CONFIG_MAX_BYTES = MIB


UNIX_PREFIX = "unix://"


class ConfigError(Exception):
    """The configuration is invalid; ``key`` is the dotted key, ``problem`` what is wrong."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}" if key else problem)
        self.key = key
        self.problem = problem


def load_toml(path: str) -> Dict[str, Any]:
    """Parse a TOML file; a missing or unreadable file, one that is not a regular file or
    is larger than :data:`CONFIG_MAX_BYTES`, bad syntax, or a value tomllib cannot read (an
    integer of thousands of digits, nesting past the recursion limit) raises
    :class:`ConfigError`."""
    try:
        return tomllib.loads(read_regular_file(path, CONFIG_MAX_BYTES).decode("utf-8"))
    except RefusedFile as e:
        raise ConfigError("", f"cannot read configuration file {path}: it is {e.problem}") from e
    except OSError as e:
        raise ConfigError("", f"cannot read configuration file {path}: {e.strerror}") from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError("", f"{path} is not valid TOML: {e}") from e
    except UnicodeDecodeError as e:  # TOML is UTF-8
        raise ConfigError("", f"{path} is not UTF-8 text (byte {e.start}): {e.reason}") from e
    except ValueError as e:  # tomllib's own besides TOMLDecodeError: an integer longer than int() reads
        raise ConfigError("", f"{path} is not valid TOML: {str(e).split(';')[0]}") from e
    except RecursionError:  # tomllib recurses once per level of nested arrays and inline tables
        raise ConfigError("", f"{path} is not valid TOML: arrays or tables nested too deeply") from None


class Table:
    """A view of one TOML table that validates as it is read."""

    def __init__(self, data: Optional[Dict[str, Any]], prefix: str = "") -> None:
        self._data = dict(data or {})
        self._prefix = prefix
        self._read: set = set()

    # -- helpers -------------------------------------------------------------------------
    def key(self, name: str) -> str:
        """The dotted name of ``name`` inside this table, for messages."""
        return f"{self._prefix}.{name}" if self._prefix else name

    def has(self, name: str) -> bool:
        return name in self._data

    def keys(self) -> List[str]:
        return list(self._data)

    def _get(self, name: str, default: Any) -> Any:
        self._read.add(name)
        if name in self._data:
            return self._data[name]
        if default is _MISSING:
            raise ConfigError(self.key(name), "is required")
        return default

    # -- typed readers -------------------------------------------------------------------
    def str(self, name: str, default: Any = _MISSING, choices: Optional[Iterable[str]] = None) -> Any:
        value = self._get(name, default)
        if value is default and default is not _MISSING:
            return value
        if not isinstance(value, str):
            raise ConfigError(self.key(name), f"must be a string, not {_tname(value)}")
        if choices is not None:
            allowed = list(choices)
            if value not in allowed:
                raise ConfigError(self.key(name), f"must be one of {', '.join(allowed)}; got {value!r}")
        return value

    def bool(self, name: str, default: Any = _MISSING) -> Any:
        value = self._get(name, default)
        if value is default and default is not _MISSING:
            return value
        if not isinstance(value, bool):
            raise ConfigError(self.key(name), f"must be true or false, not {_tname(value)}")
        return value

    def int(self, name: str, default: Any = _MISSING, min: Optional[int] = None, max: Optional[int] = None) -> Any:
        value = self._get(name, default)
        if value is default and default is not _MISSING:
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(self.key(name), f"must be an integer, not {_tname(value)}")
        check_range(self.key(name), value, min, max)
        return value

    def float(self, name: str, default: Any = _MISSING, min: Optional[float] = None,
              max: Optional[float] = None) -> Any:
        value = self._get(name, default)
        if value is default and default is not _MISSING:
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(self.key(name), f"must be a number, not {_tname(value)}")
        if value != value or value in (float("inf"), float("-inf")):  # nan compares unequal
            raise ConfigError(self.key(name), f"must be a finite number; got {value}")
        check_range(self.key(name), value, min, max)
        return float(value)

    def socket_path(self, name: str, default: Any = _MISSING) -> str:
        """An absolute unix socket path; a ``unix://`` prefix (as the kubelet writes
        endpoints) is taken off."""
        value = self.str(name, default)
        if value.startswith(UNIX_PREFIX):
            value = value[len(UNIX_PREFIX):]
        if not value.startswith("/"):
            raise ConfigError(self.key(name), f"must be an absolute unix socket path; got {value!r}")
        return value

    def str_list(self, name: str, default: Any = _MISSING) -> Any:
        value = self._get(name, default)
        if value is default and default is not _MISSING:
            return list(value)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(self.key(name), "must be a list of strings")
        return list(value)

    def table(self, name: str) -> "Table":
        """A sub-table (an absent one reads as empty, so every key takes its default)."""
        value = self._get(name, {})
        if not isinstance(value, dict):
            raise ConfigError(self.key(name), f"must be a table, not {_tname(value)}")
        return Table(value, self.key(name))

    def raw(self, name: str, default: Any = _MISSING) -> Any:
        """The untyped value, for readers that validate structure themselves."""
        return self._get(name, default)

    def finish(self) -> None:
        """Refuse every key that no reader asked for."""
        unknown = sorted(set(self._data) - self._read)
        if unknown:
            raise ConfigError(self.key(unknown[0]), "unknown key")


def check_range(key: str, value: Any, min: Any = None, max: Any = None) -> None:
    if (min is not None and value < min) or (max is not None and value > max):
        lo = "" if min is None else str(min)
        hi = "" if max is None else str(max)
        raise ConfigError(key, f"must be in {lo}..{hi}; got {value}")


def _tname(value: Any) -> str:
    return {str: "a string", bool: "a boolean", int: "an integer", float: "a number",
            list: "a list", dict: "a table"}.get(type(value), type(value).__name__)
