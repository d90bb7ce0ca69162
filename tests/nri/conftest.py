"""The event loop the NRI session and plugin run on, as the daemon's loop, on a thread of
its own so that a test drives them from its own thread as containerd and the re-pinner do."""

from __future__ import annotations

import asyncio
from typing import Iterator

import pytest

from anolisnuma.testing.loop_thread import LoopThread


@pytest.fixture
def nri_loop() -> Iterator[asyncio.AbstractEventLoop]:
    with LoopThread() as lt:
        yield lt.loop
