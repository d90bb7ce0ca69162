#!/usr/bin/env bash
# Runs the whole test suite on a Debian machine as root: installs what it needs
# (Debian packages for a real containerd, the virtualenv), checks Python 3.9
# compatibility, then runs pytest (unit tests, fake-kernel tests, and end-to-end tests
# against a private real containerd that the tests start and stop themselves).
# Extra arguments go to pytest, e.g. scripts/test.sh -k splice -x
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${ANOLISNUMA_VENV:-$HERE/.venv}
cd "$HERE"
bash scripts/install-deps.sh
echo "== vermin: the code must run on Python 3.9 (openEuler/Anolis/Alinux nodes)"
# -i: without it vermin ends with "Incompatible versions: 2.x", which says only that the code
# is Python 3 (it always is); a use of anything past 3.9 is still listed and fails the run.
"$VENV/bin/vermin" -t=3.9- -i --no-tips --violations --eval-annotations anolisnuma cri_proto nri_proto $(ls scripts/*.py scripts/*/*.py 2>/dev/null)
echo "== pytest"
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
