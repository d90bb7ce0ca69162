"""Snippets applied to the shipped config.toml as a person edits it
(anolisnuma/testing/config_edit.py): keys set in the sections the file has, commented
tables and keys taken up, nothing declared twice; and what appending would have done."""

from __future__ import annotations

import os
import sys

import pytest

from anolisnuma.testing.config_edit import ConfigEditError, edit
from anolisnuma.testing.proxy import REPO_ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def shipped() -> str:
    with open(os.path.join(REPO_ROOT, "config.toml")) as f:
        return f.read()


def changed_lines(before: str, after: str) -> list:
    return sorted(set(after.splitlines()) - set(before.splitlines()))


def test_a_key_the_file_has_gets_its_line_replaced_in_its_section() -> None:
    before = shipped()
    after = edit(before, '[kubernetes]\nkubeconfig = "/etc/anolisnuma/kubeconfig"\n')
    assert changed_lines(before, after) == ['kubeconfig = "/etc/anolisnuma/kubeconfig"']
    assert len(after.splitlines()) == len(before.splitlines())
    assert after.count("[kubernetes]") == before.count("[kubernetes]") == 1
    assert tomllib.loads(after)["kubernetes"]["kubeconfig"] == "/etc/anolisnuma/kubeconfig"


def test_appending_the_same_snippet_declares_the_table_twice() -> None:
    """Why the documents say "edit these keys" and the walk-through edits."""
    with pytest.raises(tomllib.TOMLDecodeError, match="twice"):
        tomllib.loads(shipped() + '\n[kubernetes]\nkubeconfig = "/etc/anolisnuma/kubeconfig"\n')


def test_a_commented_array_of_tables_is_uncommented_and_another_element_follows_it() -> None:
    snippet = ('[numa]\nenabled = true\nnamespaces = ["batch"]\n\n'
               '[[numa.pin]]\nnamespace = "default"\nname = "db-*"\nnodes = [3]\n\n'
               '[[numa.pin]]\nnamespace = "batch"\nname = "web-*"\nnodes = [1]\n')
    after = edit(shipped(), snippet)
    numa = tomllib.loads(after)["numa"]
    assert numa["enabled"] is True and numa["namespaces"] == ["batch"]
    assert numa["pin"] == [{"namespace": "default", "name": "db-*", "nodes": [3]},
                           {"namespace": "batch", "name": "web-*", "nodes": [1]}]
    assert "# [[numa.pin]]" not in after and after.count("[[numa.pin]]") == 2
    # the second element sits under the first, before the next section's comment
    assert after.index('name = "web-*"') < after.index("# Traffic affinity")


def test_a_key_or_table_the_file_lacks_is_added_where_it_belongs() -> None:
    after = edit(shipped(), "[hooks]\nbudget_seconds = 1.5\n\n[hooks.numa]\nfailure_policy = \"fail\"\n"
                            "[server]\nnew_key_for_test = 1\n")
    data = tomllib.loads(after)
    assert data["hooks"]["budget_seconds"] == 1.5 and data["hooks"]["numa"] == {"failure_policy": "fail"}
    lines = after.splitlines()
    # the added key is the [server] section's last, before [runtime]
    assert lines.index("new_key_for_test = 1") < lines.index("[runtime]")


def test_a_value_over_several_lines_replaces_the_whole_value() -> None:
    text = '[a]\nx = [\n  1,\n  2,\n]\ny = 1\n'
    after = edit(text, "[a]\nx = [3]\n")
    assert tomllib.loads(after) == {"a": {"x": [3], "y": 1}}


def test_what_cannot_be_edited_as_a_person_would_is_refused_naming_why() -> None:
    with pytest.raises(ConfigEditError, match="not TOML"):
        edit(shipped(), "[kubernetes]\nkubeconfig = \n")
    with pytest.raises(ConfigEditError, match="not TOML"):          # the snippet's own duplicate
        edit(shipped(), "[numa]\nenabled = true\n[numa]\nnamespaces = []\n")
    with pytest.raises(ConfigEditError, match="dotted"):
        edit(shipped(), "numa.enabled = true\n")
    with pytest.raises(ConfigEditError, match=r"declares \[a\] 2 times"):
        edit("[a]\nx = 1\n[a]\nx = 2\n", "[a]\nx = 3\n")
