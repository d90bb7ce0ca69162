"""The systemd units of rpm/ as they are in the checkout (no rpm build needed): the socket
unit and the service that takes its socket over, checked with ``systemd-analyze verify``
in a scratch root (the host's units, stand-ins for the binaries ExecStart names), and the
settings that make a restart refuse no connection."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import List

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RPM = os.path.join(REPO, "rpm")


def unit_lines(path: str) -> List[str]:
    with open(path) as f:
        return [line.strip() for line in f if line.strip() and not line.startswith(("#", ";"))]


def scratch_root(tmp: str) -> str:
    """The host's units (sysinit.target ...), ours, and executables at the paths the units
    name (verify checks that they exist); /bin as on merged-/usr distributions."""
    root = os.path.join(tmp, "vroot")
    units = os.path.join(root, "usr/lib/systemd/system")
    host_units = "/usr/lib/systemd/system" if os.path.isdir("/usr/lib/systemd/system/") else "/lib/systemd/system"
    shutil.copytree(host_units, units, symlinks=True)
    os.makedirs(os.path.join(root, "usr/bin"))
    os.makedirs(os.path.join(root, "etc/systemd/system"))
    os.symlink("usr/bin", os.path.join(root, "bin"))
    for name in ("anolisnuma.service", "anolisnuma.socket"):
        shutil.copy2(os.path.join(RPM, name), units)
    for exe in ("anolisnuma", "anolisnuma-ctl"):
        with open(os.path.join(root, "usr/bin", exe), "w") as f:
            f.write("#!/bin/sh\n")
        os.chmod(os.path.join(root, "usr/bin", exe), 0o755)
    shutil.copy2(os.path.realpath(shutil.which("kill") or "/bin/kill"), os.path.join(root, "usr/bin/kill"))
    return root


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="no systemd-analyze on this machine")
def test_both_units_verify(tmp_path):
    root = scratch_root(str(tmp_path))
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", f"--root={root}", "anolisnuma.socket",
                        "anolisnuma.service"], capture_output=True, text=True, timeout=60)
    # verify exits 0 on settings it ignores (a misspelled key): any word about our units fails.
    assert r.returncode == 0 and "anolisnuma" not in r.stdout + r.stderr, r.stdout + r.stderr


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="no systemd-analyze on this machine")
def test_verify_would_catch_a_misspelled_key(tmp_path):
    """The check above has teeth: an unknown key in the socket unit is reported."""
    root = scratch_root(str(tmp_path))
    path = os.path.join(root, "usr/lib/systemd/system/anolisnuma.socket")
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(text.replace("Backlog=", "Backlg="))
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", f"--root={root}", "anolisnuma.socket"],
                       capture_output=True, text=True, timeout=60)
    assert "Backlg" in r.stdout + r.stderr


def test_socket_unit_holds_the_configured_path():
    lines = unit_lines(os.path.join(RPM, "anolisnuma.socket"))
    listen = [line.split("=", 1)[1] for line in lines if line.startswith("ListenStream=")]
    with open(os.path.join(REPO, "config.toml")) as f:
        configured = re.search(r'^listen = "([^"]*)"', f.read(), re.M).group(1)
    # /var/run is /run: systemd wants the /run spelling, the kubelet may use either.
    assert listen == [configured.replace("/var/run/", "/run/", 1)]
    for line in ["SocketMode=0660", "Service=anolisnuma.service", "WantedBy=sockets.target", "Backlog=4096"]:
        assert line in lines, line
    assert not [line for line in lines if line.startswith("Accept=") and line != "Accept=no"]


def test_service_takes_the_socket_and_restarts_without_touching_it():
    lines = unit_lines(os.path.join(RPM, "anolisnuma.service"))
    for line in ["Requires=anolisnuma.socket", "Type=notify", "Restart=always", "RestartSec=1",
                 "KillSignal=SIGTERM", "Also=anolisnuma.socket"]:
        assert line in lines, line
    after = " ".join(line.split("=", 1)[1] for line in lines if line.startswith("After="))
    assert "anolisnuma.socket" in after.split()
    # Nothing binds the service's restarts to the kubelet or the socket's to the service.
    assert not [line for line in lines if line.startswith(("BindsTo=", "PartOf=", "RequiredBy="))]
    # The grace the daemon waits for calls in flight fits in systemd's stop timeout.
    stop = [int(line.split("=", 1)[1]) for line in lines if line.startswith("TimeoutStopSec=")]
    with open(os.path.join(REPO, "config.toml")) as f:
        grace = float(re.search(r"^shutdown_grace_seconds = ([0-9.]+)", f.read(), re.M).group(1))
    assert stop and stop[0] > grace * 2


def test_spec_restarts_only_the_service_on_upgrade():
    with open(os.path.join(RPM, "anolisnuma.spec")) as f:
        spec = f.read()
    postun = spec[spec.index("%postun"):]
    assert "systemctl try-restart anolisnuma.service" in postun
    # The socket is never restarted or stopped on an upgrade: that would drop its backlog.
    verbs = re.findall(r"systemctl (?:--\S+ )*(\S+) [^\n]*anolisnuma\.socket", spec)
    assert verbs and set(verbs) <= {"preset", "enable", "disable", "is-active", "is-enabled"}, verbs
    assert "install -m 0644 rpm/anolisnuma.socket" in spec
    assert "/usr/lib/systemd/system/anolisnuma.socket" in spec.split("%files", 1)[1]
    assert "preset anolisnuma.socket anolisnuma.service" in spec
    assert "cp -r deploy %{buildroot}/usr/share/anolisnuma/deploy" in spec


def test_kubelet_dropin_sample_wants_the_socket():
    lines = unit_lines(os.path.join(RPM, "kubelet-99-anolisnuma-endpoint.conf"))
    assert "Wants=anolisnuma.socket anolisnuma.service" in lines
    assert "After=anolisnuma.socket anolisnuma.service" in lines
    assert not [line for line in lines if line.startswith(("Requires=", "BindsTo="))]
