"""docs/operations.md's samples of ``anolisnuma-ctl`` are what it prints: the document's
marked blocks (``<!-- walkthrough: ROLE -->``, anolisnuma/testing/doc_walkthrough.py) run
in order against a daemon with the pods the document lists, each output compared with the
command's.

The node: the shipped config.toml with the document's keys set in it as a person edits it
(``config_edit.py``) and this test's paths and sockets; a fake containerd (``FakeCri``) and
fake kernel trees (Alibaba Cloud Linux's cgroup v1 files, two NUMA nodes of 4 CPUs, CPU 7
given by the kubelet's static CPU manager to one container), as the document says. Its
paths are shown as a node has them (``/etc/anolisnuma/config.toml``, ...). Read past, as
the document says: pids, times, durations, containerd's IDs, and in ``status`` the
``relay`` and ``threads`` lines (what this machine allows and runs) and the loop table's
columns after the state (counts of a running daemon's passes)."""

from __future__ import annotations

import os
import re
import shlex
import sys
from typing import Any, Iterator, List

import pytest
from conftest import Kubelet, Node

from anolisnuma.config import Config
from anolisnuma.testing import config_edit
from anolisnuma.testing.doc_walkthrough import Step, output_matches, steps
from anolisnuma.testing.fake_cri import FakeCri, pod_uid
from anolisnuma.testing.fake_sysfs import GIB, FakeTopology, write_cpu_manager_state
from anolisnuma.testing.proxy import REPO_ROOT, InProcessProxy, config_dict, to_toml

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DOC = os.path.join(REPO_ROOT, "docs", "operations.md")
TOPOLOGY = FakeTopology(name="2x4", node_cpus={0: "0-3", 1: "4-7"}, distances=[[10, 20], [20, 10]],
                        memory_bytes={0: 4 * GIB, 1: 4 * GIB})
# a running daemon's counts, and what its machine has (open files, native threads)
VOLATILE = [re.compile(p) for p in (r"^(?:relay|threads): .*", r"(?<= running ).*")]
# what the node's own settings are on a real node (shown so in the document)
AS_ON_A_NODE = {"admin_socket": "/var/run/anolisnuma/admin.sock", "listen": "/var/run/anolisnuma/anolisnuma.sock",
                "containerd": "/run/containerd/containerd.sock", "config": "/etc/anolisnuma/config.toml",
                "metrics": "http://127.0.0.1:9464/metrics"}


def uid(name: str) -> str:
    """A pod's UID, the same at every run (the document shows them)."""
    return pod_uid("docs/operations.md/" + name)


def doc_steps() -> List[Step]:
    with open(DOC) as f:
        return steps(f.read())


class DocNode:
    """The node the document shows: its configuration file made and edited, then the daemon."""

    def __init__(self, sockdir: str, fk: Any, base: str) -> None:
        self.fk = fk
        TOPOLOGY.write(fk.paths.sys_root)
        write_cpu_manager_state(fk.paths.kubelet_cpu_manager_state, policy="static", default_cpuset="0-6",
                                entries={uid("pinned"): {"app": "7"}})
        self.fake = FakeCri(os.path.join(sockdir, "containerd.sock"), containers=0, sandboxes=0).start()
        # this test's paths and sockets (the metrics on a port of its own), set again after
        # every edit of the document's
        self.own = config_dict(base, self.fake.socket_path, listen=os.path.join(sockdir, "cri.sock"), extra={
            "log": {"stderr": False}, "paths": fk.paths_table(),
            "admin": {"socket": os.path.join(sockdir, "admin.sock")}, "metrics": {"listen": "127.0.0.1:0"},
            "cgroups": {"kubelet_files_root": os.path.join(base, "no-kubelet-files")}})   # not this machine's
        del self.own["qos"], self.own["numa"]          # as shipped, but for the document's keys
        del self.own["log"]["level"]
        self.path = os.path.join(base, "config.toml")
        with open(os.path.join(REPO_ROOT, "config.toml")) as f:
            self._write(config_edit.edit(f.read(), to_toml(self.own)))
        self.node: Any = None

    def _write(self, text: str) -> None:
        with open(self.path, "w") as f:
            f.write(text)

    def edit_config(self, snippet: str) -> None:
        with open(self.path) as f:
            text = config_edit.edit(f.read(), snippet)
        self._write(config_edit.edit(text, to_toml(self.own)))

    def start(self) -> Node:
        proxy = InProcessProxy(Config.load(self.path)).start()
        proxy.wait_resynced()
        with open(self.path) as f:
            data = tomllib.loads(f.read())
        self.node = Node(proxy, Kubelet(proxy.address, self.fk), self.fk, self.fake, self.path, data,
                         self.own["admin"]["socket"])
        return self.node

    def close(self) -> None:
        if self.node is not None:
            self.node.kubelet.close()
            self.node.proxy.stop()
        self.fake.stop(0)


@pytest.fixture
def doc_node(sockdir: str, kernel: Any, tmp_path: Any) -> Iterator[DocNode]:
    made = DocNode(sockdir, kernel(), str(tmp_path))
    try:
        yield made
    finally:
        made.close()


def run_the_documents_pods(node: Node) -> None:
    """The pods docs/operations.md lists, made as the kubelet makes them."""
    k = node.kubelet
    k.run_started("web-0", uid=uid("web-0"), annotations={"anolisbox.sh/qoslevel": "BE"})
    k.run_started("web-1", uid=uid("web-1"), kube_class="besteffort", containers=("app", "sidecar"))
    k.run_started("db-0", namespace="default", uid=uid("db-0"), labels={"koordinator.sh/qosClass": "LSR"})
    k.run_started("pinned", uid=uid("pinned"), kube_class="guaranteed", cpuset="7")
    k.run_started("agent", uid=uid("agent"), annotations={"anolisnuma.io/skip": "true"})
    k.run_started("outside", namespace="default", uid=uid("outside"), cgroup_parent="/system.slice/outside.scope")


def as_on_a_node(node: Node, text: str) -> str:
    """The command's output with this test's paths as a node has them."""
    daemon = node.daemon
    swaps = {node.config_path: AS_ON_A_NODE["config"], node.admin_socket: AS_ON_A_NODE["admin_socket"],
             daemon.config.server.listen: AS_ON_A_NODE["listen"], node.fake.socket_path: AS_ON_A_NODE["containerd"],
             daemon.admin.metrics.url: AS_ON_A_NODE["metrics"]}
    defaults = {"cgroup_root": "/sys/fs/cgroup", "resctrl_root": "/sys/fs/resctrl", "sys_root": "/sys",
                "proc_root": "/proc", "kubelet_cpu_manager_state": "/var/lib/kubelet/cpu_manager_state",
                "state_dir": "/var/lib/anolisnuma"}
    for key, value in node.kernel.paths_table().items():
        if key in defaults:
            swaps[value] = defaults[key]
    for ours in sorted(swaps, key=len, reverse=True):
        text = text.replace(ours, swaps[ours])
    return text


def ctl_args(command: str) -> List[str]:
    words = shlex.split(command)
    assert words and words[0] == "anolisnuma-ctl", f"the document's node runs anolisnuma-ctl only: {command!r}"
    return words[1:]


def test_the_document_marks_its_configuration_and_samples() -> None:
    found = doc_steps()
    assert found and found[0].role == "node-config", "the node's configuration comes first"
    commands = [c.text for s in found if s.kind == "console" for c in s.commands()]
    for sample in ("status", "pods", "numa", "explain batch/web-1", "reload"):
        assert f"anolisnuma-ctl {sample}" in commands, sample


def test_the_samples_are_what_anolisnuma_ctl_prints(doc_node: DocNode) -> None:
    found = doc_steps()
    first = next(i for i, s in enumerate(found) if s.role != "node-config")
    for step in found[:first]:
        doc_node.edit_config(step.text)
    node = doc_node.start()
    run_the_documents_pods(node)
    for step in found[first:]:
        where = f"docs/operations.md line {step.line}"
        if step.role == "node-config":
            doc_node.edit_config(step.text)
            continue
        assert step.role == "node" and step.kind == "console", where
        for command in step.commands():
            code, out, err = node.ctl(*ctl_args(command.text))
            printed = as_on_a_node(node, out)
            assert code == 0 and output_matches(command.expected, printed, VOLATILE), (
                f"{where}: `{command.text}` exit {code}\nshown:\n" + "\n".join(command.expected)
                + f"\nprinted:\n{printed}{err}")
