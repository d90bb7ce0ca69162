"""Entering a process's network namespace: ``<pid>/ns/net`` under the configured
``proc_root``, with ``setns(2)``, on a short-lived helper thread (:func:`run_in_netns`).
The daemon's other threads never change namespace, and the helper closes every
descriptor it opened before it ends.
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading
from typing import Callable, List, NamedTuple, Optional, Sequence, Tuple, TypeVar

CLONE_NEWNET = 0x40000000
T = TypeVar("T")


class NetnsError(OSError):
    """The namespace helper failed as a whole (not for one PID): it could not start, or
    did not finish in time."""


NetnsKey = Tuple[int, int]   # (st_dev, st_ino) of a namespace file: its identity


class NetnsResult(NamedTuple):
    pid: int
    netns: Optional[NetnsKey]     # the namespace actually entered
    value: object                 # what ``fn`` returned
    error: Optional[BaseException]


def _libc_setns() -> Callable[[int, int], None]:
    native = getattr(os, "setns", None)   # Python >= 3.12
    if native is not None:
        return native
    libc = ctypes.CDLL(None, use_errno=True)
    fn = libc.setns
    fn.argtypes = (ctypes.c_int, ctypes.c_int)
    fn.restype = ctypes.c_int

    def setns(fd: int, nstype: int) -> None:
        if fn(fd, nstype) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns: {os.strerror(err)}")
    return setns


_setns = _libc_setns()


def run_in_netns(proc_root: str, pids: Sequence[int], fn: Callable[[int, NetnsKey], T],
                 timeout: float = 30.0) -> List[NetnsResult]:
    """Call ``fn(pid, netns)`` inside the network namespace of each of ``pids``, in order,
    on a helper thread made for this call, which goes back to its own namespace and ends
    before this returns. ``fn`` must close what it opens (its sockets keep the namespace
    they were made in, whatever thread uses them).

    Per-PID failures (process gone, namespace not enterable, ``fn`` raised) are returned in
    the result, not raised. Raises :class:`NetnsError` if the helper did not finish
    within ``timeout`` (it then finishes on its own; ``fn``'s sockets have timeouts).
    """
    results: List[NetnsResult] = []
    failure: List[BaseException] = []

    def worker() -> None:
        try:
            own = os.open(os.path.join(proc_root, "thread-self/ns/net"), os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            failure.append(e)
            return
        try:
            moved = False
            for pid in pids:
                path = os.path.join(proc_root, str(int(pid)), "ns/net")
                try:
                    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                except OSError as e:
                    results.append(NetnsResult(pid, None, None, e))
                    continue
                try:
                    st = os.fstat(fd)
                    key = (st.st_dev, st.st_ino)
                    _setns(fd, CLONE_NEWNET)
                    moved = True
                except OSError as e:
                    results.append(NetnsResult(pid, None, None, e))
                    continue
                finally:
                    os.close(fd)
                try:
                    results.append(NetnsResult(pid, key, fn(pid, key), None))
                except Exception as e:  # noqa: BLE001 - handed back to the caller per PID
                    results.append(NetnsResult(pid, key, None, e))
            if moved:
                _setns(own, CLONE_NEWNET)
        except BaseException as e:  # noqa: BLE001 - the thread ends either way
            failure.append(e)
        finally:
            os.close(own)

    thread = threading.Thread(target=worker, name="anolisnuma-netns", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise NetnsError(errno.ETIMEDOUT, f"namespace helper still busy after {timeout:.0f} s")
    if failure:
        e = failure[0]
        if isinstance(e, OSError):
            raise NetnsError(e.errno or errno.EIO, f"namespace helper: {e}") from e
        raise e
    return results


def netns_key(proc_root: str, pid: int) -> NetnsKey:
    """Identity of ``pid``'s network namespace; raises OSError if the process is gone."""
    st = os.stat(os.path.join(proc_root, str(int(pid)), "ns/net"))
    return (st.st_dev, st.st_ino)
