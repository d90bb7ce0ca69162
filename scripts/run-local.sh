#!/usr/bin/env bash
# Installs everything and runs anolisnuma in the foreground in front of a local containerd.
#
#   sudo scripts/run-local.sh [extra anolisnuma args]
#
# - installs the Debian packages and the virtualenv (scripts/install-deps.sh) and links
#   `anolisnuma` and `anolisnuma-ctl` into /usr/local/bin (override: ANOLISNUMA_BIN_DIR);
# - uses /run/containerd/containerd.sock when a containerd answers there (override:
#   ANOLISNUMA_ENDPOINT); otherwise starts a private containerd (scripts/private-containerd),
#   stopped again when this script ends, however it ends (Ctrl-C, SIGTERM, an error);
# - writes /run/anolisnuma/local.toml from the repository's config.toml with the runtime
#   endpoint, the socket, the log file and the state dir adjusted (state in
#   /run/anolisnuma/local-state, never the host's /var/lib/anolisnuma), and runs
#   `anolisnuma -c` on it;
# - the proxy listens on /var/run/anolisnuma/anolisnuma.sock (override: ANOLISNUMA_LISTEN).
# Point a kubelet (or crictl) at unix:///var/run/anolisnuma/anolisnuma.sock.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${ANOLISNUMA_VENV:-$HERE/.venv}
LISTEN=${ANOLISNUMA_LISTEN:-/var/run/anolisnuma/anolisnuma.sock}
RUN_DIR=${ANOLISNUMA_RUN_DIR:-/run/anolisnuma}
BIN_DIR=${ANOLISNUMA_BIN_DIR:-/usr/local/bin}
LOG_FILE=${ANOLISNUMA_LOG_FILE:-/var/log/anolisnuma.log}
bash "$HERE/scripts/install-deps.sh"
mkdir -p "$BIN_DIR"
for tool in anolisnuma anolisnuma-ctl; do
  [ -x "$VENV/bin/$tool" ] && ln -sfn "$VENV/bin/$tool" "$BIN_DIR/$tool"
done

# where a private containerd lives (the defaults of scripts/private-containerd)
PRIVATE_ARGS=(--base "${ANOLISNUMA_PRIVATE_CONTAINERD_BASE:-/tmp/anolisnuma-containerd}"
              --run "${ANOLISNUMA_PRIVATE_CONTAINERD_RUN:-/run/anolisnuma-containerd}")
private=0
proxy_pid=""
cleanup() {
  trap - EXIT INT TERM
  if [ -n "$proxy_pid" ] && kill -0 "$proxy_pid" 2>/dev/null; then
    kill -TERM "$proxy_pid" 2>/dev/null || true
    wait "$proxy_pid" 2>/dev/null || true
  fi
  if [ "$private" = 1 ]; then
    "$VENV/bin/python" "$HERE/scripts/private-containerd" stop "${PRIVATE_ARGS[@]}" >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT
trap 'cleanup; exit 143' TERM
trap 'cleanup; exit 130' INT

endpoint=${ANOLISNUMA_ENDPOINT:-/run/containerd/containerd.sock}
if ! "$VENV/bin/python" - "$endpoint" <<'PY' 2>/dev/null
import sys
from anolisnuma.cri.client import CriClient
CriClient(sys.argv[1], timeout_seconds=2).version()
PY
then
  echo "run-local: no containerd answers on $endpoint; starting a private one" >&2
  private=1
  endpoint=$("$VENV/bin/python" "$HERE/scripts/private-containerd" start --cni "${PRIVATE_ARGS[@]}")
fi

mkdir -p "$RUN_DIR"
"$VENV/bin/python" - "$HERE/config.toml" "$RUN_DIR/local.toml" "$endpoint" "$LISTEN" "$RUN_DIR/local-state" \
    "$LOG_FILE" "$RUN_DIR/admin.sock" <<'PY'
import re, sys
src, dst, endpoint, listen, state, log_file, admin = sys.argv[1:]
text = open(src).read()
for key, value, required in (("endpoint", endpoint, True), ("listen", listen, True), ("file", log_file, True),
                             ("state_dir", state, True), ("socket", admin, False)):
    text, n = re.subn(rf'(?m)^{key} = .*$', f'{key} = "{value}"', text, count=1)
    assert n == 1 or not required, f"config.toml has no {key} key"
open(dst, "w").write(text)
PY
echo "run-local: anolisnuma on $LISTEN -> $endpoint (log $LOG_FILE; Ctrl-C stops)" >&2
# Big replies (ListContainers on a full node) cost far less when glibc keeps its buffers.
export MALLOC_MMAP_THRESHOLD_=67108864 MALLOC_TRIM_THRESHOLD_=268435456
# In the background and waited for, so that a signal to this script reaches the trap at once.
"$VENV/bin/anolisnuma" -c "$RUN_DIR/local.toml" "$@" &
proxy_pid=$!
set +e
wait "$proxy_pid"
rc=$?
set -e
proxy_pid=""
exit $rc
