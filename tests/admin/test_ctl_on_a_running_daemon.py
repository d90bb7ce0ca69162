"""``anolisnuma-ctl`` against a running daemon during pod lifecycles: status, pods, numa,
explain (tables and JSON), reload with a good and a bad configuration, and the admin
socket's own hygiene in the daemon."""

from __future__ import annotations

import json
import os
import stat

from conftest import EXCLUSIVE_POD_UID, Node

from anolisnuma.logsetup import flush as flush_logs
from anolisnuma.testing.proxy import read_log
from anolisnuma.testing.waiting import wait_until


def rows_of(table: str):
    """The rows of a rendered table as lists of cells (split on 2+ blanks)."""
    import re

    return [re.split(r"\s{2,}", line.strip()) for line in table.strip().splitlines()]


def busy_node(node: Node):
    """A node with the cases `pods` must tell apart: levels from an annotation, a label and
    the kube class; NUMA balance, kubelet-exclusive, unmanaged, opted out, outside kubepods."""
    k = node.kubelet
    return {
        "web-0": k.run_started("web-0", annotations={"anolisbox.sh/qoslevel": "BE"}),
        "web-1": k.run_started("web-1", kube_class="besteffort", containers=("app", "sidecar")),
        "db-0": k.run_started("db-0", namespace="default", labels={"koordinator.sh/qosClass": "LSR"}),
        "pinned": k.run_started("pinned", uid=EXCLUSIVE_POD_UID, kube_class="guaranteed", cpuset="7"),
        "agent": k.run_started("agent", annotations={"anolisnuma.io/skip": "true"}),
        "outside": k.run_started("outside", namespace="default", cgroup_parent="/system.slice/outside.scope"),
    }


def test_the_admin_socket_is_root_only_and_gone_after_shutdown(node):
    st = os.stat(node.admin_socket)
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert st.st_uid == os.geteuid()   # root, as the daemon runs
    node.proxy.stop()
    assert not os.path.exists(node.admin_socket)
    code, out, err = node.ctl("status")
    assert code == 1 and out == ""
    assert err == f"anolisnuma-ctl: the daemon is not running: there is no admin socket {node.admin_socket}\n"


def test_status_says_what_runs_and_how_it_goes(node):
    pods = busy_node(node)
    s = node.ctl_json("status")
    assert s["ready"] is True and s["resynced"] is True
    assert s["config"] == node.config_path
    assert s["containerd"]["reachable"] is True and s["containerd"]["runtime"] == "fake-cri 1.0.0"
    assert s["admin_socket"] == node.admin_socket
    assert s["metrics_url"] == node.metrics_url
    # the fake kernel has the Anolis cgroup files, no resctrl and no kernel.sched_core
    assert "cpu.bvt_warp_ns" in s["knobs"]["supported"]
    assert set(s["knobs"]["unsupported"]) == {"kernel.sched_core", "resctrl.L3", "resctrl.MB"}
    hooks = {h["name"]: h for h in s["hooks"]}
    assert set(hooks) == {"numa", "qos"}
    # every RunPodSandbox and StartContainer has a QoS pre-hook (the opted-out pod none)
    started = sum(len(p.containers) for name, p in pods.items() if name != "agent")
    assert hooks["qos"]["pre_ok"] == 5 + started and hooks["qos"]["pre_failed"] == 0
    assert s["relay"]["connections"] == 1
    assert s["relay"]["buffer_bytes"] == 0 < s["relay"]["buffer_peak_bytes"]
    assert s["relay"]["buffer_limit_bytes"] == 64 << 20
    # every background loop, registered in one place, with its own counts
    loops = s["controllers"]
    assert set(loops) == {"store-writer", "numa-writer", "numa-watch", "numa-repin", "numa-affinity",
                          "numa-respread", "qos-reconcile", "runtime-resync"}
    assert all(v["running"] and v["errors"] == 0 for v in loops.values()), loops
    assert loops["store-writer"]["interval_seconds"] == 0
    # (the store's writer writes the changes of half a second at once: its first run may come later)
    loops = wait_until(lambda: (lambda c: c if c["numa-affinity"]["samples"] >= 2 and c["numa-watch"]["runs"] >= 1
                                and c["store-writer"]["runs"] >= 1
                                else None)(node.ctl_json("status")["controllers"]), "the affinity loop to sample")
    assert loops["numa-affinity"]["moves"] == 0 and loops["numa-repin"]["applied"] == 0

    code, out, err = node.ctl("status")
    assert code == 0, err
    assert "containerd:         reachable: fake-cri 1.0.0, CRI v1" in out
    assert rows_of(out.split("\n\n")[1])[0] == ["HOOK", "POLICY", "BUDGET", "PRE OK", "PRE FAILED", "POST OK",
                                                 "POST FAILED"]
    assert ["kernel.sched_core", f"{node.kernel.paths.proc_root}/sys/kernel/sched_core does not exist"] in \
        rows_of(out.split("\n\n")[2])
    loop_rows = rows_of(out.split("\n\n")[3])
    assert loop_rows[0] == ["LOOP", "STATE", "EVERY", "RUNS", "ERRORS", "LAST PASS", "COUNTS"]
    affinity = next(r for r in loop_rows if r[0] == "numa-affinity")
    assert affinity[1:3] == ["running", "0.1s"] and any(c.startswith("samples=") for c in affinity)

    node.fake.stop(0)   # containerd goes away: status says so, at once
    s = node.ctl_json("status")
    assert s["containerd"]["reachable"] is False and s["containerd"]["error"].startswith("UNAVAILABLE")
    code, out, _ = node.ctl("status")
    assert code == 0 and "containerd:         UNREACHABLE: UNAVAILABLE" in out


def test_status_counts_what_is_kept_per_pod_and_all_of_it_goes_with_the_pods(node):
    pods = busy_node(node)
    kept = node.ctl_json("status")["structures"]
    assert set(kept) == {"store", "recent_calls", "pod_locks", "journal", "numa", "numa-affinity", "numa-respread",
                         "qos"}
    assert kept["store"] == {"pods": 6, "containers": 7}
    assert kept["journal"]["pods"] == 6 and kept["pod_locks"]["pods"] == 5   # the opted-out pod runs no hook
    assert kept["qos"]["pods"] == 4 and kept["numa"]["allocations"] >= 1
    code, out, _ = node.ctl("status")
    rows = rows_of(out.split("\n\n")[-1])
    assert rows[0] == ["KEPT PER POD BY", "SIZES"] and ["store", "pods 6, containers 7"] in rows

    for pod in pods.values():
        node.kubelet.remove(pod)
    resync = node.daemon.controllers.get("runtime-resync")
    resync.step()   # the windows of what calls named turn twice: nothing is left
    resync.step()
    kept = wait_until(lambda: (lambda k: k if all(n == 0 for sizes in k.values() for n in sizes.values()) else None)(
        node.ctl_json("status")["structures"]), "every structure to be empty")
    assert kept["store"] == {"pods": 0, "containers": 0}


def test_pods_shows_each_level_and_placement_and_where_it_came_from(node):
    pods = busy_node(node)
    rows = {(p["namespace"], p["name"]): p for p in node.ctl_json("pods")}
    assert len(rows) == 6
    web0 = rows[("batch", "web-0")]
    assert web0["qos"]["level"] == "BE" and web0["qos"]["source"] == "annotation"
    assert web0["qos"]["why"] == "annotation anolisbox.sh/qoslevel=BE"
    assert web0["numa"]["placed"] and web0["numa"]["why"] == "balance (namespace)"
    web1 = rows[("batch", "web-1")]
    assert web1["containers"] == ["app", "sidecar"]
    assert web1["qos"]["source"] == "kube_class" and web1["qos"]["level"] == "BE"
    assert {tuple(web0["numa"]["nodes"]), tuple(web1["numa"]["nodes"])} == {(0,), (1,)}   # balanced
    assert rows[("default", "db-0")]["qos"]["level"] == "LSR"
    assert rows[("default", "db-0")]["qos"]["why"] == "label koordinator.sh/qosClass=LSR"
    assert rows[("default", "db-0")]["numa"] == {"placed": False, "why": "unmanaged (not selected)"}
    pinned = rows[("batch", "pinned")]["numa"]
    assert not pinned["placed"] and pinned["kubelet_exclusive"] == {"app": "7"}
    assert pinned["why"] == "kubelet-exclusive CPUs (static CPU manager); left alone"
    agent = rows[("batch", "agent")]
    assert agent["opted_out"] == "anolisnuma.io/skip"
    assert agent["qos"]["why"] == agent["numa"]["why"] == "opted out (anolisnuma.io/skip)"
    outside = rows[("default", "outside")]
    fix = outside["qos"].pop("fix")
    assert outside["qos"] == {"level": None, "why": "skipped: cgroup_parent not recognized",
                              "detail": "cgroup_parent '/system.slice/outside.scope'"}
    assert fix.startswith("the layout is cgroup root /, driver cgroupfs/systemd") and "kubelet_cgroup_root" in fix

    code, out, err = node.ctl("pods")
    assert code == 0, err
    table = rows_of(out)
    assert table[0] == ["NAMESPACE", "NAME", "UID", "CTRS", "QOS", "QOS FROM", "NODES", "CPUS", "MEMS", "NUMA WHY"]
    by_name = {r[1]: r for r in table[1:]}
    assert by_name["web-0"][:6] == ["batch", "web-0", pods["web-0"].uid[:8], "1", "BE", "annotation"]
    assert by_name["web-0"][9] == "balance (namespace)"
    assert by_name["db-0"][4:6] == ["LSR", "label"]
    assert by_name["outside"][4:6] == ["-", "skipped: cgroup_parent not recognized"]
    assert [r[1] for r in table[1:]] == ["agent", "pinned", "web-0", "web-1", "db-0", "outside"]  # by namespace, name


def test_numa_shows_each_node_and_the_kubelets_exclusive_cpus(node):
    busy_node(node)
    n = node.ctl_json("numa")
    assert n["kubelet_policy"] == "static" and n["shared_pool"] == "0-6"
    assert n["kubelet_exclusive"] == [{"pod_uid": EXCLUSIVE_POD_UID, "pod": "batch/pinned", "container": "app",
                                       "cpus": "7"}]
    nodes = {x["node"]: x for x in n["nodes"]}
    assert nodes[0]["cpus"] == "0-3" and nodes[0]["shared_cpus"] == "0-3" and nodes[0]["kubelet_exclusive_cpus"] == ""
    assert nodes[1]["shared_cpus"] == "4-6" and nodes[1]["kubelet_exclusive_cpus"] == "7"
    assert sorted(nodes[0]["pods"] + nodes[1]["pods"]) == ["batch/web-0", "batch/web-1"]
    # web-0 asks 1 CPU; web-1 two containers of 1 CPU each
    assert sorted([nodes[0]["used_cpus"], nodes[1]["used_cpus"]]) == [1.0, 2.0]
    assert nodes[0]["free_cpus"] == 4 - nodes[0]["used_cpus"]
    assert nodes[1]["free_cpus"] == 3 - nodes[1]["used_cpus"]   # CPU 7 is the kubelet's

    code, out, err = node.ctl("numa")
    assert code == 0, err
    blocks = out.split("\n\n")
    assert "shared pool:             0-6" in blocks[0]
    header, *rows = rows_of(blocks[1])
    assert header == ["NODE", "CPUS", "TOTAL", "SHARED", "EXCLUSIVE", "USED", "FREE", "MEMORY", "PLACED MEM", "PODS"]
    assert rows[1][:5] == ["1", "4-7", "4", "4-6", "7"]
    assert rows_of(blocks[2]) == [["KUBELET-EXCLUSIVE POD", "CONTAINER", "CPUS"], ["batch/pinned", "app", "7"]]


def test_explain_tells_every_decision_with_what_was_behind_it(node):
    pods = busy_node(node)
    [e] = node.ctl_json("explain", "batch/web-1")
    assert e["pod"]["uid"] == pods["web-1"].uid
    assert e["qos"]["why"] == "kube QoS class besteffort maps to BE"
    assert e["numa"]["selection"] == "namespace"
    calls = [(c["method"], c["container"], c["status"]) for c in e["calls"]]
    assert calls == [("RunPodSandbox", None, "OK"), ("CreateContainer", "app", "OK"), ("StartContainer", "app", "OK"),
                     ("CreateContainer", "sidecar", "OK"), ("StartContainer", "sidecar", "OK")]
    assert e["calls"][0]["decisions"]["qos"] == ("BE: set cpu.bvt_warp_ns=-1, memory.priority=0, "
                                                 "memory.use_priority_oom=1, memory.wmark_min_adj=50, "
                                                 "memory.wmark_ratio=95, memory.wmark_scale_factor=20")
    assert e["qos"]["knobs"]["unsupported"] == [] and "cpu.bvt_warp_ns=-1" in e["qos"]["knobs"]["set"]
    assert e["calls"][0]["decisions"]["numa"] == "managed (namespace); placed at its first container"
    assert e["calls"][1]["decisions"]["numa"].startswith(f"placed on node {e['numa']['nodes'][0]} ")
    assert "(balance: most free capacity" in e["calls"][1]["decisions"]["numa"]
    assert e["calls"][3]["decisions"]["numa"].startswith("pod on node")   # the sidecar joins its pod

    # by UID, and by the first digits of the sandbox ID: the same pod
    assert node.ctl_json("explain", pods["web-1"].uid) == [e]
    assert node.ctl_json("explain", pods["web-1"].sandbox_id[:12]) == [e]

    [agent] = node.ctl_json("explain", "batch/agent")
    assert agent["opted_out"] == "anolisnuma.io/skip"
    assert agent["markings"] == {"annotation anolisnuma.io/skip": "true"}
    assert all(c["decisions"] == {} for c in agent["calls"])

    code, out, err = node.ctl("explain", "batch/web-0")
    assert code == 0, err
    head = dict(line.split(":", 1) for line in out.split("\n\n")[0].splitlines())
    assert head["qos"].strip() == ("BE (annotation anolisbox.sh/qoslevel=BE); set cpu.bvt_warp_ns=-1, "
                                   "memory.priority=0, memory.use_priority_oom=1, memory.wmark_min_adj=50, "
                                   "memory.wmark_ratio=95, memory.wmark_scale_factor=20")
    assert head["markings"].strip() == "annotation anolisbox.sh/qoslevel=BE"
    assert head["numa"].strip().startswith("node ") and head["numa"].strip().endswith(": balance (namespace)")
    calls = rows_of(out.split("\n\n")[-1])
    assert calls[0] == ["TIME", "CALL", "CONTAINER", "STATUS", "LATENCY", "DECISIONS"]
    assert [r[1] for r in calls[1:]] == ["RunPodSandbox", "CreateContainer", "StartContainer"]
    assert calls[2][5].startswith("numa: placed on node")

    code, out, err = node.ctl("explain", "default/outside")
    assert code == 0
    assert "qos:             not applied: skipped: cgroup_parent not recognized " \
           "(cgroup_parent '/system.slice/outside.scope')" in out

    code, out, err = node.ctl("explain", "batch/nobody")
    assert (code, out) == (1, "")
    assert err == ("anolisnuma-ctl: no pod 'batch/nobody' is known to anolisnuma (give namespace/name, "
                   "a pod UID or a sandbox ID)\n")


def test_a_removed_pod_leaves_nothing_behind_in_the_journal(node):
    pods = busy_node(node)
    journal = node.daemon.interceptor.journal
    node.settle()
    assert len(journal) == 6
    node.kubelet.remove(pods["web-0"])
    node.settle()
    assert len(journal) == 5
    assert journal.calls(pods["web-0"].uid) == []
    code, _, err = node.ctl("explain", "batch/web-0")
    assert code == 1 and "no pod 'batch/web-0'" in err
    assert ("batch", "web-0") not in {(p["namespace"], p["name"]) for p in node.ctl_json("pods")}


def test_reload_applies_a_good_configuration_and_refuses_a_bad_one(node):
    node.rewrite_config(log={"level": "debug"}, hooks={"budget_seconds": 3.0})
    r = node.ctl_json("reload")
    assert r == {"config": node.config_path, "applied": ["hooks.default.budget_seconds", "log.level"],
                 "needs_restart": []}
    assert node.daemon.config.log.level == "debug"
    assert {h["name"]: h["budget_seconds"] for h in node.ctl_json("status")["hooks"]} == {"numa": 3.0, "qos": 3.0}
    runs = node.ctl_json("status")["controllers"]["runtime-resync"]["runs"]
    node.rewrite_config(runtime={"resync_interval_seconds": 0.05})
    assert node.ctl_json("reload")["applied"] == ["runtime.resync_interval_seconds"]
    wait_until(lambda: node.ctl_json("status")["controllers"]["runtime-resync"]["runs"] >= runs + 2,
               "resync passes at the new interval")
    node.rewrite_config(runtime={"resync_interval_seconds": 60.0})
    assert node.ctl_json("reload")["applied"] == ["runtime.resync_interval_seconds"]

    node.rewrite_config(server={"listen": node.data["server"]["listen"] + ".new"}, metrics={"listen": ""})
    code, out, err = node.ctl("reload")
    assert code == 0, err
    assert "needs a restart:              metrics.listen, server.listen (the running values stay until then)" in out
    assert node.daemon.config.server.listen == node.data["server"]["listen"][:-4]

    with open(node.config_path, "a") as f:
        f.write("\n[qos.group_identity]\nvalues = { BE = -7 }\n")
    code, out, err = node.ctl("reload")
    assert (code, out) == (1, "")
    assert err.startswith("anolisnuma-ctl: reload refused, the running configuration stays: qos.group_identity.values.BE")
    assert node.daemon.config.log.level == "debug"   # still the last good one
    assert node.ctl_json("status")["ready"] is True


def test_a_pod_outside_kubepods_is_warned_about_once_not_at_every_call(node):
    """Once for the daemon (every pod of a node whose kubelet has another layout is refused
    alike), with the fix; the count is in status."""
    k = node.kubelet
    outside = k.run_started("outside", namespace="default", cgroup_parent="/system.slice/outside.scope",
                            containers=("a", "b", "c"))
    k.run_started("other", namespace="default", cgroup_parent="/system.slice/other.scope")
    k.remove(outside)
    k.run_started("outside", namespace="default", uid=outside.uid, cgroup_parent="/system.slice/outside.scope")
    flush_logs()
    lines = [x for x in read_log(node.proxy.log_file) if x.get("message") == "qos skipped: cgroup_parent not recognized"]
    assert [(x["pod"], x["level"]) for x in lines] == [("default/outside", "warning")]
    assert "kubelet_cgroup_root" in lines[0]["fix"]
    s = node.ctl_json("status")
    assert s["knobs"]["kubelet_cgroups"]["unknown_cgroup_parents"] >= 3 and s["state"] == "ready"
    assert s["warnings"] and "[cgroups] kubelet_cgroup_root" in s["warnings"][0]


def test_ctl_speaks_json_wherever_the_option_is_given(node):
    busy_node(node)
    a = node.ctl("-o", "json", "pods")
    b = node.ctl("pods", "-o", "json")
    assert a[0] == b[0] == 0
    assert json.loads(a[1]) == json.loads(b[1])


def test_what_a_pod_author_wrote_cannot_drive_the_operators_terminal(node):
    # retitle the window, erase the line above and write over it, a C1 CSI, a bidi override,
    # a carriage return (white space: folded into a blank like a newline)
    hostile = "LS\x1b]0;owned\x07\x1b[1A\x1b[2Kqos: LSE (forged)\x9b31m\u202eevil\rtail"
    k = node.kubelet
    pod = k.run_started("web-9", annotations={"anolisbox.sh/qoslevel": hostile, "anolisbox.sh/llc_limit": "\x1bc"})

    [e] = node.ctl_json("explain", "batch/web-9")   # JSON stays exact
    assert e["pod"]["uid"] == pod.uid
    assert e["markings"]["annotation anolisbox.sh/qoslevel"] == hostile
    for command in (["explain", "batch/web-9"], ["pods"], ["status"]):
        code, out, err = node.ctl(*command)
        assert code == 0, err
        shown = [c for c in out if c != "\n" and not c.isprintable()]
        assert shown == [], (command, shown)
    code, out, _ = node.ctl("explain", "batch/web-9")
    assert "LS\\x1b]0;owned\\x07\\x1b[1A\\x1b[2Kqos: LSE (forged)\\x9b31m\\u202eevil tail" in out
    assert "\\x1bc" in out
