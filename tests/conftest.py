"""Fixtures shared across the test folders."""

from __future__ import annotations

import shutil
import tempfile
from typing import Any, Callable, Iterator, Set

import pytest

from anolisnuma.testing.fake_kernel import FakeKernel


@pytest.fixture
def kernel():
    """``kernel(**options)`` -> a FakeKernel on tmpfs, removed after the test."""
    made = []

    def make(**kw):
        made.append(FakeKernel.temporary(**kw))
        return made[-1]
    yield make
    for fk in made:
        fk.close()


@pytest.fixture
def sockdir() -> Iterator[str]:
    """A short directory for unix sockets (their paths are limited to 108 bytes)."""
    d = tempfile.mkdtemp(prefix="an-", dir="/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def nri_events_of(hooks: Any) -> Set[str]:
    """The NRI events (their names) a daemon running ``hooks`` subscribes to in NRI mode
    (``NriFrontEnd.events``); ``None``: hooks not built yet."""
    import asyncio

    from anolisnuma.config import HooksConfig
    from anolisnuma.nri.frontend import NriFrontEnd
    from anolisnuma.pipeline.interceptor import Interceptor
    from anolisnuma.state.store import Store
    from nri_proto import api_pb2 as nri

    ic = Interceptor(hooks, HooksConfig(), Store())
    loop = asyncio.new_event_loop()
    try:
        return {nri.Event.Name(e) for e in NriFrontEnd(ic, loop).events()}
    finally:
        loop.close()
        ic.executor.shutdown(wait=False)


@pytest.fixture
def nri_subscription() -> Callable[[Any], Set[str]]:
    """:func:`nri_events_of`, for the tests of each policy's hook."""
    return nri_events_of
