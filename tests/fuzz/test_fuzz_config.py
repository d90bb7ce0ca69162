"""The configuration file, written by root: TOML text becomes a Config or a ConfigError
naming the key, never anything else. The shipped config.toml with its values replaced by
hostile TOML (other types, huge and deep values, odd strings, bad syntax), unknown keys
and tables added; and any text."""

from __future__ import annotations

import os
import re
import shutil
import tempfile

import pytest
from hypothesis import given
from hypothesis import strategies as st

from anolisnuma.config import Config
from anolisnuma.configfile import CONFIG_MAX_BYTES, ERRORS_LISTED, ConfigError, ConfigErrors
from anolisnuma.testing.fuzzing import assert_linear, fuzz_settings, outcome

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
with open(os.path.join(REPO, "config.toml")) as _f:
    SHIPPED = _f.read().splitlines()
KEY_LINES = [i for i, line in enumerate(SHIPPED) if re.match(r"^[a-z_]+ = ", line)]
OWN = (ConfigError,)


@pytest.fixture(scope="module")
def config_path():
    path = tempfile.mkdtemp(prefix="fuzz-config-")
    yield os.path.join(path, "config.toml")
    shutil.rmtree(path, ignore_errors=True)


def load(path, text):
    with open(path, "w", encoding="utf-8", errors="surrogatepass") as f:
        f.write(text)
    return Config.load(path)


toml_values = st.one_of(
    st.sampled_from(['""', '"/"', '"unix:///x"', '"auto"', '"0660"', '"0o777"', '"9999"', '"-1"', '"0x10"',
                     '"[::1]:9464"', '"127.0.0.1:99999"', '"localhost:\u0661"', '"host:1"', '"\\u0000"', "'\\'",
                     "0", "-1", "1_000", "0x7f", "0o777", "9223372036854775807", "-9223372036854775808",
                     "1" + "0" * 30, "1" + "0" * 5000, "nan", "inf", "-inf", "1e999", "0.0", "-0.0", "true", "false",
                     "1979-05-27T07:32:00Z", "07:32:00", "[]", "[1, 2]", '["a", 1]', "{}", '{a = 1}',
                     "[" * 3000 + "]" * 3000, "[" * 200 + "]" * 200, "{a = " * 200 + "1" + "}" * 200, '"""\n"""',
                     "= =", "[[", "\x00"]),
    st.integers(-2 ** 70, 2 ** 70).map(str),
    st.text(max_size=20).map(lambda t: '"' + t.replace("\\", "\\\\").replace('"', '\\"') + '"'),
)


@st.composite
def config_texts(draw):
    """config.toml with some of its values replaced, and maybe a key or a table added."""
    lines = list(SHIPPED)
    for i in draw(st.lists(st.sampled_from(KEY_LINES), max_size=3)):
        key = lines[i].split(" = ", 1)[0]
        lines[i] = f"{key} = {draw(toml_values)}"
    if draw(st.booleans()):
        where = draw(st.integers(0, len(lines)))
        lines.insert(where, draw(st.sampled_from(["unknown = 1", "[unknown]", "[qos.unknown]", "[[numa.pin]]",
                                                  "[hooks.numa]", "[hooks.bogus]", "[numa.pin]", "[server]"])))
    return "\n".join(lines) + "\n"


@fuzz_settings(150)
@given(st.one_of(config_texts(), config_texts(), st.text(max_size=200)))
def test_a_configuration_is_read_or_refused_naming_the_key(config_path, text):
    # given a configuration file of any content, when it is loaded
    cfg, error = outcome("config", lambda: load(config_path, text), OWN, size=len(text.encode("utf-8", "replace")))
    # then it is a Config, or a ConfigError
    assert (cfg is None) != (error is None)


# Findings in configfile.py, fixed (ValueError and RecursionError out of tomllib):
@pytest.mark.parametrize("value", ["1" + "0" * 5000, "[" * 3000 + "]" * 3000, "{a = " * 3000 + "1" + "}" * 3000])
def test_values_tomllib_cannot_read_are_the_readers_own_error(config_path, value):
    _, error = outcome("config", lambda: load(config_path, f"[server]\nmax_connections = {value}\n"), OWN,
                       size=len(value))
    assert error is not None and "not valid TOML" in str(error)


def test_a_file_past_the_limit_is_refused(config_path):
    _, error = outcome("config", lambda: load(config_path, "#" * (CONFIG_MAX_BYTES + 1)), OWN,
                       size=CONFIG_MAX_BYTES + 1)
    assert "larger than 1 MiB" in str(error)


@fuzz_settings(6)
@given(st.sampled_from(["comments", "skip_keys", "pins", "unknown_keys", "unknown_tables", "wrong_pins"]))
def test_time_is_linear_in_the_file(config_path, shape):
    # given a configuration with n comment lines, n skip keys or n pins; or n errors, each
    # noted (the first ERRORS_LISTED with a "did you mean" search, the rest counted)
    def make(n):
        if shape == "comments":
            return "\n".join(SHIPPED) + "\n" + "# a comment\n" * n
        if shape == "skip_keys":
            return "[hooks]\nskip_keys = [" + ", ".join(f'"k{i}"' for i in range(n)) + "]\n"
        if shape == "unknown_keys":
            return "[server]\n" + "".join(f"max_connection{i} = 1\n" for i in range(n))
        if shape == "unknown_tables":
            return "".join(f"[serve{i}]\n" for i in range(n))
        if shape == "wrong_pins":
            return "".join(f'[[numa.pin]]\nnamespace = ""\nnodes = [{i}, {i}]\nnam = 1\n' for i in range(n))
        return "".join(f'[[numa.pin]]\nnamespace = "n{i}"\nname = "*"\nnodes = [0]\n' for i in range(n))

    def run(text):
        try:
            load(config_path, text)
        except ConfigError:
            pass
    assert_linear("config", make, run, small=20)


@pytest.mark.parametrize("line,n", [("k{i}=1\n", 100_000), ("[t{i}]\n", 100_000),
                                    ('"\\u001b{i}"=0\n', 60_000)])   # (60,000 of these fill the 1 MiB)
def test_a_hundred_thousand_errors_are_listed_to_the_cap_and_counted(config_path, line, n):
    # given a file of 100,000 unknown keys or tables, or keys with a terminal's escape code
    text = "".join(line.format(i=i) for i in range(n))
    # when it is read
    _, error = outcome("config", lambda: load(config_path, text), OWN, size=len(text))
    # then the first ERRORS_LISTED are listed and the rest counted, every one of them
    assert isinstance(error, ConfigErrors)
    assert (len(error.errors), error.more) == (ERRORS_LISTED, n - ERRORS_LISTED)
    assert len(error.lines()) == ERRORS_LISTED + 1 and all(len(x) < 200 for x in error.lines())
