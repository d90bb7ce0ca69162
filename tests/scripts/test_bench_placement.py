"""scripts/bench_placement.py runs both modes and checks numa.json against the ledger."""

from __future__ import annotations

import importlib.util
import json
import os

from anolisnuma.testing.proxy import REPO_ROOT

SCRIPT = os.path.join(REPO_ROOT, "scripts", "bench_placement.py")


def test_a_short_run_reports_both_modes(tmp_path, capsys):
    # given the script
    spec = importlib.util.spec_from_file_location("bench_placement", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "summary.json"
    # when it runs a few pods in both modes
    assert bench.main(["--pods", "40", "--population", "10", "--gap-ms", "0", "--state-dir", str(tmp_path),
                       "--json", str(out)]) == 0
    # then each mode has its numbers, the synchronous one wrote every change, and the
    # directories are gone
    summary = json.loads(out.read_text())
    sync, behind = summary["synchronous"], summary["write-behind"]
    assert sync["writes"] == 40 * 2 + 30 and 1 <= behind["writes"] <= sync["writes"]
    assert sync["allocations_at_end"] == behind["allocations_at_end"] == 10
    assert summary["ratio_p50"] > 0 and "synchronous / write-behind" in capsys.readouterr().out
    assert not os.path.exists(summary["state_dir"])
