"""The shape of ``anolisnuma/ctl/kubelet/``: small rooms, and a reading half the daemon can
import without the command half.

Given the package's source (read, not imported), when its modules are measured and the
imports of its ``__init__`` (what anolisnuma/system/pod_cgroups.py imports) are followed,
then no module is over the limit, and the daemon never pulls in anolisnuma's own config,
the CRI client or a subprocess through it.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from typing import Any, Dict, List, Set, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE_DIR = os.path.join(REPO, "anolisnuma", "ctl", "kubelet")
PACKAGE = "anolisnuma.ctl.kubelet"
MAX_LINES = 400   # well under the project's ~600: a room one can hold in the head


@functools.lru_cache(maxsize=None)
def _import_graph() -> Tuple[Any, Dict[str, Set[str]]]:
    """scripts/import_graph.py and anolisnuma's graph, every import counted (late ones too)."""
    spec = importlib.util.spec_from_file_location("import_graph", os.path.join(REPO, "scripts", "import_graph.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module, module.edges(module.modules(os.path.join(REPO, "anolisnuma"), "anolisnuma"))


def _reachable(graph: Dict[str, Set[str]], start: str) -> Set[str]:
    seen: Set[str] = set()
    todo: List[str] = [start]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(graph.get(name, ()))
    return seen


def test_no_module_of_the_kubelet_package_is_over_the_limit():
    sizes = {}
    for name in sorted(os.listdir(PACKAGE_DIR)):
        if name.endswith(".py"):
            with open(os.path.join(PACKAGE_DIR, name), encoding="utf-8") as f:
                sizes[name] = sum(1 for _ in f)
    assert len(sizes) > 5, sizes  # the package is there, not a single file again
    too_big = {name: n for name, n in sizes.items() if n > MAX_LINES}
    assert too_big == {}, f"split these along their seams (limit {MAX_LINES} lines): {too_big}"


def test_the_readers_the_daemon_imports_stay_clear_of_the_commands():
    _, graph = _import_graph()
    reached = _reachable(graph, PACKAGE)
    outside = sorted(m for m in reached if m != PACKAGE and not m.startswith(PACKAGE + "."))
    assert outside == [], f"the kubelet readers import {outside}"
    for command in ("cli", "ours", "status", "enable", "disable", "probe", "plan", "backups", "node_writes"):
        assert f"{PACKAGE}.{command}" not in reached, command
    for module in sorted(reached):
        path = os.path.join(REPO, *module.split(".")) + ".py"
        if not os.path.exists(path):
            path = os.path.join(REPO, *module.split("."), "__init__.py")
        with open(path, encoding="utf-8") as f:
            assert "subprocess" not in f.read(), module


def test_the_package_has_no_import_circle():
    ig, graph = _import_graph()
    inside = [c for c in ig.circles(graph) if any(m.startswith(PACKAGE) for m in c)]
    assert inside == []
