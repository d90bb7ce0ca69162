"""The placement-rule directory: which YAML files it holds, whether they changed, their
documents. Parsing what the documents mean is the policy's (``policies/numa/rules.py``).

A rule file has the full power of the node's configuration (any namespace, any pod, a NUMA
node's whole cpuset), so it is read like the configuration
(:func:`anolisnuma.trusted_file.read_trusted_file`): a regular file only (a FIFO dropped
there cannot block the re-read), at most 1 MiB, that only root may change, along its path
too. A file someone else may change is skipped, named in the problems with who may change
it and the command that fixes it; fixing it (``chmod``, ``chown``: the file's ctime moves)
makes the next poll read it again.

What a file's YAML stands for is bounded by its text: an alias (``*name``) stands for its
anchor's whole tree again, so a few hundred bytes of anchors and aliases can stand for
billions of entries, which the rule parser (and every message quoting a value) would walk.
A file whose documents hold more values than its text has bytes is skipped, as is one
nested deeper than the YAML reader goes (its recursion limit)."""

from __future__ import annotations

import os
from typing import Any, List, Tuple

import yaml

from anolisnuma.fileread import RefusedFile
from anolisnuma.trusted_file import read_trusted_file

RULE_FILE_SUFFIXES = (".yaml", ".yml")
MAX_RULE_FILE = 1 << 20
# YAML without aliases holds at most about one value per byte of text (`{a,b,...}`: a key
# and its null for each `a,`): two per byte is more than such a file can hold, and few
# enough that a walk of the values costs time linear in the file.
VALUES_PER_BYTE = 2


class RuleDirectory:
    """``*.yaml``/``*.yml`` files of ``path`` (hidden files skipped), in file-name order."""

    def __init__(self, path: str) -> None:
        self.path = path

    def exists(self) -> bool:
        return os.path.isdir(self.path)

    def names(self) -> List[str]:
        try:
            names = os.listdir(self.path)
        except OSError:
            return []
        return sorted(n for n in names if n.endswith(RULE_FILE_SUFFIXES) and not n.startswith("."))

    def signature(self) -> Any:
        """Changes whenever a rule file is added, removed, replaced, written, or changes
        owner or mode (so is the directory's owner and mode)."""
        out = []
        for n in self.names():
            try:
                st = os.stat(os.path.join(self.path, n))
            except OSError:
                continue
            out.append((n, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
        try:
            st = os.stat(self.path)
            here: Any = (st.st_ino, st.st_ctime_ns)
        except OSError:
            here = None
        return (self.exists(), here, tuple(out))

    def read(self) -> Tuple[List[Tuple[str, List[Any]]], List[str]]:
        """``([(file path, its YAML documents)], problems)``: a file that cannot be read or
        trusted, is not a regular file, is larger than 1 MiB, is not UTF-8 or not YAML is
        named in the problems and skipped."""
        files: List[Tuple[str, List[Any]]] = []
        problems: List[str] = []
        for name in self.names():
            path = os.path.join(self.path, name)
            try:
                data = read_trusted_file(path, MAX_RULE_FILE).data
                documents = list(yaml.safe_load_all(data.decode("utf-8")))
            except RefusedFile as e:   # (its message starts with the path)
                problems.append(f"rule file skipped: {' '.join(str(e).split())[:400]}")
                continue
            except (OSError, ValueError, yaml.YAMLError) as e:   # (UnicodeDecodeError is a ValueError)
                problems.append(f"rule file {path} skipped: {' '.join(str(e).split())[:400]}")
                continue
            except RecursionError:   # (the reader recurses once per level of nesting)
                problems.append(f"rule file {path} skipped: nested too deeply")
                continue
            limit = VALUES_PER_BYTE * len(data) + 16
            if not values_within(documents, limit):
                problems.append(f"rule file {path} skipped: its YAML aliases stand for more than {limit} values, "
                                f"more than its {len(data)} bytes hold written out")
                continue
            files.append((path, documents))
        return files, problems


def values_within(documents: List[Any], limit: int) -> bool:
    """Whether ``documents`` hold at most ``limit`` values (mappings, lists, keys and
    scalars), every alias counted as what it stands for. Walked without recursion, each
    value counted before it is put on the stack: the walk stops at the limit and costs no
    more than it, whatever the aliases (a list holding itself too)."""
    stack = list(documents)
    count = len(stack)
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            count += 2 * len(value)
            if count > limit:
                return False
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            count += len(value)
            if count > limit:
                return False
            stack.extend(value)
    return count <= limit
