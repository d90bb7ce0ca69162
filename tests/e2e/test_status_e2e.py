"""``anolisnuma-ctl status``/``pods``/``explain`` of a daemon process in front of the real
containerd say what is so: on this kernel (no Anolis knob) a QoS level is decided and
nothing is written, and explain says that; a sandbox stopped through the proxy is shown
stopped; while the private containerd is stopped the daemon is ``degraded`` (and why),
its resync retries back off, and it is ``ready`` again once containerd is back and a resync
worked. The CLI runs as its own process."""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import List

from cri_client import KubeletLike, SLEEP_FOREVER
from test_ctl_e2e import ctl, ctl_json

from anolisnuma.testing.proxy import SubprocessProxy, config_dict, read_log
from anolisnuma.testing.waiting import wait_until


def test_status_degraded_while_containerd_is_stopped_then_ready(containerd, tmp_path):
    run = tempfile.mkdtemp(prefix="an-st-", dir="/tmp")   # unix socket paths stay short
    admin = os.path.join(run, "admin.sock")
    data = config_dict(str(tmp_path), containerd.socket, listen=os.path.join(run, "cri.sock"),
                       extra={"admin": {"socket": admin}, "log": {"stderr": False},
                              "runtime": {"resync_interval_seconds": 1.0},
                              "paths": {"cgroup_root": "/sys/fs/cgroup"},
                              "qos": {"enabled": True, "reconcile_interval_seconds": 0,
                                      "resctrl": {"enabled": False}}})
    proxy = SubprocessProxy(data, str(tmp_path)).start()
    kl = None
    errors: List[str] = []
    stopped = False
    try:
        wait_until(lambda: os.path.exists(admin) and ctl_json(admin, "status")["state"] == "ready",
                   "the daemon to be ready", 15)
        status = ctl_json(admin, "status")
        assert status["degraded_because"] == [] and status["knobs"]["supported"] == []
        code, out, _ = ctl(admin, "status")
        assert "kernel knobs:       none: QoS decides levels but this kernel has no knob to write" in out

        kl = KubeletLike(proxy.socket_path, harness=containerd)
        pod = kl.run_pod(name="honest", namespace="status-e2e", qos="besteffort")
        kl.run_container(pod, "sleeper", command=SLEEP_FOREVER)
        [e] = ctl_json(admin, "explain", "status-e2e/honest")
        assert e["qos"]["level"] == "BE" and e["qos"]["knobs"]["set"] == []
        assert "memory.priority" in e["qos"]["knobs"]["unsupported"]
        decision = e["calls"][0]["decisions"]["qos"]
        assert decision.startswith("BE: nothing written (not on this kernel: cpu.bvt_warp_ns, ")
        code, out, _ = ctl(admin, "explain", "status-e2e/honest")
        head = {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in out.split("\n\n")[0].splitlines())}
        assert head["hooks"].startswith("run for this pod") and "applied" not in out
        assert "; nothing written; not on this kernel: cpu.bvt_warp_ns" in out

        # a sandbox stopped through the proxy is shown stopped
        kl.stop_pod(pod)
        [row] = [p for p in ctl_json(admin, "pods") if p["namespace"] == "status-e2e"]
        assert row["state"] == "stopped" and row["qos"]["why"].startswith("sandbox stopped")

        containerd.stop()
        stopped = True
        st = wait_until(lambda: (lambda s: s if len(s["degraded_because"]) == 2 else None)(ctl_json(admin, "status")),
                        "the resync to fail as well", 30)
        assert st["state"] == "degraded"
        assert st["degraded_because"][0].startswith(f"containerd does not answer at {containerd.socket}")
        assert st["degraded_because"][1].startswith("cannot list containerd: ")
        wait_until(lambda: ctl_json(admin, "status")["controllers"]["runtime-resync"]["consecutive_failures"] >= 2,
                   "a second failed resync", 30)
        code, out, _ = ctl(admin, "status")
        assert code == 0 and 'DEGRADED (see "degraded because")' in out.splitlines()[0]

        containerd.start()
        stopped = False
        st = wait_until(lambda: (lambda s: s if s["state"] == "ready" else None)(ctl_json(admin, "status")),
                        "ready again", 30)
        assert st["degraded_because"] == [] and st["controllers"]["runtime-resync"]["consecutive_failures"] == 0
        # the stopped sandbox is still stopped after containerd's restart (the resync says so)
        [row] = [p for p in ctl_json(admin, "pods") if p["namespace"] == "status-e2e"]
        assert row["state"] == "stopped"
    finally:
        if stopped:
            containerd.start()
        if kl is not None:
            errors = kl.cleanup()
            kl.close()
        proxy.stop()
        shutil.rmtree(run, ignore_errors=True)
    assert not errors, errors
    log = read_log(data["log"]["file"])
    assert [x for x in log if x.get("message") == "containerd listed again"]   # the periodic resync recovered
