"""``NriPlugin``: anolisnuma registered with containerd as an NRI plugin, kept registered.

One background loop (a :class:`~anolisnuma.controller.Controller`): connect to
containerd's NRI socket, register (``Runtime.RegisterPlugin`` with ``[nri] plugin_name``
and ``plugin_index``), answer ``Configure`` with the events the policies need, answer
``Synchronize`` and ask the daemon's resync to look at what containerd runs, then serve
the events (:class:`~anolisnuma.nri.frontend.NriFrontEnd`) until the connection ends;
then connect again, the delay doubling from 0.5 s up to ``[nri] reconnect_max_seconds``;
but at once when the socket is made again (containerd back): see :meth:`NriPlugin._pause`.

What containerd does meanwhile (NRI v0.11.0, vendored by containerd 2.2): a pod or
container created while no plugin is registered is created as the kubelet asked, without
us; one whose event we do not answer within ``plugin_request_timeout`` (2 s by default) is
created without us too, and containerd closes our connection. Both are what the resync
on our reconnect (``Synchronize``) finds: a managed pod's containers adopted unpinned are
pinned by the re-pinner, QoS knobs written by the reconciler. An error we return (a hook
refused under ``failure_policy = "fail"``) fails the kubelet's call, as through the proxy.

Who runs what: this loop's thread connects (``door.py``, blocking), hands the socket to
the daemon's event loop, registers and waits for the connection to end; everything on the
connection itself (reading, each request decoded, translated and run through the pipeline,
its answer written) runs on the event loop (``session.py``), with no thread in between.

Live moves (rules, traffic affinity, re-spread) leave through :meth:`update_container_resources`,
which the re-pinner calls: NRI's ``UpdateContainers`` while registered (containerd's CRI
``UpdateContainerResources`` would come back to us as an UpdateContainer event and be read
as the kubelet's), the CRI call otherwise. The re-pinner waits (:meth:`ready`) while the
plugin is not registered, for up to ``WAIT_FOR_REGISTRATION`` seconds: after a restart its
first re-pins then leave through NRI too, as soon as the plugin registers (it wakes the
re-pinner, ``on_registered``); past that wait (NRI off in containerd, say) they go through
CRI, so that a pod adopted unpinned is still pinned.

Who can write to this input: containerd, root, on a root-only socket; the wire layer
(``session.py``) bounds what a faulty peer can make us hold. A socket that someone but root
could replace (it, a directory above it or a link on the way, owned or writable by another
user) is not connected to, nor one a process of another user listens on: that user could
listen there in containerd's place (``door.py``).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import random
import threading
import time
from typing import Any, Callable, Dict, Iterable, Optional, Tuple

import structlog
from google.protobuf.message import DecodeError

from anolisnuma.controller import Controller
from anolisnuma.cri.grpcwire import STATUS_CODES
from anolisnuma.nri import door, translate
from anolisnuma.nri.frontend import EVENT_METHODS
from anolisnuma.nri.session import NriRequestError, NriSession
from anolisnuma.trusted_file import UntrustedFile
from nri_proto import api_pb2 as nri

log = structlog.get_logger("anolisnuma.nri")

_INVALID_ARGUMENT, _UNIMPLEMENTED = STATUS_CODES["INVALID_ARGUMENT"], STATUS_CODES["UNIMPLEMENTED"]
_INTERNAL = STATUS_CODES["INTERNAL"]
# the methods that carry an event (a failure counts as events_failed; the others' as requests_failed)
_EVENT_METHODS = frozenset({"CreateContainer", "UpdateContainer", "StopContainer", "StateChange", "UpdatePodSandbox"})
# What an event failed outside the pipeline is answered with when no hook it passes is
# fail-closed: the empty reply, "as if anolisnuma were not there", as the relay forwards a
# call unchanged when its pipeline fails on it (Interceptor.failed); and the CRI method each
# runs as, whose hooks' failure policies decide (None: a StateChange, any policy).
_PASS_ON = {"CreateContainer": (nri.CreateContainerResponse, "CreateContainer"),
            "UpdateContainer": (nri.UpdateContainerResponse, "UpdateContainerResources"),
            "StopContainer": (nri.StopContainerResponse, "StopContainer"),
            "StateChange": (nri.Empty, None),
            "UpdatePodSandbox": (nri.UpdatePodSandboxResponse, None)}


def event_mask(events: Iterable[int]) -> int:
    """NRI's EventMask of ``events``: bit e-1 for event e."""
    return sum(1 << (e - 1) for e in set(events))


# every event the front-end can take (anolisnuma/nri/frontend.py); the policies' own set,
# subscribed at Configure, is the part of it they act on (NriFrontEnd.events)
EVENT_MASK = event_mask(EVENT_METHODS)
REGISTRATION_TIMEOUT = 5.0   # containerd's plugin_registration_timeout default
FIRST_RETRY_SECONDS = 0.5    # the backoff's first delay, doubled up to [nri] reconnect_max_seconds
UPDATE_TIMEOUT = 5.0
# How often the socket is looked at while waiting to reconnect: one stat(2), a few
# microseconds, so that containerd's socket made again is tried within this (docs/nri.md)
DOOR_POLL_SECONDS = 0.1
# How long live moves wait for the plugin to register before going through CRI
WAIT_FOR_REGISTRATION = 10.0


class NriPlugin(Controller):
    """``NriPlugin(config, frontend, on_synchronize=None, fallback=None, loop=None,
    on_registered=None)``: ``config`` is ``[nri]``; ``on_synchronize()`` is called (on the
    event loop) after each full Synchronize (the daemon wakes its resync); ``fallback`` is
    the CRI client live moves use while not registered; ``loop`` is the event loop that
    serves the connection (the front-end's, ``frontend.loop``, when not given);
    ``on_registered()`` is called (on this loop's thread) after each registration (the
    daemon wakes its re-pinner)."""

    name = "nri"

    def __init__(self, config: Any, frontend: Any, on_synchronize: Optional[Callable[[], None]] = None,
                 fallback: Any = None, loop: Optional[asyncio.AbstractEventLoop] = None,
                 on_registered: Optional[Callable[[], None]] = None) -> None:
        super().__init__()
        self.config = config
        self.frontend = frontend
        self.loop = loop if loop is not None else frontend.loop
        self.on_synchronize = on_synchronize
        self.fallback = fallback
        self.on_registered = on_registered
        self._session: Optional[NriSession] = None
        self._lock = threading.Lock()
        self._delay = 0.0
        self._base_delay = 0.0   # the delay before its jitter: what doubles
        self._registered = False
        # since when live moves have had no registered plugin to leave through (made: not yet)
        self._unregistered_since = time.monotonic()
        self._door_seen: Optional[Tuple[int, int, int]] = None   # the socket's identity at the last try
        self._tried = False
        self._watch = True   # whether the pause after the last try watches the socket
        self.runtime = ""            # "containerd v2.2.7", from Configure
        self.request_timeout_ms = 0  # containerd's plugin_request_timeout, from Configure
        self.last_disconnect = ""
        self.n: Dict[str, int] = dict.fromkeys((
            "connects", "registrations", "disconnects", "connect_failures", "connect_refused_untrusted",
            "connect_refused_peer", "synchronizes", "events", "events_refused", "events_failed",
            "requests_failed", "events_passed_on", "updates_sent", "updates_failed", "updates_via_cri"), 0)
        self._handlers: Dict[str, Any] = {
            "Configure": (nri.ConfigureRequest, self._configure),
            "Synchronize": (nri.SynchronizeRequest, self._synchronize),
            "Shutdown": (nri.Empty, self._shutdown),
            "CreateContainer": (nri.CreateContainerRequest, self._create_container),
            "UpdateContainer": (nri.UpdateContainerRequest, self._update_container),
            "StopContainer": (nri.StopContainerRequest, self._stop_container),
            "StateChange": (nri.StateChangeEvent, self._state_change),
            "UpdatePodSandbox": (nri.UpdatePodSandboxRequest, lambda _r: nri.UpdatePodSandboxResponse()),
        }

    # ------------------------------------------------------------------ the connection loop
    @property
    def connected(self) -> bool:
        s = self._session
        return s is not None and not s.closed

    def wait_seconds(self) -> float:
        # The first pass waits for the daemon's wake; the next follow at once (the pause
        # after a failure or a disconnect is run_once's own, watching the socket).
        return 0.001 if self._tried else 0.0

    def ready(self) -> bool:
        """Whether live moves should be sent now (the re-pinner asks before each pass):
        registered, or not registered for longer than ``WAIT_FOR_REGISTRATION`` seconds
        (they then go through CRI). False meanwhile: the re-pinner keeps them for the
        registration, which wakes it."""
        return self._registered or time.monotonic() - self._unregistered_since >= WAIT_FOR_REGISTRATION

    def run_once(self) -> None:
        """Connect, register, serve until the connection ends; after a failure or the end,
        pause (:meth:`_pause`)."""
        self._tried = True
        self._attempt()
        if self._delay and not self._stopping:
            self._pause(self._delay)

    def _attempt(self) -> None:
        cfg = self.config
        self._door_seen = door.identity(cfg.socket)
        try:
            # (door.py: the path checked and connected to in one walk, and the peer's uid)
            sock = door.connect(cfg.socket, REGISTRATION_TIMEOUT)
        except UntrustedFile as e:
            # whoever may change it may listen there in containerd's place and tell us of
            # pods that are not there: we do not connect
            self.n["connect_refused_untrusted"] += 1
            self._back_off("not connected: " + e.unsafe.describe("another user could listen there in containerd's "
                                                                "place"), watch=False)
            return
        except door.UntrustedPeer as e:
            self.n["connect_refused_peer"] += 1
            self._back_off(f"not connected: {e}", watch=False)
            return
        except OSError as e:
            self.n["connect_failures"] += 1
            self._back_off(f"cannot connect to {cfg.socket}: {e.strerror or e}")
            return
        session = NriSession(sock, self._handle, loop=self.loop, log=log, on_failure=self._failed_in_session)
        self.n["connects"] += 1
        with self._lock:
            if self._stopping:
                session.close()
                return
            self._session = session
        try:
            session.start()   # the event loop reads it from here on
            # (a future the loop's reader resolves; containerd's registration timeout is 5 s)
            session.call("RegisterPlugin", nri.RegisterPluginRequest(plugin_name=cfg.plugin_name,
                                                                     plugin_idx=cfg.plugin_index),
                         nri.Empty, timeout=REGISTRATION_TIMEOUT)
        except Exception as e:
            session.close()
            self._back_off(f"registration failed: {e}")
            return
        self.n["registrations"] += 1
        self._delay = self._base_delay = 0.0
        self.last_error = ""   # (the status lists loops whose last error is set: this one is over)
        self._registered = True
        log.info("registered with containerd as an NRI plugin", socket=cfg.socket,
                 plugin=f"{cfg.plugin_index}-{cfg.plugin_name}")
        if self.on_registered is not None:
            try:
                self.on_registered()
            except Exception as e:   # (the session is served whatever it does)
                log.warning("NRI: what follows a registration failed", error=repr(e)[:300])
        session.wait_closed(None)
        self._registered = False
        self._unregistered_since = time.monotonic()
        self.n["disconnects"] += 1
        self.last_disconnect = session.reason
        if not self._stopping:
            self._back_off(f"connection ended: {session.reason}")

    def _pause(self, delay: float) -> None:
        """Wait ``delay`` seconds before the next try, or less: until the socket at
        ``[nri] socket`` is another than at the last try (containerd made it again, or made
        it at all), or the loop is stopped. Looked at every ``DOOR_POLL_SECONDS`` with one
        ``stat``: containerd removes its socket when it stops and binds a new one when it
        starts (a new inode, also over a stale file a ``kill -9`` left), so the plugin
        registers within that of containerd's NRI being back, whatever the backoff grew to
        while it was away. A socket that is there but refuses, or that was there all along,
        keeps the backoff, as does a refused path or listener (``_back_off``'s ``watch``). (Polling rather than inotify: nothing to hold open, and a removed
        directory, a path through links or a socket bound over a stale one need no case.)"""
        deadline = time.monotonic() + delay
        while not self._stopping:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if self._wake.wait(min(left, DOOR_POLL_SECONDS) if self._watch else left):
                self._wake.clear()   # woken (wake, stop): try now
                return
            if not self._watch:
                continue
            now = door.identity(self.config.socket)
            if now is not None and now != self._door_seen:
                log.info("NRI: containerd's socket is there again; connecting", socket=self.config.socket)
                return

    def _back_off(self, why: str, watch: bool = True) -> None:
        """Log ``why`` and grow the delay; ``watch`` False: the pause is the whole delay, the
        socket not watched (a path or listener another user controls: that user could
        otherwise make it try, and log, at the poll's rate)."""
        self._watch = watch
        # (the jitter is not doubled with the delay: it stays within 20 % of the cap)
        self._base_delay = min(max(self._base_delay * 2, FIRST_RETRY_SECONDS), self.config.reconnect_max_seconds)
        self._delay = self._base_delay * random.uniform(0.8, 1.2)
        self.last_error = why
        log.warning("NRI: not registered with containerd; retrying", reason=why,
                    retry_in_seconds=round(self._delay, 2))

    def stop(self, timeout: float = 5.0) -> None:
        with self._lock:
            self._stopping = True
            session = self._session
        if session is not None:
            session.close()
        super().stop(timeout)

    # ------------------------------------------------------------------ containerd's requests
    async def _handle(self, method: str, payload: bytes) -> bytes:
        """The session's handler, on the event loop: ``method``'s serialized answer to ``payload``, or
        NriRequestError, its status the answer. Each request is handled alone: whatever its
        decoding, translation or handling raises (a bug, or an event that runs them out of
        memory, past an integer's range or too deep) is told in one log line and one count
        (``events_failed``, or ``requests_failed`` for Configure, Synchronize, Shutdown), and
        the session and the other requests go on. An event that was read is then answered
        as if anolisnuma were not there (its empty reply, counted ``events_passed_on``)
        unless a hook it passes is fail-closed, as the relay does; the others, and a request
        that cannot be read, with an error status, as ttrpc answers a handler's error."""
        entry = self._handlers.get(method)
        if entry is None:
            raise NriRequestError(_UNIMPLEMENTED, f"anolisnuma does not serve {method}")
        cls, fn = entry
        failure: Optional[NriRequestError] = None
        try:
            request = cls.FromString(payload)
        except DecodeError as e:
            failure = self._failed(method, e, _INVALID_ARGUMENT, f"not a {cls.DESCRIPTOR.name}: {e}")
        except Exception as e:
            failure = self._failed(method, e)
        else:
            try:
                out = fn(request)
                if inspect.isawaitable(out):
                    out = await out
                return out.SerializeToString()
            except NriRequestError:
                raise
            except Exception as e:
                failure = self._failed(method, e)
            # (not a request that cannot be read: what no runtime sends is refused)
            passed = self._passed_on(method)
            if passed is not None:
                return passed
        # Raised out here, not in the except clause: it does not carry the failed call (its
        # frames, and what they had allocated) as its context while the answer is written.
        raise failure

    def _passed_on(self, method: str) -> Optional[bytes]:
        """The empty reply to an event that failed outside the pipeline, when the failure
        policies of the hooks it passes let it through (None: answer with the error, as a
        fail-closed relay refuses the call)."""
        passed = _PASS_ON.get(method)
        if passed is None:
            return None
        reply, cri_method = passed
        try:
            if self.frontend.interceptor.fail_closed(cri_method):
                return None
        except Exception:   # (whatever cannot be told is not fail-closed: the node first)
            pass
        self.n["events_passed_on"] += 1
        return reply().SerializeToString()

    def _failed(self, method: str, error: BaseException, code: int = _INTERNAL, message: str = "") -> NriRequestError:
        """Count and log (one line) a request that failed; the error it is answered with."""
        kind = type(error).__name__
        self.n["events_failed" if method in _EVENT_METHODS else "requests_failed"] += 1
        try:
            log.error("NRI: a request failed; the session goes on", method=method,
                      error=kind, detail=str(error)[:200], at=_where(error))
        except Exception:   # (out of memory, the line may fail too: the answer must not)
            pass
        return NriRequestError(code, message or f"anolisnuma failed to handle {method} ({kind})")

    def _failed_in_session(self) -> None:
        # a request the session could not even read (out of memory, say), answered there
        self.n["requests_failed"] += 1

    def _configure(self, req: Any) -> Any:
        self.runtime = f"{req.runtime_name} {req.runtime_version}".strip()
        self.request_timeout_ms = req.request_timeout
        if req.request_timeout > 0:   # our events must be answered within it
            self.frontend.fit_to(req.request_timeout / 1000.0)
        events = self.frontend.events()
        log.info("NRI: configured by the runtime", runtime=self.runtime,
                 request_timeout_ms=req.request_timeout, registration_timeout_ms=req.registration_timeout,
                 events=[nri.Event.Name(e) for e in events])
        return nri.ConfigureResponse(events=event_mask(events))

    def _synchronize(self, req: Any) -> Any:
        # containerd sends its pods and containers in parts when they are many; the resync
        # lists them itself (through CRI, as after a restart), so the parts are only counted
        if not req.more:
            self.n["synchronizes"] += 1
            log.info("NRI: synchronized with the runtime; resyncing", pods=len(req.pods),
                     containers=len(req.containers))
            if self.on_synchronize is not None:
                self.on_synchronize()
        return nri.SynchronizeResponse(more=req.more)

    def _shutdown(self, _req: Any) -> Any:
        log.info("NRI: the runtime is shutting the plugin down")
        return nri.Empty()

    async def _event(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``, the front-end's, awaited when it is a coroutine (NriFrontEnd's are)."""
        self.n["events"] += 1
        try:
            out = fn(*args)
            return (await out) if inspect.isawaitable(out) else out
        except NriRequestError:
            self.n["events_refused"] += 1
            raise

    async def _create_container(self, req: Any) -> Any:
        adjust = await self._event(self.frontend.create_container, req.pod, req.container)
        return nri.CreateContainerResponse(adjust=adjust)

    async def _update_container(self, req: Any) -> Any:
        update = await self._event(self.frontend.update_container, req.container, req.linux_resources)
        return nri.UpdateContainerResponse(update=[update] if update is not None else [])

    async def _stop_container(self, req: Any) -> Any:
        await self._event(self.frontend.stop_container, req.container)
        return nri.StopContainerResponse()

    async def _state_change(self, evt: Any) -> Any:
        fe = self.frontend
        handler = {
            nri.RUN_POD_SANDBOX: lambda: fe.run_pod_sandbox(evt.pod),
            nri.STOP_POD_SANDBOX: lambda: fe.stop_pod_sandbox(evt.pod),
            nri.REMOVE_POD_SANDBOX: lambda: fe.remove_pod_sandbox(evt.pod),
            nri.START_CONTAINER: lambda: fe.start_container(evt.container),
            nri.REMOVE_CONTAINER: lambda: fe.remove_container(evt.container),
        }.get(evt.event)
        if handler is not None:
            await self._event(handler)
        return nri.Empty()

    # ------------------------------------------------------------------ live moves
    def update_container_resources(self, container_id: str, res: Any) -> None:
        """The re-pinner's client call, from its thread: a container's new cpuset (``res`` is
        CRI ``LinuxContainerResources``; only its cpuset is sent). Through NRI, a call the
        event loop's reader answers, waited for at most ``UPDATE_TIMEOUT``; raises what
        :meth:`NriSession.call` raises, or RuntimeError when containerd failed the update."""
        session = self._session
        if session is None or session.closed:
            if self.fallback is None:
                raise RuntimeError("not registered with containerd's NRI")
            self.n["updates_via_cri"] += 1
            self.fallback.update_container_resources(container_id, res)
            return
        update = translate.cpuset_update(container_id, res.cpuset_cpus, res.cpuset_mems)
        try:
            reply = session.call("UpdateContainers", nri.UpdateContainersRequest(update=[update]),
                                 nri.UpdateContainersResponse, timeout=UPDATE_TIMEOUT)
        except Exception:
            self.n["updates_failed"] += 1
            raise
        if len(reply.failed):
            self.n["updates_failed"] += 1
            raise RuntimeError(f"containerd could not update container {container_id} (NRI UpdateContainers)")
        self.n["updates_sent"] += 1

    def close(self) -> None:
        """The re-pinner closes its client at shutdown: here, the CRI client live moves fall
        back to (the NRI connection itself ends with :meth:`stop`)."""
        if self.fallback is not None:
            self.fallback.close()

    def counts(self) -> Dict[str, int]:
        return dict(self.n, connected=int(self.connected))

    def describe(self) -> Dict[str, Any]:
        """For ``anolisnuma-ctl status``."""
        cfg = self.config
        budget = getattr(getattr(self.frontend, "interceptor", None), "nri_hook_budget", 0.0)
        return {"socket": cfg.socket, "plugin": f"{cfg.plugin_index}-{cfg.plugin_name}",
                "connected": self.connected, "runtime": self.runtime or None,
                "request_timeout_ms": self.request_timeout_ms or None,
                # each hook's budget on an NRI event, cut to fit the request timeout (fit_to)
                "hook_budget_ms": round(budget * 1000) if budget else None,
                "last_disconnect": self.last_disconnect or None,
                "retry_in_seconds": None if self._registered else round(self._delay, 2), **self.n}


def _where(error: BaseException) -> str:
    """Where ``error`` was raised (``translate.py:38``): a bug is found from the one line."""
    tb = error.__traceback__
    if tb is None:
        return ""
    while tb.tb_next is not None:
        tb = tb.tb_next
    return f"{os.path.basename(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno}"
