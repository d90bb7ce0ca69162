"""Fixtures shared across the test folders."""

from __future__ import annotations

import shutil
import tempfile
from typing import Iterator

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
