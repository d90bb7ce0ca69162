"""The CRI conformance gate: critest direct and through the daemon, on each containerd build.

Skipped, with the reason, on a machine that cannot run it (not root, no critest/crictl in
``../shared/cri-tools``, a containerd build missing) — unless
``ANOLISNUMA_REQUIRE_CONFORMANCE=1`` (``.ci/run`` sets it): then the same reason fails the
run, so that CI never passes without the gate having run.

Each build's table (passed / failed / skipped, direct and through the daemon) is printed at
the end of the session, so that CI's log carries the figures.
"""

from __future__ import annotations

import os
from typing import Optional

import pytest

from anolisnuma.testing.containerd_builds import builds_for_tests
from anolisnuma.testing.critest import TABLES, cri_tools_missing

REQUIRE = os.environ.get("ANOLISNUMA_REQUIRE_CONFORMANCE") == "1"


def skip_reason() -> Optional[str]:
    if os.geteuid() != 0:
        return "critest needs root (containerd, cgroups, mounts, iptables)"
    missing = cri_tools_missing()
    if missing:
        return missing
    builds = builds_for_tests()
    if not builds:
        return "no containerd found: run scripts/install-deps.sh"
    for b in builds:
        if b.missing():
            return b.missing()
    return None


@pytest.fixture(scope="session")
def conformance_possible() -> None:
    reason = skip_reason()
    if reason is None:
        return
    if REQUIRE:
        pytest.fail(f"the conformance gate cannot run: {reason}")
    pytest.skip(reason)


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # type: ignore[no-untyped-def]
    if not TABLES:
        return
    terminalreporter.section("CRI conformance (critest): direct and through anolisnuma")
    for build, lines in sorted(TABLES.items()):
        terminalreporter.write_line(f"containerd {build}")
        for line in lines:
            terminalreporter.write_line("  " + line)
