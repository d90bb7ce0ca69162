"""Fixtures for the relay tests: a fake CRI backend, the proxy in front of it, channels.

Sockets live in a short directory under /tmp (a unix socket path must fit in 108 bytes,
pytest's tmp_path often does not)."""

from __future__ import annotations

from typing import Iterator, List

import grpc
import pytest

from anolisnuma.testing.channel_options import CLIENT_OPTIONS, GO_LIKE_SERVER
from anolisnuma.testing.fake_cri import FakeCri
from anolisnuma.testing.proxy import InProcessProxy, make_config


@pytest.fixture
def fake(sockdir: str) -> Iterator[FakeCri]:
    f = FakeCri(f"{sockdir}/cri.sock", containers=3, sandboxes=2, server_options=GO_LIKE_SERVER).start()
    yield f
    f.stop(0)


@pytest.fixture
def proxy(sockdir: str, fake: FakeCri) -> Iterator[InProcessProxy]:
    p = InProcessProxy(make_config(sockdir, fake.socket_path)).start()
    yield p
    p.stop()


@pytest.fixture
def channels() -> Iterator[List[grpc.Channel]]:
    """Opened channels are closed after the test; use ``open_channel``."""
    made: List[grpc.Channel] = []
    yield made
    for ch in made:
        ch.close()


@pytest.fixture
def open_channel(channels: List[grpc.Channel]):
    def _open(address: str, options=None) -> grpc.Channel:
        ch = grpc.insecure_channel(address, options=list(options or CLIENT_OPTIONS))
        channels.append(ch)
        return ch
    return _open
