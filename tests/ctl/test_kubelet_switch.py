"""``anolisnuma-ctl kubelet enable|disable|status`` on scratch roots laid out like real nodes.

Each layout is switched over and back: ``status`` says ours after ``enable``, a second
``enable`` changes nothing, ``disable`` leaves the root byte-identical to what it was (file
contents, modes, no leftover file or directory), and ``enable`` refuses, changing nothing,
while our socket does not answer. "Our socket" is a FakeCri on a temporary unix socket.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import stat
import tempfile
import textwrap
from typing import Dict, Iterator, List, Optional, Tuple

import pytest

from anolisnuma.ctl.kubelet import cli
from anolisnuma.ctl.kubelet.endpoints import same_socket
from anolisnuma.ctl.kubelet.env_file import parse_env_file
from anolisnuma.ctl.kubelet.systemd_unit import parse_unit, split_words
from anolisnuma.testing.fake_cri import FakeCri

CONTAINERD = "unix:///run/containerd/containerd.sock"

# -- node layouts (realistic upstream files) ---------------------------------------------

KUBELET_SERVICE_UPSTREAM = """\
[Unit]
Description=kubelet: The Kubernetes Node Agent
Documentation=https://kubernetes.io/docs/
Wants=network-online.target
After=network-online.target

[Service]
ExecStart=/usr/bin/kubelet
Restart=always
StartLimitInterval=0
RestartSec=10

[Install]
WantedBy=multi-user.target
"""

KUBEADM_DROPIN = """\
# Note: This dropin only works with kubeadm and kubelet v1.11+
[Service]
Environment="KUBELET_KUBECONFIG_ARGS=--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf --kubeconfig=/etc/kubernetes/kubelet.conf"
Environment="KUBELET_CONFIG_ARGS=--config=/var/lib/kubelet/config.yaml"
# This is a file that "kubeadm init" and "kubeadm join" generates at runtime, populating the KUBELET_KUBEADM_ARGS variable dynamically
EnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env
# This is a file that the user can use for overrides of the kubelet args as a last resort. Preferably, the user should use
# the .NodeRegistration.KubeletExtraArgs object in the configuration files instead. KUBELET_EXTRA_ARGS should be sourced from this file.
EnvironmentFile=-/etc/sysconfig/kubelet
ExecStart=
ExecStart=/usr/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS
"""

KUBEADM_CONFIG_NO_KEY = """\
apiVersion: kubelet.config.k8s.io/v1beta1
authentication:
  anonymous:
    enabled: false
  webhook:
    cacheTTL: 0s
    enabled: true
  x509:
    clientCAFile: /etc/kubernetes/pki/ca.crt
authorization:
  mode: Webhook
  webhook:
    cacheAuthorizedTTL: 0s
    cacheUnauthorizedTTL: 0s
cgroupDriver: systemd
clusterDNS:
- 10.96.0.10
clusterDomain: cluster.local
# reserved for system daemons on this node
cpuManagerPolicy: static
reservedSystemCPUs: "0-1"
healthzBindAddress: 127.0.0.1
healthzPort: 10248
kind: KubeletConfiguration
rotateCertificates: true
staticPodPath: /etc/kubernetes/manifests
"""

KUBEADM_CONFIG_WITH_KEY = """\
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  x509:
    clientCAFile: /etc/kubernetes/pki/ca.crt
cgroupDriver: systemd
# the CRI socket kubeadm found on this node
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock  # from nodeRegistration.criSocket
clusterDNS:
- 10.96.0.10
evictionHard:
  memory.available: 100Mi
staticPodPath: /etc/kubernetes/manifests
"""

# Fedora / openEuler "kubernetes-node" packaging: the unit reads /etc/kubernetes/{config,kubelet}.
FEDORA_KUBELET_SERVICE = """\
[Unit]
Description=Kubernetes Kubelet Server
Documentation=https://kubernetes.io/docs/concepts/overview/components/#kubelet
After=containerd.service
Requires=containerd.service

[Service]
WorkingDirectory=/var/lib/kubelet
EnvironmentFile=-/etc/kubernetes/config
EnvironmentFile=-/etc/kubernetes/kubelet
ExecStart=/usr/bin/kubelet \\
\t    $KUBE_LOGTOSTDERR \\
\t    $KUBE_LOG_LEVEL \\
\t    $KUBELET_KUBECONFIG \\
\t    $KUBELET_ADDRESS \\
\t    $KUBELET_PORT \\
\t    $KUBELET_HOSTNAME \\
\t    $KUBELET_ARGS
Restart=on-failure
KillMode=process

[Install]
WantedBy=multi-user.target
"""

FEDORA_CONFIG = """\
###
# kubernetes system config
#
# The following values are used to configure various aspects of all
# kubernetes services, including
#
#   kube-apiserver.service
#   kube-controller-manager.service
#   kube-scheduler.service
#   kubelet.service
#   kube-proxy.service
# logging to stderr means we get it in the systemd journal
KUBE_LOGTOSTDERR="--logtostderr=true"

# journal message level, 0 is debug
KUBE_LOG_LEVEL="--v=0"
"""

FEDORA_KUBELET_ENV = """\
###
# kubernetes kubelet (minion) config

# The address for the info server to serve on (set to 0.0.0.0 or "" for all interfaces)
KUBELET_ADDRESS="--address=127.0.0.1"

# You may leave this blank to use the actual hostname
KUBELET_HOSTNAME="--hostname-override=127.0.0.1"

# Path to a kubelet.kubeconfig file
KUBELET_KUBECONFIG=--kubeconfig=/etc/kubernetes/kubelet.kubeconfig

# Add your own!
KUBELET_ARGS="--cgroup-driver=systemd --fail-swap-on=false \\
 --container-runtime-endpoint=unix:///run/containerd/containerd.sock"
"""

# A plain rpm kubelet (no kubeadm): flags in KUBELET_EXTRA_ARGS of /etc/sysconfig/kubelet.
RPM_KUBELET_SERVICE = """\
[Unit]
Description=kubelet: The Kubernetes Node Agent
Documentation=https://kubernetes.io/docs/
Wants=network-online.target
After=network-online.target containerd.service

[Service]
EnvironmentFile=-/etc/sysconfig/kubelet
ExecStart=/usr/bin/kubelet --kubeconfig=/etc/kubernetes/kubelet.conf $KUBELET_EXTRA_ARGS
Restart=always
RestartSec=10

[Install]
WantedBy=multi-user.target
"""

RPM_SYSCONFIG_WITH_FLAG = """\
# flags for the kubelet
KUBELET_EXTRA_ARGS="--container-runtime-endpoint unix:///run/containerd/containerd.sock --node-ip=10.0.0.5"
"""

RPM_SYSCONFIG_WITH_CONFIG = """\
KUBELET_EXTRA_ARGS="--config=/etc/kubernetes/kubelet-config.yaml --node-ip=10.0.0.5"
"""

RPM_KUBELET_CONFIG = """\
# kubelet settings for this node
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: systemd
failSwapOn: false
"""

KUBECONFIG = "apiVersion: v1\nkind: Config\nclusters: []\n"

Layout = Dict[str, str]

KUBEADM_FLAG: Layout = {
    "usr/lib/systemd/system/kubelet.service": KUBELET_SERVICE_UPSTREAM,
    "usr/lib/systemd/system/kubelet.service.d/10-kubeadm.conf": KUBEADM_DROPIN,
    "etc/sysconfig/kubelet": "KUBELET_EXTRA_ARGS=\n",
    "var/lib/kubelet/kubeadm-flags.env":
        'KUBELET_KUBEADM_ARGS="--container-runtime-endpoint=unix:///run/containerd/containerd.sock '
        '--pod-infra-container-image=registry.k8s.io/pause:3.9"\n',
    "var/lib/kubelet/config.yaml": KUBEADM_CONFIG_NO_KEY,
    "etc/kubernetes/kubelet.conf": KUBECONFIG,
}

KUBEADM_CONFIG: Layout = {
    "usr/lib/systemd/system/kubelet.service": KUBELET_SERVICE_UPSTREAM,
    "usr/lib/systemd/system/kubelet.service.d/10-kubeadm.conf": KUBEADM_DROPIN,
    "etc/sysconfig/kubelet": "KUBELET_EXTRA_ARGS=\n",
    "var/lib/kubelet/kubeadm-flags.env":
        'KUBELET_KUBEADM_ARGS="--node-ip=10.0.0.5 --pod-infra-container-image=registry.k8s.io/pause:3.10"\n',
    "var/lib/kubelet/config.yaml": KUBEADM_CONFIG_WITH_KEY,
    "etc/kubernetes/kubelet.conf": KUBECONFIG,
}

FEDORA_RPM: Layout = {
    "usr/lib/systemd/system/kubelet.service": FEDORA_KUBELET_SERVICE,
    "etc/kubernetes/config": FEDORA_CONFIG,
    "etc/kubernetes/kubelet": FEDORA_KUBELET_ENV,
    "etc/kubernetes/kubelet.kubeconfig": KUBECONFIG,
}

PLAIN_RPM: Layout = {
    "usr/lib/systemd/system/kubelet.service": RPM_KUBELET_SERVICE,
    "etc/sysconfig/kubelet": RPM_SYSCONFIG_WITH_FLAG,
    "etc/kubernetes/kubelet.conf": KUBECONFIG,
}

# (layout, the file enable changes, source kind before, source kind after)
LAYOUTS = {
    "kubeadm-flag": (KUBEADM_FLAG, "var/lib/kubelet/kubeadm-flags.env", "flag", "flag"),
    "kubeadm-config": (KUBEADM_CONFIG, "var/lib/kubelet/config.yaml", "config", "config"),
    "fedora-rpm": (FEDORA_RPM, "etc/kubernetes/kubelet", "flag", "flag"),
    "plain-rpm": (PLAIN_RPM, "etc/sysconfig/kubelet", "flag", "flag"),
}


# -- helpers -------------------------------------------------------------------------------


def build(root: str, layout: Layout) -> str:
    for rel, text in layout.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o640 if rel.startswith("etc/sysconfig") else 0o644)
    return root


Snapshot = Dict[str, Tuple[str, int, Optional[bytes]]]


def snapshot(root: str) -> Snapshot:
    """Every file and directory below root: kind, mode and contents."""
    out: Snapshot = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            p = os.path.join(dirpath, name)
            out[os.path.relpath(p, root)] = ("dir", stat.S_IMODE(os.lstat(p).st_mode), None)
        for name in filenames:
            p = os.path.join(dirpath, name)
            with open(p, "rb") as f:
                out[os.path.relpath(p, root)] = ("file", stat.S_IMODE(os.lstat(p).st_mode), f.read())
    return out


def read(root: str, rel: str) -> str:
    with open(os.path.join(root, rel)) as f:
        return f.read()


class Ctl:
    """Runs ``anolisnuma-ctl kubelet ...`` in process against one scratch root."""

    def __init__(self, root: str, socket_path: str, capsys: pytest.CaptureFixture) -> None:
        self.root = root
        self.socket = socket_path
        self.capsys = capsys
        self.out = ""
        self.err = ""

    def __call__(self, command: str, *extra: str, socket: Optional[str] = None, no_socket: bool = False) -> int:
        argv = ["kubelet", command, "--root", self.root]
        if not no_socket:
            argv += ["--socket", socket or self.socket]
        argv += list(extra)
        self.capsys.readouterr()
        rc = cli.main(argv)
        captured = self.capsys.readouterr()
        self.out, self.err = captured.out, captured.err
        return rc

    def status(self) -> dict:
        assert self("status", "-o", "json") == 0, self.err
        return json.loads(self.out)


@pytest.fixture(scope="module")
def sock_dir() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="an-kc-", dir="/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def ours(sock_dir: str) -> Iterator[str]:
    """Our socket: a fake CRI server that answers Version."""
    path = os.path.join(sock_dir, "ours.sock")
    with FakeCri(path, runtime_name="anolisnuma-test", runtime_version="0.0.1"):
        yield path


@pytest.fixture
def ctl_for(tmp_path, ours, capsys):
    def make(layout: Layout) -> Ctl:
        root = str(tmp_path / "root")
        os.makedirs(root)
        build(root, layout)
        return Ctl(root, ours, capsys)
    return make


def changed_lines(before: str, after: str) -> Tuple[List[str], List[str]]:
    b, a = before.splitlines(True), after.splitlines(True)
    return [x for x in b if x not in a], [x for x in a if x not in b]


# -- the round trip on every layout ----------------------------------------------------------


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_enable_status_disable_round_trip(name, ctl_for):
    layout, changed, kind_before, kind_after = LAYOUTS[name]
    ctl = ctl_for(layout)
    original = snapshot(ctl.root)

    st = ctl.status()
    assert st["ours"] is False and st["socket_answers"] is True
    assert st["endpoint"] == CONTAINERD and st["source"]["kind"] == kind_before
    assert st["switched"] is False

    assert ctl("enable") == 0, ctl.err
    assert "changed" in ctl.out and "systemctl restart kubelet" in ctl.out
    assert "anolisnuma-test" in ctl.out  # the Version answer it checked
    after = snapshot(ctl.root)
    changed_files = {p for p in after if p in original and after[p] != original[p]}
    assert changed_files == {changed}
    assert after[changed][1] == original[changed][1]  # mode kept
    new_files = {p for p in after if p not in original}
    assert all(p in ("var", "var/lib") or p.startswith("var/lib/anolisnuma") for p in new_files), new_files
    removed, added = changed_lines(layout[changed], read(ctl.root, changed))
    assert len(removed) == 1 and len(added) == 1, (removed, added)
    assert "unix://" + ctl.socket in added[0]

    st = ctl.status()
    assert st["ours"] is True and st["socket_answers"] is True
    assert st["endpoint"] == "unix://" + ctl.socket
    assert st["source"]["kind"] == kind_after and st["source"]["path"] == "/" + changed
    assert st["switched"] is True and st["switched_files"] == ["/" + changed]
    assert st["warnings"] == []

    assert ctl("enable") == 0, ctl.err
    assert "nothing changed" in ctl.out
    assert snapshot(ctl.root) == after

    assert ctl("disable") == 0, ctl.err
    assert f"restored /{changed}" in ctl.out and "systemctl restart kubelet" in ctl.out
    assert snapshot(ctl.root) == original
    st = ctl.status()
    assert st["ours"] is False and st["endpoint"] == CONTAINERD and st["switched"] is False

    assert ctl("disable") == 0, ctl.err
    assert "nothing to restore" in ctl.out
    assert snapshot(ctl.root) == original


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_enable_refuses_while_our_socket_does_not_answer(name, ctl_for, sock_dir):
    ctl = ctl_for(LAYOUTS[name][0])
    original = snapshot(ctl.root)
    missing = os.path.join(sock_dir, "nobody.sock")
    assert ctl("enable", socket=missing) == 1
    assert ctl.out == ""
    assert len(ctl.err.strip().splitlines()) == 1
    assert "refusing" in ctl.err and missing in ctl.err
    assert snapshot(ctl.root) == original


def test_enable_refuses_a_socket_that_is_bound_but_not_listening(ctl_for, sock_dir):
    ctl = ctl_for(KUBEADM_FLAG)
    original = snapshot(ctl.root)
    path = os.path.join(sock_dir, "bound.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.bind(path)  # never listen(): connect() is refused
        assert ctl("enable", socket=path) == 1
        assert "refusing" in ctl.err and "does not answer CRI Version" in ctl.err
        assert len(ctl.err.strip().splitlines()) == 1
        assert snapshot(ctl.root) == original
        assert ctl("status", "-o", "json", socket=path) == 0
        st = json.loads(ctl.out)
        assert st["ours"] is False and st["socket_answers"] is False
        assert "UNAVAILABLE" in st["socket_detail"]
    finally:
        s.close()
        os.unlink(path)


# -- which source wins -------------------------------------------------------------------------


def test_kubeadm_flag_wins_over_the_config_file(ctl_for):
    layout = dict(KUBEADM_FLAG)
    layout["var/lib/kubelet/config.yaml"] = KUBEADM_CONFIG_WITH_KEY.replace(
        "unix:///run/containerd/containerd.sock", "unix:///run/crio/crio.sock")
    ctl = ctl_for(layout)
    st = ctl.status()
    assert st["endpoint"] == CONTAINERD and st["source"]["path"] == "/var/lib/kubelet/kubeadm-flags.env"
    assert [s["endpoint"] for s in st["overridden"]] == ["unix:///run/crio/crio.sock"]
    original = snapshot(ctl.root)
    assert ctl("enable") == 0, ctl.err
    # The flag is what the kubelet uses: it is rewritten, the overridden key is left alone.
    assert read(ctl.root, "var/lib/kubelet/config.yaml") == layout["var/lib/kubelet/config.yaml"]
    assert f"--container-runtime-endpoint=unix://{ctl.socket} " in read(ctl.root, "var/lib/kubelet/kubeadm-flags.env")
    assert ctl.status()["ours"] is True
    assert ctl("disable") == 0
    assert snapshot(ctl.root) == original


def test_environment_dropin_loses_to_kubeadm_environment_file(ctl_for):
    """The trap of issue 8: Environment=KUBELET_EXTRA_ARGS in a drop-in, while 10-kubeadm.conf
    reads KUBELET_EXTRA_ARGS from /etc/sysconfig/kubelet: the file wins, the flag is lost."""
    layout = dict(KUBEADM_FLAG)
    layout["etc/systemd/system/kubelet.service.d/10-anolisnuma.conf"] = (
        "[Service]\n"
        'Environment="KUBELET_EXTRA_ARGS=--container-runtime-endpoint=unix:///var/run/anolisnuma/anolisnuma.sock"\n')
    ctl = ctl_for(layout)
    st = ctl.status()
    assert st["ours"] is False and st["endpoint"] == CONTAINERD
    assert st["source"]["path"] == "/var/lib/kubelet/kubeadm-flags.env"

    # Without /etc/sysconfig/kubelet the drop-in's value does reach the command line, after
    # KUBELET_KUBEADM_ARGS: the last flag wins.
    os.unlink(os.path.join(ctl.root, "etc/sysconfig/kubelet"))
    st = ctl.status()
    assert st["endpoint"] == "unix:///var/run/anolisnuma/anolisnuma.sock"
    assert "Environment=" in st["source"]["detail"] and "10-anolisnuma.conf" in st["source"]["detail"]
    assert [s["endpoint"] for s in st["overridden"]] == [CONTAINERD]


def test_config_key_edit_keeps_comments_and_order(ctl_for):
    ctl = ctl_for(KUBEADM_CONFIG)
    assert ctl("enable") == 0, ctl.err
    text = read(ctl.root, "var/lib/kubelet/config.yaml")
    expected = KUBEADM_CONFIG_WITH_KEY.replace(
        "containerRuntimeEndpoint: unix:///run/containerd/containerd.sock  #",
        f"containerRuntimeEndpoint: unix://{ctl.socket}  #")
    assert text == expected


def test_quoted_config_value_keeps_its_quotes(ctl_for):
    layout = dict(KUBEADM_CONFIG)
    layout["var/lib/kubelet/config.yaml"] = (
        "kind: KubeletConfiguration\napiVersion: kubelet.config.k8s.io/v1beta1\n"
        "containerRuntimeEndpoint: \"unix:///run/containerd/containerd.sock\" # quoted\n"
        "cgroupDriver: systemd")   # no newline at the end of the file
    ctl = ctl_for(layout)
    original = snapshot(ctl.root)
    assert ctl("enable") == 0, ctl.err
    assert read(ctl.root, "var/lib/kubelet/config.yaml") == layout["var/lib/kubelet/config.yaml"].replace(
        '"unix:///run/containerd/containerd.sock"', f'"unix://{ctl.socket}"')
    assert ctl("disable") == 0
    assert snapshot(ctl.root) == original


def test_plain_rpm_config_file_without_the_key(ctl_for):
    """No flag, a config file without the key: added to the config for a kubelet >= 1.27,
    else the flag goes into KUBELET_EXTRA_ARGS (an older kubelet ignores the key)."""
    layout = dict(PLAIN_RPM)
    layout["etc/sysconfig/kubelet"] = RPM_SYSCONFIG_WITH_CONFIG
    layout["etc/kubernetes/kubelet-config.yaml"] = RPM_KUBELET_CONFIG
    ctl = ctl_for(layout)
    original = snapshot(ctl.root)
    st = ctl.status()
    assert st["source"]["kind"] == "default" and st["endpoint"] == CONTAINERD
    assert st["config_file"] == "/etc/kubernetes/kubelet-config.yaml"

    assert ctl("enable", "--kubelet-version", "v1.29.3") == 0, ctl.err
    assert read(ctl.root, "etc/kubernetes/kubelet-config.yaml") == \
        RPM_KUBELET_CONFIG + f"containerRuntimeEndpoint: unix://{ctl.socket}\n"
    assert read(ctl.root, "etc/sysconfig/kubelet") == RPM_SYSCONFIG_WITH_CONFIG
    st = ctl.status()
    assert st["ours"] and st["source"]["kind"] == "config"
    assert ctl("disable") == 0
    assert snapshot(ctl.root) == original

    assert ctl("enable") == 0, ctl.err  # version unknown: the flag, not the key
    assert read(ctl.root, "etc/kubernetes/kubelet-config.yaml") == RPM_KUBELET_CONFIG
    assert read(ctl.root, "etc/sysconfig/kubelet") == RPM_SYSCONFIG_WITH_CONFIG.replace(
        '10.0.0.5"', f'10.0.0.5 --container-runtime-endpoint=unix://{ctl.socket}"')
    st = ctl.status()
    assert st["ours"] and st["source"]["kind"] == "flag"
    assert ctl("disable") == 0
    assert snapshot(ctl.root) == original


def test_kubeadm_node_without_flag_or_key(ctl_for):
    """kubeadm-flags.env without the flag (e.g. kubeadm's NodeLocalCRISocket) and a config
    file without the key: the kubelet uses its default. A kubelet >= 1.27 gets the key;
    otherwise the flag goes into the empty KUBELET_EXTRA_ARGS= of /etc/sysconfig/kubelet."""
    layout = dict(KUBEADM_FLAG)
    layout["var/lib/kubelet/kubeadm-flags.env"] = 'KUBELET_KUBEADM_ARGS="--node-ip=10.0.0.5"\n'
    ctl = ctl_for(layout)
    original = snapshot(ctl.root)
    assert ctl.status()["source"]["kind"] == "default"

    assert ctl("enable") == 0, ctl.err
    assert read(ctl.root, "etc/sysconfig/kubelet") == f"KUBELET_EXTRA_ARGS=--container-runtime-endpoint=unix://{ctl.socket}\n"
    assert ctl.status()["source"]["path"] == "/etc/sysconfig/kubelet"
    assert ctl("disable") == 0
    assert snapshot(ctl.root) == original

    assert ctl("enable", "--kubelet-version", "1.31") == 0, ctl.err
    removed, added = changed_lines(KUBEADM_CONFIG_NO_KEY, read(ctl.root, "var/lib/kubelet/config.yaml"))
    assert removed == [] and added == [f"containerRuntimeEndpoint: unix://{ctl.socket}\n"]
    assert ctl.status()["source"]["kind"] == "config"
    assert ctl("disable") == 0
    assert snapshot(ctl.root) == original


def test_flag_in_a_packaged_unit_gets_a_dropin(ctl_for):
    """A flag in /usr/lib/systemd/system/kubelet.service (rpm-owned: an update would undo an
    edit) is overridden by a drop-in in /etc that repeats ExecStart= with our endpoint."""
    layout = {
        "usr/lib/systemd/system/kubelet.service": RPM_KUBELET_SERVICE.replace(
            "--kubeconfig=/etc/kubernetes/kubelet.conf",
            "--kubeconfig=/etc/kubernetes/kubelet.conf \\\n    --container-runtime-endpoint "
            "unix:///run/containerd/containerd.sock"),
        "etc/kubernetes/kubelet.conf": KUBECONFIG,
    }
    ctl = ctl_for(layout)
    original = snapshot(ctl.root)
    assert ctl.status()["source"]["detail"].startswith("flag --container-runtime-endpoint in ExecStart=")
    assert ctl("enable") == 0, ctl.err
    assert "systemctl daemon-reload && systemctl restart kubelet" in ctl.out
    dropin = read(ctl.root, "etc/systemd/system/kubelet.service.d/99-anolisnuma-endpoint.conf")
    assert "ExecStart=\n" in dropin and f"--container-runtime-endpoint unix://{ctl.socket}" in dropin
    assert read(ctl.root, "usr/lib/systemd/system/kubelet.service") == layout["usr/lib/systemd/system/kubelet.service"]
    st = ctl.status()
    assert st["ours"] and st["dropins"] == ["/etc/systemd/system/kubelet.service.d/99-anolisnuma-endpoint.conf"]
    assert ctl("enable") == 0 and "nothing changed" in ctl.out
    assert ctl("disable") == 0, ctl.err
    assert "removed /etc/systemd/system/kubelet.service.d/99-anolisnuma-endpoint.conf" in ctl.out
    assert snapshot(ctl.root) == original  # the drop-in directories it made are gone too


def test_no_kubelet_unit_uses_the_default_config_path(ctl_for):
    ctl = ctl_for({"var/lib/kubelet/config.yaml": KUBEADM_CONFIG_WITH_KEY})
    st = ctl.status()
    assert st["unit"] is None and st["config_file"] == "/var/lib/kubelet/config.yaml"
    assert st["source"]["kind"] == "config"
    assert any("no kubelet.service" in w for w in st["warnings"])
    original = snapshot(ctl.root)
    assert ctl("enable") == 0, ctl.err
    assert ctl.status()["ours"]
    assert ctl("disable") == 0
    assert snapshot(ctl.root) == original


def test_nothing_to_edit_is_refused_with_one_line(ctl_for):
    ctl = ctl_for({"etc/hostname": "node1\n"})
    original = snapshot(ctl.root)
    assert ctl("enable") == 1
    assert "cannot find a safe way" in ctl.err and len(ctl.err.strip().splitlines()) == 1
    assert snapshot(ctl.root) == original


def test_config_dir_dropin_that_sets_the_key_is_the_one_edited(ctl_for):
    layout = dict(KUBEADM_CONFIG)
    layout["etc/sysconfig/kubelet"] = 'KUBELET_EXTRA_ARGS="--config-dir=/etc/kubernetes/kubelet.conf.d"\n'
    layout["etc/kubernetes/kubelet.conf.d/10-cri.conf"] = (
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
        "containerRuntimeEndpoint: unix:///run/containerd/containerd.sock\n")
    layout["etc/kubernetes/kubelet.conf.d/20-other.conf"] = (
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmaxPods: 200\n")
    ctl = ctl_for(layout)
    original = snapshot(ctl.root)
    st = ctl.status()
    assert st["source"]["kind"] == "config-dir" and st["source"]["path"] == "/etc/kubernetes/kubelet.conf.d/10-cri.conf"
    assert [s["kind"] for s in st["overridden"]] == ["config"]
    assert ctl("enable") == 0, ctl.err
    assert read(ctl.root, "var/lib/kubelet/config.yaml") == KUBEADM_CONFIG_WITH_KEY
    assert f"containerRuntimeEndpoint: unix://{ctl.socket}\n" in read(ctl.root, "etc/kubernetes/kubelet.conf.d/10-cri.conf")
    assert ctl.status()["ours"]
    assert ctl("disable") == 0
    assert snapshot(ctl.root) == original


def test_socket_and_runtime_from_anolisnuma_config(ctl_for):
    """Without --socket the socket is server.listen of /etc/anolisnuma/config.toml; a kubelet
    on another runtime than runtime.endpoint is not switched (its pods would be lost)."""
    layout = dict(KUBEADM_FLAG)
    ctl = ctl_for(layout)
    config = os.path.join(ctl.root, "etc/anolisnuma/config.toml")
    os.makedirs(os.path.dirname(config))
    with open(config, "w") as f:
        f.write(f'[server]\nlisten = "{ctl.socket}"\n[runtime]\nendpoint = "/run/crio/crio.sock"\n')
    original = snapshot(ctl.root)
    assert ctl("enable", no_socket=True) == 1
    assert "anolisnuma forwards to /run/crio/crio.sock" in ctl.err and len(ctl.err.strip().splitlines()) == 1
    assert snapshot(ctl.root) == original
    assert ctl("status", no_socket=True) == 0 and "forwards to" in ctl.out and "refuses" in ctl.out

    with open(config, "w") as f:
        f.write(f'[server]\nlisten = "{ctl.socket}"\n[runtime]\nendpoint = "/var/run/containerd/containerd.sock"\n')
    original = snapshot(ctl.root)
    assert ctl("enable", no_socket=True) == 0, ctl.err
    assert ctl("status", "-o", "json", no_socket=True) == 0
    st = json.loads(ctl.out)
    assert st["ours"] and st["socket"] == ctl.socket and st["warnings"] == []
    assert ctl("disable", no_socket=True) == 0
    assert snapshot(ctl.root) == original


# -- files that change behind our back ----------------------------------------------------------


def test_disable_undoes_the_edit_in_a_file_changed_since(ctl_for):
    ctl = ctl_for(KUBEADM_FLAG)
    flags = os.path.join(ctl.root, "var/lib/kubelet/kubeadm-flags.env")
    assert ctl("enable") == 0
    with open(flags) as f:
        text = f.read()
    with open(flags, "w") as f:  # someone adds a flag after the switch
        f.write(text.replace('"\n', ' --node-ip=10.0.0.7"\n'))
    assert ctl("disable") == 0, ctl.err
    assert "undid the edit" in ctl.out
    assert read(ctl.root, "var/lib/kubelet/kubeadm-flags.env") == KUBEADM_FLAG[
        "var/lib/kubelet/kubeadm-flags.env"].replace('"\n', ' --node-ip=10.0.0.7"\n')
    assert not os.path.exists(os.path.join(ctl.root, "var/lib/anolisnuma"))


def test_disable_undoes_a_config_key_and_an_added_flag_in_changed_files(ctl_for):
    ctl = ctl_for(KUBEADM_CONFIG)
    config = os.path.join(ctl.root, "var/lib/kubelet/config.yaml")
    assert ctl("enable") == 0
    with open(config, "a") as f:
        f.write("maxPods: 250\n")
    assert ctl("disable") == 0, ctl.err
    assert "undid the edit" in ctl.out
    assert read(ctl.root, "var/lib/kubelet/config.yaml") == KUBEADM_CONFIG_WITH_KEY + "maxPods: 250\n"

    layout = dict(PLAIN_RPM)
    layout["etc/sysconfig/kubelet"] = RPM_SYSCONFIG_WITH_CONFIG
    layout["etc/kubernetes/kubelet-config.yaml"] = RPM_KUBELET_CONFIG
    shutil.rmtree(ctl.root)
    os.makedirs(ctl.root)
    build(ctl.root, layout)
    sysconfig = os.path.join(ctl.root, "etc/sysconfig/kubelet")
    assert ctl("enable") == 0
    with open(sysconfig) as f:
        text = f.read()
    with open(sysconfig, "w") as f:
        f.write("# edited by hand\n" + text)
    assert ctl("disable") == 0, ctl.err
    assert read(ctl.root, "etc/sysconfig/kubelet") == "# edited by hand\n" + RPM_SYSCONFIG_WITH_CONFIG


def test_a_changed_dropin_of_ours_is_left_and_reported(ctl_for):
    layout = {
        "usr/lib/systemd/system/kubelet.service": RPM_KUBELET_SERVICE.replace(
            "$KUBELET_EXTRA_ARGS", "--container-runtime-endpoint=unix:///run/containerd/containerd.sock"),
    }
    ctl = ctl_for(layout)
    assert ctl("enable") == 0, ctl.err
    dropin = os.path.join(ctl.root, "etc/systemd/system/kubelet.service.d/99-anolisnuma-endpoint.conf")
    with open(dropin, "a") as f:
        f.write("Environment=FOO=bar\n")
    assert ctl("disable") == 1
    assert "left /etc/systemd/system/kubelet.service.d/99-anolisnuma-endpoint.conf" in ctl.out
    assert os.path.exists(dropin)
    assert ctl.status()["switched"] is True  # the manifest stays for what is left
    os.unlink(dropin)
    assert ctl("disable") == 0, ctl.err
    assert not os.path.exists(os.path.join(ctl.root, "var/lib/anolisnuma"))


def test_switch_undone_by_kubeadm_is_reported_and_enable_again_works(ctl_for):
    ctl = ctl_for(KUBEADM_FLAG)
    flags = os.path.join(ctl.root, "var/lib/kubelet/kubeadm-flags.env")
    assert ctl("enable") == 0
    rewritten = 'KUBELET_KUBEADM_ARGS="--container-runtime-endpoint=unix:///run/containerd/containerd.sock"\n'
    with open(flags, "w") as f:  # kubeadm upgrade writes the file anew
        f.write(rewritten)
    st = ctl.status()
    assert st["ours"] is False and st["switched"] is True
    assert any("no longer points at anolisnuma" in w for w in st["warnings"])
    table_rc = ctl("status")
    assert table_rc == 0 and "run `enable` again" in ctl.out
    assert ctl("enable") == 0 and ctl.status()["ours"]
    assert ctl("disable") == 0
    assert read(ctl.root, "var/lib/kubelet/kubeadm-flags.env") == rewritten  # today's original


def test_disable_refuses_a_switch_made_by_hand(ctl_for):
    ctl = ctl_for(KUBEADM_FLAG)
    flags = os.path.join(ctl.root, "var/lib/kubelet/kubeadm-flags.env")
    with open(flags, "w") as f:
        f.write(f'KUBELET_KUBEADM_ARGS="--container-runtime-endpoint=unix://{ctl.socket}"\n')
    assert ctl("enable") == 0 and "already uses" in ctl.out
    assert not os.path.exists(os.path.join(ctl.root, "var/lib/anolisnuma"))
    assert ctl("disable") == 1
    assert "not set by" in ctl.err and len(ctl.err.strip().splitlines()) == 1


def test_restart_is_refused_below_a_scratch_root(ctl_for):
    ctl = ctl_for(KUBEADM_FLAG)
    assert ctl("enable", "--restart") == 1
    assert "--restart only works with --root /" in ctl.err
    assert ctl.status()["ours"]  # the switch itself was made


# -- output -----------------------------------------------------------------------------


def test_status_table_and_main_cli_registration(ctl_for):
    ctl = ctl_for(KUBEADM_FLAG)
    assert ctl("status") == 0
    for label in ("endpoint", "source", "ours", "our socket", "unit", "config file", "switched"):
        assert any(line.startswith(label + " ") for line in ctl.out.splitlines()), label
    assert "kubeadm-flags.env" in ctl.out and "answers" in ctl.out

    # Registered the way the main anolisnuma-ctl does, next to a global -o of its own.
    parser = argparse.ArgumentParser(prog="anolisnuma-ctl")
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table")
    subparsers = parser.add_subparsers(dest="command")
    cli.add_parser(subparsers)
    args = parser.parse_args(["-o", "json", "kubelet", "status", "--root", ctl.root, "--socket", ctl.socket])
    ctl.capsys.readouterr()
    assert args.func(args) == 0
    assert json.loads(ctl.capsys.readouterr().out)["source"]["kind"] == "flag"
    args = parser.parse_args(["kubelet", "status", "--root", ctl.root, "--socket", ctl.socket])
    assert args.output == "table"


# -- parsers -------------------------------------------------------------------------------


def test_environment_file_parsing_follows_systemd():
    text = textwrap.dedent('''\
        # comment with = sign
        A=plain value   
        B="double \\"quoted\\" $HOME"
        C='single # not a comment'
        D="""
          --config=/etc/k.yaml
          --v=2
        """
        E=one \\
        two
        ; another comment
        F=
        bad line
    ''')
    values = {a.key: a.value for a in parse_env_file(text)}
    assert values == {
        "A": "plain value",
        "B": 'double "quoted" $HOME',
        "C": "single # not a comment",
        "D": "\n  --config=/etc/k.yaml\n  --v=2\n",
        "E": "one two",
        "F": "",
    }
    assert split_words(values["D"]) == ["--config=/etc/k.yaml", "--v=2"]


def test_unit_parsing_continuations_and_sections():
    text = "[Unit]\nExecStart=/not/service\n[Service]\nExecStart=/usr/bin/kubelet \\\n# skipped\n  --v=2\n"
    settings = parse_unit(text, "/x.service")
    assert [s.key for s in settings] == ["ExecStart"]
    assert split_words(settings[0].value) == ["/usr/bin/kubelet", "--v=2"]
    assert text[settings[0].start:settings[0].end] == "ExecStart=/usr/bin/kubelet \\\n# skipped\n  --v=2\n"


def test_endpoint_comparison():
    assert same_socket("unix:///var/run/anolisnuma/anolisnuma.sock", "/run/anolisnuma/anolisnuma.sock")
    assert same_socket("/run/x.sock", "unix:///run/./x.sock")
    assert not same_socket("tcp://127.0.0.1:1234", "/run/x.sock")
    assert not same_socket(CONTAINERD, "/var/run/anolisnuma/anolisnuma.sock")
