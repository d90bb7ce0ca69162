"""``EnvironmentFile=`` files (kubeadm's /var/lib/kubelet/kubeadm-flags.env, the rpm's
/etc/sysconfig/kubelet) read with systemd's rules, each assignment with its span in the
file. Apart from the unit parser: an environment file quotes, continues and comments
differently from a unit, and on a kubeadm node it is where the endpoint flag lives.
"""

from __future__ import annotations

import re
from typing import List, NamedTuple

from anolisnuma.ctl.kubelet.systemd_unit import NAME


class EnvAssignment(NamedTuple):
    key: str
    value: str
    start: int   # the key's first character
    end: int     # the newline (or end of file) that ends the value


def parse_env_file(text: str) -> List[EnvAssignment]:
    """The assignments of an ``EnvironmentFile=``, with systemd's rules.

    ``KEY=value`` per line; ``#``/``;`` comments; single quotes literal; double quotes with
    backslash escapes and newlines inside; quoted parts concatenate (so Fedora's triple quotes work);
    a backslash-newline continues an unquoted value; unquoted trailing blanks are dropped.
    """
    out: List[EnvAssignment] = []
    n = len(text)
    i = 0
    while i < n:
        c = text[i]
        if c in " \t\r\n":
            i += 1
            continue
        if c in "#;":
            while i < n and text[i] != "\n":
                i += 2 if text[i] == "\\" else 1
            continue
        start = i
        while i < n and text[i] not in "=\n":
            i += 1
        if i >= n or text[i] == "\n":
            continue  # a line without '=' is ignored
        key = text[start:i].strip()
        i += 1
        value: List[str] = []
        keep = 0          # length of value without unquoted trailing blanks
        state = "pre"     # "pre": before a (next) part; "plain": inside an unquoted part
        while i < n:
            c = text[i]
            if c == "\n":
                break
            if c == "\\":
                if i + 1 < n and text[i + 1] == "\n":
                    i += 2
                    continue
                if i + 1 < n:
                    value.append(text[i + 1])
                    keep = len(value)
                i += 2
                state = "plain"
                continue
            if state == "pre" and c in " \t\r":
                i += 1
                continue
            if state == "pre" and c == "'":
                j = text.find("'", i + 1)
                j = n if j < 0 else j
                value.append(text[i + 1:j])
                keep = len(value)
                i = j + 1
                continue
            if state == "pre" and c == '"':
                i += 1
                while i < n and text[i] != '"':
                    if text[i] == "\\" and i + 1 < n:
                        nxt = text[i + 1]
                        if nxt != "\n":
                            value.append(nxt if nxt in '"\\`$' else "\\" + nxt)
                        i += 2
                        continue
                    value.append(text[i])
                    i += 1
                i += 1
                keep = len(value)
                continue
            state = "plain"
            value.append(c)
            if c not in " \t\r":
                keep = len(value)
            i += 1
        if re.fullmatch(NAME, key):
            out.append(EnvAssignment(key, "".join(value[:keep]), start, i))
    return out
