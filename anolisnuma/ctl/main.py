"""``anolisnuma-ctl``: ask the running daemon, or switch the kubelet over.

    anolisnuma-ctl status              version, uptime, containerd, knobs, hooks, relay
    anolisnuma-ctl pods                each pod's QoS level and NUMA placement, and why
    anolisnuma-ctl numa                per NUMA node: CPUs, kubelet-exclusive CPUs, pods
    anolisnuma-ctl explain POD         every decision taken for a pod (namespace/name or UID)
    anolisnuma-ctl reload              re-read the configuration file (as SIGHUP does)
    anolisnuma-ctl kubelet enable|disable|status
    anolisnuma-ctl kubeconfig --server URL --ca FILE --token-file FILE [--check]

The daemon is reached on its admin socket: ``--admin-socket PATH``, else ``[admin] socket``
of the configuration file (``-c``, default /etc/anolisnuma/config.toml), else (no default
file, or one this user may not read) /var/run/anolisnuma/admin.sock. A file that is not a
valid configuration is refused, named with ``-c`` or not: no daemon can have started from
it as it is, so the socket it names, or the default one, may be another daemon's (a
reload of it was refused, a second daemon has the default); a named file that is missing
is refused too. Tables by default, ``-o json`` for scripts. Exit codes: 0 done, 1 the
daemon could not be asked or refused, 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, List, Optional, Sequence, TextIO

from anolisnuma import __version__
from anolisnuma.config import AdminConfig, Config
from anolisnuma.configfile import UNIX_PREFIX, ConfigError, ConfigErrors
from anolisnuma.ctl import render
from anolisnuma.ctl.client import CtlError, ask
from anolisnuma.ctl.table import printable

PROG = "anolisnuma-ctl"
DEFAULT_CONFIG = "/etc/anolisnuma/config.toml"
EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2

COMMANDS = (
    ("status", "version, uptime, containerd, kernel knobs, hooks and their failures, relay buffers"),
    ("pods", "each known pod: QoS level and where it came from, NUMA placement and why"),
    ("numa", "per NUMA node: CPUs used and free by our placements, kubelet-exclusive CPUs, pods"),
    ("explain", "every decision taken for one pod, with the rule or annotation behind it"),
    ("reload", "re-read the configuration file; say what applied and what needs a restart"),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Inspect the running anolisnuma daemon, or switch the kubelet over to it.",
        epilog="The admin socket is root only: run as root.")
    parser.add_argument("-c", "--config", default=None, metavar="FILE",
                        help=f"anolisnuma's configuration, read for [admin] socket (default {DEFAULT_CONFIG})")
    parser.add_argument("--admin-socket", metavar="PATH", default=None,
                        help=f"the daemon's admin socket (default: from the configuration, else "
                             f"{AdminConfig.socket})")
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table",
                        help="table (default) or json")
    parser.add_argument("--timeout", type=float, default=20.0, metavar="SECONDS",
                        help="how long to wait for the daemon's answer (default 20)")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, text in COMMANDS:
        p = sub.add_parser(name, help=text, description=text)
        # also after the command (`pods -o json`); SUPPRESS keeps the global one otherwise
        p.add_argument("-o", "--output", choices=("table", "json"), default=argparse.SUPPRESS,
                       help="table (default) or json")
        if name == "explain":
            p.add_argument("pod", metavar="POD", help="namespace/name, pod UID, or sandbox ID (or its first digits)")
        p.set_defaults(func=run_admin_command)
    try:
        from anolisnuma.ctl.kubelet import cli as kubelet_cli
    except ImportError:  # pragma: no cover - shipped together
        kubelet_cli = None  # type: ignore[assignment]
    if kubelet_cli is not None:
        kubelet_cli.add_parser(sub)
    from anolisnuma.ctl import kubeconfig

    kubeconfig.add_parser(sub)
    return parser


def admin_socket(args: argparse.Namespace) -> str:
    """The admin socket to use: ``--admin-socket``, else ``[admin] socket`` of the
    configuration, else the default. CtlError when the configuration turns it off, is not
    valid (every error the daemon would name counts: see the module's docstring), or was
    named with ``-c`` and cannot be read."""
    if args.admin_socket:
        return _strip_unix(args.admin_socket)
    path = args.config or DEFAULT_CONFIG
    # No default file: the daemon was started from another, or with the packaged defaults.
    # One this user may not read: not root, and the admin socket is root's (ask() says so).
    if args.config is None and (not os.path.lexists(path) or not os.access(path, os.R_OK)):
        return AdminConfig.socket
    try:
        socket = Config.load(path).admin.socket
    except ConfigError as e:
        raise CtlError(_refusal(path, e)) from None
    if not socket:
        raise CtlError(f"the admin socket is turned off in {path} ([admin] socket = \"\")")
    return socket


def _refusal(path: str, e: ConfigError) -> str:
    more = len(e.errors) + e.more - 1 if isinstance(e, ConfigErrors) else 0
    also = f" (and {more} more; anolisnuma --check-config -c {path} lists them)" if more else ""
    if not e.key:   # unreadable, not TOML: the error names the file itself
        return f"{e}; pass --admin-socket PATH to ask a daemon anyway"
    return (f"{path} is not a valid configuration, so which daemon it names is not known: {e.lines()[0]}{also}; "
            f"pass --admin-socket PATH to ask a daemon anyway")


def _strip_unix(path: str) -> str:
    return path[len(UNIX_PREFIX):] if path.startswith(UNIX_PREFIX) else path


def run_admin_command(args: argparse.Namespace, out: Optional[TextIO] = None) -> int:
    out = out or sys.stdout
    request: Dict[str, Any] = {"pod": args.pod} if args.command == "explain" else {}
    result = ask(admin_socket(args), args.command, request, timeout=args.timeout)
    if args.output == "json":
        print(json.dumps(result, indent=2, sort_keys=True), file=out)
    else:
        # The cells are escaped already; this also covers text a renderer wrote around them.
        print(printable(render.RENDERERS[args.command](result), keep="\n"), file=out)
    return EXIT_OK


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except CtlError as e:   # may quote the daemon's words, and they may quote a pod's
        print(printable(f"{PROG}: {e}"), file=sys.stderr)
        return EXIT_FAIL
    except BrokenPipeError:   # `anolisnuma-ctl pods | head`
        return EXIT_OK
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())


__all__: List[str] = ["main", "build_parser", "admin_socket"]
