"""What ``anolisnuma-ctl status`` says about the front-end: proxy mode, NRI registered, NRI
not registered (which degrades the daemon: pods are then created without the policies)."""

from __future__ import annotations

from anolisnuma.admin.views import health
from anolisnuma.ctl.render import status

BASE = {"ready": True, "resynced": True, "version": "x", "pid": 1, "uptime_seconds": 5,
        "containerd": {"reachable": True, "runtime": "containerd v2.2.7", "api_version": "v1", "latency_ms": 1,
                       "endpoint": "/run/containerd/containerd.sock"}}


def line(result: dict) -> str:
    text = status(dict(result, **health(result)))
    return next(ln for ln in text.splitlines() if ln.startswith("policies from"))


def test_proxy_mode():
    r = dict(BASE, front_end={"mode": "proxy"})
    assert "the kubelet's CRI calls through the listen socket" in line(r)
    assert health(r)["state"] == "ready"


def test_nri_registered():
    fe = {"mode": "nri", "socket": "/var/run/nri/nri.sock", "plugin": "50-anolisnuma", "connected": True,
          "runtime": "containerd v2.2.7", "request_timeout_ms": 2000, "hook_budget_ms": 800, "events": 12,
          "updates_sent": 3}
    r = dict(BASE, front_end=fe)
    text = line(r)
    assert "NRI plugin 50-anolisnuma on /var/run/nri/nri.sock: registered with containerd v2.2.7" in text
    assert "(request timeout 2000 ms, each hook's budget 800 ms)" in text
    assert "12 events, 3 live updates" in text and "relays every call unchanged" in text
    assert health(r)["state"] == "ready"


def test_nri_not_registered_degrades():
    fe = {"mode": "nri", "socket": "/var/run/nri/nri.sock", "plugin": "50-anolisnuma", "connected": False,
          "last_disconnect": "peer closed"}
    r = dict(BASE, front_end=fe)
    assert "NOT REGISTERED" in line(r) and "peer closed" in line(r)
    fe["retry_in_seconds"] = 4.12
    assert line(r).endswith("; tries again 4.12s after the last failure, or as soon as containerd makes its "
                            "socket again")
    h = health(r)
    assert h["state"] == "degraded" and any("not registered with containerd's NRI" in why for why in h["degraded_because"])
    # still starting (no resync yet): not degraded for that
    assert health(dict(r, resynced=False))["degraded_because"] == [
        "the start-up resync with containerd has not finished: the policies are not started yet"]


def test_the_hook_table_shows_the_budget_in_force_and_the_one_set():
    hooks = [{"name": "numa", "failure_policy": "ignore", "budget_seconds": 2.0, "effective_budget_seconds": 0.8,
              "pre_ok": 1, "pre_failed": 0, "post_ok": 1, "post_failed": 0},
             {"name": "qos", "failure_policy": "fail", "budget_seconds": 0.5, "effective_budget_seconds": 0.5,
              "pre_ok": 1, "pre_failed": 0, "post_ok": 1, "post_failed": 0}]
    r = dict(BASE, front_end={"mode": "nri", "connected": True}, hooks=hooks)
    text = status(dict(r, **health(r)))
    numa = next(ln for ln in text.splitlines() if ln.startswith("numa "))
    qos = next(ln for ln in text.splitlines() if ln.startswith("qos "))
    assert "0.8s (NRI; 2s set)" in numa and "0.5s " in qos and "set)" not in qos
