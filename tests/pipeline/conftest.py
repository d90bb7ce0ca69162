"""Fixtures for the interception pipeline tests: the fake backend, a proxy factory with
test hooks, and CRI v1 stubs on channels closed after each test."""

from __future__ import annotations

from typing import Dict, Iterator, List, Optional

import grpc
import pytest

from anolisnuma.config import HookSettings
from anolisnuma.testing.fake_cri import FakeCri
from anolisnuma.testing.proxy import InProcessProxy, make_config
from pipeline_helpers import CLIENT_OPTIONS, GO_LIKE_SERVER, pb_grpc


@pytest.fixture
def fake(sockdir: str) -> Iterator[FakeCri]:
    f = FakeCri(f"{sockdir}/cri.sock", containers=0, sandboxes=0, server_options=GO_LIKE_SERVER).start()
    yield f
    f.stop(0)


@pytest.fixture
def start_proxy(sockdir: str, fake: FakeCri):
    """``start_proxy(hooks, per_hook={name: HookSettings}) -> InProcessProxy``."""
    started: List[InProcessProxy] = []

    def _start(hooks=(), per_hook: Optional[Dict[str, HookSettings]] = None, **kw) -> InProcessProxy:
        p = InProcessProxy(make_config(sockdir, fake.socket_path, hooks=per_hook, **kw), hooks=list(hooks))
        started.append(p.start())
        return p

    yield _start
    for p in started:
        p.stop()


@pytest.fixture
def open_stub():
    """``open_stub(address) -> RuntimeServiceStub`` on a channel closed after the test."""
    channels: List[grpc.Channel] = []

    def _open(address: str, options=None):
        ch = grpc.insecure_channel(address, options=list(options or CLIENT_OPTIONS))
        channels.append(ch)
        return pb_grpc.RuntimeServiceStub(ch)

    yield _open
    for ch in channels:
        ch.close()
