"""The command line of ``anolisnuma-ctl kubelet enable|disable|status``: its arguments (also
registered on the main ``anolisnuma-ctl`` parser), one-line errors, exit codes, and
``--restart``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any, Optional, Sequence, TextIO

from anolisnuma.ctl.kubelet.disable import disable
from anolisnuma.ctl.kubelet.enable import enable
from anolisnuma.ctl.kubelet.names import DEFAULT_ANOLISNUMA_CONFIG, KEY
from anolisnuma.ctl.kubelet.node_root import Root
from anolisnuma.ctl.kubelet.ours import DEFAULT_SOCKET, resolve_ours
from anolisnuma.ctl.kubelet.outcome import EXIT_FAIL, EXIT_OK, PROG, CtlError
from anolisnuma.ctl.kubelet.probe import parse_version
from anolisnuma.ctl.kubelet.status import render_status, status


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``kubelet enable|disable|status`` on the main CLI's subparsers.

    The parser's default ``func`` is :func:`run` (``args.func(args)`` returns the exit code).
    """
    parser = subparsers.add_parser(
        "kubelet", help="point the kubelet at anolisnuma and back",
        description="Switch the kubelet's CRI endpoint to anolisnuma (enable), back (disable), "
                    "or show which endpoint it will use (status).")
    sub = parser.add_subparsers(dest="kubelet_command", metavar="{enable,disable,status}")
    sub.required = True

    def common(p: argparse.ArgumentParser, socket: bool) -> None:
        p.add_argument("--root", default="/", metavar="DIR",
                       help="the node's file system root (default /)")
        if socket:
            p.add_argument("--socket", metavar="PATH", dest="kubelet_socket", default=None,
                           help=f"anolisnuma's CRI socket (default: server.listen of "
                                f"{DEFAULT_ANOLISNUMA_CONFIG}, else {DEFAULT_SOCKET})")
            p.add_argument("--anolisnuma-config", metavar="FILE", dest="kubelet_anolisnuma_config", default=None,
                           help="read server.listen (our socket) and runtime.endpoint from this "
                                "anolisnuma config")
            p.add_argument("--timeout", type=float, default=3.0, dest="kubelet_timeout", metavar="SECONDS",
                           help="seconds to wait for the Version answer (default 3)")

    p = sub.add_parser("enable", help="point the kubelet at anolisnuma's socket")
    common(p, True)
    p.add_argument("--kubelet-version", metavar="X.Y", dest="kubelet_version", default=None,
                   help="the kubelet's version when it cannot be run here (>= 1.27 reads "
                        f"{KEY} from its config file)")
    p.add_argument("--restart", action="store_true", dest="kubelet_restart",
                   help="run systemctl daemon-reload/restart kubelet afterwards")
    p = sub.add_parser("disable", help="restore the kubelet's previous endpoint")
    common(p, True)
    p.add_argument("--restart", action="store_true", dest="kubelet_restart",
                   help="run systemctl daemon-reload/restart kubelet afterwards")
    p = sub.add_parser("status", help="which endpoint the kubelet will use, and from where")
    common(p, True)
    p.add_argument("-o", "--output", choices=("table", "json"), default=argparse.SUPPRESS,
                   help="table (default) or json")
    parser.set_defaults(func=run)
    return parser


def _restart(root: Root, unit_changed: bool, err: TextIO) -> int:
    if root.root != "/":
        print(f"{PROG}: --restart only works with --root /", file=err)
        return EXIT_FAIL
    commands = ([["systemctl", "daemon-reload"]] if unit_changed else []) + [["systemctl", "restart", "kubelet"]]
    for cmd in commands:
        try:
            proc = subprocess.run(cmd, timeout=120)
        except (OSError, subprocess.SubprocessError) as e:
            print(f"{PROG}: {' '.join(cmd)} failed: {e}", file=err)
            return EXIT_FAIL
        if proc.returncode != 0:
            print(f"{PROG}: {' '.join(cmd)} exited with {proc.returncode}", file=err)
            return EXIT_FAIL
    return EXIT_OK


def run(args: argparse.Namespace, out: Optional[TextIO] = None, err: Optional[TextIO] = None) -> int:
    """Run ``kubelet enable|disable|status``; the exit code."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        if not os.path.isdir(args.root):
            raise CtlError(f"--root {args.root} is not a directory")
        root = Root(args.root)
        command = args.kubelet_command
        if command == "status":
            ours = resolve_ours(root, args.kubelet_socket, args.kubelet_anolisnuma_config)
            st = status(root, ours.socket, args.kubelet_timeout, ours.runtime)
            if getattr(args, "output", "table") == "json":
                print(json.dumps(st, indent=2, sort_keys=True), file=out)
            else:
                print(render_status(st), file=out)
            return EXIT_OK
        if command == "enable":
            version = None
            if args.kubelet_version:
                version = parse_version(args.kubelet_version)
                if version is None:
                    raise CtlError(f"--kubelet-version must look like 1.29; got {args.kubelet_version!r}")
            ours = resolve_ours(root, args.kubelet_socket, args.kubelet_anolisnuma_config)
            outcome = enable(root, ours.socket, args.kubelet_timeout, version, ours.runtime)
        elif command == "disable":
            outcome = disable(root, resolve_ours(root, args.kubelet_socket, args.kubelet_anolisnuma_config).socket)
        else:  # pragma: no cover - argparse refuses others
            raise CtlError(f"unknown command {command!r}")
    except CtlError as e:
        print(f"{PROG}: {e}", file=err)
        return EXIT_FAIL
    except OSError as e:
        print(f"{PROG}: {e.filename or ''}{': ' if e.filename else ''}{e.strerror or e}", file=err)
        return EXIT_FAIL
    for line in outcome.lines:
        print(line, file=out)
    if outcome.code == EXIT_OK and outcome.changed and getattr(args, "kubelet_restart", False):
        return _restart(root, outcome.unit_changed, err)
    return outcome.code


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Standalone entry point: ``python -m anolisnuma.ctl.kubelet kubelet status``."""
    parser = argparse.ArgumentParser(prog="anolisnuma-ctl")
    add_parser(parser.add_subparsers(dest="command", metavar="kubelet"))
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_usage(sys.stderr)
        return 2
    return args.func(args)
