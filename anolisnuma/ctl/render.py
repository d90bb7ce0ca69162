"""The admin commands' results as text for a person (``-o json`` prints them as they are)."""

from __future__ import annotations

import time
from typing import Any, Dict, List

from anolisnuma.ctl.table import fields, lines, table

QOS_SOURCES = {"annotation": "annotation", "label": "label", "kube_class": "kube class", "default": "default",
               "kept": "kept offline"}


def human_bytes(n: Any) -> str:
    if not isinstance(n, (int, float)):
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)  # pragma: no cover


def human_duration(seconds: Any) -> str:
    if not isinstance(seconds, (int, float)):
        return "-"
    s = int(seconds)
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    if d:
        return f"{d}d{h}h{m:02d}m"
    if h:
        return f"{h}h{m:02d}m{s:02d}s"
    if m:
        return f"{m}m{s:02d}s"
    return f"{s}s"


def _plural(n: Any, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _threads(t: Dict[str, Any]) -> str:
    pools = ", ".join(f"{name} {p['threads']}/{p['size']}" for name, p in sorted((t.get("pools") or {}).items()))
    native = ", ".join(f"{name} {n}" for name, n in sorted((t.get("native") or {}).items()))
    parts = []
    if pools:
        parts.append(f"pools: {pools}")
    if native:   # grpc's C core: threads no Python object stands for
        parts.append(f"native: {native}")
    return f"{t.get('total', '-')}" + (f" ({'; '.join(parts)})" if parts else "")


def _counts(d: Dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(d.items()) if v) or "none"


# ---------------------------------------------------------------- status

def status(r: Dict[str, Any]) -> str:
    state = r.get("state") or ("ready" if r.get("ready") else "starting")
    if state == "starting":
        state = "starting (hooks not up yet)"
    elif state == "degraded":
        state = "DEGRADED (see \"degraded because\")"
    c = r.get("containerd") or {}
    if c.get("reachable"):
        containerd = f"reachable: {c.get('runtime')}, CRI {c.get('api_version')}, {c.get('latency_ms')} ms ({c.get('endpoint')})"
    else:
        containerd = f"UNREACHABLE: {c.get('error')} ({c.get('endpoint')})"
    relay = r.get("relay") or {}
    knobs = r.get("knobs")
    head = fields([
        ("anolisnuma", f"{r.get('version')}, pid {r.get('pid')}, up {human_duration(r.get('uptime_seconds'))}, {state}"),
        ("config", r.get("config")),
        ("listen", r.get("listen")),
        ("containerd", containerd),
        ("policies from", _front_end(r.get("front_end"))),
        ("admin socket", r.get("admin_socket")),
        ("metrics", _metrics(r)),
        ("relay", f"{_plural(relay.get('connections', 0), 'connection')} (cap {relay.get('max_connections', '?')}, "
                  f"open files {relay.get('open_files_limit', '?')}); buffers {human_bytes(relay.get('buffer_bytes'))} "
                  f"of {human_bytes(relay.get('buffer_limit_bytes'))} (peak {human_bytes(relay.get('buffer_peak_bytes'))}, "
                  f"{human_bytes(relay.get('buffer_per_connection_limit_bytes'))} per connection)"),
        ("relay events", _counts(relay.get("counters") or {})),
        ("pipeline events", _counts(r.get("pipeline") or {})),
        ("waiting for hooks", r.get("calls_waiting_for_hooks") or 0),
        ("threads", _threads(r.get("threads") or {})),
        ("kernel knobs", _knobs(knobs)),
        ("kernel family", _family(knobs)),
        ("kubelet cgroups", _layout((knobs or {}).get("kubelet_cgroups"))),
        ("api server", _cluster(r.get("cluster"))),
    ] + [("degraded because", why) for why in r.get("degraded_because") or []]
      + [("warning", w) for w in r.get("warnings") or []])
    blocks = [head]
    rules = (r.get("cluster") or {}).get("rules") or []
    if rules:
        blocks.append(table(["RULE FROM AN OENUMA CR (IN FORCE)"], [[rule] for rule in rules]))
    hooks = r.get("hooks") or []
    missing = [n for n in r.get("hooks_configured") or [] if n not in {h["name"] for h in hooks}]
    rows = [[h["name"], h["failure_policy"], _budget(h), h["pre_ok"], h["pre_failed"],
             h["post_ok"], h["post_failed"]] for h in hooks]
    rows += [[n, "-", "-", "-", "-", "-", "NOT RUNNING (see the log)" if r.get("ready") else "starting"]
             for n in missing]
    blocks.append(table(["HOOK", "POLICY", "BUDGET", "PRE OK", "PRE FAILED", "POST OK", "POST FAILED"], rows)
                  if rows else "hooks: none")
    if knobs is not None and knobs.get("unsupported"):
        blocks.append(table(["UNSUPPORTED KNOB", "WHY"], sorted(knobs["unsupported"].items())))
    loops = r.get("controllers") or {}
    if loops:
        basics = {"interval_seconds", "running", "runs", "errors", "last_error", "last_pass_ms"}
        rows = []
        for name, v in loops.items():
            interval = v.get("interval_seconds")
            rows.append([name, "running" if v.get("running") else "stopped",
                         f"{interval:g}s" if interval else "on change", v.get("runs"), v.get("errors"),
                         f"{v.get('last_pass_ms', 0):g} ms",
                         _counts({k: n for k, n in v.items() if k not in basics}) or "-"])
        blocks.append(table(["LOOP", "STATE", "EVERY", "RUNS", "ERRORS", "LAST PASS", "COUNTS"], rows))
        failing = [(name, v["last_error"]) for name, v in loops.items() if v.get("last_error")]
        if failing:
            blocks.append(table(["LOOP", "LAST ERROR"], failing))
    writes = _writes(knobs)
    if writes:
        blocks.append(table(["QOS WRITES ON THIS KERNEL", "FILES"], writes))
    structures = r.get("structures") or {}
    if structures:   # every size shown, zeros too: they say nothing outlived its pod
        blocks.append(table(["KEPT PER POD BY", "SIZES"],
                            [[holder, ", ".join(f"{k} {n}" for k, n in sizes.items()) or "-"]
                             for holder, sizes in structures.items()]))
    return lines(*blocks)


def _metrics(r: Dict[str, Any]) -> str:
    """Where the metrics are served, or why a configured endpoint is not."""
    if r.get("metrics_url"):
        return r["metrics_url"]
    asked = ((r.get("surfaces") or {}).get("metrics") or {})
    if asked.get("error"):
        return f"UNAVAILABLE on {asked.get('listen')}: {asked['error']} (the daemon runs on without it)"
    return "off"


def _knobs(knobs: Any) -> str:
    """Which QoS knobs this kernel has (those it lacks are listed below, with why)."""
    if knobs is None:
        return "none: the QoS hook is not running"
    have = knobs.get("supported") or []
    missing = len(knobs.get("unsupported") or {})
    text = ", ".join(have) if have else "none: QoS decides levels but this kernel has no knob to write"
    if missing:
        text += f" ({missing} not on this kernel, listed below)"
    return text + ("; dry run: nothing is written" if knobs.get("dry_run") else "")


def _family(knobs: Any) -> str:
    """The kernel families found, each with its files here; those not found, by name."""
    if knobs is None:
        return "-"
    families = knobs.get("families") or []
    found = [f"{f['title']} ({', '.join(f['files'])})" for f in families if f.get("found")]
    missing = [f["title"] for f in families if not f.get("found")]
    if not found:
        return ("none: neither " + " nor ".join(missing) + " files (a mainline kernel?): "
                "levels are decided and said, nothing is written")
    return "; ".join(found) + (f"; not found: {', '.join(missing)}" if missing else "")


def _writes(knobs: Any) -> List[List[str]]:
    """Rows of what is written where on this kernel: levels with the same writes share a
    row; then the class directories, the root cgroup, the host, and what is held back."""
    if not knobs:
        return []
    w = knobs.get("writes") or {}
    rows: List[List[str]] = []
    by_writes: Dict[str, List[str]] = {}
    for level, files in (w.get("levels") or {}).items():
        pod, ctr = files.get("pod") or [], files.get("container") or []
        if not pod and not ctr:
            continue
        text = f"pod: {', '.join(pod) or '-'}; containers: {', '.join(ctr) or '-'}"
        by_writes.setdefault(text, []).append(level)
    rows += [[f"level {', '.join(levels)}", text] for text, levels in by_writes.items()]
    rows += [[f"{cls} class dir", ", ".join(files)] for cls, files in (w.get("qos_class_dirs") or {}).items()]
    for where, key in (("root cgroup", "root_cgroup"), ("host (sysctl)", "host")):
        if w.get(key):
            rows.append([where, ", ".join(w[key])])
    rows += [[f"not written: {name}", why] for name, why in (knobs.get("held") or {}).items()]
    return rows


def _layout(layout: Any) -> str:
    if not layout:
        return "-"
    dirs = ", ".join(f"{d} {rel}" for d, rel in sorted((layout.get("kubepods") or {}).items()))
    return f"root {layout.get('root')} ({dirs}; from {layout.get('origin')})"


def _budget(h: Dict[str, Any]) -> str:
    """The budget in force, and the configured one when NRI mode cut it."""
    budget, effective = h["budget_seconds"], h.get("effective_budget_seconds", h["budget_seconds"])
    return f"{budget:g}s" if effective == budget else f"{effective:g}s (NRI; {budget:g}s set)"


def _front_end(f: Any) -> str:
    """One line: the kubelet's calls through this socket, or containerd's NRI events."""
    if not f or f.get("mode") != "nri":
        return "the kubelet's CRI calls through the listen socket (proxy mode)"
    where = f"NRI plugin {f.get('plugin')} on {f.get('socket')}"
    if not f.get("connected"):
        why = f"; last disconnect: {f['last_disconnect']}" if f.get("last_disconnect") else ""
        retry = (f"; tries again {f['retry_in_seconds']:g}s after the last failure, or as soon as containerd "
                 f"makes its socket again" if f.get("retry_in_seconds") else "")
        return f"{where}: NOT REGISTERED (pods are created without the policies until it is){why}{retry}"
    budget = f", each hook's budget {f['hook_budget_ms']} ms" if f.get("hook_budget_ms") else ""
    return (f"{where}: registered with {f.get('runtime') or 'the runtime'} (request timeout "
            f"{f.get('request_timeout_ms') or '?'} ms{budget}), {f.get('events', 0)} events, "
            f"{f.get('updates_sent', 0)} live updates; the listen socket relays every call unchanged")


def _cluster(c: Any) -> str:
    """One line: the API server connection, the last sync, the CRs seen and the rules."""
    if not c:
        return "off"
    since = c.get("last_sync")
    sync = f"last sync {human_duration(time.time() - since)} ago" if since else "never synced"
    text = (f"{c.get('state')} ({c.get('server')}), {sync}; {_plural(c.get('crs_seen', 0), 'CR')} seen, "
            f"{c.get('crs_naming_node', 0)} naming {c.get('node_name')}, {_plural(len(c.get('rules') or []), 'rule')} "
            f"in force (from {c.get('rules_from')})")
    if "events_sent" in c:
        text += (f"; events sent {c['events_sent']} (+{c.get('events_aggregated', 0)} in series), dropped "
                 f"{c.get('events_dropped_rate', 0) + c.get('events_dropped_full', 0)}")
    topo = c.get("topology")
    if topo:
        when = topo.get("last_publish")
        text += (f"; NodeResourceTopology published {human_duration(time.time() - when)} ago ({topo.get('publishes')}x)"
                 if when else "; NodeResourceTopology not published yet")
        if topo.get("last_error"):
            text += f" (failing: {topo['last_error']})"
    if c.get("crs_skipped"):
        text += f"; skipped (malformed or refused): {', '.join(c['crs_skipped'])}"
    if c.get("last_error"):
        text += f"; last error: {c['last_error']}"
    return text


# ---------------------------------------------------------------- pods

def pods(rows: List[Dict[str, Any]]) -> str:
    if not rows:
        return "no pods known to anolisnuma"
    out = []
    for p in rows:
        q, n = p.get("qos") or {}, p.get("numa") or {}
        qos_from = QOS_SOURCES.get(q.get("source"), q.get("source")) if q.get("level") else q.get("why")
        out.append([p["namespace"], p["name"], (p.get("uid") or "")[:8], len(p.get("containers") or []),
                    q.get("level"), qos_from, n.get("nodes"), n.get("cpus"), n.get("mems"), n.get("why")])
    return table(["NAMESPACE", "NAME", "UID", "CTRS", "QOS", "QOS FROM", "NODES", "CPUS", "MEMS", "NUMA WHY"], out)


# ---------------------------------------------------------------- numa

def numa(r: Dict[str, Any]) -> str:
    if not r.get("enabled"):
        return "NUMA placement is off ([numa] enabled = false)"
    head = fields([
        ("kubelet CPU manager", r.get("kubelet_policy")),
        ("shared pool", r.get("shared_pool")),
        ("kubelet-exclusive CPUs", r.get("kubelet_exclusive_cpus")),
        ("placed pods", r.get("allocations")),
        ("waiting to be repinned", r.get("pending_updates")),
    ])
    nodes = table(["NODE", "CPUS", "TOTAL", "SHARED", "EXCLUSIVE", "USED", "FREE", "MEMORY", "PLACED MEM", "PODS"],
                  [[n["node"], n["cpus"], n["cpus_total"], n["shared_cpus"], n["kubelet_exclusive_cpus"],
                    n["used_cpus"], n["free_cpus"], human_bytes(n["memory_bytes"]),
                    human_bytes(n["placed_memory_bytes"]), ", ".join(n["pods"])] for n in r.get("nodes") or []])
    blocks = [head, nodes]
    exclusive = r.get("kubelet_exclusive") or []
    if exclusive:
        blocks.append(table(["KUBELET-EXCLUSIVE POD", "CONTAINER", "CPUS"],
                            [[e.get("pod") or e["pod_uid"], e["container"], e["cpus"]] for e in exclusive]))
    return lines(*blocks)


# ---------------------------------------------------------------- explain

def explain(pods: List[Dict[str, Any]]) -> str:
    return "\n\n\n".join(_explain_one(p) for p in pods)


def _explain_one(e: Dict[str, Any]) -> str:
    pod, q, n = e["pod"], e.get("qos") or {}, e.get("numa") or {}
    if q.get("level"):
        qos = f"{q['level']} ({q.get('why') or q.get('source')})"
        k = q.get("knobs") or {}
        if k.get("set"):
            qos += f"; {'would set' if k.get('dry_run') else 'set'} " + ", ".join(k["set"])
        elif "set" in k and not q.get("llc_group"):
            qos += "; nothing written"
        if k.get("unsupported"):
            qos += "; not on this kernel: " + ", ".join(k["unsupported"])
        if k.get("held"):
            qos += "; not written: " + "; ".join(f"{name} ({why})" for name, why in k["held"].items())
        if q.get("llc_group"):
            qos += f"; resctrl group {q['llc_group']}"
    else:
        qos = (f"not applied: {q.get('why')}" + (f" ({q['detail']})" if q.get("detail") else "")
               + (f"; {q['fix']}" if q.get("fix") else ""))
    if n.get("placed"):
        where = ("node " if len(n["nodes"]) == 1 else "nodes ") + ",".join(str(x) for x in n["nodes"])
        numa = f"{where}, cpus {n.get('cpus') or '-'}, mems {n.get('mems') or '-'}: {n.get('why')}"
    else:
        numa = f"not placed: {n.get('why')}"
    pairs = [
        ("pod", f"{pod['namespace']}/{pod['name']}"),
        ("uid", pod["uid"]),
        ("sandbox", ", ".join(pod["sandbox_ids"]) + (" (stopped)" if pod.get("state") == "stopped" else "")),
        ("cgroup parent", pod.get("cgroup_parent")),
        ("markings", "; ".join(f"{k}={v}" for k, v in sorted((e.get("markings") or {}).items())) or "none"),
        ("hooks", f"all skipped: opted out ({e['opted_out']})" if e.get("opted_out")
         else "run for this pod (what each did: qos, numa)"),
        ("qos", qos),
        ("numa", numa),
    ]
    if n.get("selection"):
        pairs.append(("numa selection", n["selection"] + (f" ({n['rule']})" if n.get("rule") else "")))
    if n.get("kubelet_exclusive"):
        pairs.append(("kubelet-exclusive", ", ".join(f"{k}: {v}" for k, v in sorted(n["kubelet_exclusive"].items()))))
    blocks = [fields(pairs)]
    containers = pod.get("containers") or []
    if containers:
        blocks.append(table(["CONTAINER", "ID", "CPUSET CPUS", "CPUSET MEMS"],
                            [[c["name"], c["id"][:13], c["cpuset_cpus"], c["cpuset_mems"]] for c in containers]))
    calls = e.get("calls") or []
    moves = n.get("moves") or []
    if calls or moves:
        rows = []
        for c in calls:
            decisions = "; ".join(f"{k}: {v}" for k, v in sorted((c.get("decisions") or {}).items()))
            errors = "; ".join(f"FAILED {x}" for x in c.get("hook_errors") or [])
            rows.append((c["at"], [time.strftime("%H:%M:%S", time.localtime(c["at"])), c["method"],
                                   _short(c.get("container")), c["status"], f"{c['latency_ms']:g}ms",
                                   "; ".join(x for x in (decisions, errors) if x)]))
        for m in moves:   # the daemon's own re-pins: no kubelet call shows them
            rows.append((m["at"], [time.strftime("%H:%M:%S", time.localtime(m["at"])), "live NUMA move", "-",
                                   m.get("outcome"), "-", f"numa: {_move(m)}"]))
        rows.sort(key=lambda r: r[0])
        blocks.append(table(["TIME", "CALL", "CONTAINER", "STATUS", "LATENCY", "DECISIONS"], [r for _, r in rows]))
    else:
        blocks.append("calls: none seen since the daemon started")
    return lines(*blocks)


def _move(m: Dict[str, Any]) -> str:
    def nodes(ns: Any) -> str:
        ns = list(ns or [])
        return ("node " if len(ns) == 1 else "nodes ") + ",".join(str(x) for x in ns)

    text = f"moved from {nodes(m.get('from_nodes'))} to {nodes(m.get('to_nodes'))} by {m.get('source')}"
    text += f" ({m['reason']})" if m.get("reason") else ""
    return text + (f": {m['error']}" if m.get("error") else "")


def _short(container: Any) -> Any:
    """A container name as is; a bare 64-hex ID cut to 13 characters like crictl."""
    if isinstance(container, str) and len(container) == 64:
        return container[:13]
    return container


# ---------------------------------------------------------------- reload

def reload(r: Dict[str, Any]) -> str:
    applied, restart = r.get("applied") or [], r.get("needs_restart") or []
    if not applied and not restart:
        return f"configuration reloaded from {r.get('config')}: nothing changed"
    pairs = [("configuration reloaded from", r.get("config")),
             ("applied now", ", ".join(applied) or "nothing")]
    if restart:
        pairs.append(("needs a restart", ", ".join(restart) + " (the running values stay until then)"))
    return fields(pairs)


RENDERERS = {"status": status, "pods": pods, "numa": numa, "explain": explain, "reload": reload}
