#!/usr/bin/env bash
# Builds the anolisnuma rpms from this checkout (needs rpmbuild, Debian's `rpm` package, and
# a Python >= 3.9 with pip; downloads wheels from PyPI unless --no-index):
#
#   scripts/build-rpm.sh [--arch x86_64|aarch64|all] [--python 3.9,3.11] [--outdir DIR]
#                        [--wheelhouse DIR [--no-index]]
#
# --arch        architectures to build (default: all = x86_64 and aarch64)
# --python      Python versions to bundle dependencies for (default: 3.9, the version of the
#               target nodes, and the version of the Python running this build). An entry
#               may name the interpreter, e.g. 3.9=/opt/py39/bin/python3.9: with an
#               interpreter of a version at hand (given, or python3.X on PATH) the bundle is
#               byte-compiled for it, else it runs from source (a slower first start).
# --outdir      where the rpms go (default: dist/)
# --wheelhouse  keep the downloaded wheels there (one subdirectory per arch and Python) and
#               reuse them on the next build; --no-index: build from them only, offline.
#
# Each rpm holds anolisnuma (without its test helpers) and, per Python version, the runtime
# dependencies of pyproject.toml as installed from manylinux2014 wheels for that
# architecture (rpm/bundle_deps.py); see rpm/anolisnuma.spec for the layout.
# The build Python is $PYTHON, else .venv/bin/python, else python3.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

die() { echo "build-rpm: $*" >&2; exit 2; }

arches=all
pythons=""
outdir="$HERE/dist"
wheelhouse=""
no_index=""
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) arches=${2:?}; shift 2 ;;
    --arch=*) arches=${1#*=}; shift ;;
    --python) pythons=${2:?}; shift 2 ;;
    --python=*) pythons=${1#*=}; shift ;;
    --outdir) outdir=${2:?}; shift 2 ;;
    --outdir=*) outdir=${1#*=}; shift ;;
    --wheelhouse) wheelhouse=${2:?}; shift 2 ;;
    --wheelhouse=*) wheelhouse=${1#*=}; shift ;;
    --no-index) no_index=--no-index; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
case "$arches" in
  all) arches="x86_64 aarch64" ;;
  x86_64|aarch64) ;;
  *) die "--arch takes x86_64, aarch64 or all, not $arches" ;;
esac
[ -n "$no_index" ] && [ -z "$wheelhouse" ] && die "--no-index needs --wheelhouse DIR"
command -v rpmbuild >/dev/null || die "rpmbuild not found (apt-get install rpm)"

if [ -z "${PYTHON:-}" ]; then
  if [ -x "$HERE/.venv/bin/python" ]; then PYTHON=$HERE/.venv/bin/python; else PYTHON=python3; fi
fi
"$PYTHON" -m pip --version >/dev/null 2>&1 || die "$PYTHON has no pip"
pyver() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null; }
build_py_version=$(pyver "$PYTHON") || die "$PYTHON does not run"
[ -n "$pythons" ] || pythons="3.9,$build_py_version"

# versions (sorted, unique) and the interpreter to byte-compile each with ("" = none)
declare -A compiler=()
for entry in ${pythons//,/ }; do
  v=${entry%%=*}
  [[ "$v" =~ ^3\.[0-9]+$ ]] || die "--python: $v is not X.Y"
  (( ${v#3.} >= 9 )) || die "--python: anolisnuma needs Python >= 3.9, not $v"
  c=""
  if [[ "$entry" == *=* ]]; then
    c=${entry#*=}
    [ "$(pyver "$c")" = "$v" ] || die "--python: $c is not a working Python $v"
  elif [ "$build_py_version" = "$v" ]; then
    c=$PYTHON
  elif command -v "python$v" >/dev/null && [ "$(pyver "python$v")" = "$v" ]; then
    c=$(command -v "python$v")
  fi
  compiler[$v]=$c
done
versions=$(printf '%s\n' "${!compiler[@]}" | sort -t. -k1,1n -k2,2n | tr '\n' ' ')

version=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' "$HERE/anolisnuma/__init__.py")
[ -n "$version" ] || die "no __version__ in anolisnuma/__init__.py"

# The interpreters the rpm accepts: for each bundled X.Y, python3 of that version
# (openEuler's python3 is 3.9) or the distributions' parallel packages (python39, python3.11).
requires=""
for v in $versions; do
  minor=${v#3.}
  if (( minor <= 9 )); then parallel="python3$minor"; else parallel="python$v"; fi
  requires="$requires${requires:+ or }(python3 >= $v with python3 < 3.$((minor + 1))) or $parallel"
done
requires="($requires)"

top=$(mktemp -d /tmp/anolisnuma-rpm.XXXXXX)
trap 'rm -rf "$top"' EXIT
mkdir -p "$top"/{SOURCES,SPECS,BUILD,RPMS,SRPMS,stage}
[ -n "$wheelhouse" ] || wheelhouse="$top/wheelhouse"
mkdir -p "$wheelhouse" "$outdir"
wheelhouse=$(cd "$wheelhouse" && pwd)
outdir=$(cd "$outdir" && pwd)

tar -C "$HERE" --transform "s,^,anolisnuma-$version/," -czf "$top/SOURCES/anolisnuma-$version.tar.gz" \
    config.toml README.md docs rpm deploy

built=()
for arch in $arches; do
  stage="$top/stage/$arch"
  mkdir -p "$stage/app"
  # anolisnuma without its test helpers, cri_proto and nri_proto, as they are in this checkout.
  tar -C "$HERE" --exclude=__pycache__ --exclude='*.pyc' --exclude=anolisnuma/testing -cf - anolisnuma cri_proto nri_proto \
    | tar -C "$stage/app" -xf -
  install -m 0644 "$HERE/rpm/launch.py" "$stage/launch.py"
  : > "$stage/bundled.txt"
  for v in $versions; do
    echo "build-rpm: $arch: dependencies for Python $v" >&2
    "$PYTHON" "$HERE/rpm/bundle_deps.py" --arch "$arch" --python-version "$v" --pyproject "$HERE/pyproject.toml" \
      --wheelhouse "$wheelhouse/$arch-cp${v/./}" --target "$stage/python$v" $no_index > "$top/deps-$arch-$v.txt"
    sed "s/^/python$v $arch /" "$top/deps-$arch-$v.txt" >> "$stage/bundled.txt"
    c=${compiler[$v]}
    if [ -n "$c" ]; then
      # .pyc files for this version, checked against their source by hash (whatever the
      # files' mtimes), recording the installed paths for tracebacks.
      for d in "$stage/python$v" "$stage/app"; do
        "$c" -m compileall -q -j 0 --invalidation-mode checked-hash -s "$stage" -p /usr/lib/anolisnuma "$d" >/dev/null \
          || echo "build-rpm: warning: some files of $d do not compile for Python $v" >&2
      done
    else
      echo "build-rpm: no Python $v here: its bundle is not byte-compiled (give --python $v=/path/to/python$v)" >&2
    fi
  done
  tar -C "$stage" -cf "$top/SOURCES/anolisnuma-lib-$version-$arch.tar" .
  sort -u "$top"/deps-"$arch"-*.txt | sed 's/^\(.*\)==\(.*\)$/Provides: bundled(python3dist(\1)) = \2/' \
    > "$top/SOURCES/anolisnuma-bundled-$version-$arch.inc"
  echo "build-rpm: rpmbuild $arch" >&2
  rpmbuild --quiet --define "_topdir $top" --define "version $version" \
    --define "python_requires $requires" --define "bundled_pythons $versions" \
    --target "$arch" --nodeps -bb "$HERE/rpm/anolisnuma.spec" >&2
  for f in "$top/RPMS/$arch"/*.rpm; do
    cp "$f" "$outdir/"
    built+=("$outdir/$(basename "$f")")
  done
done
printf '%s\n' "${built[@]}"
