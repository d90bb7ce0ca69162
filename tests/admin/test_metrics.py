"""The Prometheus endpoint scraped during pod lifecycles: calls and latency per method and
code, hook outcomes, NUMA allocations per node, reconciler runs and drift fixed, relay
buffers; off by default, and a port in use costs the daemon nothing but the endpoint."""

from __future__ import annotations

import os
import socket
import urllib.error
import urllib.request
from typing import Dict, Tuple

import grpc
import pytest
from conftest import Node, pod_parent
from prometheus_client.parser import text_string_to_metric_families

from anolisnuma.testing.fake_cri import FakeCri, runtime_path
from anolisnuma.testing.proxy import InProcessProxy, make_config
from anolisnuma.testing.waiting import wait_until

Samples = Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float]


def scrape(node: Node) -> Samples:
    node.settle()
    # Each test reads what it just did: no page from the last second (tests of the
    # sharing itself are in test_metrics_flood.py).
    node.daemon.admin.metrics.scrapes.interval = 0.0
    with urllib.request.urlopen(node.metrics_url, timeout=5) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        text = r.read().decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def test_calls_and_their_latency_per_method_and_code(node):
    k = node.kubelet
    a = k.run_started("web-0")
    node.fake.set_error(runtime_path("StartContainer"), grpc.StatusCode.NOT_FOUND, "no such container")
    k.create(a, "sidecar")
    with pytest.raises(grpc.RpcError):
        k.start(a, "sidecar")
    m = scrape(node)
    calls = "anolisnuma_intercepted_calls_total"
    assert value(m, calls, method="RunPodSandbox", code="OK") == 1
    assert value(m, calls, method="CreateContainer", code="OK") == 2
    assert value(m, calls, method="StartContainer", code="OK") == 1
    assert value(m, calls, method="StartContainer", code="NOT_FOUND") == 1
    hist = "anolisnuma_intercepted_call_duration_seconds"
    assert value(m, hist + "_count", method="CreateContainer", code="OK") == 2
    assert value(m, hist + "_bucket", method="CreateContainer", code="OK", le="+Inf") == 2
    assert 0 < value(m, hist + "_sum", method="CreateContainer", code="OK") < 2
    assert value(m, hist + "_bucket", method="CreateContainer", code="OK", le="0.0005") <= \
        value(m, hist + "_bucket", method="CreateContainer", code="OK", le="1.0")


def test_hook_outcomes_and_latency(node):
    k = node.kubelet
    k.run_started("web-0")
    # a pod whose group identity file cannot be written: the QoS pre-hook fails (ignored)
    uid = "0f0f0f0f-0000-4000-8000-000000000001"
    pod = node.kernel.make_pod(pod_parent(uid))
    node.kernel.make_readonly(node.kernel.cgroup.file(pod.rel, "cpu.bvt_warp_ns"))
    k.run_pod("stuck", uid=uid, make_cgroup=False)
    m = scrape(node)
    calls = "anolisnuma_hook_calls_total"
    assert value(m, calls, hook="qos", stage="pre", outcome="failed") == 1
    assert value(m, calls, hook="qos", stage="pre", outcome="ok") == 2      # RunPodSandbox, StartContainer
    assert value(m, calls, hook="numa", stage="pre", outcome="ok") == 1     # CreateContainer
    assert value(m, "anolisnuma_hook_duration_seconds_count", hook="qos", stage="pre", outcome="failed") == 1
    status = {h["name"]: h for h in node.ctl_json("status")["hooks"]}
    assert status["qos"]["pre_failed"] == 1 and status["qos"]["pre_ok"] == 2
    [e] = node.ctl_json("explain", "batch/stuck")
    assert e["calls"][0]["hook_errors"][0].startswith("qos pre: qos: 1 knob write(s) refused")


def test_numa_allocations_per_node_and_the_kubelets_exclusive_cpus(node):
    k = node.kubelet
    k.run_started("a")
    k.run_started("b", containers=("app", "sidecar"))
    m = scrape(node)
    pods = {n: value(m, "anolisnuma_numa_node_pods", node=n) for n in ("0", "1")}
    assert sorted(pods.values()) == [1, 1]
    assert sorted(value(m, "anolisnuma_numa_node_allocated_cpus", node=n) for n in ("0", "1")) == [1, 2]
    assert value(m, "anolisnuma_numa_node_cpus", node="1") == 4
    assert value(m, "anolisnuma_numa_node_shared_cpus", node="1") == 3
    assert value(m, "anolisnuma_numa_node_kubelet_exclusive_cpus", node="1") == 1
    assert value(m, "anolisnuma_numa_pending_updates") == 0
    assert value(m, "anolisnuma_qos_pods", level="LS") == 2
    assert value(m, "anolisnuma_qos_knob_supported", knob="cpu.bvt_warp_ns") == 1
    assert value(m, "anolisnuma_qos_knob_supported", knob="resctrl.L3") == 0
    assert value(m, "anolisnuma_qos_kernel_family", family="alinux") == 1
    assert value(m, "anolisnuma_qos_kernel_family", family="openeuler") == 0


def test_reconciler_runs_and_drift_fixed(node):
    k = node.kubelet
    pod = k.run_started("a", annotations={"anolisbox.sh/qoslevel": "BE"})
    node.settle()
    qos = next(h for h in node.daemon.hooks if h.name == "qos")
    before = scrape(node)
    runs = value(before, "anolisnuma_reconcile_runs_total", reconciler="qos")
    rel = pod_parent(pod.uid).lstrip("/")
    node.kernel.cgroup.set(rel, "cpu.bvt_warp_ns", 0)       # someone changed it behind our back
    counts = qos.run_once()
    assert counts.rewritten == 1
    assert node.kernel.cgroup.read(rel, "cpu.bvt_warp_ns") == "-1"
    after = scrape(node)
    assert value(after, "anolisnuma_reconcile_runs_total", reconciler="qos") >= runs + 1
    assert value(after, "anolisnuma_reconcile_drift_fixed_total", reconciler="qos") >= 1
    assert value(after, "anolisnuma_reconcile_errors_total", reconciler="qos") == 0
    assert value(after, "anolisnuma_reconcile_runs_total", reconciler="numa_repin") >= 1
    recs = node.ctl_json("status")["reconcilers"]
    assert recs["qos"]["rewritten"] >= 1
    # every background loop under one family, with its own counts as events
    after = wait_until(lambda: (lambda m: m if all(value(m, "anolisnuma_controller_runs_total", controller=c) >= 1
                                                   for c in ("numa-watch", "numa-affinity", "store-writer"))
                                    else None)(scrape(node)),
                       "a pass of the watcher, of the affinity loop and of the store's writer (it gathers changes)")
    for name in ("store-writer", "numa-watch", "numa-repin", "numa-affinity", "qos-reconcile"):
        assert value(after, "anolisnuma_controller_runs_total", controller=name) >= 1, name
        assert value(after, "anolisnuma_controller_errors_total", controller=name) == 0, name
        assert value(after, "anolisnuma_controller_last_pass_seconds", controller=name) >= 0, name
    assert value(after, "anolisnuma_controller_events_total", controller="numa-affinity", event="samples") >= 1
    assert value(after, "anolisnuma_controller_events_total", controller="numa-affinity", event="moves") == 0
    assert value(after, "anolisnuma_controller_events_total", controller="qos-reconcile", event="rewritten") >= 1


def test_relay_buffers_and_daemon_gauges(node):
    node.kubelet.run_started("a")
    m = scrape(node)
    assert value(m, "anolisnuma_relay_buffer_bytes") == 0
    assert value(m, "anolisnuma_relay_buffer_peak_bytes") > 0
    assert value(m, "anolisnuma_relay_buffer_limit_bytes") == 64 << 20
    assert value(m, "anolisnuma_relay_buffer_connection_limit_bytes") == 32 << 20
    assert value(m, "anolisnuma_relay_connections") == 1
    assert value(m, "anolisnuma_relay_refused_calls_total") == 0
    assert value(m, "anolisnuma_ready") == 1
    assert value(m, "anolisnuma_calls_waiting_for_hooks") == 0
    assert value(m, "anolisnuma_build_info", version=node.ctl_json("status")["version"]) == 1
    assert m[("process_resident_memory_bytes", ())] > 0


def test_the_endpoint_is_off_by_default_and_stops_with_the_daemon(node, sockdir):
    fake = FakeCri(os.path.join(sockdir, "b.sock"), containers=0, sandboxes=0).start()
    try:
        with InProcessProxy(make_config(sockdir, fake.socket_path, listen=os.path.join(sockdir, "b-cri.sock")),
                            hooks=[], configure_logging=False) as plain:
            wait_until(lambda: plain.daemon.ready, "the daemon to be ready")
            assert plain.daemon.admin.metrics is None and plain.daemon.admin.server is None
    finally:
        fake.stop(0)
    url = node.metrics_url
    node.proxy.stop()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=2)


def test_a_port_in_use_leaves_the_daemon_running_without_metrics(sockdir):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    fake = FakeCri(os.path.join(sockdir, "c.sock"), containers=0, sandboxes=0).start()
    try:
        cfg = make_config(sockdir, fake.socket_path, metrics_listen=f"127.0.0.1:{port}",
                          admin_socket=os.path.join(sockdir, "admin.sock"))
        with InProcessProxy(cfg, hooks=[]) as proxy:
            wait_until(lambda: proxy.daemon.ready, "the daemon to be ready")
            assert proxy.daemon.admin.metrics is None
            assert proxy.daemon.admin.server is not None
            lines = [x for x in proxy.log_lines() if x.get("message", "").startswith("metrics endpoint unavailable")]
            assert lines and lines[0]["level"] == "error" and lines[0]["listen"] == f"127.0.0.1:{port}"
    finally:
        fake.stop(0)
        taken.close()
