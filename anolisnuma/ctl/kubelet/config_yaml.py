"""The kubelet's config files (``--config`` and the files of ``--config-dir``): read with
PyYAML, and ``containerRuntimeEndpoint`` edited as text, one line, so that comments, order
and every other byte stay. An edit counts only when PyYAML reads the edited text as the old
mapping with the one key changed.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from anolisnuma.ctl.kubelet.endpoints import same_socket
from anolisnuma.ctl.kubelet.names import KEY
from anolisnuma.ctl.kubelet.text import text_lines, unquote

_KEY_LINE = re.compile(re.escape(KEY) + r"[ \t]*:")


class KeyEdit(NamedTuple):
    """A config file's text with the endpoint key set, how to undo it, and what changed."""

    text: str
    undo: Dict[str, Any]
    change: str   # "old -> new" or "added new"


def load_yaml(text: str) -> Dict[str, Any]:
    import yaml  # a dependency of the package; imported late to keep `--help` fast

    data = yaml.safe_load(text)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError("not a mapping")
    return data


def yaml_value_span(line: str, colon: int) -> Tuple[int, int, str]:
    """(start, end, quote) of the scalar after ``key:`` on a YAML line; an empty span if none."""
    i = colon + 1
    while i < len(line) and line[i] in " \t":
        i += 1
    if i >= len(line) or line[i] == "#":
        return i, i, ""
    q = line[i]
    if q in "\"'":
        j = i + 1
        while j < len(line):
            if q == '"' and line[j] == "\\":
                j += 2
                continue
            if line[j] == q:
                if q == "'" and j + 1 < len(line) and line[j + 1] == "'":
                    j += 2
                    continue
                return i, j + 1, q
            j += 1
        return i, len(line), q
    m = re.search(r"[ \t]#", line[i:])
    end = i + (m.start() if m else len(line) - i)
    while end > i and line[end - 1] in " \t\r":
        end -= 1
    return i, end, ""


def set_endpoint(text: str, endpoint: str, add: bool) -> Optional[KeyEdit]:
    """Set ``containerRuntimeEndpoint`` with a one-line textual edit, checked with PyYAML.

    Every line that sets the key gets the new value (its quotes kept); without one the key
    is appended when ``add``. None when the text is not a YAML mapping, has no key and
    ``add`` is off, or the edit would read as anything but the one key changed.
    """
    try:
        old_data = load_yaml(text)
    except Exception:
        return None
    key_lines = [(s, line, e) for s, line, e in text_lines(text) if _KEY_LINE.match(line)]
    if key_lines:
        previous: List[str] = []
        for s, line, e in reversed(key_lines):
            colon = line.index(":")
            a, b, quote = yaml_value_span(line, colon)
            previous.insert(0, line[a:b])
            value = quote + endpoint + quote
            if a == b:
                value = (" " if a == colon + 1 else "") + value + (" " if a < len(line) else "")
            text = text[:s] + line[:a] + value + line[b:] + text[s + len(line):]
        undo: Dict[str, Any] = {"kind": "yaml-value", "previous": previous}
        change = f"{', '.join(unquote(p) for p in previous)} -> {endpoint}"
    elif add:
        newline = "\r\n" if "\r\n" in text else "\n"
        added = f"{KEY}: {endpoint}{newline}"
        if text and not text.endswith("\n"):
            added = newline + added
        text += added
        undo = {"kind": "yaml-added", "text": added}
        change = f"added {endpoint}"
    else:
        return None
    try:
        new_data = load_yaml(text)
    except Exception:
        return None
    expected = dict(old_data)
    expected[KEY] = endpoint
    if new_data != expected:
        return None
    return KeyEdit(text, undo, change)


def restore_endpoint(text: str, previous: List[str], endpoint: str) -> Optional[str]:
    """The text with every ``containerRuntimeEndpoint`` that names ``endpoint`` given back its
    ``previous`` value (in order; the last one repeats); None when none was found."""
    out = []
    done = 0
    for s, line, e in text_lines(text):
        newline = text[s + len(line):e]
        if previous and _KEY_LINE.match(line):
            a, b, _ = yaml_value_span(line, line.index(":"))
            if same_socket(unquote(line[a:b]), endpoint):
                line = line[:a] + previous[min(done, len(previous) - 1)] + line[b:]
                done += 1
        out.append(line + newline)
    return "".join(out) if done else None
