"""docs/cluster.md's install and worked session run as written: its marked blocks
(``<!-- walkthrough: ROLE -->``, anolisnuma/testing/doc_walkthrough.py), in order, on an
empty private API server of their own and node worker-1
(anolisnuma/testing/walkthrough_node.py: a daemon in its own process, FakeCri with the
document's topology, a stand-in kubelet), each output the document shows compared with the
command's."""

from __future__ import annotations

import os
from typing import Any, Dict, Iterator

import pytest

from anolisnuma.testing import kube_apiserver
from anolisnuma.testing.doc_walkthrough import Step, as_shown, console_commands, steps
from anolisnuma.testing.kube_apiserver import PrivateControlPlane
from anolisnuma.testing.proxy import REPO_ROOT
from anolisnuma.testing.waiting import wait_until
from anolisnuma.testing.walkthrough_node import WalkthroughNode

DOC = os.path.join(REPO_ROOT, "docs", "cluster.md")
# a command whose output is not yet what the document shows is run again this long (the
# status of a CR, the link after a restart: a person typing sees them a moment later)
SETTLE_SECONDS = 30.0


def doc_steps() -> list:
    with open(DOC) as f:
        return steps(f.read())


@pytest.fixture
def empty_cluster() -> Iterator[PrivateControlPlane]:
    """The session starts from an empty cluster: not the one tests/cluster shares."""
    why = kube_apiserver.missing()
    if why is not None:
        pytest.skip(why)
    cp = PrivateControlPlane.start_new()
    try:
        yield cp
    finally:
        cp.close()


def run_step(node: WalkthroughNode, step: Step) -> None:
    text = node.substitute(step.text)
    where = f"docs/cluster.md line {step.line} ({step.role})"
    if step.kind == "toml":
        node.edit_config(text)
        return
    if step.kind == "sh":
        done = node.run(step.role, text)
        assert done.returncode == 0, f"{where}: exit {done.returncode}\n{done.stdout}{done.stderr}\n{node.logs()}"
        return
    for command in console_commands(text):
        last: Dict[str, Any] = {}

        def done_as_shown() -> bool:
            last["done"] = done = node.run(step.role, command.text)
            return as_shown(command, done.returncode, done.stdout)
        try:
            wait_until(done_as_shown, f"{where}: {command.text}", timeout=SETTLE_SECONDS, interval=0.5)
        except AssertionError:
            done = last["done"]
            raise AssertionError(f"{where}: `{command.text}` exit {done.returncode}\nshown:\n"
                                 + "\n".join(command.expected) + f"\nprinted:\n{done.stdout}{done.stderr}\n"
                                 + node.logs()) from None


def test_the_document_marks_an_install_and_a_session() -> None:
    found = doc_steps()
    roles = [s.role for s in found]
    assert {"admin", "node", "node-config"} == set(roles)
    assert roles.index("admin") < roles.index("node"), "the install starts on the admin's side"
    assert any("create serviceaccount" in s.text for s in found)   # (each node its own identity)


def test_the_install_and_the_worked_session_run_as_written(empty_cluster: PrivateControlPlane, tmp_path: Any,
                                                          sockdir: str) -> None:
    node = WalkthroughNode(empty_cluster, str(tmp_path), sockdir).start()
    try:
        for step in doc_steps():
            run_step(node, step)
        assert node.kubelet is not None and node.kubelet.ran, "the session ran no pod on worker-1"
    finally:
        problems = node.close()
    assert not problems, problems
