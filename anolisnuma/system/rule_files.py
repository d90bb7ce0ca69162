"""The placement-rule directory: which YAML files it holds, whether they changed, their
documents. Parsing what the documents mean is the policy's (``policies/numa/rules.py``)."""

from __future__ import annotations

import os
from typing import Any, List, Tuple

import yaml

RULE_FILE_SUFFIXES = (".yaml", ".yml")
MAX_RULE_FILE = 1 << 20


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
        """Changes whenever a rule file is added, removed, replaced or written."""
        out = []
        for n in self.names():
            try:
                st = os.stat(os.path.join(self.path, n))
            except OSError:
                continue
            out.append((n, st.st_ino, st.st_size, st.st_mtime_ns))
        return (self.exists(), tuple(out))

    def read(self) -> Tuple[List[Tuple[str, List[Any]]], List[str]]:
        """``([(file path, its YAML documents)], problems)``: a file that cannot be read,
        is larger than 1 MiB, is not UTF-8 or not YAML is named in the problems and skipped."""
        files: List[Tuple[str, List[Any]]] = []
        problems: List[str] = []
        for name in self.names():
            path = os.path.join(self.path, name)
            try:
                with open(path, "rb") as f:
                    data = f.read(MAX_RULE_FILE + 1)
                if len(data) > MAX_RULE_FILE:
                    raise ValueError(f"larger than {MAX_RULE_FILE} bytes")
                files.append((path, list(yaml.safe_load_all(data.decode("utf-8")))))
            except (OSError, ValueError, yaml.YAMLError) as e:   # (UnicodeDecodeError is a ValueError)
                problems.append(f"rule file {path} skipped: {' '.join(str(e).split())[:400]}")
        return files, problems
