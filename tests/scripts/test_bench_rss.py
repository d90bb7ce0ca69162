"""scripts/bench_rss.py's own parts: reading VmRSS, the checkpoints, the verdict on the
48 MB flat target, the report; and one --quick run (FakeCri, the fake host, the fake NRI
runtime; without the cluster link, which has its own tests): a reading at rest, one per
100 pods, every pod through and placed. Its figures are the benchmark's to print, never asserted."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from anolisnuma.testing.proxy import REPO_ROOT

SCRIPT = os.path.join(REPO_ROOT, "scripts", "bench_rss.py")


def _load():
    spec = importlib.util.spec_from_file_location("bench_rss", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


bench = _load()


def _cannot_run():
    try:
        import cri_api.v1.api_pb2  # noqa: F401
    except ImportError as e:
        return f"needs the CRI stubs (container-runtime-interface-api): {e}"
    return None


def test_vmrss_is_read_from_proc_status_in_mb():
    text = "Name:\tpython\nVmPeak:\t  99999 kB\nVmRSS:\t   49152 kB\nRssAnon:\t 1 kB\n"
    assert bench.vmrss_mb(text) == 48.0
    assert bench.vmrss_mb("Name:\tzombie\n") != bench.vmrss_mb("")   # nan


def test_checkpoints_every_n_pods_and_at_the_end():
    assert bench.checkpoints(10_000, 1_000) == list(range(1_000, 10_001, 1_000))
    assert bench.checkpoints(250, 100) == [100, 200, 250]
    assert bench.checkpoints(50, 100) == [50]
    assert bench.checkpoints(5, 0) == [5]


def test_the_verdict_is_the_peak_and_the_growth_after_the_first_checkpoint():
    flat = [("at rest", 0, 30.0), ("checkpoint", 1000, 40.0), ("checkpoint", 2000, 41.0), ("rest", 2000, 41.5)]
    v = bench.rss_verdict(flat)
    assert v["met"] and v["peak_mb"] == 41.5 and v["growth_mb"] == pytest.approx(1.5)
    assert "met: peak 41.5 MB" in v["text"] and "from 1000 pods" in v["text"]
    growing = flat[:3] + [("checkpoint", 3000, 44.0)]
    assert not bench.rss_verdict(growing)["met"]                      # +4 MB: not flat
    big = [("at rest", 0, 70.0), ("checkpoint", 100, 70.5), ("checkpoint", 200, 70.4)]
    assert not bench.rss_verdict(big)["met"] and bench.rss_verdict(big)["text"].startswith("missed")


def test_the_report_says_what_was_on_and_the_load():
    r = {"mode": "quick", "machine": bench.machine(), "command": "scripts/bench_rss.py --quick", "pods": 200,
         "callers": 2, "on": ["QoS", "NUMA"], "off": ["NRI"], "problems": [], "elapsed_s": 12.0,
         "samples": [{"label": "at rest", "pods": 0, "mb": 30.0, "rate": None, "loadavg": "1.00 1.00 1.00"},
                     {"label": "checkpoint", "pods": 100, "mb": 31.0, "rate": 40.0, "loadavg": "1.50 1.00 1.00"}],
         "load": {"busy": 90.0, "other": 20.0, "steal": 0.0}}
    r["verdict"] = bench.rss_verdict([(s["label"], s["pods"], s["mb"]) for s in r["samples"]])
    out = bench.render(r)
    assert "on: QoS, NUMA; off: NRI" in out
    assert "| checkpoint | 100 | 31.00 | 40 | 1.50 1.00 1.00 |" in out
    assert "used 20 % of all CPUs" in out and "RSS <= 48 MB, flat: met" in out


@pytest.mark.skipif(_cannot_run() is not None, reason=_cannot_run() or "")
def test_a_quick_run_reads_rss_at_rest_and_every_100_pods(tmp_path):
    out = tmp_path / "rss.json"
    proc = subprocess.run([sys.executable, SCRIPT, "--quick", "--no-cluster", "--json", str(out)],
                          capture_output=True, text=True, cwd=REPO_ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert [s["pods"] for s in r["samples"]] == [0, 100, 200, 300, 400, 500, 500]
    assert all(s["mb"] > 0 for s in r["samples"])
    assert r["failed_pods"] == 0, r["problems"][:5]
    assert any(x.startswith("cluster link") for x in r["off"])
    assert any(x.startswith("NRI") for x in r["on"]) and r["nri_placed"] == 500   # NUMA acted on NRI's creates
    assert "RSS <= 48 MB, flat:" in proc.stdout
