#!/usr/bin/env bash
# Installs everything and runs anolisnuma in the foreground in front of a local containerd.
#
#   sudo scripts/run-local.sh [extra anolisnuma args]
#
# - uses /run/containerd/containerd.sock when a containerd answers there; otherwise starts a
#   private containerd (scripts/private-containerd, stopped again when this script ends);
# - writes /run/anolisnuma/local.toml from the repository's config.toml with the runtime
#   endpoint, log file and state dir adjusted, and runs `anolisnuma -c` on it;
# - the proxy listens on /var/run/anolisnuma/anolisnuma.sock (override: ANOLISNUMA_LISTEN).
# Point a kubelet (or crictl) at unix:///var/run/anolisnuma/anolisnuma.sock.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${ANOLISNUMA_VENV:-$HERE/.venv}
LISTEN=${ANOLISNUMA_LISTEN:-/var/run/anolisnuma/anolisnuma.sock}
bash "$HERE/scripts/install-deps.sh"

endpoint=/run/containerd/containerd.sock
private=0
if ! "$VENV/bin/python" - "$endpoint" <<'PY' 2>/dev/null
import sys
from anolisnuma.cri.client import CriClient
CriClient(sys.argv[1], timeout_seconds=2).version()
PY
then
  echo "run-local: no containerd answers on $endpoint; starting a private one" >&2
  endpoint=$("$VENV/bin/python" "$HERE/scripts/private-containerd" start --cni)
  private=1
fi

mkdir -p /run/anolisnuma
"$VENV/bin/python" - "$HERE/config.toml" /run/anolisnuma/local.toml "$endpoint" "$LISTEN" <<'PY'
import re, sys
src, dst, endpoint, listen = sys.argv[1:]
text = open(src).read()
text = re.sub(r'(?m)^endpoint = .*$', f'endpoint = "{endpoint}"', text, count=1)
text = re.sub(r'(?m)^listen = .*$', f'listen = "{listen}"', text, count=1)
text = re.sub(r'(?m)^file = .*$', 'file = "/var/log/anolisnuma.log"', text, count=1)
open(dst, "w").write(text)
PY
echo "run-local: anolisnuma on $LISTEN -> $endpoint (log /var/log/anolisnuma.log; Ctrl-C stops)" >&2
# Big replies (ListContainers on a full node) cost far less when glibc keeps its buffers.
export MALLOC_MMAP_THRESHOLD_=67108864 MALLOC_TRIM_THRESHOLD_=268435456
set +e
"$VENV/bin/anolisnuma" -c /run/anolisnuma/local.toml "$@"
rc=$?
set -e
if [ "$private" = 1 ]; then
  "$VENV/bin/python" "$HERE/scripts/private-containerd" stop >/dev/null || true
fi
exit $rc
