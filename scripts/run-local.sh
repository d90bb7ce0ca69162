#!/usr/bin/env bash
# Installs everything and runs anolisnuma in the foreground in front of a local containerd.
#
#   sudo scripts/run-local.sh [--config FILE] [--demo] [-- extra anolisnuma args]
#
# - installs the Debian packages and the virtualenv (scripts/install-deps.sh) and links
#   `anolisnuma` and `anolisnuma-ctl` into /usr/local/bin (override: ANOLISNUMA_BIN_DIR);
# - uses /run/containerd/containerd.sock when a containerd answers there (override:
#   ANOLISNUMA_ENDPOINT); otherwise starts a private containerd (scripts/private-containerd),
#   stopped again when this script ends, however it ends (Ctrl-C, SIGTERM, an error);
# - writes /run/anolisnuma/local.toml from a configuration file (--config FILE, default the
#   repository's config.toml: set there what you want, e.g. a key that needs a restart,
#   without editing the tracked file) with the runtime endpoint, the socket, the log file,
#   the admin socket and the state dir set for a local run (state in
#   /run/anolisnuma/local-state, never the host's /var/lib/anolisnuma), and runs
#   `anolisnuma -c` on it;
# - --demo also turns NUMA placement on for the namespace anolisnuma-demo and, once the proxy
#   answers, runs scripts/demo.py: a BestEffort pod written for anolisbox and a NUMA-managed
#   pod through the proxy, then `anolisnuma-ctl pods` and `explain` for them (the pods are
#   removed when this script ends);
# - the proxy listens on /var/run/anolisnuma/anolisnuma.sock (override: ANOLISNUMA_LISTEN).
# Point a kubelet (or crictl) at unix:///var/run/anolisnuma/anolisnuma.sock.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${ANOLISNUMA_VENV:-$HERE/.venv}
LISTEN=${ANOLISNUMA_LISTEN:-/var/run/anolisnuma/anolisnuma.sock}
RUN_DIR=${ANOLISNUMA_RUN_DIR:-/run/anolisnuma}
BIN_DIR=${ANOLISNUMA_BIN_DIR:-/usr/local/bin}
LOG_FILE=${ANOLISNUMA_LOG_FILE:-/var/log/anolisnuma.log}
CONFIG=$HERE/config.toml
demo=0
while [ $# -gt 0 ]; do
  case "$1" in
    --config) [ $# -ge 2 ] || { echo "run-local: --config needs a file" >&2; exit 2; }
              CONFIG=$2; shift 2 ;;
    --config=*) CONFIG=${1#--config=}; shift ;;
    --demo) demo=1; shift ;;
    --) shift; break ;;
    *) break ;;
  esac
done
[ -f "$CONFIG" ] || { echo "run-local: no configuration file $CONFIG" >&2; exit 2; }
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
endpoint=""
cleanup() {
  trap - EXIT INT TERM
  if [ "$demo" = 1 ] && [ -n "$endpoint" ]; then
    # straight to containerd: Ctrl-C has reached the proxy too (one process group)
    "$VENV/bin/python" "$HERE/scripts/demo.py" --remove --socket "$endpoint" >&2 || true
  fi
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

probe=${ANOLISNUMA_ENDPOINT:-/run/containerd/containerd.sock}
if "$VENV/bin/python" - "$probe" <<'PY' 2>/dev/null
import sys
from anolisnuma.cri.client import CriClient
CriClient(sys.argv[1], timeout_seconds=2).version()
PY
then
  endpoint=$probe
else
  echo "run-local: no containerd answers on $probe; starting a private one" >&2
  private=1
  endpoint=$("$VENV/bin/python" "$HERE/scripts/private-containerd" start --cni "${PRIVATE_ARGS[@]}")
fi

mkdir -p "$RUN_DIR"
"$VENV/bin/python" - "$CONFIG" "$RUN_DIR/local.toml" "$endpoint" "$LISTEN" "$RUN_DIR/local-state" \
    "$LOG_FILE" "$RUN_DIR/admin.sock" "$demo" <<'PY'
import sys
from anolisnuma.configfile import ConfigError, load_toml
from anolisnuma.testing.proxy import write_config
src, dst, endpoint, listen, state, log_file, admin, demo = sys.argv[1:]
try:
    data = load_toml(src)
except ConfigError as e:
    sys.exit(f"run-local: {e}")
for section, key, value in (("runtime", "endpoint", endpoint), ("server", "listen", listen),
                            ("log", "file", log_file), ("paths", "state_dir", state), ("admin", "socket", admin)):
    data.setdefault(section, {})[key] = value
if demo == "1":
    numa = data.setdefault("numa", {})
    numa["enabled"] = True
    numa["namespaces"] = sorted(set(numa.get("namespaces", [])) | {"anolisnuma-demo"})
write_config(dst, data)
PY
echo "run-local: anolisnuma on $LISTEN -> $endpoint (log $LOG_FILE; Ctrl-C stops)" >&2
# Big replies (ListContainers on a full node) cost far less when glibc keeps its buffers.
export MALLOC_MMAP_THRESHOLD_=67108864 MALLOC_TRIM_THRESHOLD_=268435456
# In the background and waited for, so that a signal to this script reaches the trap at once.
"$VENV/bin/anolisnuma" -c "$RUN_DIR/local.toml" "$@" &
proxy_pid=$!
if [ "$demo" = 1 ]; then
  # demo.py waits for the socket itself (wait_for_ready); the proxy runs on when it is done.
  "$VENV/bin/python" "$HERE/scripts/demo.py" --socket "$LISTEN" --admin-socket "$RUN_DIR/admin.sock" || true
  echo "run-local: the demo's pods stay until this script ends (Ctrl-C)" >&2
fi
set +e
wait "$proxy_pid"
rc=$?
set -e
proxy_pid=""
exit $rc
