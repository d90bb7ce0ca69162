"""scripts/bench_nri.py's own parts: percentiles, ratios to direct, the round order, the
placement check, the other-load figure, the daemons' metrics and log lines it reads, the
intervals over rounds, issue 34's verdicts, finding nri-anchor, the report; and, with root
and containerd 2.2, one --quick run: every arm has figures and every proxy, nri and anchor
pod was placed. Its figures are the benchmark's to print, never asserted."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest

from anolisnuma.testing.containerd_builds import build_named
from anolisnuma.testing.proxy import REPO_ROOT

SCRIPT = os.path.join(REPO_ROOT, "scripts", "bench_nri.py")


def _load():
    spec = importlib.util.spec_from_file_location("bench_nri", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


bench = _load()


def _cannot_run():
    if os.geteuid() != 0:
        return "starts a private containerd: needs root"
    missing = build_named("2.2").missing()
    if missing:
        return f"needs containerd 2.2 (NRI): {missing}"
    if shutil.which("runc", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") is None:
        return "runc not found"
    if not os.path.isdir("/sys/fs/cgroup/cpuset"):
        return "needs the cgroup v1 cpuset hierarchy"
    try:
        import cri_api.v1.api_pb2  # noqa: F401
    except ImportError as e:
        return f"needs the CRI stubs (container-runtime-interface-api): {e}"
    return None


def test_percentiles_are_nearest_rank():
    values = list(range(1, 21))   # 1..20
    assert bench.pct(values, 0.5) == 10 and bench.pct(values, 0.9) == 18 and bench.pct(values, 1.0) == 20
    assert bench.pct([7.0], 0.9) == 7.0
    assert bench.pct([], 0.5) != bench.pct([], 0.5)   # nan
    s = bench.stats([3.0, 1.0, 2.0])
    assert (s["n"], s["p50"], s["p90"], s["max"], s["mean"]) == (3, 2.0, 3.0, 3.0, 2.0)


def test_ratios_are_to_the_direct_arm():
    figs = {"direct": {"p50": 100.0, "p90": 200.0}, "proxy": {"p50": 110.0, "p90": 300.0},
            "nri": {"p50": 90.0, "p90": 200.0}}
    r = bench.ratios(figs)
    assert r["direct"] == {"p50": 1.0, "p90": 1.0}
    assert r["proxy"] == pytest.approx({"p50": 1.1, "p90": 1.5})
    assert r["nri"] == pytest.approx({"p50": 0.9, "p90": 1.0})
    nan = bench.ratios({"direct": {"p50": 0.0, "p90": 1.0}, "nri": {"p50": 1.0, "p90": 1.0}})["nri"]["p50"]
    assert nan != nan


def test_every_arm_runs_once_a_round_and_none_always_first():
    order = bench.run_order(bench.ARMS, 6)
    assert all(sorted(r) == sorted(bench.ARMS) for r in order)
    assert {r[0] for r in order} == set(bench.ARMS)
    assert len({tuple(r) for r in order}) == 6   # forward and backward rotations


def test_placement_is_one_nodes_cpus_not_the_machine():
    nodes = {0: "0", 1: "1"}
    assert bench.placement("1", "", nodes) == 1
    assert bench.placement("0", "0-1", nodes) == 0          # the real cgroup wins
    assert bench.placement("", "1", nodes) == 1              # no cgroup readable: the spec
    assert bench.placement("0-1", "0", nodes) is None        # the whole machine: not placed
    assert bench.placement("", "", nodes) is None
    assert bench.placement("garbage", "", nodes) is None
    assert bench.node_of("2,3", {0: "0-1", 1: "2-3"}) == 1
    assert bench.node_of("0-3", {0: "0-1", 1: "2-3"}) is None


def test_other_load_is_busy_time_minus_ours():
    before = {"total": 1000, "busy": 100, "steal": 0, "ours": 50}
    after = {"total": 2000, "busy": 900, "steal": 10, "ours": 350}
    load = bench.other_cpu_percent(before, after)
    assert load == pytest.approx({"busy": 80.0, "other": 50.0, "steal": 1.0})
    assert bench.other_cpu_percent(before, dict(after, ours=2000))["other"] == 0.0


def test_pre_hook_time_comes_from_the_metrics_page():
    page = "\n".join([
        "# TYPE anolisnuma_hook_duration_seconds histogram",
        'anolisnuma_hook_duration_seconds_bucket{hook="numa",outcome="ok",stage="pre",le="0.005"} 3.0',
        'anolisnuma_hook_duration_seconds_count{hook="numa",outcome="ok",stage="pre"} 4.0',
        'anolisnuma_hook_duration_seconds_sum{hook="numa",outcome="ok",stage="pre"} 0.010',
        'anolisnuma_hook_duration_seconds_count{hook="numa",outcome="failed",stage="pre"} 1.0',
        'anolisnuma_hook_duration_seconds_sum{hook="numa",outcome="failed",stage="pre"} 0.002',
        'anolisnuma_hook_duration_seconds_count{hook="numa",outcome="ok",stage="post"} 9.0',
        'anolisnuma_hook_duration_seconds_sum{hook="numa",outcome="ok",stage="post"} 1.0',
        'anolisnuma_intercepted_call_duration_seconds_sum{code="OK",method="CreateContainer"} 5.0',
    ])
    parsed = bench.parse_metrics(page)
    assert parsed[("numa", "pre")] == pytest.approx((5.0, 0.012))
    before = {("numa", "pre"): (1.0, 0.002)}
    calls, ms = bench.pre_hook_ms(before, parsed)
    assert calls == 4 and ms == pytest.approx(10.0)   # post-hooks (after the reply) left out


def test_daemon_latencies_are_the_calls_of_the_benchmarks_namespace():
    lines = [
        {"message": "CreateContainer reply from containerd", "method": "CreateContainer", "latency_ms": 20.0,
         "pod_namespace": bench.NS},
        {"message": "CreateContainer reply from containerd", "method": "CreateContainer", "latency_ms": 99.0,
         "pod_namespace": "someone-else"},
        {"message": "StartContainer reply from containerd", "method": "StartContainer", "latency_ms": 80.0},
        {"message": "StopContainer reply from containerd", "method": "StopContainer", "latency_ms": 5.0},
        {"message": "CreateContainer request from kubelet", "method": "CreateContainer"},
        {"message": "RunPodSandbox answered to containerd (NRI)", "method": "RunPodSandbox", "latency_ms": 0.5},
    ]
    assert bench.daemon_latencies(lines, "proxy") == {"RunPodSandbox": [], "CreateContainer": [20.0],
                                                     "StartContainer": [80.0]}
    assert bench.daemon_latencies(lines, "nri")["RunPodSandbox"] == [0.5]


def _summary(placed_proxy: int = 4):
    figs = {k: {a: bench.stats([10.0, 20.0, 30.0, 40.0]) for a in bench.ARMS} for k in ("pod",) + bench.CALLS}
    placed = {"direct": {"pods": 4, "placed": 0, "node0": 0, "node1": 0},
              "proxy": {"pods": 4, "placed": placed_proxy, "node0": placed_proxy, "node1": 0},
              "nri": {"pods": 4, "placed": 4, "node0": 2, "node1": 2},
              "anchor": {"pods": 4, "placed": 4, "node0": 2, "node1": 2}}
    return {"figures_ms": figs, "ratios": {k: bench.ratios(v) for k, v in figs.items()}, "placement": placed,
            "unplaced": [] if placed_proxy == 4 else ["proxy abc: cgroup cpus '0-1', spec cpus ''"],
            "daemon_ms": {"proxy": {c: bench.stats([1.0]) for c in bench.CALLS},
                          "nri": {c: bench.stats([0.5]) for c in bench.CALLS}},
            "hooks": {"proxy": {"pre_hook_calls": 4, "pre_hook_ms_total": 8.0, "pre_hook_ms_per_pod": 2.0},
                      "nri": {"pre_hook_calls": 4, "pre_hook_ms_total": 8.0, "pre_hook_ms_per_pod": 2.0}},
            "rounds": 1, "pods_per_arm_round": 4, "b_start_to_registered_s": bench.stats([0.7]),
            "other_load": {"busy": 60.0, "other": 30.0, "steal": 0.0}, "measured_s": 5.0, "pod_start_s_total": 3.0,
            "arms": list(bench.ARMS), "repeat": 1, "anchor": "nri-anchor at /x",
            "loads": [{"busy": 60.0, "other": 30.0, "steal": 0.0}],
            "intervals": {k: {a: bench.mean_interval([1.0, 3.0]) for a in bench.ARMS if a != "direct"}
                          for k in ("pod",) + bench.CALLS},
            "plugin_cpu": {"nri": bench.mean_interval([7.0, 8.0]), "anchor": bench.mean_interval([1.0, 1.2])},
            "anchor_start_to_synchronized_s": bench.stats([0.02])}


def test_the_report_has_every_arm_every_call_and_says_when_the_machine_was_shared():
    r = {"mode": "quick", "machine": bench.machine(), "command": "scripts/bench_nri.py --quick",
         "summary": _summary(), "problems": [], "loadavg_at_end": "1 1 1", "elapsed_s": 20.0}
    out = bench.render(r)
    for arm in bench.ARMS:
        assert f"| {arm} | 4 |" in out
        for call in bench.CALLS:
            assert f"| {call} | {arm} |" in out
    assert "| nri | 4 | 4 (node 0: 2, node 1: 2) |" in out
    assert "not the benchmark's used 30 % of all CPUs" in out and "noisy" in out
    assert "PLACEMENT WRONG" not in out
    assert "| CreateContainer | +2.00 [" in out and "plugin CPU per pod start" in out
    assert "CreateContainer added over no plugin: nri +2.00" in out
    assert "plugin CPU per pod start <= 2 x anchor's: missed" in out
    assert "repeat 1: other processes 30 %" in out
    assert "PLACEMENT WRONG for 1 containers" in bench.render(dict(r, summary=_summary(placed_proxy=3)))


@pytest.mark.skipif(_cannot_run() is not None, reason=_cannot_run() or "")
def test_a_quick_run_has_all_three_arms_and_every_pod_placed(tmp_path):
    out = tmp_path / "figures.json"
    proc = subprocess.Popen([sys.executable, SCRIPT, "--quick", "--json", str(out)],
                            stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    r = json.loads(out.read_text())
    s = r["summary"]
    n = bench.QUICK["rounds"] * bench.QUICK["pods"]
    assert s["arms"][:3] == ["direct", "proxy", "nri"]
    for arm in s["arms"]:
        assert s["figures_ms"]["pod"][arm]["n"] == n, arm
        for call in bench.CALLS:
            assert s["figures_ms"][call][arm]["n"] == n
    if "anchor" in s["arms"]:
        assert s["plugin_cpu"]["anchor"]["n"] == bench.QUICK["rounds"]
        assert s["intervals"]["CreateContainer"]["anchor"]["n"] == bench.QUICK["rounds"]
    else:
        assert s["anchor"].startswith("skipped")
    assert s["plugin_cpu"]["nri"]["n"] == bench.QUICK["rounds"]
    assert "issue 34's targets" in stdout
    for arm in [a for a in s["arms"] if a != "direct"]:
        assert s["placement"][arm]["placed"] == s["placement"][arm]["pods"] == n, s["unplaced"]
    assert s["placement"]["direct"]["placed"] == 0   # no plugin registered during the direct arm
    assert s["unplaced"] == []
    assert s["hooks"]["nri"]["pre_hook_calls"] >= n   # the NRI events went through the hooks
    assert "| nri |" in stdout
    # its containerd and its directories are gone
    assert not os.path.exists(f"{bench.BASE_PREFIX}{proc.pid}") and not os.path.exists(f"{bench.RUN_PREFIX}{proc.pid}")


def test_t_quantiles_and_the_interval_over_rounds():
    assert bench.t975(1) == 12.706 and bench.t975(5) == 2.571 and bench.t975(35) == 2.042
    assert bench.t975(500) == 1.960 and bench.t975(0) != bench.t975(0)
    iv = bench.mean_interval([1.0, 2.0, 3.0])       # sd 1, n 3: half width 4.303 / sqrt(3)
    assert iv["n"] == 3 and iv["mean"] == 2.0
    assert iv["hi"] - 2.0 == pytest.approx(4.303 / 3 ** 0.5) and iv["lo"] == pytest.approx(4.0 - iv["hi"])
    one = bench.mean_interval([5.0])
    assert one["mean"] == 5.0 and one["lo"] != one["lo"]   # one round: no interval
    assert bench.mean_interval([])["n"] == 0


def test_differences_to_direct_are_paired_by_round():
    arm = [[10.0, 12.0], [20.0], []]
    direct = [[9.0, 9.0], [15.0], [1.0]]
    assert bench.round_differences(arm, direct) == [2.0, 5.0]   # the empty round left out


def _verdict_summary(nri_create, anchor_create, nri_cpu, anchor_cpu, proxy_x, nri_x):
    return {"intervals": {"CreateContainer": {"nri": bench.mean_interval([nri_create] * 2),
                                              "anchor": bench.mean_interval([anchor_create] * 2)}},
            "plugin_cpu": {"nri": bench.mean_interval([nri_cpu] * 2), "anchor": bench.mean_interval([anchor_cpu] * 2)},
            "ratios": {"pod": {"proxy": {"p50": proxy_x}, "nri": {"p50": nri_x}}}}


def test_verdicts_read_issue_34s_targets():
    v = bench.verdicts(_verdict_summary(1.2, 0.3, 2.0, 1.0, 1.03, 1.01))
    assert [ok for _, ok, _ in v] == [True, True, True, True]
    v = bench.verdicts(_verdict_summary(5.9, 0.3, 7.0, 1.0, 1.07, 1.12))
    assert [ok for _, ok, _ in v] == [False, False, False, False]
    assert "nri +5.90 ms, anchor +0.30 ms (difference 5.60 ms)" in v[0][2]
    assert "(7.00 x)" in v[1][2]
    assert v[3][2] == "missed: 1.120 x"
    # no anchor arm: its two targets are not measured, the pod start ones still are
    s = _verdict_summary(1.0, 0.0, 1.0, 1.0, 1.0, 1.0)
    del s["intervals"]["CreateContainer"]["anchor"], s["plugin_cpu"]["anchor"]
    assert [ok for _, ok, _ in bench.verdicts(s)] == [None, None, True, True]


def test_the_anchor_is_found_by_environment_or_beside_the_repository(tmp_path):
    repo = tmp_path / "main"
    repo.mkdir()
    path, why = bench.anchor_binary(str(repo), env={})
    assert path is None and "shared/nri-anchor/nri-anchor" in why and bench.ANCHOR_ENV in why
    binary = tmp_path / "shared" / "nri-anchor" / "nri-anchor"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    assert bench.anchor_binary(str(repo), env={})[0] is None      # not executable
    binary.chmod(0o755)
    assert bench.anchor_binary(str(repo), env={})[0] == str(binary)
    other = tmp_path / "elsewhere"
    other.write_text("#!/bin/sh\n")
    other.chmod(0o755)
    assert bench.anchor_binary(str(repo), env={bench.ANCHOR_ENV: str(other)})[0] == str(other)


def test_the_anchor_is_started_with_the_benchmarks_namespace_and_cpus():
    argv = bench.Anchor("/bin/anchor", "/run/x/nri.sock", "/tmp/log").argv()
    assert argv[:3] == ["/bin/anchor", "-socket", "/run/x/nri.sock"]
    assert argv[argv.index("-namespace") + 1] == bench.NS and argv[argv.index("-cpus") + 1] == "0,1"
    assert "-mems=" in argv   # memory pinning off, as the daemons'


def test_pooled_load_averages_the_repeats():
    loads = [{"busy": 50.0, "other": 20.0, "steal": 0.0}, {"busy": 70.0, "other": 40.0, "steal": 2.0}]
    assert bench.pooled_load(loads) == {"busy": 60.0, "other": 30.0, "steal": 1.0}
    assert bench.pooled_load([]) == {}
