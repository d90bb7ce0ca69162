"""scripts/fuzz.py's own parts: the catalogue it lists (every parser with its generator and
bounds, the ones the suite asserts), and the sum of passes' observations."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

from anolisnuma.testing import fuzzing

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "fuzz.py")


def _script():
    spec = importlib.util.spec_from_file_location("fuzz_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_list_names_every_parser_with_its_generator_and_bounds():
    out = subprocess.run([sys.executable, SCRIPT, "--list"], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                         check=True).stdout
    for parser in fuzzing.PARSERS.values():
        assert f"{parser.name}\n  entry:     {parser.entry}" in out
        assert parser.describe_bounds() in out and parser.generator in out


def test_passes_add_their_inputs_and_keep_the_worst(tmp_path):
    fuzz = _script()
    report = tmp_path / "report.json"
    total = {}
    for inputs, cpu, peak in ((10, 0.5, 100), (5, 0.2, 300)):
        report.write_text(json.dumps({"cpuset": {"inputs": inputs, "worst_cpu_seconds": cpu, "worst_peak_bytes": peak,
                                                 "worst_time_ratio": 2.0}}))
        fuzz.merge(total, str(report))
    assert total == {"cpuset": {"inputs": 15, "worst_cpu_seconds": 0.5, "worst_peak_bytes": 300,
                                "worst_time_ratio": 2.0}}


def test_every_parser_of_the_suite_is_in_the_catalogue():
    tests = os.listdir(os.path.join(ROOT, "tests", "fuzz"))
    named = set()
    for name in tests:
        if name.startswith("test_") and name.endswith(".py"):
            with open(os.path.join(ROOT, "tests", "fuzz", name)) as f:
                text = f.read()
            named.update(n for n in fuzzing.PARSERS if f'"{n}"' in text)
    assert named == set(fuzzing.PARSERS)


def test_the_docs_state_the_bounds_the_suite_asserts():
    with open(os.path.join(ROOT, "docs", "fuzzing.md")) as f:
        rows = {line.split("`")[1]: line for line in f if line.startswith("| `")}
    assert set(rows) == set(fuzzing.PARSERS)
    for name, parser in fuzzing.PARSERS.items():
        assert f"| {parser.size_ratio}, {parser.time_ratio:g} |" in rows[name], name
        assert f"{fuzzing._size(parser.memory_base)} + {parser.memory_per_byte} B/byte" in rows[name], name
