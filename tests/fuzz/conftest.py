"""The fuzz suite's Hypothesis profiles and its report (``anolisnuma/testing/fuzzing.py``).

``fuzz-ci`` (the default): derandomized and without an example database, so that every
run, CI's included, tries the same inputs and a failure is a failure of the code, not of
the draw. ``fuzz-long`` (``ANOLISNUMA_FUZZ_PROFILE=long``, as ``scripts/fuzz.py --minutes``
sets it): random, each test's examples scaled up. No deadline in either: the time property
is measured by the tests themselves, in CPU time, not by a wall clock a busy machine moves.
The profiles are registered, not loaded: each fuzz test takes its settings from one
(``fuzzing.fuzz_settings``), and the other tests of a session keep theirs."""

from __future__ import annotations

from anolisnuma.testing import fuzzing

fuzzing.register_profiles()


def pytest_sessionfinish(session, exitstatus):
    fuzzing.write_report()
