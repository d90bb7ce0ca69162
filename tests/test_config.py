"""Configuration of [server] [runtime] [log] [paths] [hooks]: defaults, accepted forms, and
errors that name the key. ([qos] and [numa] are tested with their policy packages.)"""

from __future__ import annotations

import os

import pytest

from anolisnuma.config import (MIB, Config, HooksConfig, HookSettings, LogConfig, PathsConfig, RuntimeConfig,
                               ServerConfig)
from anolisnuma.configfile import ConfigError, Table
from anolisnuma.testing.proxy import config_dict, write_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def section(cls, values, name):
    return cls.from_table(Table(values, name))


def error_of(cls, values, name) -> ConfigError:
    with pytest.raises(ConfigError) as e:
        section(cls, values, name)
    return e.value


# ---------------------------------------------------------------- [server]

def test_server_defaults():
    s = section(ServerConfig, {}, "server")
    assert s.listen == "/var/run/anolisnuma/anolisnuma.sock"
    assert s.socket_mode == 0o660
    assert s.max_message_bytes == 16 * MIB
    assert s.shutdown_grace_seconds == 10.0


def test_server_values():
    s = section(ServerConfig, {"listen": "unix:///run/x/a.sock", "socket_mode": "0600",
                               "max_message_bytes": 64 * MIB, "shutdown_grace_seconds": 3}, "server")
    assert s.listen == "/run/x/a.sock"
    assert s.socket_mode == 0o600
    assert s.max_message_bytes == 64 * MIB
    assert s.shutdown_grace_seconds == 3.0 and isinstance(s.shutdown_grace_seconds, float)


@pytest.mark.parametrize("values,key", [
    ({"socket_mode": 660}, "server.socket_mode"),
    ({"socket_mode": "rw-rw----"}, "server.socket_mode"),
    ({"socket_mode": "0999"}, "server.socket_mode"),
    ({"socket_mode": "01777"}, "server.socket_mode"),
    ({"listen": "anolisnuma.sock"}, "server.listen"),
    ({"listen": 5}, "server.listen"),
    ({"max_message_bytes": 4 * MIB}, "server.max_message_bytes"),
    ({"max_message_bytes": "16MiB"}, "server.max_message_bytes"),
    ({"shutdown_grace_seconds": -1}, "server.shutdown_grace_seconds"),
    ({"shutdown_grace_seconds": True}, "server.shutdown_grace_seconds"),
    ({"listn": "/run/a.sock"}, "server.listn"),
])
def test_server_errors_name_the_key(values, key):
    e = error_of(ServerConfig, values, "server")
    assert e.key == key
    assert key in str(e)


# ---------------------------------------------------------------- [runtime]

def test_runtime_defaults_and_prefix():
    assert section(RuntimeConfig, {}, "runtime").endpoint == "/run/containerd/containerd.sock"
    r = section(RuntimeConfig, {"endpoint": "unix:///run/k3s/containerd/containerd.sock",
                                "connect_timeout_seconds": 0.5, "max_message_bytes": 32 * MIB}, "runtime")
    assert r.endpoint == "/run/k3s/containerd/containerd.sock"
    assert r.connect_timeout_seconds == 0.5 and r.max_message_bytes == 32 * MIB
    assert r.resync_interval_seconds == 60.0
    assert section(RuntimeConfig, {"resync_interval_seconds": 0}, "runtime").resync_interval_seconds == 0


@pytest.mark.parametrize("values,key", [
    ({"endpoint": "tcp://127.0.0.1:1234"}, "runtime.endpoint"),
    ({"endpoint": "containerd.sock"}, "runtime.endpoint"),
    ({"endpoint": ["/run/a.sock"]}, "runtime.endpoint"),
    ({"connect_timeout_seconds": 0}, "runtime.connect_timeout_seconds"),
    ({"connect_timeout_seconds": "1s"}, "runtime.connect_timeout_seconds"),
    ({"max_message_bytes": 1024}, "runtime.max_message_bytes"),
    ({"resync_interval_seconds": -1}, "runtime.resync_interval_seconds"),
    ({"resync_interval_seconds": 86401}, "runtime.resync_interval_seconds"),
    ({"timeout": 3}, "runtime.timeout"),
])
def test_runtime_errors_name_the_key(values, key):
    e = error_of(RuntimeConfig, values, "runtime")
    assert e.key == key


# ---------------------------------------------------------------- [log]

def test_log_defaults_and_values():
    d = section(LogConfig, {}, "log")
    assert (d.file, d.level, d.stderr) == ("/var/log/anolisnuma.log", "info", False)
    v = section(LogConfig, {"file": "", "level": "debug", "stderr": True}, "log")
    assert (v.file, v.level, v.stderr) == ("", "debug", True)


@pytest.mark.parametrize("values,key", [
    ({"level": "verbose"}, "log.level"),
    ({"level": "INFO"}, "log.level"),
    ({"level": 1}, "log.level"),
    ({"file": "anolisnuma.log"}, "log.file"),
    ({"stderr": "yes"}, "log.stderr"),
    ({"format": "json"}, "log.format"),
])
def test_log_errors_name_the_key(values, key):
    assert error_of(LogConfig, values, "log").key == key


# ---------------------------------------------------------------- [paths]

def test_paths_defaults_and_trailing_slashes():
    d = section(PathsConfig, {}, "paths")
    assert d.cgroup_root == "/sys/fs/cgroup" and d.state_dir == "/var/lib/anolisnuma"
    assert d.kubelet_cpu_manager_state == "/var/lib/kubelet/cpu_manager_state"
    v = section(PathsConfig, {"cgroup_root": "/tmp/fake/cgroup/", "sys_root": "/"}, "paths")
    assert v.cgroup_root == "/tmp/fake/cgroup" and v.sys_root == "/"


@pytest.mark.parametrize("name", ["cgroup_root", "resctrl_root", "sys_root", "proc_root", "state_dir",
                                  "kubelet_cpu_manager_state"])
def test_paths_must_be_absolute(name):
    e = error_of(PathsConfig, {name: "relative/dir"}, "paths")
    assert e.key == f"paths.{name}" and "absolute" in e.problem


def test_paths_unknown_key():
    assert error_of(PathsConfig, {"cgroups_root": "/x"}, "paths").key == "paths.cgroups_root"


# ---------------------------------------------------------------- [hooks]

def test_hooks_defaults():
    h = section(HooksConfig, {}, "hooks")
    assert h.settings("numa") == HookSettings(budget_seconds=2.0, failure_policy="ignore")
    assert "anolisnuma.io/skip" in h.skip_keys


def test_hooks_default_and_per_hook_settings():
    h = section(HooksConfig, {"budget_seconds": 1.5, "failure_policy": "ignore",
                              "skip_keys": ["example.com/no-policies"],
                              "numa": {"failure_policy": "fail"},
                              "qos": {"budget_seconds": 0.25}}, "hooks")
    assert h.skip_keys == ["example.com/no-policies"]
    assert h.settings("numa") == HookSettings(budget_seconds=1.5, failure_policy="fail")  # inherits the budget
    assert h.settings("qos") == HookSettings(budget_seconds=0.25, failure_policy="ignore")
    assert h.settings("other") == HookSettings(budget_seconds=1.5, failure_policy="ignore")


@pytest.mark.parametrize("values,key", [
    ({"failure_policy": "panic"}, "hooks.failure_policy"),
    ({"budget_seconds": 0}, "hooks.budget_seconds"),
    ({"budget_seconds": "2s"}, "hooks.budget_seconds"),
    ({"skip_keys": "anolisnuma.io/skip"}, "hooks.skip_keys"),
    ({"numa": {"failure_policy": "abort"}}, "hooks.numa.failure_policy"),
    ({"numa": {"budget_seconds": 1000}}, "hooks.numa.budget_seconds"),
    ({"numa": {"budget": 1}}, "hooks.numa.budget"),
    ({"numa": 3}, "hooks.numa"),
    ({"qoss": {"failure_policy": "fail"}}, "hooks.qoss"),  # a misspelt hook name
])
def test_hooks_errors_name_the_key(values, key):
    assert error_of(HooksConfig, values, "hooks").key == key


# ---------------------------------------------------------------- whole file

def test_whole_file_roundtrip(tmp_path):
    data = config_dict(str(tmp_path), "/run/test/cri.sock",
                       extra={"server": {"socket_mode": "0640"}, "hooks": {"numa": {"failure_policy": "fail"}}})
    cfg = Config.load(write_config(str(tmp_path / "c.toml"), data))
    assert cfg.server.listen == data["server"]["listen"]
    assert cfg.server.socket_mode == 0o640
    assert cfg.runtime.endpoint == "/run/test/cri.sock"
    assert cfg.log.file == data["log"]["file"]
    assert cfg.paths.state_dir == data["paths"]["state_dir"]
    assert cfg.hooks.settings("numa").failure_policy == "fail"
    assert cfg.source == str(tmp_path / "c.toml")


def test_empty_file_gives_defaults(tmp_path):
    path = tmp_path / "empty.toml"
    path.write_text("")
    cfg = Config.load(str(path))
    assert cfg.server.listen == "/var/run/anolisnuma/anolisnuma.sock"
    assert cfg.runtime.endpoint == "/run/containerd/containerd.sock"


def test_listen_equal_to_endpoint_is_refused(tmp_path):
    path = write_config(str(tmp_path / "c.toml"), {"server": {"listen": "/run/a.sock"},
                                                   "runtime": {"endpoint": "unix:///run/a.sock"}})
    with pytest.raises(ConfigError) as e:
        Config.load(path)
    assert e.value.key == "server.listen"


@pytest.mark.parametrize("text,key", [
    ("[servr]\nlisten = '/run/a.sock'\n", "servr"),
    ("server = 3\n", "server"),
    ("[server]\nsocket_mode = 0o660\n", "server.socket_mode"),
    ("[runtime]\nendpoint = 'relative.sock'\n", "runtime.endpoint"),
    ("[log]\nlevel = 'loud'\n", "log.level"),
    ("[paths]\nstate_dir = 'state'\n", "paths.state_dir"),
    ("[hooks.qos]\nfailure_policy = 'sometimes'\n", "hooks.qos.failure_policy"),
])
def test_file_errors_name_the_key(tmp_path, text, key):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        Config.load(str(path))
    assert e.value.key == key


def test_syntax_error_and_missing_file(tmp_path):
    bad = tmp_path / "syntax.toml"
    bad.write_text("[server\nlisten = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        Config.load(str(bad))
    with pytest.raises(ConfigError, match="cannot read"):
        Config.load(str(tmp_path / "missing.toml"))


@pytest.mark.parametrize("value, said", [
    ("1" + "0" * 5000, "value has 5001 digits"),                    # int()'s digit limit: ValueError before
    ("[" * 3000 + "]" * 3000, "nested too deeply"),                 # RecursionError before
    ("{a = " * 3000 + "1" + "}" * 3000, "nested too deeply"),
])
def test_a_value_tomllib_cannot_read_is_a_config_error(tmp_path, value, said):
    # given a value tomllib raises on with another error than its TOMLDecodeError
    bad = tmp_path / "hostile.toml"
    bad.write_text(f"[server]\nmax_connections = {value}\n")
    # when the configuration is loaded, then it is refused as invalid TOML, saying why
    with pytest.raises(ConfigError, match="not valid TOML") as e:
        Config.load(str(bad))
    assert said in str(e.value) and "set_int_max_str_digits" not in str(e.value)


# ---------------------------------------------------------------- what sits at the path

def _load_within(path: str, seconds: float = 10.0) -> BaseException:
    """What Config.load(path) raised, run on a thread; AssertionError when it is still
    blocked after ``seconds`` (then a writer is opened and closed on a FIFO, so the thread
    ends)."""
    import threading

    raised = []

    def load() -> None:
        try:
            Config.load(path)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            raised.append(e)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(seconds)
        raise AssertionError(f"Config.load({path}) blocked")
    assert raised, f"Config.load({path}) loaded it"
    return raised[0]


@pytest.mark.parametrize("make,kind", [
    (os.mkfifo, "a FIFO"),                                  # open() would wait for a writer
    (lambda p: os.symlink("/dev/null", p), "a character device"),  # as /dev/zero, which never ends
    (os.mkdir, "a directory"),
])
def test_a_config_path_that_is_not_a_regular_file_is_refused_at_once(tmp_path, make, kind):
    path = str(tmp_path / "c.toml")
    make(path)
    e = _load_within(path)
    assert isinstance(e, ConfigError)
    assert str(e) == f"cannot read configuration file {path}: it is not a regular file ({kind})"


def test_a_config_file_larger_than_1_mib_is_refused(tmp_path):
    path = tmp_path / "c.toml"
    comment = b"#" * 1023 + b"\n"
    path.write_bytes(comment * (MIB // len(comment)))   # exactly the cap: read
    assert Config.load(str(path)).server == ServerConfig()
    with open(path, "ab") as f:
        f.write(b"\n")
    with pytest.raises(ConfigError) as e:
        Config.load(str(path))
    assert str(e.value) == f"cannot read configuration file {path}: it is larger than 1 MiB ({MIB + 1} bytes)"


@pytest.mark.skipif(not os.path.exists(os.path.join(REPO, "config.toml")), reason="no shipped config.toml yet")
def test_shipped_default_config_is_valid():
    Config.load(os.path.join(REPO, "config.toml"))


def test_buffer_budgets_default_and_follow_the_message_limit():
    s = section(ServerConfig, {}, "server")
    assert (s.buffer_bytes_per_connection, s.buffer_bytes_total) == (32 * MIB, 64 * MIB)
    s = section(ServerConfig, {"max_message_bytes": 64 * MIB}, "server")
    assert (s.buffer_bytes_per_connection, s.buffer_bytes_total) == (128 * MIB, 256 * MIB)
    s = section(ServerConfig, {"buffer_bytes_per_connection": 20 * MIB, "buffer_bytes_total": 20 * MIB}, "server")
    assert (s.buffer_bytes_per_connection, s.buffer_bytes_total) == (20 * MIB, 20 * MIB)


@pytest.mark.parametrize("values,key", [
    ({"buffer_bytes_per_connection": 8 * MIB}, "server.buffer_bytes_per_connection"),  # < one message
    ({"buffer_bytes_per_connection": 32 * MIB, "buffer_bytes_total": 16 * MIB}, "server.buffer_bytes_total"),
    ({"buffer_bytes_total": "64M"}, "server.buffer_bytes_total"),
])
def test_bad_buffer_budgets_are_refused_naming_the_key(values, key):
    with pytest.raises(ConfigError) as e:
        section(ServerConfig, values, "server")
    assert e.value.key == key


# ---------------------------------------------------------------- [admin] [metrics]

def test_admin_and_metrics_defaults():
    from anolisnuma.config import AdminConfig, MetricsConfig

    assert section(AdminConfig, {}, "admin").socket == "/var/run/anolisnuma/admin.sock"
    assert section(AdminConfig, {"socket": ""}, "admin").socket == ""          # off
    assert section(AdminConfig, {"socket": "unix:///run/a/admin.sock"}, "admin").socket == "/run/a/admin.sock"
    m = section(MetricsConfig, {}, "metrics")
    assert (m.listen, m.allow_remote) == ("", False)                          # off by default


@pytest.mark.parametrize("listen,address", [
    ("127.0.0.1:9464", ("127.0.0.1", 9464)),
    ("[::1]:9464", ("::1", 9464)),
    ("localhost:0", ("localhost", 0)),
    ("127.1.2.3:80", ("127.1.2.3", 80)),
])
def test_metrics_listen_on_loopback_addresses(listen, address):
    from anolisnuma.config import MetricsConfig

    assert section(MetricsConfig, {"listen": listen}, "metrics").address == address


def test_metrics_beyond_the_node_only_when_allowed():
    from anolisnuma.config import MetricsConfig

    e = error_of(MetricsConfig, {"listen": "0.0.0.0:9464"}, "metrics")
    assert e.key == "metrics.listen" and "not a loopback address" in str(e) and "metrics.allow_remote" in str(e)
    m = section(MetricsConfig, {"listen": "0.0.0.0:9464", "allow_remote": True}, "metrics")
    assert m.address == ("0.0.0.0", 9464)


@pytest.mark.parametrize("cls_name,values,key", [
    ("AdminConfig", {"socket": "admin.sock"}, "admin.socket"),
    ("AdminConfig", {"socket": 5}, "admin.socket"),
    ("AdminConfig", {"sockett": "/run/a.sock"}, "admin.sockett"),
    ("MetricsConfig", {"listen": "9464"}, "metrics.listen"),
    ("MetricsConfig", {"listen": "metrics.example.com:9464"}, "metrics.listen"),
    ("MetricsConfig", {"listen": "127.0.0.1:99999"}, "metrics.listen"),
    ("MetricsConfig", {"listen": "127.0.0.1:port"}, "metrics.listen"),
    ("MetricsConfig", {"listen": 9464}, "metrics.listen"),
    ("MetricsConfig", {"allow_remote": "yes"}, "metrics.allow_remote"),
    ("MetricsConfig", {"port": 9464}, "metrics.port"),
])
def test_admin_and_metrics_errors_name_the_key(cls_name, values, key):
    import anolisnuma.config as C

    e = error_of(getattr(C, cls_name), values, key.split(".")[0])
    assert e.key == key
    assert key in str(e)


@pytest.mark.parametrize("admin", ["/run/a.sock", "/run/containerd/containerd.sock"])
def test_the_admin_socket_is_never_the_cri_socket(tmp_path, admin):
    path = write_config(str(tmp_path / "c.toml"), {"server": {"listen": "/run/a.sock"}, "admin": {"socket": admin}})
    with pytest.raises(ConfigError) as e:
        Config.load(path)
    assert e.value.key == "admin.socket"


@pytest.mark.parametrize("text,key", [
    ("[admin]\nsocket = 'relative.sock'\n", "admin.socket"),
    ("[metrics]\nlisten = '0.0.0.0:9464'\n", "metrics.listen"),
])
def test_bad_admin_and_metrics_values_exit_2_naming_the_key(tmp_path, text, key):
    from anolisnuma.testing.proxy import run_cli

    path = tmp_path / "bad.toml"
    path.write_text(text)
    r = run_cli(["-c", str(path), "--check-config"])
    assert r.returncode == 2
    assert r.stderr.startswith("anolisnuma: invalid configuration: " + key)
    assert r.stderr.count("\n") == 1
