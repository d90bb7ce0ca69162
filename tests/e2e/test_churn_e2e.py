"""A short churn soak on the real containerd (``scripts/bench_churn.py``'s own code): the
daemon with every policy on, four callers on one connection, a share of the teardowns sent
behind the proxy's back and a share of RunPodSandbox calls that fail for good; once the
pods are gone and two resyncs passed with no call, every structure the daemon keeps per
pod is back to empty, as ``anolisnuma-ctl status`` reports it."""

from __future__ import annotations

import os
import sys
from collections import Counter

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "scripts")
if SCRIPTS not in sys.path:
    sys.path.insert(0, SCRIPTS)

from bench_churn import ChurnSoak, SoakPlan  # noqa: E402

# A soak of the proxy's own bookkeeping: the runtime's side is covered by the lifecycle
# tests on every build; this one runs on Debian's containerd only (CI's time budget).
CONTAINERD_BUILDS = ("1.6",)

# Every holder the daemon has with QoS, NUMA and affinity on, and the store.
HOLDERS = {"store", "recent_calls", "pod_locks", "journal", "numa", "numa-affinity", "numa-respread", "qos"}


def test_every_structure_returns_to_empty_once_the_pods_are_gone(containerd, tmp_path):
    plan = SoakPlan(lifecycles=150, every=50, lost_every=10, failed_every=16)
    soak = ChurnSoak(containerd, str(tmp_path / "soak"), plan)
    try:
        soak.start()
        outcome = soak.run()
    finally:
        soak.stop()
    assert outcome.problems == []
    assert outcome.kinds == dict(Counter(plan.kind(i) for i in range(plan.lifecycles)))
    assert outcome.kinds["lost"] >= 12 and outcome.kinds["failed"] >= 9
    assert {k.split(".")[0] for k in outcome.final.structures} == HOLDERS
    # the pods were there while they ran (the counts are not empty by accident) ...
    busy = {k for s in outcome.samples for k, v in s.structures.items() if v}
    assert {"store.pods", "journal.pods", "pod_locks.pods", "qos.pods", "numa.allocations"} <= busy
    # ... and nothing is left of them: the lost teardowns and the failed runs included
    assert outcome.not_empty() == {}
    # the loops' connections are made at first use, then kept: no fd more than under load
    assert outcome.final.fds <= outcome.samples[1].fds
