"""``anolisnuma-ctl`` and the metrics endpoint of a daemon process in front of the real
containerd, during a real pod lifecycle (busybox), the CLI run as its own process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from typing import Any, List, Tuple

from cri_client import KubeletLike, SLEEP_FOREVER
from prometheus_client.parser import text_string_to_metric_families

from anolisnuma.testing.proxy import REPO_ROOT, SubprocessProxy, config_dict
from anolisnuma.testing.waiting import wait_until


def ctl(admin: str, *args: str) -> Tuple[int, str, str]:
    env = dict(os.environ, PYTHONPATH=REPO_ROOT)
    p = subprocess.run([sys.executable, "-m", "anolisnuma.ctl.main", "--admin-socket", admin] + list(args),
                       capture_output=True, text=True, timeout=60, env=env)
    return p.returncode, p.stdout, p.stderr


def ctl_json(admin: str, *args: str) -> Any:
    code, out, err = ctl(admin, "-o", "json", *args)
    assert code == 0, err
    return json.loads(out)


def metric(url: str, name: str, **labels: str) -> float:
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


def test_ctl_and_metrics_during_a_real_pod_lifecycle(containerd, tmp_path):
    run = tempfile.mkdtemp(prefix="an-ctl-", dir="/tmp")   # unix socket paths stay short
    admin = os.path.join(run, "admin.sock")
    data = config_dict(str(tmp_path), containerd.socket, listen=os.path.join(run, "cri.sock"),
                       extra={"admin": {"socket": admin}, "metrics": {"listen": "127.0.0.1:0"},
                              "log": {"stderr": False}})
    proxy = SubprocessProxy(data, str(tmp_path)).start()
    kl = None
    errors: List[str] = []
    try:
        wait_until(lambda: os.path.exists(admin) and ctl_json(admin, "status")["ready"], "the daemon to be ready", 15)
        status = ctl_json(admin, "status")
        assert status["containerd"]["reachable"] is True
        assert status["containerd"]["runtime"].startswith("containerd ")
        assert status["config"] == proxy.config_path
        url = status["metrics_url"]
        assert url.startswith("http://127.0.0.1:")

        kl = KubeletLike(proxy.socket_path, harness=containerd)
        pod = kl.run_pod(name="ctl-e2e", namespace="ctl-e2e")
        cid = kl.run_container(pod, "sleeper", command=SLEEP_FOREVER)
        wait_until(lambda: metric(url, "anolisnuma_intercepted_calls_total", method="StartContainer", code="OK") == 1,
                   "StartContainer to be counted")
        assert metric(url, "anolisnuma_intercepted_calls_total", method="RunPodSandbox", code="OK") == 1
        assert metric(url, "anolisnuma_intercepted_call_duration_seconds_count", method="CreateContainer",
                      code="OK") == 1

        [row] = [p for p in ctl_json(admin, "pods") if p["namespace"] == "ctl-e2e"]
        assert (row["name"], row["uid"], row["sandbox_id"], row["containers"]) == ("ctl-e2e", pod.uid, pod.id,
                                                                                   ["sleeper"])
        [e] = ctl_json(admin, "explain", "ctl-e2e/ctl-e2e")
        assert [(c["method"], c["status"]) for c in e["calls"]] == [
            ("RunPodSandbox", "OK"), ("CreateContainer", "OK"), ("StartContainer", "OK")]
        assert e["pod"]["containers"][0]["id"] == cid
        code, out, err = ctl(admin, "explain", pod.uid)
        assert code == 0 and "StartContainer" in out and "sleeper" in out, err

        kl.cleanup()
        wait_until(lambda: all(p["namespace"] != "ctl-e2e" for p in ctl_json(admin, "pods")), "the pod to be gone")
        code, _, err = ctl(admin, "explain", "ctl-e2e/ctl-e2e")
        assert code == 1 and "is known" in err

        assert ctl_json(admin, "reload")["needs_restart"] == []
    finally:
        if kl is not None:
            errors = kl.cleanup()
            kl.close()
        proxy.stop()
        shutil.rmtree(run, ignore_errors=True)
    assert not errors, errors
    code, _, err = ctl(admin, "status")
    assert code == 1 and "the daemon is not running" in err
