#!/usr/bin/env python3
"""Which Kubernetes client the daemon uses: resident memory added, CPU per watch event.

The daemon must list and watch Oenuma CRs and server-side apply their status, beside the
CRI relay, on nodes with Python 3.9. This measures each candidate that still supports 3.9
the way the daemon would use it (list every CR, then watch from the list's
resourceVersion), against a private real kube-apiserver (anolisnuma/testing/kube_apiserver),
and the standard library's http.client + json as the floor:

- ``rss_import``: resident memory added by importing the client and making it (the
  baseline process has imported what the daemon imports anyway: json, ssl, asyncio, yaml);
- ``rss_list``: added after listing ``--crs`` CRs (default 1000) and watching;
- ``cpu_us_event``: process CPU per watch event over ``--events`` MODIFIED events
  (default 2000), from the first to the last one received.

Each candidate runs in a virtualenv of its own under /tmp/anolisnuma-kubeclient-<name>
(made with pip on first use), in a child process of its own. ``anolisnuma`` is the
daemon's own path (``anolisnuma/cluster/kube_client.py``: lightkube behind the bounded
transport, the list and watch its watcher makes) with the lightkube of the Python running
this script.

    python3 scripts/bench_kubeclient.py [--crs 1000] [--events 2000] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from anolisnuma.testing.kube_apiserver import PrivateControlPlane  # noqa: E402

# The last releases that install on Python 3.9 (kubernetes 36, kubernetes-asyncio 34 and
# lightkube 1.0 need 3.10), and lightkube 1.0, what pip takes on 3.10+.
CANDIDATES = {
    "stdlib": [],
    "kubernetes": ["kubernetes==35.0.0"],
    "kubernetes-asyncio": ["kubernetes-asyncio==33.3.0"],
    "lightkube": ["lightkube==0.22.0"],
    "lightkube-1.0": ["lightkube==1.0.1"],
    "anolisnuma": [],
}
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GROUP, VERSION, PLURAL = "resource.sop.huawei.com", "v1alpha1", "oenumas"
NAMESPACE = "bench"

CHILD = r'''
import json, os, ssl, sys, time, asyncio, yaml
lib, kubeconfig, n_events = sys.argv[1], sys.argv[2], int(sys.argv[3])
G, V, P = "resource.sop.huawei.com", "v1alpha1", "oenumas"

def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024

out = {"rss_base": rss()}
cfg = yaml.safe_load(open(kubeconfig))
cluster, user = cfg["clusters"][0]["cluster"], cfg["users"][0]["user"]
state = {}

def ready(rv):
    out["rss_import"] = state["rss_import"] - out["rss_base"]
    print("READY", rv, flush=True)

def count(kind):
    if kind != "MODIFIED":
        return False
    n = state["n"] = state.get("n", 0) + 1
    if n == 1:
        state["cpu0"] = time.process_time()
    if n == n_events:
        out["cpu_us_event"] = (time.process_time() - state["cpu0"]) / max(n_events - 1, 1) * 1e6
        out["rss_list"] = rss() - out["rss_base"]
        return True
    return False

if lib == "stdlib":
    import http.client, urllib.parse
    ctx = ssl.create_default_context(cafile=cluster["certificate-authority"])
    ctx.load_cert_chain(user["client-certificate"], user["client-key"])
    url = urllib.parse.urlsplit(cluster["server"])
    state["rss_import"] = rss()
    def get(path):
        c = http.client.HTTPSConnection(url.hostname, url.port, context=ctx, timeout=60)
        c.request("GET", path, headers={"Accept": "application/json"})
        return c, c.getresponse()
    c, r = get(f"/apis/{G}/{V}/{P}")
    items = json.loads(r.read())
    c.close()
    ready(items["metadata"]["resourceVersion"])
    c, r = get(f"/apis/{G}/{V}/{P}?watch=1&allowWatchBookmarks=true&resourceVersion={items['metadata']['resourceVersion']}")
    while True:
        line = r.readline()
        if count(json.loads(line)["type"]):
            break
elif lib == "kubernetes":
    import kubernetes
    kubernetes.config.load_kube_config(kubeconfig)
    api = kubernetes.client.CustomObjectsApi()
    state["rss_import"] = rss()
    items = api.list_cluster_custom_object(G, V, P)
    ready(items["metadata"]["resourceVersion"])
    w = kubernetes.watch.Watch()
    for ev in w.stream(api.list_cluster_custom_object, G, V, P, resource_version=items["metadata"]["resourceVersion"],
                       allow_watch_bookmarks=True):
        if count(ev["type"]):
            break
elif lib == "kubernetes-asyncio":
    import uvloop
    import kubernetes_asyncio as k
    async def main():
        await k.config.load_kube_config(kubeconfig)
        async with k.client.ApiClient() as client:
            api = k.client.CustomObjectsApi(client)
            state["rss_import"] = rss()
            items = await api.list_cluster_custom_object(G, V, P)
            ready(items["metadata"]["resourceVersion"])
            w = k.watch.Watch()
            async for ev in w.stream(api.list_cluster_custom_object, G, V, P,
                                     resource_version=items["metadata"]["resourceVersion"], allow_watch_bookmarks=True):
                if count(ev["type"]):
                    break
    uvloop.install()
    asyncio.run(main())
elif lib == "anolisnuma":
    sys.path.insert(0, os.environ["ANOLISNUMA_REPO"])
    from anolisnuma.cluster.kube_client import KubeClient
    from anolisnuma.cluster.kubeconfig import load_kubeconfig
    client = KubeClient(load_kubeconfig(kubeconfig), 60.0)
    state["rss_import"] = rss()
    listing = client.list_oenumas(500)
    items = list(listing)
    ready(listing.resource_version)
    for kind, obj in client.watch_oenumas(listing.resource_version, 600):
        if count(kind):
            break
elif lib.startswith("lightkube"):
    from lightkube import Client, KubeConfig
    from lightkube.generic_resource import create_namespaced_resource
    Oenuma = create_namespaced_resource(G, V, "Oenuma", P)
    client = Client(KubeConfig.from_file(kubeconfig))
    state["rss_import"] = rss()
    it = client.list(Oenuma, namespace="*")
    items = list(it)
    ready(it.resourceVersion)
    for kind, obj in client.watch(Oenuma, namespace="*", resource_version=it.resourceVersion):
        if count(kind):
            break
print("RESULT", json.dumps(out), flush=True)
'''


def venv_python(name: str, specs: List[str]) -> str:
    if not specs:
        return sys.executable
    venv = f"/tmp/anolisnuma-kubeclient-{name}"
    py = os.path.join(venv, "bin", "python")
    if not os.path.exists(py):
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", *specs, "pyyaml", "uvloop"],
                       check=True)
    return py


def make_crs(cp: PrivateControlPlane, n: int) -> None:
    cp.kubectl("apply", "-f", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "deploy",
                                           "crd-oenuma.yaml"))
    cp.kubectl("wait", "--for=condition=Established", f"crd/{PLURAL}.{GROUP}")
    cp.kubectl("create", "namespace", NAMESPACE)

    def one(i: int) -> None:
        cp.request("POST", f"/apis/{GROUP}/{VERSION}/namespaces/{NAMESPACE}/{PLURAL}", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Oenuma", "metadata": {"name": f"cr-{i}"},
            "spec": {"node": [{"name": f"node-{i % 50}", "podAffinity": [{"podName": f"pod-{i}", "numaNum": i % 4}],
                               "numa": [{"numaNum": i % 4, "cpuset": f"{i % 4 * 8}-{i % 4 * 8 + 7}"}]}]}})
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(n)))


def patch_loop(cp: PrivateControlPlane, crs: int, events: int) -> None:
    def one(i: int) -> None:
        req = urllib.request.Request(
            f"{cp.server}/apis/{GROUP}/{VERSION}/namespaces/{NAMESPACE}/{PLURAL}/cr-{i % crs}",
            data=json.dumps({"spec": {"replicas": i}}).encode(), method="PATCH",
            headers={"Content-Type": "application/merge-patch+json"})
        urllib.request.urlopen(req, context=ctx, timeout=30).read()
    ctx = cp.ssl_context()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(events)))


def measure(cp: PrivateControlPlane, name: str, py: str, crs: int, events: int) -> Dict[str, Any]:
    child = subprocess.Popen([py, "-c", CHILD, name, cp.admin_kubeconfig, str(events)], stdout=subprocess.PIPE,
                             text=True, env=dict(os.environ, ANOLISNUMA_REPO=REPO))
    assert child.stdout is not None
    line = child.stdout.readline()
    if not line.startswith("READY"):
        child.kill()
        raise RuntimeError(f"{name}: {line!r}")
    time.sleep(0.5)   # the watch request is on its way; events made before it would be replayed anyway
    threading.Thread(target=patch_loop, args=(cp, crs, events), daemon=True).start()
    for line in child.stdout:
        if line.startswith("RESULT"):
            child.wait(60)
            return json.loads(line.split(" ", 1)[1])
    raise RuntimeError(f"{name}: no result (exit {child.wait()})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--crs", type=int, default=1000)
    ap.add_argument("--events", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--only", nargs="*", default=list(CANDIDATES))
    args = ap.parse_args()
    pythons = {name: venv_python(name, CANDIDATES[name]) for name in args.only}
    with PrivateControlPlane.start_new() as cp:
        make_crs(cp, args.crs)
        print(f"{'client':20} {'run':>3} {'rss_import MB':>14} {'rss_list MB':>12} {'cpu/event us':>13}")
        for run in range(args.runs):
            for name in args.only:
                r = measure(cp, name, pythons[name], args.crs, args.events)
                print(f"{name:20} {run + 1:>3} {r['rss_import'] / 1e6:>14.1f} {r['rss_list'] / 1e6:>12.1f} "
                      f"{r['cpu_us_event']:>13.0f}", flush=True)


if __name__ == "__main__":
    main()
