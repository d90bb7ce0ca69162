"""``anolisnuma-ctl kubeconfig``: write the daemon's kubeconfig from a token and the CA.

Each node's daemon has an identity of its own: the ServiceAccount named as the node in
anolisnuma-nodes (deploy/rbac.yaml, deploy/node-policy.yaml), whose token and the cluster's
CA are put on the node (docs/cluster.md, "Install"); this writes the file ``[kubernetes]
kubeconfig`` names (mode 0600, atomically), the CA embedded and the token by file (read at
each connection: a new token takes effect without a restart), and with ``--check`` asks
the API server for the Oenuma CRs with it, so a wrong server, CA, token or binding shows
now and not in the daemon's log.

Nothing is replaced before it is known to work: the kubeconfig is made and checked in
memory as the daemon will check it (``cluster/kubeconfig.py``: the token file a regular
file of one token that only root may change, the directory of ``--out`` too), with
``--check`` the API server asked with it, and only then is ``--out`` replaced (atomically:
a symbolic link there is replaced, never followed). A mistake leaves the kubeconfig the
daemon uses as it was.
"""

from __future__ import annotations

import argparse
import os
import ssl
import sys
from typing import Any, List, Optional

from anolisnuma.state.persist import atomic_write_bytes

DEFAULT_OUT = "/etc/anolisnuma/kubeconfig"
MAX_CA = 1 << 20


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "kubeconfig", help="write the daemon's kubeconfig from a ServiceAccount token and the CA",
        description="Write the kubeconfig [kubernetes] kubeconfig names: the API server, its CA "
                    "(embedded) and a token file (docs/cluster.md).")
    p.add_argument("--server", required=True, metavar="URL", help="the API server, https://HOST:PORT")
    p.add_argument("--ca", required=True, metavar="FILE", help="the cluster's CA certificate (PEM)")
    p.add_argument("--token-file", required=True, metavar="FILE",
                   help="the ServiceAccount token, one line (kept where it is: the kubeconfig names it)")
    p.add_argument("--out", default=DEFAULT_OUT, metavar="FILE", help=f"where to write (default {DEFAULT_OUT})")
    p.add_argument("--check", action="store_true", help="list Oenuma CRs with it and say how it went")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Everything is checked before ``--out`` is replaced (with ``--check``, the API
    server's answer too): a mistake leaves the kubeconfig the daemon uses as it was."""
    from anolisnuma.cluster.kubeconfig import (
        KubeconfigError, decode_kubeconfig, load_kubeconfig, parse_kubeconfig, render_kubeconfig)
    from anolisnuma.fileread import RefusedFile, read_regular_file
    from anolisnuma.trusted_file import unsafe_along

    out = os.path.abspath(args.out)
    try:
        ca = read_regular_file(args.ca, MAX_CA).decode("ascii")
        ssl.create_default_context(cadata=ca)
        text = render_kubeconfig(args.server, ca, token_file=os.path.abspath(args.token_file))
        kubeconfig = parse_kubeconfig(decode_kubeconfig(text.encode(), out), out)   # (the token file read, too)
        unsafe = unsafe_along(os.path.dirname(out))
        if unsafe is not None:
            raise KubeconfigError(f"{out} is not written: {unsafe.describe()}")
    except (OSError, ValueError, ssl.SSLError, RefusedFile) as e:   # (KubeconfigError is a ValueError)
        print(f"anolisnuma-ctl kubeconfig: {_message(e)}; {out} left as it was", file=sys.stderr)
        return 1
    for warning in kubeconfig.warnings:
        print(f"anolisnuma-ctl kubeconfig: warning: {warning}", file=sys.stderr)
    checked: List[str] = []
    if args.check and check(kubeconfig, checked) != 0:
        print(f"anolisnuma-ctl kubeconfig: {out} left as it was", file=sys.stderr)
        return 1
    try:
        atomic_write_bytes(out, text.encode(), mode=0o600)
        kubeconfig = load_kubeconfig(out)
    except (OSError, KubeconfigError) as e:
        print(f"anolisnuma-ctl kubeconfig: {_message(e)}", file=sys.stderr)
        return 1
    print(f"wrote {out} for {kubeconfig.server}")
    for line in checked:
        print(line)
    return 0


def _message(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return f"{e.filename}: {e.strerror}" if e.filename else e.strerror
    if isinstance(e, UnicodeDecodeError):
        return "the CA file is not PEM text"
    return str(e)


def check(kubeconfig: Any, said: Optional[List[str]] = None) -> int:
    """List the Oenuma CRs (one page of one) as the daemon would; 0 when it could. The line
    that says so is printed, or appended to ``said`` when given (printed once written)."""
    try:
        from anolisnuma.cluster.kube_client import ApiError, KubeClient
        from anolisnuma.cluster.kubeconfig import KubeconfigError
    except ImportError as e:
        print(f"check: lightkube, the Kubernetes client, cannot be imported: {e}", file=sys.stderr)
        return 1
    try:
        client = KubeClient(kubeconfig, 10.0)
        try:
            listing = client.list_oenumas(1)
            first = next(iter(listing), None)
        finally:
            client.close()
    except (ApiError, KubeconfigError) as e:
        print(f"check: the API server refused or could not be reached: {e}", file=sys.stderr)
        return 1
    line = f"check: listed Oenuma CRs ({'some' if first is not None else 'none yet'} in the cluster)"
    if said is None:
        print(line)
    else:
        said.append(line)
    return 0
