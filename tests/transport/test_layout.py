"""The transport's rooms stay small and free of import circles (issue 20).

The splice is read and tested without the relay: what it needs of its owner is the narrow
``SpliceOwner`` defined on its side, so nothing under ``transport/splice/`` imports the relay,
and no circle forms among the transport's modules (TYPE_CHECKING imports count too, as in
``scripts/import_graph.py``)."""

from __future__ import annotations

import importlib.util
import os

import anolisnuma.transport

TRANSPORT = os.path.dirname(anolisnuma.transport.__file__)
REPO = os.path.dirname(os.path.dirname(TRANSPORT))
MAX_LINES = 600


def _import_graph():
    spec = importlib.util.spec_from_file_location("import_graph", os.path.join(REPO, "scripts", "import_graph.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_no_import_circle_in_the_transport_and_the_splice_never_imports_the_relay() -> None:
    ig = _import_graph()
    whole = ig.edges(ig.modules(os.path.dirname(TRANSPORT), "anolisnuma"))
    graph = {m: {t for t in ts if t.startswith("anolisnuma.transport")}
             for m, ts in whole.items() if m.startswith("anolisnuma.transport")}
    assert ig.circles(graph) == []
    splice_side = {m: sorted(t) for m, t in graph.items() if m.startswith("anolisnuma.transport.splice")}
    assert splice_side, "the splice package was not found"
    assert not [m for m, t in splice_side.items() if "anolisnuma.transport.relay" in t], splice_side


def test_every_transport_module_is_a_room_one_can_hold() -> None:
    sizes = {}
    for root, _, files in os.walk(TRANSPORT):
        for f in files:
            if f.endswith(".py"):
                with open(os.path.join(root, f), encoding="utf-8") as fh:
                    sizes[os.path.relpath(os.path.join(root, f), TRANSPORT)] = sum(1 for _ in fh)
    assert {f: n for f, n in sizes.items() if n > MAX_LINES} == {}, sizes
