#!/usr/bin/env python3
"""The CPU one log line costs the daemon, from the call that logs it to the disk (issue 34).

    .venv/bin/python scripts/bench_logging.py [--lines N] [--repeat K]

Configures logging as the daemon does (``anolisnuma.logsetup.configure``, a file under a
temporary directory), then logs N lines shaped like the pipeline's reply line (a logger
bound to a pod's five identity fields, then ``info`` with a message, status, latency, the
policies' decisions and a container ID) and waits until the writer thread wrote them all
(``logsetup.flush``). Printed: the process's CPU time (both threads) per line, the best of K
runs; and a filtered ``debug`` call at info level, which must cost next to nothing. Exit
status 0.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import structlog  # noqa: E402

from anolisnuma import logsetup  # noqa: E402


def per_line_us(log: object, lines: int) -> float:
    t0 = time.process_time()
    for _ in range(lines):
        pl = log.bind(method="CreateContainer", pod="shop/web-0", pod_uid="0123-4567-89ab",  # type: ignore[attr-defined]
                      container="main", sandbox_id="a" * 64)
        pl.info("create container answered to containerd (NRI)", status="OK", latency_ms=1.234,
                decisions={"numa": "placed on node 0 (cpus 0)"}, container_id="b" * 64)
    logsetup.flush(30)
    return (time.process_time() - t0) / lines * 1e6


def main(argv: object = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lines", type=int, default=20000, help="lines per run (default 20000)")
    ap.add_argument("--repeat", type=int, default=3, help="runs; the best is printed (default 3)")
    args = ap.parse_args(argv)  # type: ignore[arg-type]
    work = tempfile.mkdtemp(prefix="anolisnuma-bench-logging-")
    try:
        logsetup.configure("info", os.path.join(work, "anolisnuma.log"))
        log = structlog.get_logger("anolisnuma.pipeline")
        per_line_us(log, min(args.lines, 1000))   # warm-up
        best = min(per_line_us(log, args.lines) for _ in range(max(1, args.repeat)))
        t0 = time.process_time()
        for _ in range(args.lines):
            log.debug("not written at info", n=1)
        filtered = (time.process_time() - t0) / args.lines * 1e6
        logsetup.shutdown()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"bench_logging: {args.lines} lines x {args.repeat} runs, Python {sys.version.split()[0]}")
    print(f"  one info line, logged and written: {best:.1f} µs of CPU (best run)")
    print(f"  one debug call filtered at info:   {filtered:.2f} µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
