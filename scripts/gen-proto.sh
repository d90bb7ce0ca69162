#!/bin/sh
# Regenerate cri_proto/api_pb2.py and cri_proto/api_pb2.pyi from cri_proto/api.proto, and
# the gRPC stub cri_proto/runtime_service_pb2_grpc.py from cri_proto/runtime_service.proto,
# and nri_proto/api_pb2.py(i) and nri_proto/ttrpc_pb2.py(i) from nri_proto/api.proto (NRI's
# own, verbatim) and nri_proto/ttrpc.proto (the ttrpc envelope, see nri_proto/README.md):
#
#     scripts/gen-proto.sh
#
# The generated code refuses to import under a protobuf runtime OLDER than the protoc that
# generated it (ValidateProtobufRuntimeVersion). pyproject.toml allows protobuf >= 6.31.0,
# so the code must come from protoc 31.0, which is what grpcio-tools 1.73.1 bundles
# (newer grpcio-tools emit e.g. 6.33.5 and would break on protobuf 6.31/6.32).
# Likewise the stub refuses to import under a grpcio OLDER than the grpcio-tools that
# generated it (GRPC_GENERATED_VERSION): 1.73.1, the grpcio floor in pyproject.toml.
#
# Only the stub is generated from runtime_service.proto, never its _pb2 module: that would
# register runtime.v1.RuntimeService in the process's descriptor pool, where the full CRI
# stubs the tests load register the same name (cri_proto/README.md). protoc runs from the
# repository root for it, so the stub imports `cri_proto.api_pb2` (not a top-level api_pb2).
#
# grpcio-tools is a development tool, not a runtime dependency: it is in the `dev` extra
# (`.venv/bin/pip install -e '.[dev]'`), pinned to that same 1.73.1.
#
# The interpreter is $PYTHON if set, else .venv/bin/python, else python3. If its installed
# grpcio-tools is not $GRPCIO_TOOLS_VERSION (default 1.73.1), e.g. without the dev extra,
# that version is installed once (no dependencies; the interpreter's own protobuf is used)
# into ${XDG_CACHE_HOME:-~/.cache}/anolisnuma/grpcio-tools-<version> and used from there.
# GEN_PROTO_USE_INSTALLED=1 skips the pinning and uses whatever grpcio-tools is installed;
# the gencode-version check below then tells you whether the result is still usable.
set -eu

here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"

if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then
        PYTHON=.venv/bin/python
    else
        PYTHON=python3
    fi
fi
want=${GRPCIO_TOOLS_VERSION:-1.73.1}
floor=6.31.0   # keep in step with the protobuf floor in pyproject.toml
grpc_floor=1.73.1   # keep in step with the grpcio floor in pyproject.toml

have=$("$PYTHON" -c 'from importlib.metadata import version; print(version("grpcio-tools"))' 2>/dev/null || echo none)
if [ "${GEN_PROTO_USE_INSTALLED:-0}" != 1 ] && [ "$have" != "$want" ]; then
    tools="${XDG_CACHE_HOME:-$HOME/.cache}/anolisnuma/grpcio-tools-$want"
    if [ ! -d "$tools/grpc_tools" ]; then
        echo "installing grpcio-tools==$want into $tools" >&2
        "$PYTHON" -m pip install --quiet --no-deps --target "$tools" "grpcio-tools==$want"
    fi
    PYTHONPATH="$tools${PYTHONPATH:+:$PYTHONPATH}"
    export PYTHONPATH
fi

"$PYTHON" -m grpc_tools.protoc -I cri_proto --python_out=cri_proto --pyi_out=cri_proto cri_proto/api.proto
"$PYTHON" -m grpc_tools.protoc -I . --grpc_python_out=. cri_proto/runtime_service.proto
# NRI: messages only, no service stubs (nri_proto/README.md). -I . (not -I nri_proto): the
# descriptor pool knows each file by the name it was given to protoc, and cri_proto's is
# "api.proto" already; a second "api.proto" refuses to load in the same process. api.proto
# and ttrpc.proto import nothing, so the modules are self-contained.
"$PYTHON" -m grpc_tools.protoc -I . --python_out=. --pyi_out=. nri_proto/api.proto nri_proto/ttrpc.proto
# NRI's enum Field has a value named None; protoc's .pyi declares it as `None: Field`, which
# is not valid Python (the runtime module is fine: Field.Value("None") == 0). Comment the
# two declarations out so that type checkers and linters can read the stub.
sed -i 's/^\( *\)None: /\1# not a Python name, use Field.Value("None"): None: /' nri_proto/api_pb2.pyi

not_newer() {   # not_newer VERSION FLOOR: whether VERSION <= FLOOR
    "$PYTHON" - "$1" "$2" <<'PY'
import sys
gen, floor = (tuple(int(p) for p in v.split(".")[:3]) for v in sys.argv[1:3])
sys.exit(0 if gen <= floor else 1)
PY
}

gencode=$(sed -n 's/^# Protobuf Python Version: //p' cri_proto/api_pb2.py)
for f in nri_proto/api_pb2.py nri_proto/ttrpc_pb2.py; do
    other=$(sed -n 's/^# Protobuf Python Version: //p' "$f")
    if [ "$other" != "$gencode" ]; then
        echo "ERROR: $f has gencode $other, cri_proto/api_pb2.py $gencode" >&2
        exit 1
    fi
done
grpc_gencode=$(sed -n "s/^GRPC_GENERATED_VERSION = '\(.*\)'$/\1/p" cri_proto/runtime_service_pb2_grpc.py)
echo "generated cri_proto/api_pb2.py, api_pb2.pyi, runtime_service_pb2_grpc.py and nri_proto/{api,ttrpc}_pb2.py{,i}" \
     "($("$PYTHON" -m grpc_tools.protoc --version), gencode $gencode, grpc gencode $grpc_gencode)"
if ! not_newer "$gencode" "$floor"; then
    echo "ERROR: gencode $gencode needs protobuf >= $gencode at run time but pyproject.toml allows $floor;" >&2
    echo "       regenerate with grpcio-tools $want (unset GEN_PROTO_USE_INSTALLED) or raise the floor." >&2
    exit 1
fi
if [ -z "$grpc_gencode" ] || ! not_newer "$grpc_gencode" "$grpc_floor"; then
    echo "ERROR: the stub needs grpcio >= ${grpc_gencode:-?} at run time but pyproject.toml allows $grpc_floor;" >&2
    echo "       regenerate with grpcio-tools $want (unset GEN_PROTO_USE_INSTALLED) or raise the floor." >&2
    exit 1
fi
