"""The start-up refuses directories (and a configuration file) that someone other than root
may change: the daemon, as root, would read what they planted there."""

from __future__ import annotations

import os

import pytest

from anolisnuma.config import Config
from anolisnuma.configfile import ConfigError
from anolisnuma.preflight import check_owners, check_writable_paths
from anolisnuma.testing.proxy import REPO_ROOT, config_dict, run_cli, write_config

NOBODY = 65534


def node(tmp_path, admin: bool = True) -> Config:
    """A configuration with every path under ``tmp_path``, its directories made as the
    daemon makes them (0755 under the usual umask), and the file written (0644)."""
    extra = {"admin": {"socket": str(tmp_path / "admin" / "admin.sock")}} if admin else None
    data = config_dict(str(tmp_path), "/run/containerd/containerd.sock", extra=extra)
    cfg = Config.load(write_config(str(tmp_path / "etc" / "config.toml"), data))
    check_writable_paths(cfg)
    return cfg


def refusal(cfg: Config) -> str:
    with pytest.raises(ConfigError) as e:
        check_owners(cfg)
    return str(e.value)


def test_the_directories_the_daemon_makes_pass(tmp_path):
    cfg = node(tmp_path)
    check_owners(cfg)
    os.chmod(tmp_path / "log", 0o775)   # writable by root's group only
    check_owners(cfg)


@pytest.mark.parametrize("where,mode,key", [
    ("state", 0o777, "paths.state_dir"),
    ("log", 0o757, "log.file"),
    ("run", 0o1777, "server.listen"),   # the sticky bit excuses a directory above, not the daemon's own
    ("admin", 0o777, "admin.socket"),
    ("etc", 0o777, "configuration file"),
    ("etc/config.toml", 0o646, "configuration file"),
])
def test_a_path_writable_by_every_user_is_refused(tmp_path, where, mode, key):
    cfg = node(tmp_path)
    path = str(tmp_path / where)
    os.chmod(path, mode)
    message = refusal(cfg)
    assert message.startswith(f"{key}: {path} ")   # for etc/: "(above .../config.toml)" follows
    assert message.endswith(f" is writable by every user (mode {mode:04o}): whoever may write there may swap "
                            f"what the daemon reads and writes as root; fix: chmod go-w {path}")


def test_a_path_writable_by_a_group_other_than_root_is_refused(tmp_path):
    cfg = node(tmp_path)
    path = str(tmp_path / "state")
    os.chown(path, 0, NOBODY)
    os.chmod(path, 0o770)
    assert refusal(cfg).startswith(f"paths.state_dir: {path} is writable by group {NOBODY} (mode 0770)")


@pytest.mark.parametrize("where,key", [("state", "paths.state_dir"), ("etc/config.toml", "configuration file")])
def test_a_path_owned_by_another_user_is_refused(tmp_path, where, key):
    cfg = node(tmp_path)
    path = str(tmp_path / where)
    os.chown(path, NOBODY, 0)
    assert refusal(cfg).startswith(f"{key}: {path} is owned by uid {NOBODY}, not root:")
    assert refusal(cfg).endswith(f"; fix: chown root {path}")


def test_a_directory_above_writable_by_others_is_refused_unless_sticky(tmp_path):
    cfg = node(tmp_path, admin=False)
    os.chmod(tmp_path, 0o777)
    listen_dir = str(tmp_path / "run")
    assert refusal(cfg).startswith(f"server.listen: {tmp_path} (above {listen_dir}) is writable by every user")
    os.chmod(tmp_path, 0o1777)   # as /tmp: nobody may rename what is not theirs
    check_owners(cfg)


def test_a_symbolic_link_is_followed_to_the_directory_it_names(tmp_path):
    cfg = node(tmp_path, admin=False)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "state").mkdir(parents=True)
    os.rmdir(cfg.paths.state_dir)
    os.symlink(elsewhere / "state", cfg.paths.state_dir)
    check_owners(cfg)
    os.chmod(elsewhere, 0o777)   # above the link's target, not above the configured path
    assert refusal(cfg).startswith(f"paths.state_dir: {elsewhere} (above {cfg.paths.state_dir}) is writable by "
                                   "every user")


def test_the_rpm_layout_passes(tmp_path):
    """The modes the rpm installs (rpm/anolisnuma.spec: /etc/anolisnuma by install -d,
    0755; /var/lib/anolisnuma 0700; config.toml 0644) and the ones the daemon makes
    (/var/run/anolisnuma 0755) under a root like a node's (/var/log, /run: 0755)."""
    with open(os.path.join(REPO_ROOT, "rpm", "anolisnuma.spec")) as f:
        assert "%dir %attr(0700,root,root) /var/lib/anolisnuma" in f.read()
    root = tmp_path / "node"
    for d, mode in (("etc/anolisnuma", 0o755), ("var/lib/anolisnuma", 0o700), ("var/log", 0o755),
                    ("run/anolisnuma", 0o755)):
        os.makedirs(root / d)
        os.chmod(root / d, mode)
    with open(os.path.join(REPO_ROOT, "config.toml")) as f:
        text = f.read()
    for path in ("/var/run/anolisnuma", "/var/lib/anolisnuma", "/var/log"):
        text = text.replace(f'"{path}', f'"{root}{path.replace("/var/run", "/run")}')
    (root / "etc/anolisnuma/config.toml").write_text(text)
    cfg = Config.load(str(root / "etc/anolisnuma/config.toml"))
    assert cfg.paths.state_dir == f"{root}/var/lib/anolisnuma" and cfg.log.file.startswith(str(root))
    assert cfg.server.listen.startswith(f"{root}/run/anolisnuma/")
    check_owners(cfg)


def test_the_daemon_refuses_to_start_with_exit_2_naming_the_path(tmp_path):
    data = config_dict(str(tmp_path), "/run/containerd/containerd.sock")
    os.makedirs(data["paths"]["state_dir"])
    os.chmod(data["paths"]["state_dir"], 0o777)
    r = run_cli(["-c", write_config(str(tmp_path / "c.toml"), data)], timeout=20)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(f"anolisnuma: invalid configuration: paths.state_dir: {data['paths']['state_dir']} "
                               "is writable by every user (mode 0777)")
    assert "Traceback" not in r.stderr


# ------------------------------------------------------------------ POSIX ACLs

def set_acl(path: str, *named: tuple, mask: int = 7, default: bool = False) -> None:
    """``setfacl -m`` as the kernel stores it: owner rwx, group r-x, others r-x, the
    ``named`` (tag, perm, id) entries (tag 2 a user, 8 a group) and ``mask``."""
    import struct

    entries = [(1, 7, 0xFFFFFFFF), *named, (4, 5, 0xFFFFFFFF), (0x10, mask, 0xFFFFFFFF), (0x20, 5, 0xFFFFFFFF)]
    data = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in sorted(entries))
    try:
        os.setxattr(path, "system.posix_acl_default" if default else "system.posix_acl_access", data)
    except OSError as e:
        pytest.skip(f"no POSIX ACLs on this file system: {e.strerror}")


def test_a_write_acl_for_another_user_or_group_is_refused_as_mode_bits_are(tmp_path):
    cfg = node(tmp_path)
    state = str(tmp_path / "state")
    set_acl(state, (2, 7, 1000))
    assert refusal(cfg) == (f"paths.state_dir: {state} is writable by uid 1000 through a POSIX ACL: whoever may "
                            f"write there may swap what the daemon reads and writes as root; fix: setfacl -x u:1000 "
                            f"{state}")
    set_acl(state, (8, 6, 50))
    assert "writable by gid 50 through a POSIX ACL" in refusal(cfg) and "setfacl -x g:50" in refusal(cfg)
    set_acl(str(tmp_path / "etc" / "config.toml"), (2, 6, 1000))
    set_acl(state, (2, 5, 1000))   # read and enter only
    assert refusal(cfg).startswith(f"configuration file: {tmp_path}/etc/config.toml is writable by uid 1000 "
                                   "through a POSIX ACL")


def test_an_acl_that_grants_no_write_passes(tmp_path):
    cfg = node(tmp_path)
    set_acl(str(tmp_path / "state"), (2, 5, 1000), (8, 7, 0))    # read for a user, write for root's group
    set_acl(str(tmp_path / "log"), (2, 7, 1000), mask=5)          # the mask takes the write away
    set_acl(str(tmp_path / "etc" / "config.toml"), (2, 4, 1000))
    check_owners(cfg)


def test_a_default_acl_granting_write_where_the_daemon_creates_files_is_refused(tmp_path):
    """The socket the daemon binds there would inherit it: that user could connect."""
    cfg = node(tmp_path)
    run = str(tmp_path / "run")
    set_acl(run, (2, 6, 1000), default=True)
    assert refusal(cfg).startswith(f"server.listen: {run} is given a default POSIX ACL that makes what the daemon "
                                   f"creates there writable by uid 1000")
    assert refusal(cfg).endswith(f"fix: setfacl -d -x u:1000 {run}")
