"""The node's kubeconfig and token file, written by root, read by the daemon at start and
(the token) at each 401: a checked kubeconfig or KubeconfigError, a token or TokenError
(BadToken through the transport), never anything else, and never a byte of a secret in
a message."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from anolisnuma.cluster.kubeconfig import KubeconfigError, load_kubeconfig
from anolisnuma.cluster.token_auth import BadToken, TokenFileAuth
from anolisnuma.cluster.token_file import TokenError, read_token_file
from anolisnuma.testing.fuzzing import assert_linear, fuzz_settings, outcome

SECRET = "s3cr3t-t0ken"
PEM = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg=="


@pytest.fixture(scope="module")
def home():
    path = tempfile.mkdtemp(prefix="fuzz-kube-")
    with open(os.path.join(path, "token"), "w") as f:
        f.write(SECRET + "\n")
    os.chmod(os.path.join(path, "token"), 0o600)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def write(home, name, data):
    path = os.path.join(home, name)
    with open(path, "wb") as f:
        f.write(data)
    os.chmod(path, 0o600)
    return path


odd = st.one_of(st.text(max_size=10), st.integers(), st.none(), st.booleans(), st.lists(st.text(max_size=3), max_size=2),
                st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2),
                st.sampled_from(["", "a\x00b", "../token", "/dev/zero", "/proc/self/environ", "token", "/",
                                 "https://[::1", "https://h:99999", "https://h/p", "http://h", "https://h:6443"]))


@st.composite
def maybe(draw, usual):
    return draw(odd) if draw(st.integers(0, 9)) == 5 else draw(usual)


users = st.fixed_dictionaries({}, optional={
    "token": maybe(st.sampled_from([SECRET, SECRET + " x", "\u00e9", ""])), "tokenFile": maybe(st.just("token")),
    "client-certificate-data": maybe(st.just(PEM)), "client-key-data": maybe(st.sampled_from([PEM, "not base64!"])),
    "exec": odd, "username": odd})
kubeconfigs = st.fixed_dictionaries({
    "current-context": maybe(st.sampled_from(["node", "other"])),
    "contexts": maybe(st.lists(maybe(st.fixed_dictionaries({"name": maybe(st.just("node")), "context": maybe(
        st.fixed_dictionaries({"cluster": maybe(st.just("c")), "user": maybe(st.just("u"))}))})), max_size=3)),
    "clusters": maybe(st.lists(maybe(st.fixed_dictionaries({"name": maybe(st.just("c")), "cluster": maybe(
        st.fixed_dictionaries({"server": maybe(st.sampled_from(["https://10.0.0.1:6443", "https://api"]))},
                              optional={"certificate-authority-data": maybe(st.just(PEM)),
                                        "insecure-skip-tls-verify": odd}))})), max_size=2)),
    "users": maybe(st.lists(maybe(st.fixed_dictionaries({"name": maybe(st.just("u")), "user": maybe(users)})),
                            max_size=2)),
})
hostile_yaml = st.sampled_from([
    "[" * 5000, "a: &a [*a]", "current-context: *x", "\xff\xfe", "a: 1" + "0" * 5000, "a: 2001-02-30",
    "l0: &l0 [x, x, x, x, x, x, x, x, x]\n" + "".join(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n"
                                                        for i in range(1, 9)),
])

# Findings, each the smallest input found (cluster/kubeconfig.py, reported in issue 33):
CTX = "contexts: [{name: n, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {token: t}}]\n"
UNHASHABLE_CONTEXT = "current-context: [n]\ncontexts: [{name: n, context: {}}]\n"     # TypeError
BAD_IPV6 = CTX + "clusters: [{name: c, cluster: {server: 'https://[::1'}}]\n"      # ValueError
NUL_IN_A_NAME = CTX.replace("{token: t}", '{tokenFile: "a\\0b"}') + "clusters: [{name: c, cluster: {server: 'https://h'}}]\n"
TOO_DEEP = "[" * 5000                                                                   # RecursionError


@fuzz_settings(150)
@given(st.one_of(kubeconfigs.map(yaml.safe_dump), hostile_yaml).map(lambda t: t.encode("utf-8", "surrogatepass"))
       | st.binary(max_size=200))
def test_a_kubeconfig_is_checked_or_refused_naming_the_key(home, data):
    # given a kubeconfig of any content (its token file beside it)
    path = write(home, "kubeconfig", data)
    # when it is loaded, then it is checked or refused with the module's own error
    checked, error = outcome("kubeconfig", lambda: load_kubeconfig(path), (KubeconfigError,), size=len(data),
                             traced=not data.startswith(b"[[[["))   # (tracemalloc: 20 s for its unwinding)
    # and no message holds the token
    if error is not None:
        assert SECRET not in str(error)
    else:
        assert checked.server.startswith("https://")


@pytest.mark.parametrize("text", [UNHASHABLE_CONTEXT, BAD_IPV6, NUL_IN_A_NAME, TOO_DEEP],
                         ids=["unhashable-current-context", "server-not-a-url", "nul-in-a-file-name", "too-deep"])
def test_the_inputs_found_are_refused_naming_the_key(home, text):
    test_a_kubeconfig_is_checked_or_refused_naming_the_key.hypothesis.inner_test(home, text.encode())


tokens = st.one_of(st.binary(max_size=100), st.sampled_from([b"", b"\n", b"a b", b"a\nb", b"\xff", b"t" * 65536,
                                                              b"t" * 65537, b"-----BEGIN PRIVATE KEY-----\nx\n"]),
                   st.text(alphabet="!~azAZ09 \t\n", max_size=50).map(str.encode))


@fuzz_settings(150)
@given(tokens)
def test_a_token_file_is_a_token_or_refused_without_quoting_it(home, data):
    path = write(home, "tokenfile", data)
    got, error = outcome("kubeconfig", lambda: read_token_file(path), (TokenError,), size=len(data))
    if error is None:
        token, _ = got
        assert token and all("!" <= c <= "~" for c in token) and token == data.decode().strip()
    elif len(data.strip()) >= 16:   # (shorter ones may be words of the message)
        assert data.decode("latin-1").strip() not in str(error).replace(path, "")


class Answer:
    """The API server's side of one request: 401 for any but the good token."""

    def __init__(self, status):
        self.status_code = status

    def close(self):
        pass


class Server:
    def handle_request(self, request):
        return Answer(200 if request.headers["Authorization"] == f"Bearer {SECRET}" else 401)


class Request:
    def __init__(self):
        self.headers = {}


@fuzz_settings(60)
@given(tokens)
def test_a_401_reads_the_token_file_again_and_a_bad_one_fails_the_request(home, data):
    # given a transport whose token was rotated into a file of any content
    path = write(home, "rotated", data)
    auth = TokenFileAuth(Server(), path, token="old")
    # when a request is refused (401), then the file is read again: a 200 with a good
    # token, the 401 with another one, or BadToken naming the file
    answer, error = outcome("kubeconfig", lambda: auth.handle_request(Request()), (BadToken,), size=len(data))
    assert error is not None or answer.status_code in (200, 401)


@fuzz_settings(2)
@given(st.sampled_from(["contexts", "users"]))
def test_time_is_linear_in_the_kubeconfig(home, key):
    # given a kubeconfig with n contexts or users besides the one used
    def make(n):
        doc = yaml.safe_load(CTX + "clusters: [{name: c, cluster: {server: 'https://h'}}]\n")
        doc[key] += [{"name": f"x{i}", key[:-1]: {"cluster": "c", "user": "u"} if key == "contexts" else {"token": "t"}}
                     for i in range(n)]
        doc["current-context"] = "n"
        return yaml.safe_dump(doc).encode()

    def run(data):
        path = write(home, "kubeconfig", data)
        try:
            load_kubeconfig(path)
        except KubeconfigError:
            pass
    assert_linear("kubeconfig", make, run, small=20)
