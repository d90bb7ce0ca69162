#!/bin/sh
# @PROG@: runs @ENTRY@ with a Python >= 3.9 of this node and the dependencies the rpm
# bundles for that Python version (@LIBDIR@/pythonX.Y); no PyPI, no python3-* rpms.
#
# Interpreter: $ANOLISNUMA_PYTHON if set (only that one), else the first of python3.9,
# python3, then the python3.X of each bundled version, that is >= 3.9 and has a bundle.
# The library directory is @LIBDIR@, or ../lib/anolisnuma next to this script when this
# script was installed elsewhere (e.g. rpm -i --root DIR); $ANOLISNUMA_LIBDIR overrides it.
prog=@PROG@
entry=@ENTRY@

self=$(readlink -f -- "$0" 2>/dev/null || echo "$0")
lib=${ANOLISNUMA_LIBDIR:-}
if [ -z "$lib" ]; then
    lib=$(cd -- "$(dirname -- "$self")/../lib/anolisnuma" 2>/dev/null && pwd)
    [ -n "$lib" ] && [ -f "$lib/launch.py" ] || lib=@LIBDIR@
fi
if [ ! -f "$lib/launch.py" ]; then
    echo "$prog: $lib/launch.py is missing: reinstall the anolisnuma package" >&2
    exit 1
fi

bundled=""
for d in "$lib"/python3.*; do
    [ -d "$d" ] && bundled="$bundled ${d##*/python}"
done

# prints X.Y of interpreter $1 (nothing when it does not run)
pyversion() {
    "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null
}
# succeeds when X.Y $1 is >= 3.9 and bundled
usable() {
    case "$1" in
        3.[0-8]|2.*|"") return 1 ;;
    esac
    [ -d "$lib/python$1" ]
}

if [ -n "${ANOLISNUMA_PYTHON:-}" ]; then
    v=$(pyversion "$ANOLISNUMA_PYTHON")
    if ! usable "$v"; then
        echo "$prog: ANOLISNUMA_PYTHON=$ANOLISNUMA_PYTHON is ${v:+Python }${v:-not a working Python}; need Python >= 3.9 with a bundle in $lib (bundled:${bundled:- none})" >&2
        exit 1
    fi
    py=$ANOLISNUMA_PYTHON
else
    py=""
    seen=" "
    tried=""
    for cand in python3.9 python3 $(for v in $bundled; do echo "python$v"; done); do
        case "$seen" in *" $cand "*) continue ;; esac
        seen="$seen$cand "
        path=$(command -v "$cand" 2>/dev/null) || path=""
        if [ -z "$path" ]; then
            tried="$tried $cand(not found)"
            continue
        fi
        v=$(pyversion "$path")
        if usable "$v"; then
            py=$path
            break
        fi
        case "$v" in
            "") tried="$tried $cand(does not run)" ;;
            3.[0-8]|2.*) tried="$tried $cand($v: too old)" ;;
            *) tried="$tried $cand($v: not bundled)" ;;
        esac
    done
    if [ -z "$py" ]; then
        echo "$prog: no Python >= 3.9 with a bundle in $lib on PATH (tried:$tried; bundled:${bundled:- none}); install python39 (or python3 >= 3.9), or set ANOLISNUMA_PYTHON" >&2
        exit 1
    fi
fi

exec "$py" -I -S -B "$lib/launch.py" "$prog" "$entry" "$@"
