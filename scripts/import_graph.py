#!/usr/bin/env python3
"""The import graph of the daemon's package, and its circles.

    scripts/import_graph.py [--package anolisnuma] [--runtime] [--edges]

Reads every module's source (nothing is imported), takes each ``import``/``from ... import``
of a module inside the package (relative ones resolved; ``from pkg import name`` counts as
an import of ``pkg.name`` when that is a module, else of ``pkg``), and prints each strongly
connected set of modules — a circle, where neither side can be read or tested without the
other. Every import counts: those inside functions (they run when called) and those under
``if TYPE_CHECKING:`` (they never run, but a module that names another's class in its
types cannot be read without it). ``--runtime`` counts only the imports that run when the
module is imported. Exit status 1 when there is a circle, 0 when there is none. ``--edges``
prints every edge as ``a -> b``.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
from typing import Dict, Iterator, List, Optional, Set

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def modules(package_dir: str, package: str) -> Dict[str, str]:
    """Dotted module name -> source path, for every .py under the package."""
    found = {}
    for root, dirs, files in os.walk(package_dir):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__pycache__")))
        rel = os.path.relpath(root, os.path.dirname(package_dir))
        dotted = rel.replace(os.sep, ".")
        for f in sorted(files):
            if f.endswith(".py"):
                name = dotted if f == "__init__.py" else f"{dotted}.{f[:-3]}"
                found[name] = os.path.join(root, f)
    return {k: v for k, v in found.items() if k == package or k.startswith(package + ".")}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, runtime_only: bool) -> Iterator[ast.stmt]:
    """The import statements of a module: all of them, or with ``runtime_only`` those that
    run when it is imported (not in function bodies, not under ``if TYPE_CHECKING:``)."""
    stack: List[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child
            elif runtime_only and isinstance(child, ast.If) and _is_type_checking(child.test):
                stack.append(ast.Module(body=child.orelse, type_ignores=[]))  # the else branch runs
            elif runtime_only and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            else:
                stack.append(child)


def edges(mods: Dict[str, str], runtime_only: bool = False) -> Dict[str, Set[str]]:
    graph: Dict[str, Set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        is_pkg = path.endswith("__init__.py")
        here = name if is_pkg else name.rpartition(".")[0]
        for stmt in _imports(tree, runtime_only):
            if isinstance(stmt, ast.Import):
                targets = [a.name for a in stmt.names]
            else:
                base = stmt.module or ""
                if stmt.level:
                    parts = here.split(".")
                    anchor = ".".join(parts[:len(parts) - (stmt.level - 1)])
                    base = f"{anchor}.{base}" if base else anchor
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in stmt.names]
            for t in targets:
                while t and t not in mods:  # `import a.b.c` of a name inside a module
                    t = t.rpartition(".")[0]
                if t and t != name:
                    graph[name].add(t)
    return graph


def circles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    on_stack: Set[str] = set()
    stack: List[str] = []
    out: List[List[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            advanced = False
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.append(m)
                    if m == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return sorted(out)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="import_graph.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--package", default="anolisnuma")
    ap.add_argument("--runtime", action="store_true",
                    help="count only imports that run at import time (not in functions, not TYPE_CHECKING)")
    ap.add_argument("--edges", action="store_true", help="print every edge")
    args = ap.parse_args(argv)
    mods = modules(os.path.join(REPO, args.package), args.package)
    graph = edges(mods, args.runtime)
    if args.edges:
        for a in sorted(graph):
            for b in sorted(graph[a]):
                print(f"{a} -> {b}")
    found = circles(graph)
    for c in found:
        inner = {m: sorted(graph[m] & set(c)) for m in c}
        print(f"circle of {len(c)}: " + "; ".join(f"{m} -> {', '.join(t)}" for m, t in inner.items()))
    print(f"{len(mods)} modules, {sum(len(v) for v in graph.values())} imports, {len(found)} circles"
          + (" (imports at import time only)" if args.runtime else ""))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
