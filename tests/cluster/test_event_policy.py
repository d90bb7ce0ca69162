"""The reasons and actions of the daemon's events, where they are worded, listed in
events.py, and allowed by the node policy are the same three lists; a note is cut to the
bytes the API server takes. (No API server: test_event_policy_live.py sends them to it.)"""

from __future__ import annotations

import ast
import os
import re
from typing import Dict, List, Optional, Set, Tuple

import yaml

from anolisnuma.cluster import events
from anolisnuma.testing.proxy import REPO_ROOT

PACKAGE = os.path.join(REPO_ROOT, "anolisnuma")
CONTROLLERS = {"REPORTING_CONTROLLER": events.REPORTING_CONTROLLER, "QOS_CONTROLLER": events.QOS_CONTROLLER}


def worded() -> Tuple[Set[Tuple[str, str, str]], List[str]]:
    """(controller, reason, action) of every event the package words: each ``Event(...)``
    call with a literal reason and action, and each ``(type, reason, action, note)`` of
    pod_events' ``_qos`` (the QoS component's); and the calls whose reason is not a
    literal but those (where they are)."""
    found: Set[Tuple[str, str, str]] = set()
    other: List[str] = []
    for root, _, files in os.walk(PACKAGE):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(root, name)
            with open(path) as f:
                tree = ast.parse(f.read())
            for fn in ast.walk(tree):
                if isinstance(fn, ast.FunctionDef) and fn.name == "_qos" and name == "pod_events.py":
                    for t in ast.walk(fn):
                        if isinstance(t, ast.Tuple) and len(t.elts) == 4 and isinstance(t.elts[1], ast.Constant):
                            found.add((events.QOS_CONTROLLER, t.elts[1].value, t.elts[2].value))
            for call in ast.walk(tree):
                if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "Event"):
                    continue
                reason, action, controller = (argument(call, i, k) for i, k in ((2, "reason"), (3, "action"),
                                                                                  (5, "controller")))
                if reason is None and call.keywords and not call.args:   # (lightkube's Event, kube_client.py)
                    continue
                if not (isinstance(reason, ast.Constant) and isinstance(action, ast.Constant)):
                    other.append(f"{os.path.relpath(path, REPO_ROOT)}:{call.lineno}")
                    continue
                found.add((CONTROLLERS[controller.id] if controller is not None else events.REPORTING_CONTROLLER,
                           reason.value, action.value))
    return found, other


def argument(call: ast.Call, position: int, keyword: str) -> Optional[ast.expr]:
    """A call's argument given by position or by keyword; None when not given."""
    if len(call.args) > position:
        return call.args[position]
    return next((k.value for k in call.keywords if k.arg == keyword), None)


def node_events_policy(name: str) -> str:
    with open(os.path.join(REPO_ROOT, "deploy", name)) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    policy = next(d for d in docs if d["metadata"]["name"] == "anolisnuma-node-events" and "validations" in d["spec"])
    return "\n".join(v["expression"] for v in policy["spec"]["validations"])


def listed(expression: str, before: str) -> List[str]:
    """The CEL list of strings that follows ``before`` in the expression."""
    m = re.search(re.escape(before) + r"\s*\[([^\]]*)\]", expression)
    assert m, before
    return re.findall(r"'([^']*)'", m.group(1))


def test_every_reason_and_action_the_daemon_words_is_listed_and_every_listed_one_is_worded() -> None:
    found, other = worded()
    # (pod_event's QoS events take their reason from _qos, read above: the one call whose
    # reason is not written where it is made; its line moves as the file changes)
    assert [site.rsplit(":", 1)[0] for site in other] == ["anolisnuma/cluster/pod_events.py"], other
    by_controller: Dict[str, Set[str]] = {}
    for controller, reason, _ in found:
        by_controller.setdefault(controller, set()).add(reason)
    assert by_controller == {c: set(r) for c, r in events.REASONS.items()}
    assert {action for _, _, action in found} == set(events.ACTIONS)


def test_the_node_policy_allows_exactly_those_reasons_and_actions() -> None:
    for name in ("node-policy-v1alpha1.yaml", "node-policy.yaml"):
        expression = node_events_policy(name)
        assert listed(expression, "object.action in") == list(events.ACTIONS)
        for controller, reasons in events.REASONS.items():
            assert listed(expression, f"object.reportingController == '{controller}' && object.reason in") == \
                list(reasons), (name, controller)
        assert "object.note.startsWith(request.userInfo.username.substring(39) + ': ')" in expression


def test_a_note_is_cut_to_the_bytes_the_api_server_takes_at_a_characters_boundary() -> None:
    ascii_note, wide = "n1: " + "x" * 2000, "n1: " + "é" * 2000
    assert events.clip_note(ascii_note) == ascii_note[:events.MAX_NOTE_BYTES]
    cut = events.clip_note(wide)
    assert cut.startswith("n1: é") and set(cut[4:]) == {"é"}
    assert events.MAX_NOTE_BYTES - 1 <= len(cut.encode()) <= events.MAX_NOTE_BYTES
    assert events.clip_note("n1: short") == "n1: short"
