"""The kubeconfig and the files it names are read like the configuration: a FIFO cannot block
the start, a file another user may change is refused (naming where and the fix), a secret
others may read is used with a warning naming it, and no secret comes back in a message
(a token file of several lines, a YAML error on a token's line). Without an API server but
for the last test, which rotates a token file under a client of the real one."""

from __future__ import annotations

import json
import os
import threading
from typing import Any, Dict, List

import pytest
from structlog.testing import capture_logs

from anolisnuma.cluster import link as link_mod
from anolisnuma.cluster.config import KubernetesConfig
from anolisnuma.cluster.kubeconfig import KubeconfigError, load_kubeconfig, render_kubeconfig
from anolisnuma.testing.waiting import wait_until

CA = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
SECRET_1, SECRET_2 = "eyJhbGciOiJSUzI1NiJ9.first-half", "second-half-of-the-secret"
NOBODY = 65534


def kubeconfig(tmp_path: Any, **user: str) -> str:
    """A kubeconfig in ``tmp_path/etc`` (0600) whose user is ``user`` (a token file by default)."""
    etc = tmp_path / "etc"
    etc.mkdir(exist_ok=True)
    if not user:
        (etc / "token").write_text("a-token\n")
        os.chmod(etc / "token", 0o600)
        user = {"tokenFile": "token"}
    doc = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
           "clusters": [{"name": "k", "cluster": {"server": "https://10.0.0.1:6443",
                                                  "certificate-authority": str(etc / "ca.crt")}}],
           "users": [{"name": "u", "user": user}],
           "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}
    (etc / "ca.crt").write_text(CA)
    path = etc / "kubeconfig"
    path.write_text(json.dumps(doc))
    os.chmod(path, 0o600)
    return str(path)


def refusal(path: str) -> str:
    with pytest.raises(KubeconfigError) as e:
        load_kubeconfig(path)
    return str(e.value)


@pytest.mark.parametrize("which", ["kubeconfig", "token", "ca.crt", "client.key"])
def test_a_fifo_anywhere_is_refused_at_once(tmp_path, which) -> None:
    if which == "client.key":
        path = kubeconfig(tmp_path, **{"client-certificate": "client.crt", "client-key": "client.key"})
        (tmp_path / "etc" / "client.crt").write_text(CA)
    else:
        path = kubeconfig(tmp_path)
    fifo = str(tmp_path / "etc" / which)
    if os.path.exists(fifo):
        os.unlink(fifo)
    os.mkfifo(fifo, 0o600)
    got: List[str] = []
    reader = threading.Thread(target=lambda: got.append(refusal(path)), daemon=True)
    reader.start()
    try:
        wait_until(lambda: got, f"the kubeconfig check with a FIFO as {which} to return")
    finally:
        if reader.is_alive():   # (blocked in open: a writer lets it go)
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert f"{fifo} is not a regular file (a FIFO)" in got[0]


def test_a_kubeconfig_another_user_may_change_is_refused_naming_where_and_the_fix(tmp_path) -> None:
    """The repro of the issue: a 0666 kubeconfig owned by uid 1000 in a 0777 directory."""
    path = kubeconfig(tmp_path)
    os.chmod(path, 0o666)
    assert refusal(path).endswith(f"is writable by every user (mode 0666): whoever may write there may swap "
                                  f"what the daemon reads as root; fix: chmod go-w {path}")
    os.chown(path, 1000, 1000)
    assert f"{path} is owned by uid 1000, not root" in refusal(path)
    os.chown(path, 0, 0)
    os.chmod(path, 0o600)
    etc = os.path.dirname(path)
    os.chmod(etc, 0o777)
    assert f"{etc} (above {path}) is writable by every user (mode 0777)" in refusal(path)
    os.chmod(etc, 0o755)
    load_kubeconfig(path)


@pytest.mark.parametrize("which", ["token", "ca.crt"])
def test_a_file_it_names_that_another_user_may_change_is_refused(tmp_path, which) -> None:
    path = kubeconfig(tmp_path)
    named = str(tmp_path / "etc" / which)
    os.chown(named, NOBODY, 0)
    message = refusal(path)
    assert message.startswith(f"{path}: ") and f"{named} is owned by uid {NOBODY}, not root" in message
    assert f"fix: chown root {named}" in message


def test_a_token_file_pointing_elsewhere_must_be_one_token(tmp_path) -> None:
    """A tokenFile naming a root-only file of several lines (/etc/shadow, a key) is refused
    before it is sent anywhere, and the message holds nothing of it."""
    path = kubeconfig(tmp_path)
    token = tmp_path / "etc" / "token"
    token.write_text(f"{SECRET_1}\n{SECRET_2}\n")
    message = refusal(path)
    assert f"tokenFile {token} holds 2 lines: a token file holds one token on one line" in message
    token.write_text(f"{SECRET_1} {SECRET_2}\n")
    message += refusal(path)
    assert "is not a token: whitespace at character 32 of 57" in message
    token.write_text("x" * (64 * 1024 + 1))
    message += refusal(path)
    assert f"{token} is larger than 65536 bytes" in message
    assert SECRET_1 not in message and SECRET_2 not in message and "xxxx" not in message


def test_a_yaml_error_says_where_never_what(tmp_path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(f"users:\n- user:\n    token: {SECRET_1}: {SECRET_2}\n")
    message = refusal(str(path))
    assert message.startswith(f"{path}: not YAML at line 3, column ")
    assert SECRET_1 not in message and SECRET_2 not in message
    path.write_text(render_kubeconfig("https://10.0.0.1:6443", CA, token=f"{SECRET_1}\t{SECRET_2}"))
    message = refusal(str(path))
    assert "users[].user.token is not a token: whitespace at character 32" in message and SECRET_1 not in message


def test_secrets_others_may_read_are_used_with_a_warning_naming_them(tmp_path) -> None:
    path = kubeconfig(tmp_path)
    token = str(tmp_path / "etc" / "token")
    assert load_kubeconfig(path).warnings == ()
    os.chmod(path, 0o644)   # (names the token file: holds no secret itself)
    assert load_kubeconfig(path).warnings == ()
    os.chmod(token, 0o644)
    (warning,) = load_kubeconfig(path).warnings
    assert warning.startswith(f"{token} holds a credential and is readable by every user (mode 0644): ")
    assert warning.endswith(f"fix: chmod go-r {token} (and remove the ACL entry, if one grants it)")
    os.chown(token, 0, NOBODY)
    os.chmod(token, 0o640)
    assert load_kubeconfig(path).warnings[0].startswith(f"{token} holds a credential and is readable by "
                                                        f"group {NOBODY} (mode 0640)")
    inline = kubeconfig(tmp_path, token="inline-token")
    os.chmod(inline, 0o604)
    assert load_kubeconfig(inline).warnings[0].startswith(f"{inline} holds a credential and is readable by "
                                                          "every user (mode 0604)")


def test_an_untrusted_kubeconfig_leaves_the_node_without_the_link_saying_why(tmp_path) -> None:
    path = kubeconfig(tmp_path)
    os.chmod(path, 0o646)
    with capture_logs() as logs:
        link = link_mod.cluster_link(KubernetesConfig(kubeconfig=path), None, str(tmp_path), "node-a")
    assert link is None
    (line,) = [e for e in logs if e["log_level"] == "error"]
    assert "no API server link" in line["event"] and f"{path} is not safe to trust" in line["error"]


def test_a_token_file_rotated_to_garbage_fails_requests_without_showing_it(cluster: Any, tmp_path) -> None:
    """Under a running client (the real API server): the token the server refuses (401)
    makes the file be read again; a file of two lines is not sent, and the request's error
    names the file, not its content."""
    from anolisnuma.cluster.kube_client import ApiError, KubeClient
    from anolisnuma.testing.kube_apiserver import kubeconfig_text

    token = tmp_path / "token"
    token.write_text("expired-token\n")
    path = tmp_path / "kubeconfig"
    path.write_text(kubeconfig_text(cluster.cp.server, cluster.cp.ca_file, token_file="token"))
    client = KubeClient(load_kubeconfig(str(path)), 5.0)
    errors: Dict[str, str] = {}
    try:
        for what in ("expired", "two lines"):
            with pytest.raises(ApiError) as e:
                list(client.list_oenumas(10))
            errors[what] = str(e.value)
            token.write_text(f"{SECRET_1}\n{SECRET_2}\n")
    finally:
        client.close()
    assert errors["expired"].startswith("401") and SECRET_1 not in errors["two lines"]
    assert errors["two lines"] == (f"no reply BadCredentials: list oenumas: tokenFile {token} holds 2 lines: a "
                                   "token file holds one token on one line")


CREDENTIALS = ("kubeconfig", "token", "ca.crt", "client.crt", "client.key")


def behind_links(tmp_path: Any) -> str:
    """Every credential in a root-only ``real/``, each reached through a root-owned link in
    ``shared/``, a sticky directory every user may write (as ``/tmp``); the kubeconfig names
    them by those links and is loaded by its own. Returns the kubeconfig's link."""
    real, shared = tmp_path / "real", tmp_path / "shared"
    real.mkdir()
    shared.mkdir()
    os.chmod(shared, 0o1777)
    doc = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
           "clusters": [{"name": "k", "cluster": {"server": "https://10.0.0.1:6443",
                                                  "certificate-authority": str(shared / "ca.crt")}}],
           "users": [{"name": "u", "user": {"tokenFile": str(shared / "token"),
                                            "client-certificate": str(shared / "client.crt"),
                                            "client-key": str(shared / "client.key")}}],
           "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}
    content = {"kubeconfig": json.dumps(doc), "token": "a-token\n", "ca.crt": CA, "client.crt": CA,
               "client.key": "-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----\n"}
    for name in CREDENTIALS:
        (real / name).write_text(content[name])
        os.chmod(real / name, 0o600)
        os.symlink(real / name, shared / name)
    return str(shared / "kubeconfig")


@pytest.mark.parametrize("which", CREDENTIALS)
def test_a_credential_behind_a_link_another_user_owns_is_refused(tmp_path, which) -> None:
    """Whoever owns a link in a sticky directory may point it elsewhere at any time (another
    kubeconfig, another root-only file as the token), whatever it points to when checked;
    a link root owns there cannot be changed by anyone else, and is followed (as kubeadm's
    and the kubelet's links to rotated certificates are)."""
    # given every credential behind a link root owns: followed
    path = behind_links(tmp_path)
    assert load_kubeconfig(path).token == "a-token"
    # when one of the links is another user's (still pointing to the same root-only file)
    link = str(tmp_path / "shared" / which)
    os.lchown(link, NOBODY, NOBODY)
    # then it is refused, naming the link and the fix
    message = refusal(path)
    assert (f"{link} is a symbolic link owned by uid {NOBODY}, not root: whoever may write there may swap what "
            f"the daemon reads as root; fix: chown -h root {link}") in message


def test_a_directory_link_on_the_way_that_another_user_owns_is_refused(tmp_path) -> None:
    # given the kubeconfig's directory reached through a link in a sticky directory
    path = kubeconfig(tmp_path)
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    os.symlink(tmp_path / "etc", shared / "etc")
    through = str(shared / "etc" / "kubeconfig")
    assert load_kubeconfig(through).server == "https://10.0.0.1:6443"
    # when that link is another user's
    os.lchown(shared / "etc", NOBODY, NOBODY)
    # then the kubeconfig is refused, naming the link above it
    assert (f"{shared / 'etc'} (above {through}) is a symbolic link owned by uid {NOBODY}, not root"
            in refusal(through))


def set_acl(path: str, uid: int, perm: int) -> None:
    """``setfacl -m u:UID:PERM`` as the kernel stores it (mask rwx)."""
    import struct

    entries = [(1, 6, 0xFFFFFFFF), (2, perm, uid), (4, 0, 0xFFFFFFFF), (0x10, 7, 0xFFFFFFFF), (0x20, 0, 0xFFFFFFFF)]
    try:
        os.setxattr(path, "system.posix_acl_access",
                    struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries))
    except OSError as e:
        pytest.skip(f"no POSIX ACLs on this file system: {e.strerror}")


def test_acl_entries_are_read_on_what_was_walked_to(tmp_path) -> None:
    """(The walk reads ACLs through its descriptors, not by name.)"""
    # given a token file another user may read through an ACL: used, with a warning
    path = kubeconfig(tmp_path)
    token = str(tmp_path / "etc" / "token")
    set_acl(token, NOBODY, 4)
    (warning,) = load_kubeconfig(path).warnings
    assert warning.startswith(f"{token} holds a credential and is readable by uid {NOBODY} through a POSIX ACL")
    # when the directory above is writable by that user through an ACL: refused
    etc = str(tmp_path / "etc")
    set_acl(etc, NOBODY, 7)
    assert (f"{etc} (above {path}) is writable by uid {NOBODY} through a POSIX ACL: whoever may write there may "
            f"swap what the daemon reads as root; fix: setfacl -x u:{NOBODY} {etc}") in refusal(path)
