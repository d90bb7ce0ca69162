#!/usr/bin/env bash
# Installs everything and runs anolisnuma in front of a local containerd, in the foreground:
# the script returns when the daemon ends, and Ctrl-C (or SIGTERM) stops the daemon and
# everything this script started.
#
#   sudo scripts/run-local.sh [--config FILE] [--nri] [--demo] [-- extra anolisnuma args]
#
# - checks the configuration first: the file this run would run (below) is judged by the
#   daemon's own `anolisnuma --check-config` before anything is started (exit 2 with its
#   words);
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
#   running. Its config has `restrict_oom_score_adj = true` where this machine needs it
#   (CAP_SYS_RESOURCE missing: every pod would fail in runc init without it), and the
#   busybox and pause images are imported from a local archive (no registry);
# - --nri runs the daemon in NRI mode (docs/nri.md): always on a private containerd of 1.7
#   or later, with NRI on a socket of its own (RUN/nri.sock of its directories, by default
#   /tmp/anolisnuma-containerd-nri and /run/anolisnuma-containerd-nri): the one in
#   ANOLISNUMA_CONTAINERD_DIR (containerd, containerd-shim-runc-v2, ctr; e.g. the bin/ of
#   containerd's release tarball), else the containerd on PATH when it is 1.7 or later
#   (Debian 12's is 1.6: then it stops before it starts anything, saying where to get one).
#   `[nri] enabled` on that socket; the daemon's CRI socket still answers, relaying every
#   call unchanged, and kubelets and crictl use containerd's socket (printed at start);
# - writes /run/anolisnuma/local.toml (ANOLISNUMA_RUN_DIR) from a configuration file
#   (--config FILE, default the repository's config.toml: set there what you want, e.g. a
#   key that needs a restart, without editing the tracked file) with the runtime endpoint,
#   the socket, the log file, the admin socket (RUN_DIR/admin.sock) and the state dir set
#   for a local run (state in RUN_DIR/local-state, never the host's /var/lib/anolisnuma),
#   and runs `anolisnuma -c` on it;
# - --demo also turns NUMA placement on for the namespace anolisnuma-demo and, once the
#   daemon answers, runs scripts/demo.py: a pod written for anolisbox as BestEffort and a
#   Burstable one, through the proxy (with --nri: on containerd's socket, as a kubelet does
#   in NRI mode), then what each got: its NUMA node, and its QoS level with what it gets on
#   each kernel family and what this kernel lets it write. On a machine of one NUMA node
#   placement reads a fake topology of two (the e2e tests': node 0 = CPU 0, node 1 = CPU 1
#   on 2 CPUs; RUN_DIR/demo-sys as [paths] sys_root, memory not pinned), and the demo says
#   so. It prints every command it runs, with this run's paths. The pods are removed when
#   this script ends;
# - the proxy listens on /var/run/anolisnuma/anolisnuma.sock (ANOLISNUMA_LISTEN).
# Point a kubelet (or crictl) at unix:///var/run/anolisnuma/anolisnuma.sock.
#
# When it ends (Ctrl-C, SIGTERM, the daemon's end, an error) it says what it stopped and
# removed, in a closing line. Left behind: the links in the bin dir, the run dir (local.toml,
# local-state, demo-sys, the sockets' .lock files), the log file; the daemon removes its
# sockets as it stops.
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
#                         and /run/anolisnuma-containerd; with --nri, the same with -nri)
#   ANOLISNUMA_CONTAINERD_DIR  --nri: the directory of a containerd >= 1.7 (default: PATH's)
#
# Who can steer it: these variables, --config and the files they name are root's to give
# (the script runs as root and runs what ANOLISNUMA_CONTAINERD_DIR and ANOLISNUMA_VENV hold:
# whoever may write there, or set them, runs code as root).
set -euo pipefail
# Run as root: no Python it starts takes modules from the directory it was started in (a
# grp.py there would run). Python 3.11 and later read this; older ones ignore it.
export PYTHONSAFEPATH=1
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${ANOLISNUMA_VENV:-$HERE/.venv}
LISTEN=${ANOLISNUMA_LISTEN:-/var/run/anolisnuma/anolisnuma.sock}
RUN_DIR=${ANOLISNUMA_RUN_DIR:-/run/anolisnuma}
BIN_DIR=${ANOLISNUMA_BIN_DIR:-/usr/local/bin}
LOG_FILE=${ANOLISNUMA_LOG_FILE:-/var/log/anolisnuma.log}
CONFIG=$HERE/config.toml
demo=0
nri=0
ORIG_ARGS=("$@")   # for the command suggested when the paths are taken
while [ $# -gt 0 ]; do
  case "$1" in
    --config) [ $# -ge 2 ] || { echo "run-local: --config needs a file" >&2; exit 2; }
              CONFIG=$2; shift 2 ;;
    --config=*) CONFIG=${1#--config=}; shift ;;
    --demo) demo=1; shift ;;
    --nri) nri=1; shift ;;
    --) shift; break ;;
    *) break ;;
  esac
done
[ -f "$CONFIG" ] || { echo "run-local: no configuration file $CONFIG" >&2; exit 2; }
bash "$HERE/scripts/install-deps.sh"

# where a private containerd lives (the defaults of scripts/private-containerd; NRI's apart,
# so that a 1.6 another run left in the usual ones is not taken for it)
suffix=""
[ "$nri" = 1 ] && suffix="-nri"
PRIVATE_BASE=${ANOLISNUMA_PRIVATE_CONTAINERD_BASE:-/tmp/anolisnuma-containerd$suffix}
PRIVATE_RUN=${ANOLISNUMA_PRIVATE_CONTAINERD_RUN:-/run/anolisnuma-containerd$suffix}
PRIVATE_ARGS=(--base "$PRIVATE_BASE" --run "$PRIVATE_RUN")
NRI_ARGS=()
[ "$nri" = 1 ] && NRI_ARGS=(--nri)

# Which containerd, decided before anything is started (the configuration names it).
probe=${ANOLISNUMA_ENDPOINT:-/run/containerd/containerd.sock}
if [ "$nri" = 0 ] && "$VENV/bin/python" - "$probe" <<'PY' 2>/dev/null
import sys
from anolisnuma.cri.client import CriClient
CriClient(sys.argv[1], timeout_seconds=2).version()
PY
then
  endpoint=$probe
  private=0
else
  endpoint=$PRIVATE_RUN/containerd.sock   # PrivateContainerd.socket
  private=1
fi
nri_socket=""
[ "$nri" = 1 ] && nri_socket=$PRIVATE_RUN/nri.sock   # PrivateContainerd.nri_socket
CONFIG_ARGS=(--endpoint "$endpoint" --listen "$LISTEN" --state "$RUN_DIR/local-state" --log "$LOG_FILE"
             --admin "$RUN_DIR/admin.sock")
[ "$nri" = 1 ] && CONFIG_ARGS+=(--nri "$nri_socket")
[ "$demo" = 1 ] && CONFIG_ARGS+=(--demo "$RUN_DIR/demo-sys")

# The configuration this run would run, judged by the daemon's own check before anything is
# started (a mistake in --config FILE would otherwise be found once containerd runs).
checked=$(mktemp -d)
trap 'rm -rf "$checked"' EXIT
"$VENV/bin/python" "$HERE/scripts/local_config.py" "$CONFIG" "$checked/local.toml" "${CONFIG_ARGS[@]}" || {
  echo "run-local: nothing was started" >&2; exit 2; }
if ! said=$("$VENV/bin/anolisnuma" --check-config -c "$checked/local.toml" 2>&1); then
  # (the file checked is a copy of $CONFIG with this run's paths: name the user's)
  echo "${said//$checked\/local.toml/$CONFIG}" >&2
  echo "run-local: $CONFIG is not a configuration the daemon can run; nothing was started" >&2
  exit 2
fi
# its warnings, but the one of a private containerd's socket, which is not there until started
grep '^anolisnuma: warning: ' <<<"$said" | { [ "$private" = 1 ] && grep -v ': runtime.endpoint: ' || cat; } >&2 || true
rm -rf "$checked"
trap - EXIT

# --nri needs a containerd of 1.7 or later: said now, before anything is started.
if [ "$nri" = 1 ] && ! "$VENV/bin/python" "$HERE/scripts/private-containerd" check-nri >&2; then
  echo "run-local: nothing was started" >&2
  exit 2
fi

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
             "ANOLISNUMA_ENDPOINT", "ANOLISNUMA_PRIVATE_CONTAINERD_BASE", "ANOLISNUMA_PRIVATE_CONTAINERD_RUN",
             "ANOLISNUMA_CONTAINERD_DIR")
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

started_containerd=0   # 1: this run started the private containerd, and stops it
containerd_pid=""
proxy_pid=""
proxy_was=""
pods_made=0
done_lines=()   # what the end did, for the closing line
cleanup() {
  local rc=$1 why=$2
  trap - EXIT INT TERM
  if [ "$pods_made" = 1 ]; then
    # straight to containerd: Ctrl-C has reached the daemon too (one process group)
    "$VENV/bin/python" "$HERE/scripts/demo.py" --remove --socket "$endpoint" >&2 \
      && done_lines+=("the demo's pods removed") || done_lines+=("the demo's pods NOT removed (see above)")
  fi
  if [ -n "$proxy_pid" ] && kill -0 "$proxy_pid" 2>/dev/null; then
    kill -TERM "$proxy_pid" 2>/dev/null || true
    wait "$proxy_pid" 2>/dev/null || true
  fi
  [ -n "$proxy_was" ] && done_lines+=("anolisnuma (pid $proxy_was) stopped")
  if [ "$started_containerd" = 1 ]; then
    if "$VENV/bin/python" "$HERE/scripts/private-containerd" stop "${PRIVATE_ARGS[@]}" >/dev/null 2>&1; then
      done_lines+=("the private containerd (pid ${containerd_pid:-?}) stopped" "removed $PRIVATE_BASE and $PRIVATE_RUN")
    else
      done_lines+=("the private containerd NOT fully removed: scripts/private-containerd stop ${PRIVATE_ARGS[*]}")
    fi
  elif [ "$private" = 1 ] && [ -n "$containerd_pid" ]; then
    done_lines+=("the private containerd (pid $containerd_pid, another run's) left running")
  fi
  local line
  for line in ${done_lines[@]+"${done_lines[@]}"}; do
    echo "run-local: $line" >&2
  done
  local kept="" f
  for f in local.toml local-state demo-sys; do
    if [ -e "$RUN_DIR/$f" ]; then kept+="${kept:+, }$f"; fi
  done
  if [ -n "$kept" ]; then echo "run-local: kept: $RUN_DIR ($kept), $LOG_FILE" >&2; fi
  echo "run-local: ended ($why)" >&2
  exit "$rc"
}
trap 'rc=$?; cleanup "$rc" "exit $rc"' EXIT
trap 'cleanup 143 "SIGTERM"' TERM
trap 'cleanup 130 "Ctrl-C"' INT

if [ "$private" = 1 ]; then
  if "$VENV/bin/python" "$HERE/scripts/private-containerd" status "${PRIVATE_ARGS[@]}" >/dev/null 2>&1; then
    # another run's (or one a crash left): not this run's to stop
    why="no containerd answers on $probe"
    [ "$nri" = 1 ] && why="--nri"
    echo "run-local: $why; using the private one that already runs in $PRIVATE_RUN, left running" \
         "when this script ends (to stop it: scripts/private-containerd stop ${PRIVATE_ARGS[*]})" >&2
  else
    [ "$nri" = 0 ] && echo "run-local: no containerd answers on $probe; starting a private one" >&2
    [ "$nri" = 1 ] && echo "run-local: --nri: starting a private containerd with NRI on $nri_socket" >&2
    if "$VENV/bin/python" -c 'import sys; from anolisnuma.testing.containerd import oom_score_adj_restricted as r
sys.exit(0 if r() else 1)'; then
      echo "run-local: this machine refuses a lower oom_score_adj (no CAP_SYS_RESOURCE): containerd" >&2
      echo "run-local: runs with restrict_oom_score_adj = true, or every pod would fail in runc init" >&2
    fi
    started_containerd=1
  fi
  started=$("$VENV/bin/python" "$HERE/scripts/private-containerd" start --cni ${NRI_ARGS[@]+"${NRI_ARGS[@]}"} \
            "${PRIVATE_ARGS[@]}")
  containerd_pid=$("$VENV/bin/python" "$HERE/scripts/private-containerd" status "${PRIVATE_ARGS[@]}" \
                   | sed -n 's/^pid: //p')
  [ "$started" = "$endpoint" ] || { echo "run-local: the private containerd serves $started, not $endpoint" >&2; exit 1; }
fi

mkdir -p "$RUN_DIR"
"$VENV/bin/python" "$HERE/scripts/local_config.py" "$CONFIG" "$RUN_DIR/local.toml" "${CONFIG_ARGS[@]}" \
  --write-topology
if [ "$nri" = 1 ]; then
  echo "run-local: anolisnuma in NRI mode on $nri_socket" >&2
  echo "run-local: for a kubelet or crictl: unix://$endpoint" >&2
else
  echo "run-local: anolisnuma runs as a proxy in front of $endpoint" >&2
  echo "run-local: for a kubelet or crictl: unix://$LISTEN" >&2
fi
echo "run-local: its log: $LOG_FILE; Ctrl-C stops" >&2
# Big replies (ListContainers on a full node) cost far less when glibc keeps its buffers.
export MALLOC_MMAP_THRESHOLD_=67108864 MALLOC_TRIM_THRESHOLD_=268435456
# In the background and waited for, so that a signal to this script reaches the trap at once.
"$VENV/bin/anolisnuma" -c "$RUN_DIR/local.toml" "$@" &
proxy_pid=$!
proxy_was=$proxy_pid
if [ "$demo" = 1 ]; then
  # demo.py waits for the daemon itself, and makes nothing unless the admin socket is this
  # daemon's (not another's that took it since the check above); the daemon runs on after it.
  # The pods are made where a kubelet would make them: the proxy's socket, or with --nri
  # containerd's.
  pods_socket=$LISTEN
  [ "$nri" = 1 ] && pods_socket=$endpoint
  pods_made=1
  if "$VENV/bin/python" "$HERE/scripts/demo.py" --socket "$pods_socket" --admin-socket "$RUN_DIR/admin.sock" \
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
trap - EXIT
cleanup "$rc" "anolisnuma exited with $rc"
