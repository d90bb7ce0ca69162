"""A node without ``[kubernetes]`` pays nothing for the cluster side: a daemon with the NUMA
hook on and ``[kubernetes] kubeconfig`` empty has not imported lightkube nor its HTTP
library once it serves. Run in a child Python of its own: this test process has imported
them for the other tests. No API server needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from anolisnuma.testing.proxy import REPO_ROOT

CHILD = r"""
import json, os, sys
from anolisnuma.config import Config
from anolisnuma.testing.fake_cri import FakeCri
from anolisnuma.testing.proxy import InProcessProxy, config_dict, write_config
from cluster_helpers import TOPOLOGY

base, sockdir = sys.argv[1], sys.argv[2]
fake = FakeCri(os.path.join(sockdir, "containerd.sock"), containers=0, sandboxes=0).start()
data = config_dict(base, fake.socket_path, listen=os.path.join(sockdir, "cri.sock"), extra={
    "log": {"stderr": False}, "runtime": {"resync_interval_seconds": 0.0},
    "numa": {"enabled": True, "namespaces": ["batch"], "node_name": "w1"},
    "kubernetes": {"kubeconfig": ""}})
TOPOLOGY.write(data["paths"]["sys_root"])
proxy = InProcessProxy(Config.load(write_config(os.path.join(base, "config.toml"), data))).start()
proxy.wait_resynced()
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("lightkube", "httpx", "httpx2", "httpcore",
                                                              "httpcore2", "msgspec", "anyio"))
cluster = sorted(m for m in sys.modules if m.startswith("anolisnuma.cluster"))
proxy.stop()
fake.stop(0)
print(json.dumps({"loaded": loaded, "cluster": cluster}))
"""


def test_a_daemon_without_kubernetes_imports_no_kubernetes_client(tmp_path, sockdir: str) -> None:
    path = [REPO_ROOT, os.path.dirname(__file__)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    done = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path), sockdir], env=env, cwd=REPO_ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["loaded"] == [], got
    # (the [kubernetes] section's parser is all of the cluster side a node without it loads)
    assert set(got["cluster"]) <= {"anolisnuma.cluster", "anolisnuma.cluster.config"}, got
