"""``anolisnuma-ctl kubeconfig``: write the daemon's kubeconfig from a token and the CA.

Each node's daemon has an identity of its own: the ServiceAccount named as the node in
anolisnuma-nodes (deploy/rbac.yaml, deploy/node-policy.yaml), whose token and the cluster's
CA are put on the node (docs/cluster.md, "Install"); this writes the file ``[kubernetes]
kubeconfig`` names (mode 0600, atomically), the CA embedded and the token by file (read at
each connection: a new token takes effect without a restart), and with ``--check`` asks
the API server for the Oenuma CRs with it, so a wrong server, CA, token or binding shows
now and not in the daemon's log.
"""

from __future__ import annotations

import argparse
import os
import ssl
import sys
from typing import Any

from anolisnuma.state.persist import atomic_write_bytes

DEFAULT_OUT = "/etc/anolisnuma/kubeconfig"


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
    from anolisnuma.cluster.kubeconfig import KubeconfigError, load_kubeconfig, render_kubeconfig

    try:
        with open(args.ca) as f:
            ca = f.read()
        ssl.create_default_context(cadata=ca)
        with open(args.token_file) as f:
            if not f.read().strip():
                raise ValueError(f"{args.token_file} is empty")
    except (OSError, ValueError, ssl.SSLError) as e:
        print(f"anolisnuma-ctl kubeconfig: {e}", file=sys.stderr)
        return 1
    text = render_kubeconfig(args.server, ca, token_file=os.path.abspath(args.token_file))
    try:
        atomic_write_bytes(args.out, text.encode(), mode=0o600)
        kubeconfig = load_kubeconfig(args.out)
    except (OSError, KubeconfigError) as e:
        print(f"anolisnuma-ctl kubeconfig: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.out} for {kubeconfig.server}")
    if not args.check:
        return 0
    return check(kubeconfig)


def check(kubeconfig: Any) -> int:
    """List the Oenuma CRs (one page of one) as the daemon would; 0 when it could."""
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
    print(f"check: listed Oenuma CRs ({'some' if first is not None else 'none yet'} in the cluster)")
    return 0
