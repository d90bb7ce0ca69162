"""The endpoint flag (``--container-runtime-endpoint``) as text inside a unit, a drop-in or an
environment file: every value rewritten in place with its quotes kept, and put back by
``disable`` in a file that changed since ``enable``.
"""

from __future__ import annotations

import re
from typing import List, Optional, Sequence, Tuple

from anolisnuma.ctl.kubelet.endpoints import same_socket
from anolisnuma.ctl.kubelet.names import FLAG
from anolisnuma.ctl.kubelet.text import unquote

FLAG_VALUE = re.compile(
    r"(?P<flag>" + re.escape(FLAG) + r")(?P<sep>=|[ \t]+)"
    r"(?P<val>\"[^\"\n]*\"|'[^'\n]*'|[^\s\"'\\]+)")


def rewrite_flag_values(text: str, spans: Sequence[Tuple[int, int]], new: str) -> Tuple[str, List[str]]:
    """Replace every endpoint flag value inside the spans; the old values, in order."""
    previous: List[str] = []
    for start, end in sorted(set(spans), reverse=True):
        found: List[str] = []

        def sub(m: "re.Match[str]") -> str:
            value = m.group("val")
            quote = value[0] if value[0] in "\"'" else ""
            found.append(unquote(value))
            return m.group("flag") + m.group("sep") + quote + new + quote

        text = text[:start] + FLAG_VALUE.sub(sub, text[start:end]) + text[end:]
        previous = found + previous
    return text, previous


def restore_flag_values(text: str, previous: List[str], endpoint: str) -> Optional[str]:
    """The text with every endpoint flag that names ``endpoint`` given back its ``previous``
    value (in order; the last one repeats); None when none was found."""
    if not previous:
        return None
    count = [0]

    def sub(m: "re.Match[str]") -> str:
        value = unquote(m.group("val"))
        if not same_socket(value, endpoint):
            return m.group(0)
        old = previous[min(count[0], len(previous) - 1)]
        count[0] += 1
        quote = m.group("val")[0] if m.group("val")[0] in "\"'" else ""
        return m.group("flag") + m.group("sep") + quote + old + quote

    new = FLAG_VALUE.sub(sub, text)
    return new if count[0] else None
