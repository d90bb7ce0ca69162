"""A node and an admin's shell for running docs/cluster.md's install and worked session as
written (tests/cluster/test_walkthrough.py; the document's steps: ``doc_walkthrough.py``).

:class:`WalkthroughNode` is node ``worker-1`` as the document has it: anolisnuma installed
(its configuration file in ``<base>/etc/anolisnuma``, standing for ``/etc/anolisnuma``: the
shipped config.toml with the node's own paths and sockets set in it, the link off as
shipped; the document's keys are set in it as a person edits it, ``config_edit.py``), run as its own process by ``systemctl restart anolisnuma`` in front
of a FakeCri with 4 NUMA nodes of 16 CPUs, and a :class:`StandInKubelet` running the pods
bound to it. Commands run in one of two shells (bash), each with commands of its own first
on its PATH:

- ``admin``: the cluster's kubectl with the admin's kubeconfig, and ``ssh root@worker-1
  CMD``, which runs CMD in the node's shell (as ssh would);
- ``node`` (root on worker-1): ``anolisnuma-ctl`` (reading the configuration file there),
  and ``systemctl restart anolisnuma``.

The example's values in the document are replaced by the test's own
(:meth:`WalkthroughNode.substitute`). ``python -m anolisnuma.testing.walkthrough_node
systemctl|ssh ARGS`` are the commands' own implementations.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from typing import Any, Dict, List, Optional

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the Python 3.9/3.10 nodes
    import tomli as tomllib

from anolisnuma.testing import config_edit
from anolisnuma.testing.fake_cri import FakeCri
from anolisnuma.testing.fake_sysfs import GIB, FakeTopology
from anolisnuma.testing.kube_apiserver import PrivateControlPlane
from anolisnuma.testing.proxy import REPO_ROOT, config_dict, to_toml, wait_for_socket
from anolisnuma.testing.stand_in_kubelet import StandInKubelet
from anolisnuma.testing.waiting import wait_until

NODE = "worker-1"
# the document's worker-1: 4 NUMA nodes of 16 CPUs
TOPOLOGY = FakeTopology(name="4x16", node_cpus={0: "0-15", 1: "16-31", 2: "32-47", 3: "48-63"},
                        distances=[[10 if a == b else 20 for b in range(4)] for a in range(4)],
                        memory_bytes={n: 16 * GIB for n in range(4)})
EXAMPLE_SERVER = "https://10.0.0.10:6443"
EXAMPLE_ETC = "/etc/anolisnuma"
PID_FILE = "anolisnuma.pid"
DAEMON_LOG = "anolisnuma.stderr"


class WalkthroughNode:
    """``WalkthroughNode(cp, base, sockdir)``: :meth:`start`, :meth:`run`, :meth:`close`."""

    def __init__(self, cp: PrivateControlPlane, base: str, sockdir: str) -> None:
        self.cp = cp
        self.base = base
        self.etc = os.path.join(base, "etc", "anolisnuma")
        self.config_path = os.path.join(self.etc, "config.toml")
        self.daemon_log = os.path.join(base, DAEMON_LOG)
        self.admin_dir = os.path.join(base, "admin")       # the admin's working directory
        self.socket = os.path.join(sockdir, "cri.sock")
        self.admin_socket = os.path.join(sockdir, "admin.sock")
        self.fake = FakeCri(os.path.join(sockdir, "containerd.sock"), containers=0, sandboxes=0)
        self.kubelet: Optional[StandInKubelet] = None
        self.config: Dict[str, Any] = {}

    # ------------------------------------------------------------------ setting up
    def start(self) -> "WalkthroughNode":
        os.makedirs(self.etc, exist_ok=True)
        os.makedirs(self.admin_dir, exist_ok=True)
        os.symlink(os.path.join(REPO_ROOT, "deploy"), os.path.join(self.admin_dir, "deploy"))
        self.fake.start()
        self.config = config_dict(self.base, self.fake.socket_path, listen=self.socket, extra={
            "log": {"stderr": False},
            "admin": {"socket": self.admin_socket},
            "runtime": {"resync_interval_seconds": 0.0},
            "numa": {"node_name": NODE},          # (the host's name)
        })
        TOPOLOGY.write(self.config["paths"]["sys_root"])
        self._write_config()
        self._write_commands()
        self.restart_daemon()
        self.kubelet = StandInKubelet(self.cp, NODE, "unix://" + self.socket).start()
        return self

    def _write_config(self) -> None:
        """The shipped config.toml, with this stand-in node's own paths and sockets set in
        it as :meth:`edit_config` sets the document's keys."""
        with open(os.path.join(REPO_ROOT, "config.toml")) as f:
            shipped = f.read()
        with open(self.config_path, "w") as f:
            f.write(config_edit.edit(shipped, to_toml(self.config)))

    def edit_config(self, toml_text: str) -> None:
        """Set the keys of ``toml_text`` in the configuration file as an operator edits it:
        in the sections the file has (``config_edit.edit``; a table declared twice, or a
        key that does not end up set, fails)."""
        with open(self.config_path) as f:
            text = config_edit.edit(f.read(), toml_text)
        with open(self.config_path, "w") as f:
            f.write(text)
        self.config = tomllib.loads(text)

    def _write_commands(self) -> None:
        for role, commands in (("admin", {"ssh": "ssh"}), ("node", {"systemctl": "systemctl"})):
            bin_dir = os.path.join(self.base, f"bin-{role}")
            os.makedirs(bin_dir, exist_ok=True)
            for name, verb in commands.items():
                _script(os.path.join(bin_dir, name),
                        f'exec {shlex.quote(sys.executable)} -m anolisnuma.testing.walkthrough_node {verb} "$@"')
        _script(os.path.join(self.base, "bin-node", "anolisnuma-ctl"),
                f'exec {shlex.quote(sys.executable)} -m anolisnuma.ctl.main -c {shlex.quote(self.config_path)} "$@"')

    # ------------------------------------------------------------------ the shells
    def env(self, role: str) -> Dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
        env["HOME"] = os.path.join(self.base, f"home-{role}")      # (kubectl's cache)
        env["WALK_NODE_BASE"] = self.base
        env["WALK_NODE_SOCKET"] = self.socket
        env["WALK_NODE_PATH"] = os.path.join(self.base, "bin-node") + os.pathsep + env["PATH"]
        env.pop("KUBECONFIG", None)
        if role == "admin":
            env["PATH"] = os.pathsep.join((os.path.join(self.base, "bin-admin"), self.cp.bin_dir, env["PATH"]))
            env["KUBECONFIG"] = self.cp.admin_kubeconfig
        else:
            env["PATH"] = env["WALK_NODE_PATH"]
        return env

    def cwd(self, role: str) -> str:
        return self.admin_dir if role == "admin" else self.base

    def substitute(self, text: str) -> str:
        """The document's example values as this node has them: the API server's address
        and /etc/anolisnuma (the install shows the node policy of the tests' v1.26 as it is)."""
        return text.replace(EXAMPLE_SERVER, self.cp.server).replace(EXAMPLE_ETC, self.etc)

    def run(self, role: str, script: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
        """``script`` in ``role``'s shell (bash, -e, pipefail)."""
        return subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=self.cwd(role),
                              env=self.env(role), capture_output=True, text=True, timeout=timeout)

    # ------------------------------------------------------------------ the daemon
    def daemon_pid(self) -> Optional[int]:
        return _daemon_pid(self.base)

    def stop_daemon(self) -> None:
        stop_daemon(self.base)

    def restart_daemon(self) -> None:
        """What ``systemctl restart anolisnuma`` does (:func:`restart_daemon`)."""
        restart_daemon(self.env("node"))

    def logs(self, size: int = 3000) -> str:
        """The end of the daemon's stderr and log file, and the stand-in kubelet's last error
        (for a failure's message)."""
        out = []
        for path in (self.daemon_log, self.config.get("log", {}).get("file", "")):
            try:
                with open(path, "rb") as f:
                    out.append(f"--- {path}\n" + f.read()[-size:].decode(errors="replace"))
            except OSError:
                pass
        if self.kubelet is not None and self.kubelet.last_error:
            out.append(f"--- stand-in kubelet: {self.kubelet.errors} errors, the last: {self.kubelet.last_error}")
        return "\n".join(out)

    def close(self) -> List[str]:
        """Stop everything; what could not be stopped."""
        problems = []
        if self.kubelet is not None:
            self.kubelet.stop()
        try:
            self.stop_daemon()
        except AssertionError as e:
            problems.append(str(e))
            pid = self.daemon_pid()
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
        self.fake.stop(0)
        return problems


def _daemon_pid(base: str) -> Optional[int]:
    try:
        with open(os.path.join(base, PID_FILE)) as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def stop_daemon(base: str) -> None:
    pid = _daemon_pid(base)
    if pid is None or not _alive(pid):
        return
    os.kill(pid, signal.SIGTERM)
    wait_until(lambda: not _alive(pid), "the daemon stopped", timeout=20)


def restart_daemon(env: Dict[str, str]) -> None:
    """Stop the node's daemon, start it again (``python -m anolisnuma -c
    <etc>/config.toml``, a process of its own, as the unit runs it), wait for its socket.
    ``env``: the node shell's (``WALK_NODE_BASE``, ``WALK_NODE_SOCKET``)."""
    base = env["WALK_NODE_BASE"]
    stop_daemon(base)
    config = os.path.join(base, "etc", "anolisnuma", "config.toml")
    with open(os.path.join(base, DAEMON_LOG), "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "anolisnuma", "-c", config], stdout=log, stderr=log,
                                stdin=subprocess.DEVNULL, cwd=base, env=env, start_new_session=True)
    with open(os.path.join(base, PID_FILE), "w") as f:
        f.write(str(proc.pid))
    try:
        wait_for_socket(env["WALK_NODE_SOCKET"], 30, alive=lambda: proc.poll() is None)
    except Exception as e:
        raise RuntimeError(f"{e}; exit code {proc.poll()}; see {os.path.join(base, DAEMON_LOG)}") from e


def _alive(pid: int) -> bool:
    """The process runs (a zombie left to init does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _script(path: str, line: str) -> None:
    with open(path, "w") as f:
        f.write("#!/bin/sh\n" + line + "\n")
    os.chmod(path, 0o755)


def main(argv: List[str]) -> int:
    """The node's ``systemctl`` and the admin's ``ssh`` (see the module docstring)."""
    verb, args = argv[0], argv[1:]
    base = os.environ["WALK_NODE_BASE"]
    if verb == "systemctl":
        if args != ["restart", "anolisnuma"]:
            print(f"systemctl {' '.join(args)}: the walk-through's node knows only `restart anolisnuma`",
                  file=sys.stderr)
            return 1
        restart_daemon(dict(os.environ))
        return 0
    if verb == "ssh":
        if len(args) < 2 or args[0] != f"root@{NODE}":
            print(f"ssh {' '.join(args)}: the walk-through's admin reaches only root@{NODE}", file=sys.stderr)
            return 255
        env = dict(os.environ, PATH=os.environ["WALK_NODE_PATH"])
        env.pop("KUBECONFIG", None)
        return subprocess.run(["bash", "-c", " ".join(args[1:])], env=env, cwd=base).returncode
    print(f"unknown command {verb}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
