#!/usr/bin/env python3
"""Builds the self-contained dependency tree of one (architecture, Python version) pair.

    rpm/bundle_deps.py --arch aarch64 --python-version 3.9 --pyproject pyproject.toml \
        --wheelhouse DIR --target SITE [--manylinux manylinux2014] [--no-index]

The runtime dependencies come from pyproject.toml's [project] dependencies, their
environment markers evaluated for the TARGET (Linux, CPython X.Y, the architecture), not
for the Python running this script: pip evaluates markers against its own interpreter even
under --python-version (a cp39 tree built on 3.11 would miss tomli and typing-extensions).
So pip only downloads (binary wheels for the target's platform tags); this script walks
the wheels' Requires-Dist with the target's markers, downloads what is still missing, and
installs exactly that closure into SITE (pip install --target --no-deps). It fails when a
requirement has no wheel for the target, when a chosen version does not satisfy every
specifier on it, or when an extension module is for another architecture or Python.

Prints one line per bundled distribution: "name==version".
Needs only the Python running it (>= 3.9) and its pip.
"""

from __future__ import annotations

import argparse
import email.parser
import os
import re
import shutil
import struct
import subprocess
import sys
import zipfile
from typing import Dict, List, Optional, Set, Tuple

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name, parse_wheel_filename
    from packaging.version import Version
except ImportError:  # pip's copy: always there where pip is
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name, parse_wheel_filename
    from pip._vendor.packaging.version import Version

try:
    import tomllib  # novermin (Python >= 3.11; the fallbacks below for 3.9 and 3.10)
except ImportError:
    try:
        import tomli as tomllib
    except ImportError:
        from pip._vendor import tomli as tomllib

# ELF e_machine of each architecture we build for.
ELF_MACHINE = {"x86_64": 62, "aarch64": 183}


def target_env(python_version: str, arch: str) -> Dict[str, str]:
    """PEP 508 marker environment of CPython X.Y on Linux/arch."""
    return {
        "implementation_name": "cpython",
        "implementation_version": python_version + ".0",
        "os_name": "posix",
        "platform_machine": arch,
        "platform_python_implementation": "CPython",
        "platform_release": "",
        "platform_system": "Linux",
        "platform_version": "",
        "python_full_version": python_version + ".0",
        "python_version": python_version,
        "sys_platform": "linux",
        "extra": "",
    }


def applies(req: Requirement, env: Dict[str, str], extras: Set[str]) -> bool:
    if req.marker is None:
        return True
    for extra in sorted(extras) or [""]:
        e = dict(env, extra=extra)
        if req.marker.evaluate(e):
            return True
    return False


def runtime_requirements(pyproject: str, env: Dict[str, str]) -> List[Requirement]:
    with open(pyproject, "rb") as f:
        data = tomllib.load(f)
    reqs = [Requirement(s) for s in data["project"].get("dependencies", [])]
    out = []
    for r in reqs:
        if applies(r, env, set()):
            r.marker = None  # pip would evaluate it for its own interpreter
            out.append(r)
    return out


def wheel_requires(path: str) -> List[Requirement]:
    with zipfile.ZipFile(path) as z:
        meta = [n for n in z.namelist() if re.match(r"[^/]+\.dist-info/METADATA$", n)]
        if len(meta) != 1:
            raise SystemExit(f"bundle: {path}: no single METADATA")
        msg = email.parser.BytesParser().parsebytes(z.read(meta[0]), headersonly=True)
    return [Requirement(v) for v in (msg.get_all("Requires-Dist") or [])]


def wheels_in(wheelhouse: str) -> Dict[str, List[Tuple[Version, str]]]:
    found: Dict[str, List[Tuple[Version, str]]] = {}
    for fn in os.listdir(wheelhouse):
        if fn.endswith(".whl"):
            name, version, _build, _tags = parse_wheel_filename(fn)
            found.setdefault(canonicalize_name(name), []).append((version, os.path.join(wheelhouse, fn)))
    return found


def pick(candidates: List[Tuple[Version, str]], specs: List[Requirement]) -> Optional[Tuple[Version, str]]:
    ok = [(v, p) for v, p in candidates if all(r.specifier.contains(v, prereleases=True) for r in specs)]
    return max(ok) if ok else None


def pip_args(args: argparse.Namespace) -> List[str]:
    xy = args.python_version.replace(".", "")
    out = ["--only-binary=:all:", "--implementation", "cp", "--python-version", args.python_version,
           "--abi", f"cp{xy}"]
    for tag in args.manylinux:
        out += ["--platform", f"{tag}_{args.arch}"]
    return out


def pip(args: argparse.Namespace, *argv: str) -> None:
    env = dict(os.environ, PIP_ROOT_USER_ACTION="ignore", PIP_DISABLE_PIP_VERSION_CHECK="1")
    cmd = [sys.executable, "-m", "pip", *argv]
    r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    if r.returncode != 0:
        noise = re.compile(r"^WARNING: Location '.*' is ignored")
        text = "\n".join(line for line in r.stdout.splitlines() if not noise.match(line))
        raise SystemExit(f"bundle: {' '.join(cmd)} failed:\n{text}")


def download(args: argparse.Namespace, reqs: List[Requirement]) -> None:
    if args.no_index:
        return  # offline: the wheelhouse must hold everything already
    pip(args, "download", "--quiet", "--dest", args.wheelhouse, *pip_args(args), *[str(r) for r in reqs])


def resolve(args: argparse.Namespace) -> List[Tuple[str, Version, str]]:
    env = target_env(args.python_version, args.arch)
    roots = runtime_requirements(args.pyproject, env)
    os.makedirs(args.wheelhouse, exist_ok=True)
    for _attempt in range(8):
        have = wheels_in(args.wheelhouse)
        specs: Dict[str, List[Requirement]] = {}
        extras: Dict[str, Set[str]] = {}
        chosen: Dict[str, Tuple[Version, str]] = {}
        missing: List[Requirement] = []
        todo = list(roots)
        while todo:
            req = todo.pop()
            name = canonicalize_name(req.name)
            specs.setdefault(name, []).append(req)
            before = (chosen.get(name), set(extras.get(name, set())))
            extras.setdefault(name, set()).update(req.extras)
            got = pick(have.get(name, []), specs[name])
            if got is None:
                missing.append(req)
                continue
            chosen[name] = got
            if (got, extras[name]) == before:
                continue
            for sub in wheel_requires(got[1]):
                if applies(sub, env, extras[name]):
                    sub.marker = None
                    todo.append(sub)
        if not missing:
            return sorted((n, v, p) for n, (v, p) in chosen.items())
        if args.no_index:
            raise SystemExit("bundle: no wheel in %s for %s (cp%s, %s)" % (
                args.wheelhouse, ", ".join(sorted({str(r) for r in missing})),
                args.python_version.replace(".", ""), args.arch))
        download(args, missing)
    raise SystemExit(f"bundle: the requirements of {args.pyproject} do not settle for cp{args.python_version}/{args.arch}")


# What the wheels ship that never runs: Cython sources (uvloop's .pyx/.pxd/.pxi) and test
# suites inside packages (certifi/tests, pulled by httpx on 3.9).
SOURCE_SUFFIXES = (".pyx", ".pxd", ".pxi")
TEST_DIRS = ("tests", "test")


def prune(site: str) -> List[str]:
    """Remove what never runs (above) from the installed tree; returns what went."""
    gone = []
    for dirpath, dirs, files in os.walk(site):
        inside_package = os.path.relpath(dirpath, site) != "."   # (never a top-level module)
        for d in [d for d in dirs if inside_package and d in TEST_DIRS]:
            shutil.rmtree(os.path.join(dirpath, d))
            dirs.remove(d)
            gone.append(os.path.join(dirpath, d))
        for fn in files:
            if fn.endswith(SOURCE_SUFFIXES):
                os.unlink(os.path.join(dirpath, fn))
                gone.append(os.path.join(dirpath, fn))
    return gone


def check_extensions(site: str, arch: str, python_version: str) -> None:
    xy = python_version.replace(".", "")
    for dirpath, _dirs, files in os.walk(site):
        for fn in files:
            if not (fn.endswith(".so") or ".so." in fn):
                continue
            path = os.path.join(dirpath, fn)
            with open(path, "rb") as f:
                head = f.read(20)
            if head[:4] != b"\x7fELF":
                continue
            machine = struct.unpack("<H", head[18:20])[0]
            if machine != ELF_MACHINE[arch]:
                raise SystemExit(f"bundle: {path} is for ELF machine {machine}, not {arch}")
            m = re.search(r"\.cpython-(\d+)", fn)
            if m and m.group(1) != xy:
                raise SystemExit(f"bundle: {path} is for CPython {m.group(1)}, not {xy}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", required=True, choices=sorted(ELF_MACHINE))
    ap.add_argument("--python-version", required=True, help="X.Y of the target CPython")
    ap.add_argument("--pyproject", required=True)
    ap.add_argument("--wheelhouse", required=True, help="downloaded wheels (kept, reused)")
    ap.add_argument("--target", required=True, help="site directory to create")
    ap.add_argument("--manylinux", action="append", default=None,
                    help="platform tag prefix (default manylinux2014, i.e. glibc >= 2.17); repeatable")
    ap.add_argument("--no-index", action="store_true", help="use only the wheels already in --wheelhouse")
    args = ap.parse_args()
    if not re.match(r"^3\.\d+$", args.python_version):
        ap.error("--python-version takes X.Y, e.g. 3.9")
    args.manylinux = args.manylinux or ["manylinux2014"]

    dists = resolve(args)
    if os.path.exists(args.target):
        shutil.rmtree(args.target)
    pip(args, "install", "--quiet", "--no-index", "--no-deps", "--no-compile", "--target", args.target,
        *pip_args(args), *[p for _n, _v, p in dists])
    # Console scripts carry the build machine's interpreter in their #! line: not ours to ship.
    shutil.rmtree(os.path.join(args.target, "bin"), ignore_errors=True)
    for dirpath, dirs, _files in os.walk(args.target):
        if "__pycache__" in dirs:
            shutil.rmtree(os.path.join(dirpath, "__pycache__"))
            dirs.remove("__pycache__")
    prune(args.target)
    check_extensions(args.target, args.arch, args.python_version)
    for name, version, _path in dists:
        print(f"{name}=={version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
