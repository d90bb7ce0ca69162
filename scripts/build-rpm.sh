#!/usr/bin/env bash
# Builds the anolisnuma rpm from this checkout into dist/ (needs rpmbuild: Debian's `rpm`).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
version=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' "$HERE/anolisnuma/__init__.py")
top=$(mktemp -d /tmp/anolisnuma-rpm.XXXXXX)
trap 'rm -rf "$top"' EXIT
mkdir -p "$top"/{SOURCES,SPECS,BUILD,RPMS,SRPMS}
tar -C "$HERE" --transform "s,^,anolisnuma-$version/," -czf "$top/SOURCES/anolisnuma-$version.tar.gz" \
    anolisnuma cri_proto config.toml rpm README.md
rpmbuild --define "_topdir $top" --define "version $version" --nodeps -bb "$HERE/rpm/anolisnuma.spec" >&2
mkdir -p "$HERE/dist"
cp "$top"/RPMS/noarch/*.rpm "$HERE/dist/"
ls "$HERE"/dist/*.rpm
