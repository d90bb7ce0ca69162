"""``TokenFileAuth``: the bearer token of a ``tokenFile``, set on every request.

lightkube would read a ``tokenFile`` itself (at the first request, again on a 401), with a
plain ``open`` (a FIFO there blocks the thread, a file of any size is read whole), and a
file of several lines would go into the ``Authorization`` header, whose refusal by httpx
quotes the header: the token in the log. So lightkube is given no ``tokenFile``
(``kubeconfig.py``) and this transport, under :class:`~anolisnuma.cluster.bounded_transport.BoundedTransport`
and over the one that connects, sets the header from the file as ``token_file.py`` reads
it: checked, bounded, never quoted. As client-go does, the token read is kept and the
file read again when the API server answers 401; when that gives another token the
request is made once more with it (a token rotated under a running daemon is used at the
first request the old one is refused for).

A token file that has become unusable fails the request with :class:`BadToken` (an
``httpx.TransportError``, so lightkube hands it back as it would a connection failure;
``kube_client.py`` maps it to ``ApiError`` reason ``BadCredentials``), naming the file and
what is wrong with it.
"""

from __future__ import annotations

import threading
from typing import Any, Optional

from lightkube.core.generic_client import httpx  # (httpx or httpx2, as lightkube imports it)

from anolisnuma.cluster.token_file import TokenError, read_token_file


class BadToken(httpx.TransportError):
    """The token file cannot be used (the message names it and never holds the token)."""


class TokenFileAuth(httpx.BaseTransport):
    """``TokenFileAuth(inner, path, token=None)``: ``token``, when given, is what was read
    from ``path`` already (the kubeconfig's check at start)."""

    def __init__(self, inner: Any, path: str, token: Optional[str] = None) -> None:
        self.inner = inner
        self.path = path
        self._token = token
        self._lock = threading.Lock()
        self.reads = 0

    def __deepcopy__(self, memo: Any) -> "TokenFileAuth":
        return self   # (see BoundedTransport.__deepcopy__)

    def _read(self) -> str:
        self.reads += 1
        try:
            token, _ = read_token_file(self.path)
        except TokenError as e:
            raise BadToken(str(e)) from None
        with self._lock:
            self._token = token
        return token

    def handle_request(self, request: Any) -> Any:
        with self._lock:
            token = self._token
        if token is None:
            token = self._read()
        request.headers["Authorization"] = f"Bearer {token}"
        response = self.inner.handle_request(request)
        if response.status_code != 401:
            return response
        try:
            fresh = self._read()
        except BadToken:
            response.close()
            raise
        if fresh == token:
            return response
        response.close()
        request.headers["Authorization"] = f"Bearer {fresh}"
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()
