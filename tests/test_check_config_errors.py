"""``anolisnuma --check-config`` names every error of a file in one run (issue 35): unknown
keys and tables with the known name they may be a typo of, wrong types, bad values, in
the order they are read; at most ``ERRORS_LISTED`` lines and a count of the rest; keys and
values echoed cut and escaped. The file is root's, but a generated or damaged one must
not make a hundred thousand lines or write a terminal's escape codes."""

from __future__ import annotations

import pytest

from anolisnuma.config import Config
from anolisnuma.configfile import ERRORS_LISTED, SHOWN_CHARS, ConfigError, ConfigErrors
from anolisnuma.testing.proxy import run_cli

PREFIX = "anolisnuma: invalid configuration: "

MANY = """\
[servr]
listen = "/run/x.sock"

[server]
socket_mode = "0999"
max_conections = 5

[log]
level = "verbose"
stderr = "yes"

[qos]
reconcile_interval_seconds = 0.5
[qos.kube_class_mapping]
besteffort = "LSS"

[[numa.pin]]
namespace = ""
nodes = [2000]

[[numa.pin]]
name = "web-*"
nodes = [0]

[nri]
plugin_index = "5"
plugn_name = "x"

[hooks.numaa]
budget_seconds = 1
"""


def check(tmp_path, text=None, data=None):
    path = tmp_path / "config.toml"
    if data is not None:
        path.write_bytes(data)
    else:
        path.write_text(text)
    return run_cli(["--check-config", "-c", str(path)])


def test_every_error_of_a_file_is_named_at_once_with_what_was_meant(tmp_path):
    # given a file with errors in six sections: typos of keys and tables, wrong types, bad values
    r = check(tmp_path, MANY)
    # then the exit status is the configuration's, and each error is one line, in reading order
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines() == [PREFIX + line for line in [
        "server.socket_mode: must be an octal string like \"0660\"; got '0999'",
        "server.max_conections: unknown key (did you mean max_connections?)",
        "log.level: must be one of debug, info, warning, error; got 'verbose'",
        "log.stderr: must be true or false, not a string",
        "hooks.numaa: unknown key (hooks are numa, qos) (did you mean numa?)",
        "qos.reconcile_interval_seconds: must be 0 (off) or in 1..3600; got 0.5",
        "qos.kube_class_mapping.besteffort: must be one of LSE, LSR, LS, BE; got 'LSS' (did you mean LS?)",
        "numa.pin[0].namespace: must not be empty",
        "numa.pin[0].name: is required",
        "numa.pin[0].nodes: NUMA node ids must be in 0..1023; got 2000",
        "nri.plugin_index: must be two digits (containerd orders plugins by it); got '5'",
        "nri.plugn_name: unknown key (did you mean plugin_name?)",
        "servr: unknown table (did you mean server?)",
    ]]


def test_a_hundred_thousand_unknown_keys_are_twenty_lines_and_a_count(tmp_path):
    # given a file of 100,000 unknown keys (under the 1 MiB the reader takes)
    n = 100_000
    r = check(tmp_path, "[server]\n" + "".join(f"k{i}=1\n" for i in range(n)))
    # then the first ERRORS_LISTED are named, and the rest counted on one more line
    lines = r.stderr.splitlines()
    assert r.returncode == 2
    assert len(lines) == ERRORS_LISTED + 1
    assert lines[0] == PREFIX + "server.k0: unknown key"
    assert lines[-1] == PREFIX + f"... and {n - ERRORS_LISTED} more errors not listed"


def test_keys_and_values_are_echoed_cut_and_escaped(tmp_path):
    # given a key of 200,000 characters, a key and a value with a terminal's escape code, a long value
    long_key = "k" * 200_000
    r = check(tmp_path, f'[log]\n"{long_key}" = 1\n"\\u001b[2J" = 1\nlevel = "{"v" * 5000}"\n'
                        '[runtime]\nendpoint = "\\u001b]0;owned\\u0007"\n')
    lines = r.stderr.splitlines()
    # then each is one short line, the long ones cut with their length, the escapes escaped
    assert r.returncode == 2 and len(lines) == 4, r.stderr
    assert all(len(line) < 250 for line in lines), lines
    assert "\x1b" not in r.stderr and "\x07" not in r.stderr
    assert lines[0] == PREFIX + "runtime.endpoint: must be an absolute unix socket path; got '\\x1b]0;owned\\x07'"
    assert lines[1].startswith(PREFIX + "log.level: must be one of") and "(5000 characters)" in lines[1]
    assert lines[2] == PREFIX + f"'log.{'k' * (SHOWN_CHARS - 5)}... (200004 characters): unknown key"
    assert lines[3] == PREFIX + "'log.\\x1b[2J': unknown key"


def test_bytes_that_are_not_utf8_stay_one_line(tmp_path):
    # given a file with errors and a byte that is not UTF-8 (TOML is UTF-8: nothing is read)
    r = check(tmp_path, data=b"[servr]\n[log]\nlevel = \"verbose\"\nfile = \"/\xff\xfe\"\n")
    # then one line says so, and no key is reported from a file that could not be read
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "not UTF-8" in r.stderr and "Traceback" not in r.stderr


def test_one_error_is_one_line_as_before(tmp_path):
    r = check(tmp_path, "[log]\nlevl = 'info'\n")
    assert (r.returncode, r.stderr) == (2, PREFIX + "log.levl: unknown key (did you mean level?)\n")


def test_the_errors_are_one_exception_whose_message_is_one_line(tmp_path):
    """The daemon's SIGHUP reload and the admin ``reload`` log ``str(error)``: one line."""
    path = tmp_path / "config.toml"
    path.write_text(MANY)
    with pytest.raises(ConfigErrors) as info:
        Config.load(str(path))
    e = info.value
    assert isinstance(e, ConfigError) and e.key == "server.socket_mode" and e.more == 0
    assert len(e.errors) == 13 and "\n" not in str(e)
    assert str(e).startswith("server.socket_mode: must be an octal") and str(e).endswith("(did you mean server?)")


def test_a_wrong_value_does_not_hide_the_other_sections_own_checks(tmp_path):
    # given a wrong listen socket and an admin socket equal to the runtime endpoint
    r = check(tmp_path, "[server]\nlisten = 'rel.sock'\n[runtime]\nendpoint = '/run/c.sock'\n"
                        "[admin]\nsocket = '/run/c.sock'\n")
    # then the wrong value is named, and the comparison it would spoil is not made up from a default
    assert r.stderr.splitlines() == [PREFIX + "server.listen: must be an absolute unix socket path; got 'rel.sock'"]
    r = check(tmp_path, "[log]\nlevel = 'x'\n[runtime]\nendpoint = '/run/c.sock'\n[admin]\nsocket = '/run/c.sock'\n")
    assert len(r.stderr.splitlines()) == 2 and "admin.socket: must differ" in r.stderr


def test_each_wrong_pin_is_named_once_per_key_and_left_out_and_the_good_ones_kept():
    data = {"numa": {"pin": [{"nodes": "x", "namespace": 3}, 7, {"name": 5, "nodes": [0]},
                             {"name": "a", "nodes": [1, 1], "nodez": 1}, {"name": "web-*", "nodes": [0]}]}}
    with pytest.raises(ConfigErrors) as info:
        Config.from_dict(data)
    assert info.value.lines() == [
        "numa.pin[0].namespace: must be a string, not an integer",
        "numa.pin[0].name: is required",
        "numa.pin[0].nodes: must be a non-empty list of NUMA node ids (integers)",
        "numa.pin[1]: must be a table",
        "numa.pin[2].name: must be a string, not an integer",
        "numa.pin[3].nodes: lists a node twice",
        "numa.pin[3].nodez: unknown key (did you mean nodes?)",
    ]
    from anolisnuma.configfile import Table
    from anolisnuma.policies.numa.config import _pins

    t = Table(data["numa"], "numa")
    assert [p.name for p in _pins(t)] == ["web-*"] and len(t.errors.listed) == 7
