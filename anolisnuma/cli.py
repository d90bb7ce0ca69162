"""Command line: ``anolisnuma -c FILE`` runs the proxy; ``--check-config`` only validates."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import List, Optional

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
    except ConfigError as e:
        print(f"anolisnuma: invalid configuration: {e}", file=sys.stderr)
        return EXIT_CONFIG
    if args.check_config:
        print(f"anolisnuma: {args.config} is valid")
        return 0

    from anolisnuma import logsetup
    from anolisnuma.daemon import EXIT_START, Daemon
    from anolisnuma.preflight import check_writable_paths
    from anolisnuma.transport.listener import ListenerError

    try:
        check_writable_paths(config)
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
            code = asyncio.run(daemon.run())
            if daemon.failure:
                print(f"anolisnuma: cannot start: {daemon.failure}", file=sys.stderr)
            return code
        except ListenerError as e:
            print(f"anolisnuma: cannot listen: {e}", file=sys.stderr)
            return EXIT_START
    finally:
        logsetup.shutdown()  # every queued line is written before the process exits


if __name__ == "__main__":
    sys.exit(main())
