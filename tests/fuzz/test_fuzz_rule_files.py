"""Rule files: YAML Oenuma files in the placement-rule directory, written by root. Read by
the directory's reader (a file it cannot use is a problem named, never an exception) and
parsed by the rule parser (rules, or its RuleFileError for the file): Oenuma documents with
hostile parts, YAML's anchors and aliases (bombs among them), deep nesting, any bytes, up
to the reader's own limit of 1 MiB."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from oenuma_shapes import NODE, TOPO, crs

from anolisnuma.policies.numa.rules import RuleFileError, parse_oenuma_documents
from anolisnuma.system.rule_files import MAX_RULE_FILE, RuleDirectory
from anolisnuma.testing.fuzzing import assert_linear, fuzz_settings, outcome

OENUMA = ("apiVersion: resource.sop.huawei.com/v1alpha1\nkind: Oenuma\nmetadata: {name: plan, namespace: ops}\n"
          "spec:\n  node:\n")


@pytest.fixture(scope="module")
def rules_dir():
    path = tempfile.mkdtemp(prefix="fuzz-rules-")   # (0700, root's: a directory the reader trusts)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def read_and_parse(directory, data):
    """The daemon's path: the file written, the directory read, each file's documents parsed."""
    with open(os.path.join(directory, "rules.yaml"), "wb") as f:
        f.write(data)
    files, problems = RuleDirectory(directory).read()
    out = []
    for path, documents in files:
        try:
            out.append(parse_oenuma_documents(documents, path, NODE, TOPO))
        except RuleFileError as e:
            out.append(e)
    return files, problems, out


def laughs(levels, width):
    lines = [f"l0: &l0 [{', '.join(['x'] * width)}]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def nested(depth, lists=True):
    return "a: " + ("[" * depth + "]" * depth if lists else "{a: " * depth + "}" * depth)


def squared(n):
    """An Oenuma whose n entries are aliases of one entry of n affinity aliases."""
    return ("shared: [&p {podName: web, numaNum: 0}, &e {name: worker-1, podAffinity: ["
            + ", ".join(["*p"] * n) + "]}]\n" + OENUMA + "".join("    - *e\n" for _ in range(n)))


hostile_yaml = st.one_of(
    st.builds(laughs, st.integers(1, 12), st.integers(1, 12)),
    st.integers(1, 400).map(squared),
    # (deeper, to past the reader's recursion: the test after this one, once: each costs
    # 0.5 s, and 20 s under tracemalloc)
    st.builds(nested, st.integers(1, 100), st.booleans()),
    st.sampled_from(["&a [*a]", "a: !!python/object:os.system x", "a: *undefined", "\t- x", "--- |\n  x\n...\n" * 3,
                     "a: 2001-02-30", "a: 1" + "0" * 5000, "<<: *x", "a: &a {<<: *a}", "? [a]\n: b"]),
    st.text(max_size=200),
)


@fuzz_settings(60)
@given(st.one_of(crs.map(lambda obj: yaml.safe_dump(obj)), hostile_yaml).map(str.encode) | st.binary(max_size=300))
def test_any_file_is_rules_or_a_problem_named(rules_dir, data):
    # given a rule file of any text, when the directory is read and the file parsed
    (files, problems, parsed), _ = outcome("rule-files", lambda: read_and_parse(rules_dir, data), size=len(data))
    # then it is read (its documents parsed into rules or its error), or skipped with a problem
    assert len(files) + len(problems) == 1
    for result in parsed:
        assert isinstance(result, RuleFileError) or all(r.nodes for r in result[0])


@pytest.mark.parametrize("lists", [True, False])
def test_a_file_nested_past_the_readers_recursion_is_a_problem(rules_dir, lists):
    data = nested(5000, lists).encode()
    # (not traced: tracemalloc makes the YAML reader's unwinding of its recursion take 20 s;
    # what it holds is bounded by the recursion limit)
    (files, problems, _), _ = outcome("rule-files", lambda: read_and_parse(rules_dir, data), size=len(data),
                                      traced=False)
    assert files == [] and problems[0].endswith("skipped: nested too deeply")


def test_a_file_past_the_readers_limit_is_a_problem(rules_dir):
    (files, problems, _), _ = outcome("rule-files", lambda: read_and_parse(rules_dir, b"#" * (MAX_RULE_FILE + 1)),
                                      size=MAX_RULE_FILE + 1)
    assert files == [] and "larger than 1 MiB" in problems[0]


SHAPES = {
    "entries": lambda n: OENUMA + "".join(f"    - {{name: worker-1, podAffinity: [{{podName: web-{i}, numaNum: 0}}]}}\n"
                                          for i in range(n)),
    "aliases squared": lambda n: squared(n),
    "laughs": lambda n: laughs(3, n),
    # (not nesting: YAML's reader costs more than linear time in the depth, up to its
    # recursion limit, past which the file is a problem: a bounded cost, the test above)
}


@fuzz_settings(len(SHAPES))
@given(st.sampled_from(sorted(SHAPES)))
def test_time_is_linear_in_the_file(rules_dir, shape):
    # given files of one shape, the large one 30x the small one
    def run(text):
        read_and_parse(rules_dir, text.encode())
    # when each is read and parsed, then the large one costs no more than 90x
    assert_linear("rule-files", SHAPES[shape], run, small=30)
