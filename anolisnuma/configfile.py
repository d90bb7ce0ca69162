"""Typed, strict reading of TOML tables.

Every section of the configuration is read through a :class:`Table`, which checks the
type and range of each key, remembers which keys were read, and refuses the keys nobody
read (a typo in an operator's file must not be silently ignored). Errors name the full
dotted key, e.g. ``qos.group_identity.values.BE: must be an integer in -1..2``, and a
reading goes on past them, so that ``anolisnuma --check-config`` names every error of a
file in one run (the first :data:`ERRORS_LISTED`, and how many more), with the known key
an unknown one may be a typo of.
"""

from __future__ import annotations

import difflib
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
    """The configuration is invalid; ``key`` is the dotted key, ``problem`` what is wrong.
    The message shows the key as :func:`shown_key` does: the file is root's, but a key of
    a megabyte or with a terminal's escape codes would still bury or garble the line."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{shown_key(key)}: {problem}" if key else problem)
        self.key = key
        self.problem = problem

    def lines(self) -> List[str]:
        """One line per error (a :class:`ConfigErrors` has several)."""
        return [str(self)]


class ConfigErrors(ConfigError):
    """Several errors of one file at once: ``errors`` the first :data:`ERRORS_LISTED` in
    the order they were read, ``more`` how many past them were only counted. ``key`` and
    ``problem`` are the first one's; the message joins them on one line (for the log)."""

    def __init__(self, errors: List[ConfigError], more: int = 0) -> None:
        super().__init__(errors[0].key, errors[0].problem)
        self.errors = errors
        self.more = more
        self.args = ("; ".join(self.lines()),)

    def lines(self) -> List[str]:
        out = [str(e) for e in self.errors]
        if self.more:
            out.append(f"... and {self.more} more {_plural(self.more, 'error')} not listed")
        return out


# A file with a hundred thousand unknown keys gets twenty lines and a count, not a hundred
# thousand lines (nor a hundred thousand "did you mean" searches).
ERRORS_LISTED = 20
# Past this many characters a key or a value is cut in a message (its length said).
SHOWN_CHARS = 60


class Errors:
    """What one reading of a file found wrong so far (every :class:`Table` of the file
    adds to the same one)."""

    def __init__(self) -> None:
        self.listed: List[ConfigError] = []
        self.more = 0
        self._sections: set = set()   # the first part of each key added, listed or not

    def __bool__(self) -> bool:
        return bool(self.listed)

    def full(self) -> bool:
        return len(self.listed) >= ERRORS_LISTED

    def add(self, error: ConfigError) -> None:
        for e in error.errors if isinstance(error, ConfigErrors) else [error]:
            self._sections.add(e.key.split(".", 1)[0])
            if self.full():
                self.more += 1
            else:
                self.listed.append(e)
        self.more += error.more if isinstance(error, ConfigErrors) else 0

    def count(self, n: int) -> None:
        """``n`` more errors, not worth listing once the list is full."""
        self.more += n

    def in_section(self, section: str) -> bool:
        """Whether an error was added about a key of ``section`` (or the section itself)."""
        return section in self._sections

    def check(self) -> None:
        """Raise what was found: the one ConfigError itself, or :class:`ConfigErrors`."""
        if len(self.listed) == 1 and not self.more:
            raise self.listed[0]
        if self.listed:
            raise ConfigErrors(list(self.listed), self.more)


def shown(value: Any) -> str:
    """``value`` for a message: a string quoted and escaped (repr), anything cut past
    :data:`SHOWN_CHARS` characters with its length."""
    text = repr(value) if isinstance(value, str) else str(value)
    return _cut(text, len(value) if isinstance(value, str) else len(text))


def shown_key(key: str) -> str:
    """A dotted key for a message: as it is when short and printable, else as
    :func:`shown` shows a value."""
    if len(key) <= SHOWN_CHARS and key.isprintable():
        return key
    return shown(key)


def _cut(text: str, length: int) -> str:
    if len(text) <= SHOWN_CHARS:
        return text
    return f"{text[:SHOWN_CHARS]}... ({length} characters)"


def did_you_mean(name: Any, known: Iterable[str]) -> str:
    """`` (did you mean X?)`` when ``name`` is close to one of ``known``, else ""."""
    if not isinstance(name, str) or len(name) > 2 * SHOWN_CHARS:   # nothing known is that long
        return ""
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def _plural(n: int, word: str) -> str:
    return word if n == 1 else word + "s"


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
    """A view of one TOML table that validates as it is read.

    A wrong value is noted (in :attr:`errors`, shared by every table of the file) and
    read as the key's default, so that the reading goes on and one run names every
    error; a required key that is missing or wrong has no default and raises at once.
    The table made first, for the whole file, raises what was noted when it is finished
    (:meth:`finish`); sub-tables only add to it."""

    def __init__(self, data: Optional[Dict[str, Any]], prefix: str = "", errors: Optional[Errors] = None) -> None:
        self._data = dict(data or {})
        self._prefix = prefix
        self._read: set = set()
        self._owner = errors is None
        self.errors = Errors() if errors is None else errors

    # -- helpers -------------------------------------------------------------------------
    def key(self, name: str) -> str:
        """The dotted name of ``name`` inside this table, for messages."""
        return f"{self._prefix}.{name}" if self._prefix else name

    def has(self, name: str) -> bool:
        return name in self._data

    def keys(self) -> List[str]:
        return list(self._data)

    def child(self, data: Optional[Dict[str, Any]], prefix: str) -> "Table":
        """A table of this file that is not one of this table's keys (an array's item)."""
        return Table(data, prefix, self.errors)

    def invalid(self, name: str, problem: str, fallback: Any = None) -> Any:
        """Note that ``name`` is wrong (it counts as read: no "unknown key" besides);
        returns ``fallback``, what the reading goes on with."""
        self._read.add(name)
        self.errors.add(ConfigError(self.key(name), problem))
        return fallback

    def _wrong(self, name: str, problem: str, default: Any) -> Any:
        if default is _MISSING:   # nothing to go on with
            raise ConfigError(self.key(name), problem)
        return self.invalid(name, problem, default)

    def _get(self, name: str, default: Any) -> Any:
        self._read.add(name)
        if name in self._data:
            return self._data[name]
        if default is _MISSING:
            raise ConfigError(self.key(name), "is required")
        return default

    # -- typed readers: the value, or the default when it is wrong (noted) ----------------
    def str(self, name: str, default: Any = _MISSING, choices: Optional[Iterable[str]] = None) -> Any:
        value = self._get(name, default)
        if value is default and default is not _MISSING:
            return value
        if not isinstance(value, str):
            return self._wrong(name, f"must be a string, not {_tname(value)}", default)
        if choices is not None:
            allowed = list(choices)
            if value not in allowed:
                return self._wrong(name, f"must be one of {', '.join(allowed)}; got {shown(value)}"
                                   + did_you_mean(value, allowed), default)
        return value

    def bool(self, name: str, default: Any = _MISSING) -> Any:
        value = self._get(name, default)
        if value is default and default is not _MISSING:
            return value
        if not isinstance(value, bool):
            return self._wrong(name, f"must be true or false, not {_tname(value)}", default)
        return value

    def int(self, name: str, default: Any = _MISSING, min: Optional[int] = None, max: Optional[int] = None) -> Any:
        value = self._get(name, default)
        if value is default and default is not _MISSING:
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            return self._wrong(name, f"must be an integer, not {_tname(value)}", default)
        problem = range_problem(value, min, max)
        return self._wrong(name, problem, default) if problem else value

    def float(self, name: str, default: Any = _MISSING, min: Optional[float] = None,
              max: Optional[float] = None) -> Any:
        value = self._get(name, default)
        if value is default and default is not _MISSING:
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return self._wrong(name, f"must be a number, not {_tname(value)}", default)
        if value != value or value in (float("inf"), float("-inf")):  # nan compares unequal
            return self._wrong(name, f"must be a finite number; got {value}", default)
        problem = range_problem(value, min, max)
        return self._wrong(name, problem, default) if problem else float(value)

    def socket_path(self, name: str, default: Any = _MISSING) -> str:
        """An absolute unix socket path; a ``unix://`` prefix (as the kubelet writes
        endpoints) is taken off."""
        value = self.str(name, default)
        if value.startswith(UNIX_PREFIX):
            value = value[len(UNIX_PREFIX):]
        if not value.startswith("/"):
            return self._wrong(name, f"must be an absolute unix socket path; got {shown(value)}", default)
        return value

    def str_list(self, name: str, default: Any = _MISSING) -> Any:
        value = self._get(name, default)
        if value is default and default is not _MISSING:
            return list(value)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            return list(self._wrong(name, "must be a list of strings", default))
        return list(value)

    def table(self, name: str) -> "Table":
        """A sub-table (an absent one reads as empty, so every key takes its default; so
        does one that is no table, noted)."""
        value = self._get(name, {})
        if not isinstance(value, dict):
            value = self.invalid(name, f"must be a table, not {_tname(value)}", {})
        return Table(value, self.key(name), self.errors)

    def raw(self, name: str, default: Any = _MISSING) -> Any:
        """The untyped value, for readers that validate structure themselves."""
        return self._get(name, default)

    def finish(self) -> None:
        """Note every key that no reader asked for, with the known key it may be a typo
        of; the file's first table then raises all that was noted (:meth:`Errors.check`)."""
        unknown = [name for name in self._data if name not in self._read]
        for i, name in enumerate(unknown):
            if self.errors.full():
                self.errors.count(len(unknown) - i)
                break
            what = "table" if isinstance(self._data[name], dict) else "key"
            self.errors.add(ConfigError(self.key(name), f"unknown {what}" + did_you_mean(name, self._read)))
        if self._owner:
            self.errors.check()


def range_problem(value: Any, min: Any = None, max: Any = None) -> Optional[str]:
    """What is wrong with ``value`` outside ``min..max``, or None."""
    if (min is not None and value < min) or (max is not None and value > max):
        lo = "" if min is None else str(min)
        hi = "" if max is None else str(max)
        return f"must be in {lo}..{hi}; got {shown(value)}"
    return None


def _tname(value: Any) -> str:
    return {str: "a string", bool: "a boolean", int: "an integer", float: "a number",
            list: "a list", dict: "a table"}.get(type(value), type(value).__name__)
