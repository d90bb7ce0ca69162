"""The admin surface reads the daemon only through admin/daemon_view.py's protocol: the
daemon must keep that shape (an attribute renamed in daemon.py fails here, not in a
status command on a node)."""

from __future__ import annotations

import os

from anolisnuma.admin.daemon_view import DaemonView
from anolisnuma.config import Config
from anolisnuma.daemon import Daemon
from anolisnuma.testing.proxy import config_dict


def test_the_daemon_has_the_shape_the_admin_surface_reads(tmp_path):
    daemon = Daemon(Config.from_dict(config_dict(tmp_path, os.path.join(tmp_path, "containerd.sock"))), hooks=[])
    try:
        assert isinstance(daemon, DaemonView)
    finally:
        daemon.executor.shutdown(wait=False)
        daemon.reload_pool.shutdown(wait=False)


def test_an_object_without_a_member_is_not_a_view():
    class Partial:
        config = store = hooks = interceptor = relay = controllers = runtime_resync = cluster = None
        ready = resynced = False

    assert not isinstance(Partial(), DaemonView)
