"""Issue 18 with the real kubelet: pods made with ``kubectl run`` go kubelet v1.26 ->
anolisnuma -> containerd while the daemon is restarted (SIGTERM from its socket
supervisor, systemd's part) and reloaded (SIGHUP) several times; the kubelet polls all the
while (PLEG relists every second, runtime status, pod syncs). Its log then holds no
runtime error and every pod runs."""

from __future__ import annotations

from typing import Any, Dict, Optional

import pytest

from anolisnuma.testing.daemon_probes import status_when_up, wait_until
from anolisnuma.testing.kubelet_node import KubeletNode
from anolisnuma.testing.proxy import read_log

pytestmark = pytest.mark.containerd

NS = "restarts"
RESTARTS = 4


def kubelet_back(node: KubeletNode) -> Optional[Dict[str, Any]]:
    """The new daemon's status once the kubelet's runtime and image clients both connected to it."""
    assert node.supervisor is not None and node.supervisor.proc is not None
    st = status_when_up(node.admin_socket)
    if st is None or st["pid"] != node.supervisor.proc.pid or st["relay"]["connections"] < 2:
        return None
    return st


def reloads_logged(node: KubeletNode) -> int:
    return sum(1 for r in read_log(node.daemon_log_path) if r.get("message") == "configuration reloaded")


def test_restarts_and_reloads_under_the_real_kubelet_leave_no_runtime_error(make_node):
    node = make_node()
    node.run_pod("steady-0", NS)
    node.run_pod("steady-1", NS)
    node.wait_running(NS, ["steady-0", "steady-1"])
    wait_until(lambda: kubelet_back(node), "the kubelet on the daemon", 30)
    mark = len(node.kubelet_log())
    names = ["steady-0", "steady-1"]
    for i in range(RESTARTS):
        # made now, so its RunPodSandbox/CreateContainer/StartContainer race the restart
        node.run_pod(f"during-{i}", NS)
        names.append(f"during-{i}")
        assert node.supervisor.restart() == 0
        wait_until(lambda: kubelet_back(node), f"the kubelet back after restart {i + 1}", 30)
        node.supervisor.reload()
        wait_until(lambda: reloads_logged(node) >= i + 1, f"reload {i + 1} logged", 30)
    pods = node.wait_running(NS, names)
    assert all(p["status"]["containerStatuses"][0]["restartCount"] == 0 for p in pods.values())
    errors = node.runtime_errors(mark)
    assert errors == [], "\n".join(errors)
    assert node.supervisor.exits == [0] * RESTARTS and node.supervisor.starts == RESTARTS + 1
    # a teardown through the last daemon: the kubelet's container deletor then asks for a
    # container its own pod removal already took, "ContainerStatus from runtime service
    # failed ... code = NotFound", just as straight on containerd (KubeletNode(via_daemon=False))
    mark = len(node.kubelet_log())
    node.delete_pod("steady-0", NS)
    errors = [line for line in node.runtime_errors(mark) if "code = NotFound" not in line
              and "DeleteContainer returned error" not in line]
    assert errors == [], "\n".join(errors)
    cut = [r for r in read_log(node.daemon_log_path) if "were cut" in str(r.get("message", ""))]
    assert cut == []
    assert node.running(NS, names[1:]) is not None
