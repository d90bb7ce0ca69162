"""The placement-rule directory's reader on hostile YAML: what a file stands for is bounded
by its text (aliases are counted as what they stand for), and nesting past the YAML
reader's recursion is a problem named, not an exception out of the reader."""

from __future__ import annotations

import os
import time

import pytest

from anolisnuma.system.rule_files import RuleDirectory, values_within

ENTRY = "    - {name: worker-1, podAffinity: [{podName: web, numaNum: 0}]}\n"
OENUMA = ("apiVersion: resource.sop.huawei.com/v1alpha1\nkind: Oenuma\nmetadata: {name: plan}\n"
          "spec:\n  node:\n")


@pytest.fixture
def rules_dir(tmp_path):
    os.chmod(tmp_path, 0o700)
    return tmp_path


def laughs(levels: int) -> str:
    """The billion laughs: each level a list of nine aliases of the one before."""
    lines = ["l0: &l0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_skipped_at_once_and_named(rules_dir):
    # given a 700-byte file whose aliases stand for 9^9 values, beside a good file
    (rules_dir / "bomb.yaml").write_text(laughs(9))
    (rules_dir / "good.yaml").write_text(OENUMA + ENTRY)
    # when the directory is read
    start = time.process_time()
    files, problems = RuleDirectory(str(rules_dir)).read()
    # then the bomb is skipped, saying why, within a few milliseconds, and the good file read
    assert time.process_time() - start < 0.5
    assert [os.path.basename(p) for p, _ in files] == ["good.yaml"]
    assert len(problems) == 1 and "bomb.yaml skipped: its YAML aliases stand for more than" in problems[0]


def test_entries_repeated_by_aliases_cannot_multiply_the_parsers_work(rules_dir):
    # given an Oenuma whose 2,000 entries are aliases of one entry holding 2,000 aliases
    # (30 kB of text, 4 million affinity entries for the rule parser)
    anchors = ("shared: [&p {podName: web, numaNum: 0}, &e {name: worker-1, podAffinity: ["
               + ", ".join(["*p"] * 2000) + "]}]\n")
    text = anchors + OENUMA + "".join("    - *e\n" for _ in range(2000))
    (rules_dir / "square.yaml").write_text(text)
    # when the directory is read, then the file is skipped
    files, problems = RuleDirectory(str(rules_dir)).read()
    assert files == [] and "aliases stand for more than" in problems[0]


def test_a_file_nested_past_the_readers_recursion_is_a_problem_not_an_exception(rules_dir):
    (rules_dir / "deep.yaml").write_text("a: " + "[" * 5000 + "]" * 5000 + "\n")
    files, problems = RuleDirectory(str(rules_dir)).read()
    assert files == [] and problems == [f"rule file {rules_dir}/deep.yaml skipped: nested too deeply"]


def test_anchors_that_stand_for_no_more_than_their_text_are_fine(rules_dir):
    # given an operator's file that reuses one affinity entry by an alias
    text = OENUMA + "    - {name: worker-1, podAffinity: [&p {podName: web, numaNum: 0}, *p]}\n"
    (rules_dir / "anchors.yaml").write_text(text)
    files, problems = RuleDirectory(str(rules_dir)).read()
    assert problems == [] and len(files) == 1


def test_a_list_holding_itself_is_counted_without_end_and_refused():
    looped = []
    looped.extend([looped] * 1000)
    start = time.process_time()
    assert not values_within([looped], 100_000)
    assert time.process_time() - start < 0.5
