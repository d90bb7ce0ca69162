"""The per-pod journal behind `anolisnuma-ctl explain` and the latency histograms behind the
metrics: bounded, and cheap to feed."""

from __future__ import annotations

import time

from anolisnuma.pipeline.journal import JournalEntry, PodJournal
from anolisnuma.pipeline.metrics import LatencyStats
from anolisnuma.state.gone import PodGone, PodKeys


def entry(method: str = "StartContainer", **notes: str) -> JournalEntry:
    return JournalEntry(method, "OK", 1.5, "app", dict(notes), [], "containerd")


def test_the_journal_keeps_the_last_calls_of_each_pod_and_forgets_removed_pods():
    j = PodJournal(calls_per_pod=3, max_pods=10)
    for i in range(5):
        j.record("uid-a", entry(f"Call{i}"))
    j.record("uid-b", entry("RunPodSandbox", qos="BE"))
    assert [c["method"] for c in j.calls("uid-a")] == ["Call2", "Call3", "Call4"]
    [b] = j.calls("uid-b")
    assert b["decisions"] == {"qos": "BE"} and b["status"] == "OK" and b["container"] == "app"
    assert abs(b["at"] - time.time()) < 5
    assert j.held() == PodKeys.of(["uid-a", "uid-b"]) and j.structures() == {"pods": 2, "entries": 4}
    j.forget(PodGone.of_ids("removed", ["uid-a"], ["sandbox-of-a"]))
    assert j.calls("uid-a") == [] and len(j) == 1 and j.structures() == {"pods": 1, "entries": 1}


def test_the_journal_holds_at_most_max_pods_dropping_the_least_recently_seen():
    j = PodJournal(calls_per_pod=2, max_pods=3)
    for uid in ("a", "b", "c"):
        j.record(uid, entry())
    j.record("a", entry())          # a is seen again: b is now the oldest
    j.record("d", entry())
    assert len(j) == 3
    assert j.calls("b") == [] and j.calls("a") and j.calls("d")


def test_post_hook_notes_amend_their_entry():
    j = PodJournal()
    e = entry("RunPodSandbox", qos="BE")
    j.record("a", e)
    j.amend(e, {"qos": "BE", "numa": "managed"}, ["numa post: boom"])
    [c] = j.calls("a")
    assert c["decisions"] == {"qos": "BE", "numa": "managed"} and c["hook_errors"] == ["numa post: boom"]


def test_latency_stats_are_cumulative_histograms_per_label():
    s = LatencyStats(buckets=(0.001, 0.01, 0.1))
    for seconds in (0.0005, 0.001, 0.005, 0.05, 3.0):
        s.observe(("CreateContainer", "OK"), seconds)
    s.observe(("StartContainer", "NOT_FOUND"), 0.002)
    snap = s.snapshot()
    count, total, cumulative = snap[("CreateContainer", "OK")]
    assert count == 5 and abs(total - 3.0565) < 1e-9
    assert cumulative == [2, 3, 4, 5]     # le 0.001 (bounds inclusive), 0.01, 0.1, +Inf
    assert snap[("StartContainer", "NOT_FOUND")][2] == [0, 1, 1, 1]
