"""``KubeClient``: the daemon's requests to the API server, made with lightkube.

Why lightkube: measured beside the CRI relay (scripts/bench_kubeclient.py; docs/cluster.md,
Cost), it adds a third of the memory the official ``kubernetes`` client does, and it has
what the daemon needs as its own: generic resources (Oenuma, NodeResourceTopology), list
with pages, watch from a resourceVersion, server-side apply with a field manager, typed
``events.k8s.io/v1`` Events, and a sync client that takes an httpx transport, through which
every reply is bounded (``bounded_transport.py``). lightkube 0.x (Python 3.9) and 1.x
(3.10+) are both used the same way.

This adapter makes the client (the kubeconfig checked by ``kubeconfig.py``, the TLS context
and credentials from lightkube but a ``tokenFile``'s, which ``token_auth.py`` reads, our
transport in front of httpx's), maps every failure to one :class:`ApiError` (a reply that
fails to decode in any way among them: a reply nested past the decoder's depth raises
RecursionError), and hands the loops plain dicts. One client is used by one thread;
requests are blocking and run on the cluster loops' own threads, never on the CRI loop.
"""

from __future__ import annotations

import datetime
from typing import Any, Callable, Dict, Iterator, Tuple

from lightkube import ApiError as LightkubeApiError
from lightkube import Client
from lightkube.config import client_adapter
from lightkube.core.exceptions import ConfigError
from lightkube.generic_resource import create_global_resource, create_namespaced_resource
from lightkube.types import OnErrorAction, OnErrorResult, PatchType

from anolisnuma import __version__
from anolisnuma.cluster.bounded_transport import BoundedTransport, ReplyTooLarge, WatchEnded, httpx
from anolisnuma.cluster.kubeconfig import Kubeconfig, KubeconfigError
from anolisnuma.cluster.reply_encoding import ReplyEncoding
from anolisnuma.cluster.token_auth import BadToken, TokenFileAuth
from anolisnuma.policies.numa.rules import OENUMA_API_VERSION, OENUMA_KIND

MIB = 1 << 20
MAX_REPLY_BYTES = 64 * MIB    # any reply but a watch's, decoded: a list page of LIST_PAGE of the largest CRs
MAX_EVENT_BYTES = 4 * MIB     # one watch event: an object etcd took (1.5 MiB), JSON-escaped
# No object is larger than etcd's --max-request-bytes (1.5 MiB unless raised): the largest
# Oenuma etcd took was 1,572,768 bytes in a list reply of it alone (measured on the tests'
# API server, which stores a string's "<" as the 6 bytes of "\u003c" already, and so serves
# no more than it stored: tests/cluster/test_reply_bounds_live.py finds that CR again and
# holds these numbers to it); 4 % more for the list's own fields and the search's step.
MAX_CR_BYTES = 1600 * 1024
LIST_PAGE = MAX_REPLY_BYTES // MAX_CR_BYTES   # 40 CRs a page: a page of the largest is within the bound
USER_AGENT = f"anolisnuma/{__version__}"
ALL_NAMESPACES = "*"

_group, _version = OENUMA_API_VERSION.split("/")
Oenuma = create_namespaced_resource(_group, _version, OENUMA_KIND, "oenumas")
NodeResourceTopology = create_global_resource("topology.node.k8s.io", "v1alpha2", "NodeResourceTopology",
                                              "noderesourcetopologies")


class ApiError(Exception):
    """A request failed: ``status`` is the HTTP status (0 when none came back: refused,
    timed out, cut; 200 for a reply that is garbage), ``reason`` the Kubernetes reason
    (``Expired``, ``NotFound``...) or ours (``Timeout``, ``Unreachable``, ``Garbage``...)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status or 'no reply'} {reason}: {message}" if reason else f"{status}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def gone(self) -> bool:
        """410 Gone: the resourceVersion asked for is older than the server keeps."""
        return self.status == 410


def api_error(e: BaseException, what: str) -> ApiError:
    """Any failure of a request (or of reading its reply) as an :class:`ApiError`."""
    if isinstance(e, ApiError):
        return e
    if isinstance(e, LightkubeApiError):
        st = e.status
        return ApiError(int(getattr(st, "code", 0) or 0), str(getattr(st, "reason", "") or ""),
                        " ".join(str(getattr(st, "message", "") or "").split())[:500])
    if isinstance(e, httpx.HTTPStatusError):   # (an error reply that is not a Status)
        text = e.response.text if e.response.is_stream_consumed else ""
        return ApiError(e.response.status_code, "", " ".join(text[:300].split()) or what)
    if isinstance(e, (ReplyTooLarge, ReplyEncoding)):
        return ApiError(200, "Garbage", f"{what}: {e}")
    if isinstance(e, BadToken):   # (its message names the file, never the token)
        return ApiError(0, "BadCredentials", f"{what}: {e}")
    if isinstance(e, httpx.TimeoutException):
        return ApiError(0, "Timeout", f"{what}: {e or type(e).__name__}")
    if isinstance(e, httpx.ConnectError):
        return ApiError(0, "Unreachable", f"{what}: {e or type(e).__name__}")
    if isinstance(e, httpx.HTTPError):
        return ApiError(0, "ConnectionLost", f"{what}: {e or type(e).__name__}")
    if isinstance(e, ConfigError):   # (lightkube's word for credentials it cannot use)
        return ApiError(0, "BadCredentials", str(e))
    # what a reply that is not JSON, or not the object it should be, makes the decoders raise
    return ApiError(200, "Garbage", f"{what}: the reply is garbage ({type(e).__name__}: {str(e)[:200]})")


# What a request that failed or a reply that is garbage can raise (lightkube 0.x decodes with
# json and dataclasses, 1.x with msgspec: ValueError and its kin, KeyError, TypeError...;
# both raise RecursionError for a reply nested deeper than they go, and MemoryError is what
# a decoder may raise for a reply that claims more than there is).
FAILURES = (httpx.HTTPError, ConfigError, ValueError, KeyError, TypeError, AttributeError, LookupError,
            RecursionError, MemoryError)
try:
    import msgspec

    FAILURES = FAILURES + (msgspec.MsgspecError,)   # type: ignore[assignment]
except ImportError:   # (lightkube 0.x does not use it)
    pass


class KubeClient:
    """``KubeClient(kubeconfig, timeout)``: ``timeout`` bounds each request but a watch
    (connect, send, the whole reply); a watch is bounded by ``watch_idle_timeout`` of
    silence. Raises :class:`KubeconfigError` when the CA or client certificate cannot be
    used."""

    def __init__(self, kubeconfig: Kubeconfig, timeout: float = 10.0, max_reply_bytes: int = MAX_REPLY_BYTES,
                 max_event_bytes: int = MAX_EVENT_BYTES, watch_idle_timeout: float = 330.0) -> None:
        self.server = kubeconfig.server
        self.timeout = timeout
        config = kubeconfig.lightkube_config()
        try:
            tls = client_adapter.verify_cluster(config.cluster, config.user, config.abs_file, trust_env=False)
        except (OSError, ValueError, ConfigError) as e:   # (ssl.SSLError is an OSError)
            raise KubeconfigError(f"{kubeconfig.source}: the CA or the client certificate cannot be used: "
                                  f"{' '.join(str(e).split())[:300]}") from e
        connect: Any = httpx.HTTPTransport(verify=tls, trust_env=False)
        if kubeconfig.token_file:
            connect = TokenFileAuth(connect, kubeconfig.token_file, kubeconfig.token or None)
        self.transport = BoundedTransport(connect, max_reply_bytes, max_event_bytes, timeout, watch_idle_timeout,
                                          user_agent=USER_AGENT)
        # (trust_env=False: no proxy nor CA bundle from the environment of a node daemon)
        self._client = Client(config, timeout=httpx.Timeout(timeout), trust_env=False, transport=self.transport)

    @property
    def requests(self) -> int:
        return self.transport.requests

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except FAILURES as e:
            raise api_error(e, what) from e

    # ------------------------------------------------------------------ Oenuma CRs
    def list_oenumas(self, page: int) -> "Listing":
        """Every Oenuma CR of the cluster, ``page`` at a time: iterate the result (each CR
        a dict), then read its ``resource_version``."""
        return Listing(self, self._client.list(Oenuma, namespace=ALL_NAMESPACES, chunk_size=page))

    def watch_oenumas(self, resource_version: str, server_timeout: int) -> Iterator[Tuple[str, Dict[str, Any]]]:
        """``(type, object)`` of each event after ``resource_version`` (bookmarks too),
        until the server ends the watch (after ``server_timeout`` seconds); raises
        :class:`ApiError` (410 Gone among them)."""
        events = self._client.watch(Oenuma, namespace=ALL_NAMESPACES, resource_version=resource_version,
                                    server_timeout=server_timeout, on_error=_end_or_raise)
        try:
            while True:
                try:
                    kind, obj = next(events)
                except StopIteration:
                    return
                except FAILURES as e:
                    raise api_error(e, "watch oenumas") from e
                yield kind, obj
        finally:
            events.close()
            self.transport.close_watches()

    def apply_oenuma_status(self, namespace: str, name: str, body: Dict[str, Any], field_manager: str) -> None:
        """Server-side apply of ``body`` to the CR's ``status`` under ``field_manager``."""
        self._call(f"apply status of oenuma {namespace}/{name}", lambda: self._client.patch(
            Oenuma.Status, name, body, namespace=namespace, patch_type=PatchType.APPLY,
            field_manager=field_manager, force=True))

    # ------------------------------------------------------------------ events.k8s.io/v1
    def create_event(self, namespace: str, name: str, when: float, regarding: Dict[str, str], **fields: str) -> str:
        """Create an Event (``fields``: type, reason, action, note, reportingController,
        reportingInstance); returns the name the API server gave it."""
        from lightkube.models.core_v1 import ObjectReference
        from lightkube.models.meta_v1 import ObjectMeta
        from lightkube.resources.events_v1 import Event

        event = Event(metadata=ObjectMeta(name=name, namespace=namespace), eventTime=_micro_time(when),
                      regarding=ObjectReference(**regarding), **fields)
        made = self._call(f"create event in {namespace}", lambda: self._client.create(event))
        return str(made.metadata.name) if made is not None and made.metadata is not None else name

    def patch_event_series(self, namespace: str, name: str, count: int, last_observed: str) -> None:
        """One more of an Event already made: its ``series`` (a merge patch)."""
        from lightkube.resources.events_v1 import Event

        self._call(f"patch event {namespace}/{name}", lambda: self._client.patch(
            Event, name, {"series": {"count": count, "lastObservedTime": last_observed}}, namespace=namespace,
            patch_type=PatchType.MERGE))

    # ------------------------------------------------------------------ NodeResourceTopology
    def apply_topology(self, body: Dict[str, Any], field_manager: str) -> None:
        """Server-side apply of a whole NodeResourceTopology object (``body``)."""
        name = body["metadata"]["name"]
        self._call(f"apply noderesourcetopology {name}", lambda: self._client.patch(
            NodeResourceTopology, name, body, patch_type=PatchType.APPLY, field_manager=field_manager, force=True))

    # ------------------------------------------------------------------
    def abort(self) -> None:
        """Cut the open watch (from any thread): its blocked read returns at once."""
        self.transport.abort()

    def close(self) -> None:
        self._call("close", self._client.close)


class Listing:
    """A list of CRs being read (see :meth:`KubeClient.list_oenumas`)."""

    def __init__(self, client: KubeClient, items: Any) -> None:
        self._client = client
        self._items = items

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        it = iter(self._items)
        while True:
            try:
                obj = next(it)
            except StopIteration:
                return
            except FAILURES as e:
                raise api_error(e, "list oenumas") from e
            if not isinstance(obj, dict):
                raise ApiError(200, "Garbage", "list oenumas: an item is not an object")
            yield obj

    @property
    def resource_version(self) -> str:
        try:
            rv = self._items.resourceVersion
        except Exception:   # (lightkube's NotReadyError: no page was read)
            rv = None
        if not isinstance(rv, str) or not rv:
            raise ApiError(200, "Garbage", "list oenumas: the reply has no resourceVersion")
        return rv


def _end_or_raise(e: BaseException, count: int) -> Any:
    """lightkube's watch goes on after a watch the server ended: the session ends there."""
    return OnErrorResult(OnErrorAction.STOP if isinstance(e, WatchEnded) else OnErrorAction.RAISE)


def _micro_time(t: float) -> datetime.datetime:
    """A MicroTime for lightkube's models. Both of its encoders write a datetime whose
    microseconds are 0 without a fraction, which the API server's MicroTime refuses: such
    a time is moved on by one microsecond."""
    when = datetime.datetime.fromtimestamp(t, tz=datetime.timezone.utc)
    return when.replace(microsecond=1) if when.microsecond == 0 else when

