"""The README and docs/ as a reader meets them: the README short, its two commands first
and its test command the one CI runs; every link between the pages leading to a file and a
heading that are there; every configuration snippet one a person can set in the shipped
config.toml (config_edit.py) and that the daemon takes."""

from __future__ import annotations

import glob
import os
import re
import sys
from typing import Dict, List, Set

import pytest

from anolisnuma.config import Config
from anolisnuma.testing import config_edit
from anolisnuma.testing.proxy import REPO_ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

README = os.path.join(REPO_ROOT, "README.md")
PAGES = [README] + sorted(glob.glob(os.path.join(REPO_ROOT, "docs", "*.md")))
LINK = re.compile(r"\]\(([^)\s]+)\)")


def read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def fenced(text: str, language: str) -> List[str]:
    return re.findall(r"^```" + language + r"\n(.*?)^```", text, re.S | re.M)


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: str) -> Set[str]:
    out: Set[str] = set()
    seen: Dict[str, int] = {}
    in_fence = False
    for line in read(path).splitlines():
        if line.startswith("```"):
            in_fence = not in_fence
        elif not in_fence and re.match(r"^#{1,6} ", line):
            s = slug(line.lstrip("#"))
            out.add(s if s not in seen else f"{s}-{seen[s]}")
            seen[s] = seen.get(s, 0) + 1
    return out


def test_the_readme_is_read_in_five_minutes_and_starts_with_its_two_commands() -> None:
    text = read(README)
    assert len(text.splitlines()) <= 200
    commands = [line for block in fenced(text, "sh") for line in block.splitlines()]
    assert commands[:3] == ["sudo scripts/test.sh", "sudo scripts/run-local.sh", "sudo scripts/run-local.sh --demo"]
    first_heading = text.index("\n## ")
    assert text.index("sudo scripts/run-local.sh --demo") < text.index("\n## ", first_heading + 1)


def test_ci_runs_the_readmes_test_command() -> None:
    readme_command = fenced(read(README), "sh")[0].split()
    ci_lines = [line for line in read(os.path.join(REPO_ROOT, ".ci", "run")).splitlines()
                if line.strip() and not line.startswith("#")]
    assert readme_command == ["sudo", "scripts/test.sh"]
    assert ci_lines[-1] == "exec bash scripts/test.sh", "the README's test command closes CI's log"


def test_every_link_between_the_pages_leads_to_a_file_and_a_heading_there() -> None:
    broken, checked = [], 0
    for page in PAGES:
        for target in LINK.findall(read(page)):
            if "://" in target or target.startswith("mailto:"):
                continue
            path, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            checked += 1
            where = f"{os.path.relpath(page, REPO_ROOT)} -> {target}"
            if not os.path.exists(dest):
                broken.append(where)
            elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                broken.append(where + " (no such heading)")
    assert checked > 50 and not broken, broken


@pytest.mark.parametrize("page", [os.path.relpath(p, REPO_ROOT) for p in PAGES])
def test_every_configuration_snippet_sets_keys_of_the_shipped_file_the_daemon_takes(page: str) -> None:
    shipped = read(os.path.join(REPO_ROOT, "config.toml"))
    for snippet in fenced(read(os.path.join(REPO_ROOT, page)), "toml"):
        edited = config_edit.edit(shipped, snippet)     # ConfigEditError: a person could not either
        Config.from_dict(tomllib.loads(edited))         # ConfigError: the daemon would refuse it
