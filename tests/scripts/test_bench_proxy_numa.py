"""scripts/bench_proxy.py's CreateContainer with the NUMA hook on against direct (issue 34):
the interval arithmetic, the paired differences, the verdict and its report line. The
benchmark's runs are its own (root, containerd); its figures are never asserted."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

from anolisnuma.testing.proxy import REPO_ROOT

SCRIPT = os.path.join(REPO_ROOT, "scripts", "bench_proxy.py")


def _load():
    spec = importlib.util.spec_from_file_location("bench_proxy", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


try:
    bench = _load()
except ImportError as e:   # grpcio / psutil are test extras
    pytest.skip(f"bench_proxy needs its extras: {e}", allow_module_level=True)


def test_the_interval_is_a_t_interval_over_the_values():
    iv = bench.mean_interval([2.0, 4.0])          # sd sqrt(2), n 2, t(1) 12.706
    assert iv["mean"] == 3.0
    assert iv["hi"] - 3.0 == pytest.approx(12.706 * 2 ** 0.5 / 2 ** 0.5)
    assert bench.t975(12) == 2.179 and bench.t975(45) == 2.021


def test_numa_create_is_paired_by_iteration_and_judged_on_the_mean():
    creates = {"direct": [10.0, 12.0, 14.0], "proxy": [11.0, 13.0, 15.0], "numa": [11.0, 13.5, 15.0]}
    times = {"direct": [0.2, 0.2, 0.2], "proxy": [0.21] * 3, "numa": [0.22, 0.2, 0.21]}
    s = bench.numa_create_summary(creates, times)
    assert s["added_mean"]["n"] == 3 and s["added_mean"]["mean"] == pytest.approx(7 / 6)
    assert s["added_p50_ms"] == pytest.approx(1.5) and s["met"] is True
    assert s["pod_ratio_median"] == pytest.approx(1.05)
    slow = bench.numa_create_summary(dict(creates, numa=[15.0, 17.0, 19.0]), times)
    assert slow["met"] is False
    assert bench.numa_create_summary({"direct": [], "numa": []}, {})["met"] is None


def test_the_report_line_has_the_figures_the_interval_and_the_verdict():
    creates = {"direct": [10.0, 12.0], "proxy": [11.0, 13.0], "numa": [13.0, 15.0]}
    s = bench.numa_create_summary(creates, {"direct": [0.2, 0.2], "numa": [0.21, 0.21]})
    s["placed"] = {"containers": 3, "placed": 3}
    out = "\n".join(bench.render_numa_create(s))
    assert "3 of 3 containers placed on one node" in out
    assert "NUMA on over direct: mean +3.00 ms [95 %: 3.00, 3.00]" in out
    assert "target <= +1.5 ms MISS" in out
    assert bench.render_numa_create(None) == []
