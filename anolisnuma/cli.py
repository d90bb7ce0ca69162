"""Command line: ``anolisnuma -c FILE`` runs the proxy; ``--check-config`` only validates."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any, List, Optional

from anolisnuma import __version__

DEFAULT_CONFIG = "/etc/anolisnuma/config.toml"
EXIT_CONFIG = 2


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="anolisnuma",
        description="CRI proxy between the kubelet and containerd applying QoS and NUMA placement policies.")
    parser.add_argument("-c", "--config", default=DEFAULT_CONFIG, help=f"configuration file (default {DEFAULT_CONFIG})")
    parser.add_argument("--check-config", action="store_true", help="validate the configuration and exit")
    parser.add_argument("--version", action="version", version=f"anolisnuma {__version__}")
    args = parser.parse_args(argv)

    from anolisnuma.config import Config
    from anolisnuma.configfile import ConfigError

    try:
        config = Config.load(args.config)
    except ConfigError as e:   # every error the file has, one a line (ConfigErrors)
        for line in e.lines():
            print(f"anolisnuma: invalid configuration: {line}", file=sys.stderr)
        return EXIT_CONFIG
    if args.check_config:
        from anolisnuma.preflight import config_warnings, credential_warnings

        for warning in config_warnings(config):
            print(f"anolisnuma: warning: {warning}", file=sys.stderr)
        try:
            # the credentials by the daemon's own checks: what it would refuse is an error here
            for warning in credential_warnings(config):
                print(f"anolisnuma: warning: {warning}", file=sys.stderr)
        except ConfigError as e:
            print(f"anolisnuma: invalid configuration: {e}", file=sys.stderr)
            return EXIT_CONFIG
        print(f"anolisnuma: {args.config} is valid")
        return 0

    from anolisnuma import logsetup
    from anolisnuma.daemon import EXIT_START, Daemon
    from anolisnuma.preflight import check_owners, check_writable_paths
    from anolisnuma.transport.listener import ListenerError

    try:
        check_writable_paths(config)
        check_owners(config)
    except ConfigError as e:
        print(f"anolisnuma: invalid configuration: {e}", file=sys.stderr)
        return EXIT_CONFIG
    logsetup.configure(config.log.level, config.log.file, config.log.stderr)
    try:
        try:
            daemon = Daemon(config)
        except Exception as e:  # e.g. an unusable state directory
            print(f"anolisnuma: cannot start: {e}", file=sys.stderr)
            return EXIT_START
        try:
            code = _run(daemon.run())
            if daemon.failure:
                print(f"anolisnuma: cannot start: {daemon.failure}", file=sys.stderr)
            return code
        except ListenerError as e:
            print(f"anolisnuma: cannot listen: {e}", file=sys.stderr)
            return EXIT_START
    finally:
        logsetup.shutdown()  # every queued line is written before the process exits


def _run(main: Any) -> int:
    """Run the daemon on uvloop's event loop (libuv): the relay wakes twice or three times
    per relayed call, and uvloop's loop costs ~10 µs less of CPU per call than asyncio's
    (docs/benchmarks.md). Without it (a platform it has no build for) asyncio's own loop
    does the same, a little slower."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)   # asyncio.run's life cycle on uvloop's loop


if __name__ == "__main__":
    sys.exit(main())
