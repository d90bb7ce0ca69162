#!/usr/bin/env bash
# Installs everything and runs anolisnuma in front of a local containerd, in the foreground:
# the script returns when the daemon ends, and Ctrl-C (or SIGTERM) stops the daemon and
# everything this script started.
#
#   sudo scripts/run-local.sh [--config FILE] [--demo] [-- extra anolisnuma args]
#
# - installs the Debian packages and the virtualenv (scripts/install-deps.sh) and links
#   `anolisnuma` and `anolisnuma-ctl` into /usr/local/bin (ANOLISNUMA_BIN_DIR);
# - stops before it starts anything (exit 1) when another anolisnuma, or any process, already
#   serves the CRI socket or the admin socket this run would serve: it names the path, the
#   pid of the daemon holding it (the `.lock` file beside the socket names it) and the exact
#   command that runs this one on paths of its own. It does not move elsewhere by itself:
#   a run that quietly took other paths would leave crictl, a kubelet and anolisnuma-ctl
#   pointed at the other daemon, which is what a second daemon must never be mistaken for;
# - uses /run/containerd/containerd.sock when a containerd answers there (ANOLISNUMA_ENDPOINT);
#   otherwise a private containerd (scripts/private-containerd): started, and stopped again
#   with everything it created when this script ends, however it ends (Ctrl-C, SIGTERM, an
#   error); one that already runs in those directories (another run's) is used and left
#   running;
# - writes /run/anolisnuma/local.toml (ANOLISNUMA_RUN_DIR) from a configuration file
#   (--config FILE, default the repository's config.toml: set there what you want, e.g. a
#   key that needs a restart, without editing the tracked file) with the runtime endpoint,
#   the socket, the log file, the admin socket (RUN_DIR/admin.sock) and the state dir set
#   for a local run (state in RUN_DIR/local-state, never the host's /var/lib/anolisnuma),
#   and runs `anolisnuma -c` on it;
# - --demo also turns NUMA placement on for the namespace anolisnuma-demo and, once the proxy
#   answers, runs scripts/demo.py: a BestEffort pod written for anolisbox and a NUMA-managed
#   pod through the proxy, then `anolisnuma-ctl pods` and `explain` for them (the pods are
#   removed when this script ends);
# - the proxy listens on /var/run/anolisnuma/anolisnuma.sock (ANOLISNUMA_LISTEN).
# Point a kubelet (or crictl) at unix:///var/run/anolisnuma/anolisnuma.sock.
#
# Left behind when it ends: the links in the bin dir, the run dir (local.toml, local-state,
# the sockets' .lock files), the log file; the daemon removes its sockets as it stops.
#
# Environment overrides, all optional:
#   ANOLISNUMA_VENV       the virtualenv (default: .venv in the repository)
#   ANOLISNUMA_LISTEN     the CRI socket the proxy serves (default /var/run/anolisnuma/anolisnuma.sock)
#   ANOLISNUMA_RUN_DIR    local.toml, admin.sock and local-state (default /run/anolisnuma)
#   ANOLISNUMA_BIN_DIR    where the anolisnuma and anolisnuma-ctl links go (default /usr/local/bin)
#   ANOLISNUMA_LOG_FILE   the daemon's log file (default /var/log/anolisnuma.log)
#   ANOLISNUMA_ENDPOINT   the containerd used when it answers (default /run/containerd/containerd.sock)
#   ANOLISNUMA_PRIVATE_CONTAINERD_BASE, ANOLISNUMA_PRIVATE_CONTAINERD_RUN
#                         a private containerd's directories (default /tmp/anolisnuma-containerd
#                         and /run/anolisnuma-containerd)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${ANOLISNUMA_VENV:-$HERE/.venv}
LISTEN=${ANOLISNUMA_LISTEN:-/var/run/anolisnuma/anolisnuma.sock}
RUN_DIR=${ANOLISNUMA_RUN_DIR:-/run/anolisnuma}
BIN_DIR=${ANOLISNUMA_BIN_DIR:-/usr/local/bin}
LOG_FILE=${ANOLISNUMA_LOG_FILE:-/var/log/anolisnuma.log}
CONFIG=$HERE/config.toml
demo=0
ORIG_ARGS=("$@")   # for the command suggested when the paths are taken
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

# Another daemon on these paths would leave this one without its admin socket (and
# anolisnuma-ctl, the demo's too, showing that daemon's pods) or without its CRI socket
# (the demo's calls reaching that daemon): say so before anything is started.
"$VENV/bin/python" - "$LISTEN" "$RUN_DIR" "$LOG_FILE" "$0" ${ORIG_ARGS[@]+"${ORIG_ARGS[@]}"} <<'PY' || exit 1
import os, shlex, sys
from anolisnuma.transport.listener import occupant
listen, run_dir, log_file, script, *args = sys.argv[1:]
admin = os.path.join(run_dir, "admin.sock")
taken = [(what, occupant(path), harm) for what, path, harm in (
    ("CRI socket", listen, "this run's daemon could not listen, and the calls made to that socket (the "
                           "demo's too) would reach that daemon"),
    ("admin socket", admin, "this run's daemon would go without an admin socket, and anolisnuma-ctl (the "
                            "demo's too) would show that daemon's pods"))]
taken = [(what, o, harm) for what, o, harm in taken if o is not None]
if not taken:
    sys.exit(0)
for what, o, harm in taken:
    print(f"run-local: this run's {what} is taken: {o.describe()}. Started anyway, {harm}.", file=sys.stderr)
# The first free "<run dir>-N" and the log file "<log>-N": paths of its own for every
# daemon file this run writes (two daemons appending to one log would be hard to read).
listen_taken = any(what == "CRI socket" for what, _, _ in taken)
n = 2
while True:
    alt = f"{run_dir.rstrip('/')}-{n}"
    alt_listen = os.path.join(alt, "anolisnuma.sock") if listen_taken else listen
    if occupant(os.path.join(alt, "admin.sock")) is None and occupant(alt_listen) is None:
        break
    n += 1
stem, ext = os.path.splitext(log_file)
OVERRIDES = ("ANOLISNUMA_VENV", "ANOLISNUMA_LISTEN", "ANOLISNUMA_RUN_DIR", "ANOLISNUMA_BIN_DIR", "ANOLISNUMA_LOG_FILE",
             "ANOLISNUMA_ENDPOINT", "ANOLISNUMA_PRIVATE_CONTAINERD_BASE", "ANOLISNUMA_PRIVATE_CONTAINERD_RUN")
env = {k: os.environ[k] for k in OVERRIDES if k in os.environ}   # those set now: sudo would drop them
env["ANOLISNUMA_RUN_DIR"] = alt
env["ANOLISNUMA_LOG_FILE"] = f"{stem}-{n}{ext}"
if listen_taken:
    env["ANOLISNUMA_LISTEN"] = alt_listen
command = ["sudo"] if os.environ.get("SUDO_USER") else []
command += [f"{k}={v}" for k, v in env.items()] + [script] + args
print("run-local: nothing was started. Stop that daemon, or run this one on paths of its own:\n  "
      + " ".join(shlex.quote(c) for c in command), file=sys.stderr)
sys.exit(1)
PY
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
elif "$VENV/bin/python" "$HERE/scripts/private-containerd" status "${PRIVATE_ARGS[@]}" >/dev/null 2>&1; then
  # another run's (or one a crash left): not this run's to stop
  echo "run-local: no containerd answers on $probe; using the private one that already runs in" \
       "${PRIVATE_ARGS[1]}, left running when this script ends (to stop it:" \
       "scripts/private-containerd stop ${PRIVATE_ARGS[*]})" >&2
  endpoint=$("$VENV/bin/python" "$HERE/scripts/private-containerd" start --cni "${PRIVATE_ARGS[@]}")
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
  # demo.py waits for the daemon itself, and makes nothing unless the admin socket is this
  # daemon's (not another's that took it since the check above); the proxy runs on after it.
  if "$VENV/bin/python" "$HERE/scripts/demo.py" --socket "$LISTEN" --admin-socket "$RUN_DIR/admin.sock" \
       --daemon-pid "$proxy_pid"; then
    echo "run-local: the demo's pods stay until this script ends (Ctrl-C)" >&2
  else
    echo "run-local: the demo did not finish (see above); anolisnuma runs on until Ctrl-C" >&2
  fi
fi
set +e
wait "$proxy_pid"
rc=$?
set -e
proxy_pid=""
exit $rc
