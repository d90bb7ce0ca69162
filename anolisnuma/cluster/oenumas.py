"""The Oenuma CRs seen on the API server, and their placement rules for this node.

Only what concerns this node is kept: a CR whose ``spec.node[]`` names it is kept trimmed
to what a rule or a status needs (apiVersion, kind, name, namespace, uid, generation, and
of its spec only this node's entries, when they are within the bounds of
``policies/numa/oenuma_bounds.py``; over them, only why it is refused); any other CR is
counted by its key alone. Memory therefore grows with the number of CRs in the cluster by a
key each, and with the CRs naming this node by their entries for it (bounded per CR); a
watch that floods events replaces entries, it never adds any.

Rules come from the CR parser (``policies/numa/oenuma_cr.py``, the rule files' entry
reader under the node's trust: ``[kubernetes] trusted_namespaces``), one CR at a time: a
malformed CR is reported and skipped, the others still apply. Precedence, documented in
docs/cluster.md: config pins, then rule files, then CRs in namespace/name order; the first
rule that names a pod wins.

The CRs whose rules are in force are persisted (``<state_dir>/cluster-oenumas.json``)
whenever they change, and loaded at start, before the hooks take calls: when the API
server cannot be reached, the last rules seen still apply. The file is read only up to
``RULES_FILE_MAX_BYTES`` (what the node's caps let it hold, with room to spare) and every
CR in it is bounded again, so what the hooks wait for at start is bounded whatever is
there (an older daemon's file, a hostile CR it kept).
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple

import structlog

from anolisnuma.fileread import MIB
from anolisnuma.policies.numa.oenuma_bounds import MAX_CPU_LIST, entries_for_node
from anolisnuma.policies.numa.oenuma_cr import parse_cr
from anolisnuma.policies.numa.rules import OENUMA_API_VERSION, OENUMA_KIND, PinRule, RuleFileError
from anolisnuma.policies.numa.topology import NumaTopology
from anolisnuma.state.persist import atomic_write_bytes, load_json_state

log = structlog.get_logger("anolisnuma.cluster")

Key = Tuple[str, str]   # (namespace, name)
STATE_FILE = "cluster-oenumas.json"
STATE_VERSION = 1
# At the node's caps (cluster/node_caps.py: 2,048 entries, each CR counting one at least)
# the file holds about 11 MB at the very most (tests/cluster/test_cr_bounds.py).
RULES_FILE_MAX_BYTES = 16 * MIB


def key_of(obj: Any) -> Optional[Key]:
    """``(namespace, name)`` of an API object; None when it has none (garbage)."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(meta, dict):
        return None
    ns, name = meta.get("namespace"), meta.get("name")
    if not isinstance(ns, str) or not isinstance(name, str) or not name:
        return None
    return ns, name


def resource_version(obj: Any) -> str:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
    return rv if isinstance(rv, str) else ""


def trim(obj: Dict[str, Any], node_name: str) -> Optional[Dict[str, Any]]:
    """:func:`trim_cr`, and a CR that makes it fail is logged and left aside (None), as a
    CR naming another node is: one object's failure is its own, never the watch's."""
    try:
        return trim_cr(obj, node_name)
    except Exception as e:  # noqa: BLE001 - (issue 33: every object fails alone)
        key = key_of(obj)
        log.error("Oenuma CR could not be read; left aside", cr=f"{key[0]}/{key[1]}" if key else None,
                  error_type=type(e).__name__, error=str(e)[:300])
        return None


def trim_cr(obj: Dict[str, Any], node_name: str) -> Optional[Dict[str, Any]]:
    """What is kept of a CR naming ``node_name`` (None when it does not name it): enough to
    make its rules and write its status. Of the spec, only this node's entries (their
    places in ``spec.node[]`` in ``nodeIndex``, for the reports); of a CR over the bounds,
    only why (``refused``). Not its resourceVersion: a status written (by any node)
    changes that, not the rules."""
    at, why = entries_for_node(obj, node_name)
    if at is None:
        return None
    meta = obj.get("metadata") or {}
    kept = {k: meta[k] for k in ("name", "namespace", "uid", "generation") if k in meta}
    out = {"apiVersion": obj.get("apiVersion", OENUMA_API_VERSION), "kind": obj.get("kind", OENUMA_KIND),
           "metadata": kept}
    if why:
        out["refused"] = why
        return out
    nodes = obj["spec"]["node"]
    was = obj.get("nodeIndex")   # (a CR trimmed before: saved in the state file)
    if isinstance(was, list) and len(was) == len(nodes):
        out["nodeIndex"] = [was[i] for i in at]
    else:
        out["nodeIndex"] = at
    out["spec"] = {"node": [_kept_entry(nodes[i]) for i in at]}
    return out


# What a rule or a status reads of a node entry; nothing else of it is kept.
_ENTRY_FIELDS = {"numa": ("numaNum", "cpuset", "memset"), "podAffinity": ("namespace", "podName", "numaNum")}


def _kept_entry(entry: Dict[str, Any]) -> Dict[str, Any]:
    """The fields of a node entry the rules read, with their values as they are when
    scalars (the parser says what is wrong with them) and a small mapping naming the type
    when not: a hostile CR's nested or unknown fields cost neither memory nor the time of a
    comparison, a repr or a save."""
    out: Dict[str, Any] = {"name": entry["name"]}
    for key, fields in _ENTRY_FIELDS.items():
        if key not in entry:
            continue
        items = entry[key]
        if not isinstance(items, list):
            out[key] = _scalar(items)
            continue
        out[key] = [{f: _scalar(item[f]) for f in fields if f in item}
                    if isinstance(item, dict) and not _is_placeholder(item) else _scalar(item) for item in items]
    return out


def _scalar(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        # (the fields the bounds check are at most this long already: this cuts the others)
        return value[:MAX_CPU_LIST]
    # A mapping naming the type, never a string: the parser refuses it where it wants a
    # name or a number, as it refused the value (a string "<dict>" read as a namespace).
    # One already made is kept as it is: the saved file trimmed again at start is unchanged.
    if _is_placeholder(value):
        return value
    return {"unread": type(value).__name__}


def _is_placeholder(value: Any) -> bool:
    return (isinstance(value, dict) and len(value) == 1 and isinstance(value.get("unread"), str)
            and len(value["unread"]) <= 32)


class OenumaSet:
    """The CRs seen (see the module docstring); thread-safe. ``version`` grows whenever
    the CRs naming this node change, and :meth:`changes` says which did (the rules loop
    takes only those again: a flood of changes to one CR among a thousand costs one CR's
    work per pass, not a thousand)."""

    def __init__(self, node_name: str) -> None:
        self.node_name = node_name
        self._lock = threading.Lock()
        self._keys: Dict[Key, str] = {}            # every CR seen: its resourceVersion
        self._mine: Dict[Key, Dict[str, Any]] = {}  # the CRs naming this node, trimmed
        self._changed: Set[Key] = set()             # CRs of _mine added, changed or gone since changes()
        self.version = 0

    def replace(self, objects: Iterable[Any]) -> bool:
        """A full list: what is not in it is gone. True when the CRs naming us changed."""
        keys: Dict[Key, str] = {}
        mine: Dict[Key, Dict[str, Any]] = {}
        for obj in objects:
            key = key_of(obj)
            if key is None:
                continue
            keys[key] = resource_version(obj)
            kept = trim(obj, self.node_name)
            if kept is not None:
                mine[key] = kept
        with self._lock:
            old = self._mine
            # (an object unchanged keeps the one held: the rules made of it stay as they are)
            for key, obj in mine.items():
                was = old.get(key)
                if was is not None and was == obj:
                    mine[key] = was
                else:
                    self._changed.add(key)
            self._changed.update(key for key in old if key not in mine)
            changed = mine != old
            self._keys, self._mine = keys, mine
            if changed:
                self.version += 1
        return changed

    def upsert(self, obj: Any) -> bool:
        """ADDED or MODIFIED; True when the CRs naming us changed."""
        key = key_of(obj)
        if key is None:
            return False
        with self._lock:
            self._keys[key] = resource_version(obj)
            new = trim(obj, self.node_name)
            if new is not None:
                if self._mine.get(key) == new:
                    return False
                self._mine[key] = new
            elif self._mine.pop(key, None) is None:
                return False
            self._changed.add(key)
            self.version += 1
            return True

    def delete(self, obj: Any) -> bool:
        key = key_of(obj)
        if key is None:
            return False
        with self._lock:
            self._keys.pop(key, None)
            if self._mine.pop(key, None) is None:
                return False
            self._changed.add(key)
            self.version += 1
            return True

    @property
    def seen(self) -> int:
        return len(self._keys)

    def mine(self) -> Tuple[int, List[Dict[str, Any]]]:
        """``(version, the CRs naming this node in namespace/name order)``."""
        with self._lock:
            return self.version, [self._mine[k] for k in sorted(self._mine)]

    def changes(self) -> Tuple[int, Dict[Key, Optional[Dict[str, Any]]]]:
        """``(version, {key: the CR now, or None when it no longer names this node})`` of
        the CRs naming this node that changed since the last call (the first call: all)."""
        with self._lock:
            changed, self._changed = self._changed, set()
            return self.version, {k: self._mine.get(k) for k in changed}


@dataclass
class CrRules:
    """What one CR means for this node: its rules, the entries dropped because the machine
    lacks what they name (``problems``), the parts refused by the node's trust
    (``refusals``), or why it was skipped as a whole (``error``: malformed, or ``refused``
    over a bound or a cap). ``entries``, ``patterns``: what it has for this node, as the
    caps count (``node_caps.py``)."""

    key: Key
    generation: int
    uid: str
    rules: List[PinRule] = field(default_factory=list)
    problems: List[str] = field(default_factory=list)
    error: str = ""
    refusals: List[str] = field(default_factory=list)
    refused: bool = False
    entries: int = 1
    patterns: int = 0
    trusted: bool = True    # of a namespace the node trusts (what its status and events may tell)

    @property
    def ref(self) -> str:
        return f"{self.key[0]}/{self.key[1]}"


class RuleBook:
    """Turns the CRs naming this node into rules (:meth:`parse` one CR; :meth:`rules_of`
    a whole list, parsing again only the CRs that changed); CRs of the ``trusted``
    namespaces may do everything a rule file may (``policies/numa/oenuma_cr.py``)."""

    def __init__(self, node_name: str, topology: NumaTopology, trusted: Iterable[str] = ()) -> None:
        self.node_name = node_name
        self.topology = topology
        self.trusted = frozenset(trusted)
        self._parsed: Dict[Key, Tuple[Dict[str, Any], CrRules]] = {}

    def rules_of(self, objects: List[Dict[str, Any]]) -> List[CrRules]:
        out = []
        parsed: Dict[Key, Tuple[Dict[str, Any], CrRules]] = {}
        for obj in objects:
            key = key_of(obj)
            if key is None:
                continue
            known = self._parsed.get(key)
            # (OenumaSet replaces a CR's object only when it changed: an unchanged CR is the
            # same object, and a pass over a thousand CRs costs no comparison of their specs)
            same = known is not None and (known[0] is obj or known[0] == obj)
            cr = known[1] if known is not None and same else self.parse(key, obj)
            parsed[key] = (obj, cr)
            out.append(cr)
        self._parsed = parsed
        return out

    def parse(self, key: Key, obj: Dict[str, Any]) -> CrRules:
        meta = obj.get("metadata") or {}
        generation = meta.get("generation")
        cr = CrRules(key=key, generation=generation if isinstance(generation, int) else 0,
                     uid=str(meta.get("uid") or "")[:64], trusted=key[0] in self.trusted)
        refused = obj.get("refused")
        if isinstance(refused, str):
            cr.error, cr.refused = f"refused, not parsed: {refused}", True
            return cr
        try:
            parsed = parse_cr(obj, f"apiserver {cr.ref}", self.node_name, self.topology, cr.trusted)
        except RuleFileError as e:
            cr.error = " ".join(str(e).split())[:400]
            return cr
        except Exception as e:  # noqa: BLE001 - whatever a CR makes the parser do is that CR's alone
            # (issue 33, H2: a MemoryError here once broke the pass for every CR after it)
            log.error("Oenuma CR could not be parsed; skipped as malformed", cr=cr.ref, error_type=type(e).__name__,
                      error=str(e)[:300])
            cr.error = f"could not be parsed ({type(e).__name__})"
            return cr
        cr.rules, cr.problems, cr.refusals = parsed.rules, parsed.problems, parsed.refusals
        cr.entries, cr.patterns = parsed.entries, parsed.patterns
        return cr


class RulesFile:
    """``<state_dir>/cluster-oenumas.json``: the CRs whose rules were in force, last seen."""

    def __init__(self, state_dir: str) -> None:
        self.path = os.path.join(state_dir, STATE_FILE)

    def save(self, node_name: str, objects: List[Dict[str, Any]]) -> None:
        # One CR at a time, the interpreter lock let go between two: at the node's caps the
        # file is megabytes, and json.dumps holds the lock for the whole of what it encodes
        # (the relay would wait for all of it).
        chunks = []
        for obj in objects:
            chunks.append(json.dumps(obj, separators=(",", ":")))
            time.sleep(0)
        head = json.dumps({"version": STATE_VERSION, "node_name": node_name, "saved_at": round(time.time(), 3)},
                          separators=(",", ":"))
        atomic_write_bytes(self.path, (head[:-1] + ',"objects":[' + ",".join(chunks) + "]}").encode("utf-8"))

    def load(self, node_name: str) -> Optional[List[Dict[str, Any]]]:
        """The CRs saved for ``node_name``; None when there is no usable file (absent,
        corrupt, another version or another node's)."""
        data = load_json_state(self.path, STATE_VERSION, _saved_objects, RULES_FILE_MAX_BYTES)
        if data is None or data[0] != node_name:   # another node's: this node has none saved
            return None
        return data[1]


def _saved_objects(data: Dict[str, Any]) -> Tuple[Any, List[Dict[str, Any]]]:
    """(node name, the CRs) of a rules file's content; ValueError when it is not one."""
    objects = data.get("objects")
    if not isinstance(objects, list):
        raise ValueError("objects: must be a list")
    return data.get("node_name"), [o for o in objects if isinstance(o, dict) and key_of(o) is not None]
