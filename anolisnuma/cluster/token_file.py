"""A bearer token, inline in the kubeconfig or in its ``tokenFile``: checked, never shown.

A token file is read as the kubeconfig is (:mod:`anolisnuma.trusted_file`: a regular file
only root may change, along its path too and through no link another user owns, opened
without blocking, at most
:data:`MAX_TOKEN_FILE` bytes) at start and again whenever the API server answers 401
(``token_auth.py``). A token is one line of visible ASCII: what else a file holds (two
lines, a private key, ``/etc/shadow``) is refused before it is sent anywhere, and no
message here carries a byte of it, only where and what kind of thing is wrong (the
messages are logged, shown by ``anolisnuma-ctl status`` and sent nowhere else).

Importing this module does not import lightkube.
"""

from __future__ import annotations

from typing import Optional, Tuple

from anolisnuma.trusted_file import read_trusted_or

MAX_TOKEN_FILE = 64 * 1024   # a ServiceAccount token is about 1 KiB, a bootstrap token 23 bytes


class TokenError(ValueError):
    """The token cannot be used; the message names where it is and never holds it."""


def token_problem(token: str) -> Optional[str]:
    """What makes ``token`` unusable as a bearer token (no byte of it said), or None."""
    if not token:
        return "empty"
    for i, ch in enumerate(token):
        if not "!" <= ch <= "~":   # (visible ASCII: what an HTTP header carries as it is)
            what = "whitespace" if ch.isspace() else "a character that is not visible ASCII"
            return f"not a token: {what} at character {i + 1} of {len(token)}"
    return None


def read_token_file(path: str) -> Tuple[str, Optional[str]]:
    """``(token, readers)``: the token in ``path`` and who but root may read the file
    (None: nobody; else words for a warning). Raises :class:`TokenError`."""
    read = read_trusted_or(path, MAX_TOKEN_FILE, lambda problem: TokenError(f"tokenFile {problem}"))
    try:
        text = read.data.decode("ascii")
    except UnicodeDecodeError as e:
        raise TokenError(f"tokenFile {path} is not a token: byte {e.start + 1} of {len(read.data)} is not "
                         f"ASCII") from None
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    if len(lines) > 1:
        raise TokenError(f"tokenFile {path} holds {len(lines)} lines: a token file holds one token on one line")
    token = text.strip()
    problem = token_problem(token)
    if problem is not None:
        raise TokenError(f"tokenFile {path} is {problem}")
    return token, read.readers
