"""The line a green conformance run prints before its table: which specs fail on containerd
itself and how each fared through the daemon (a table's "failed 5" said nothing of why)."""

from __future__ import annotations

from anolisnuma.testing.critest import failing_directly, short_spec

DIGEST = "[k8s.io] Image Manager public image with digest should be pulled and removed [Conformance]"
MASKED = "[k8s.io] Security Context bucket runtime should support MaskedPaths"
STOP = "[k8s.io] Idempotence StopContainer should not return an error if not found"
PASSING = "[k8s.io] Networking runtime should support DNS config [Conformance]"


def run(**states):
    names = {"digest": DIGEST, "masked": MASKED, "stop": STOP, "passing": PASSING}
    return {names[k]: {"state": v, "seconds": 1.0, "failure": "", "start": 0, "end": 0} for k, v in states.items()}


def test_the_same_failures_both_ways_are_said_to_be_expected_and_named():
    direct = run(digest="failed", masked="failed", passing="passed")
    proxied = run(digest="failed", masked="panicked", passing="passed")
    assert failing_directly(direct, proxied) == [
        "2 spec(s) fail on containerd itself, and the same through the daemon: expected here (why each: "
        "docs/conformance.md, \"Failing every way\"); the gate fails only on a spec that passes directly and not through the daemon",
        "- Image Manager public image with digest should be pulled and removed",
        "- Security Context bucket runtime should support MaskedPaths",
    ]


def test_a_spec_that_fares_otherwise_through_the_daemon_says_how():
    lines = failing_directly(run(stop="failed", passing="passed"), run(stop="passed", passing="passed"))
    assert lines[0].startswith("1 spec(s) fail on containerd itself: expected here")
    assert lines[1:] == ["- Idempotence StopContainer should not return an error if not found (through the daemon: passed)"]
    assert failing_directly(run(stop="failed"), {})[1].endswith("(through the daemon: -)")


def test_nothing_failing_directly_is_no_line():
    assert failing_directly(run(passing="passed"), run(passing="failed")) == []


def test_short_names_drop_the_tags_every_spec_has():
    assert short_spec(DIGEST) == "Image Manager public image with digest should be pulled and removed"
    assert short_spec("[sig-node] x [Conformance] y") == "x [Conformance] y"
