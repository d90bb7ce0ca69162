#!/usr/bin/env python3
"""The fuzz suite (tests/fuzz, docs/fuzzing.md), longer than CI runs it, or its catalogue.

    python scripts/fuzz.py --list          every parser: who writes its input, what the
                                           suite generates, its time and memory bounds
    python scripts/fuzz.py --minutes N     the suite again and again for N minutes, each
                                           pass with new random inputs and --scale times
                                           each test's examples; then, per parser, the
                                           inputs tried and the worst CPU time, memory
                                           peak and time ratio seen; exit 1 on a finding

A pass is ``pytest tests/fuzz`` in a child process (ANOLISNUMA_FUZZ_PROFILE=long); a
finding is a test that failed, its output kept in the log named at the end (a Hypothesis
failure there prints the blob that replays it: ``@reproduce_failure``). Run from the
repository, with the project's Python (``.venv/bin/python``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from anolisnuma.testing import fuzzing  # noqa: E402  (the repository's own, not an installed one)


def list_parsers() -> None:
    for p in fuzzing.PARSERS.values():
        print(f"{p.name}\n  entry:     {p.entry}\n  error:     {p.error}\n  written by: {p.writer}\n"
              f"  generator: {p.generator}\n  bounds:    {p.describe_bounds()}\n")


def one_pass(scale: int, report: str, log: str) -> List[str]:
    """One run of the suite; the ids of the tests that failed."""
    env = dict(os.environ, **{fuzzing.ENV_PROFILE: "long", fuzzing.ENV_SCALE: str(scale),
                              fuzzing.ENV_REPORT: report})
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rf", "tests/fuzz"],
                         cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    failed = re.findall(r"^FAILED (.+?)(?: - .*)?$", run.stdout, re.M)
    if run.returncode != 0:
        with open(log, "a") as f:
            f.write(run.stdout)
        if not failed:   # (pytest itself failed: no test ran)
            failed = [f"pytest exited {run.returncode}"]
    return failed


def merge(total: Dict[str, Dict[str, float]], report: str) -> None:
    try:
        with open(report) as f:
            seen = json.load(f)
    except (OSError, ValueError):
        return
    for name, s in seen.items():
        t = total.setdefault(name, {"inputs": 0, "worst_cpu_seconds": 0.0, "worst_peak_bytes": 0,
                                    "worst_time_ratio": 0.0})
        t["inputs"] += s["inputs"]
        for key in ("worst_cpu_seconds", "worst_peak_bytes", "worst_time_ratio"):
            t[key] = max(t[key], s[key])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="print each parser, its generator and its bounds")
    ap.add_argument("--minutes", type=float, default=0, help="run the suite again and again for this long")
    ap.add_argument("--scale", type=int, default=4, help="each test's examples times this, per pass (default 4)")
    args = ap.parse_args()
    if args.list or not args.minutes:
        list_parsers()
        return 0
    start = time.monotonic()
    deadline = start + args.minutes * 60   # (a pass begun before it runs to its end)
    total: Dict[str, Dict[str, float]] = {}
    findings: Dict[str, int] = {}
    passes = 0
    work = tempfile.mkdtemp(prefix="anolisnuma-fuzz-")
    report, log = os.path.join(work, "report.json"), os.path.join(work, "findings.log")
    while time.monotonic() < deadline:
        passes += 1
        for test in one_pass(args.scale, report, log):
            findings[test] = findings.get(test, 0) + 1
        merge(total, report)
        print(f"pass {passes}: {sum(t['inputs'] for t in total.values()):.0f} inputs so far, "
              f"{len(findings)} failing tests", flush=True)
    print(f"\n{passes} passes in {(time.monotonic() - start) / 60:.1f} min (scale {args.scale})\n")
    print(f"{'parser':16} {'inputs':>8} {'worst CPU':>10} {'worst peak':>11} {'time ratio':>11}  bounds")
    for name, parser in fuzzing.PARSERS.items():
        t = total.get(name, {"inputs": 0, "worst_cpu_seconds": 0, "worst_peak_bytes": 0, "worst_time_ratio": 0})
        print(f"{name:16} {t['inputs']:8.0f} {t['worst_cpu_seconds'] * 1e3:8.1f}ms "
              f"{t['worst_peak_bytes'] / 1024:9.0f}KiB {t['worst_time_ratio']:6.0f}/{parser.time_ratio:<4g}  "
              f"{parser.describe_bounds()}")
    if findings:
        print("\nfindings (test: passes it failed in):")
        for test, count in sorted(findings.items()):
            print(f"  {test}: {count}/{passes}")
        print(f"\nthe failing passes' output: {log}")
        return 1
    print("\nno findings")
    return 0


if __name__ == "__main__":
    sys.exit(main())
