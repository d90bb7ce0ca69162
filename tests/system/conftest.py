"""Fixtures of the system adapter tests."""

from __future__ import annotations

from typing import Iterator

import pytest

from anolisnuma.testing.netlab import NetLab


@pytest.fixture
def lab() -> Iterator[NetLab]:
    """Network namespaces on a private bridge, all removed after the test."""
    lab = NetLab()
    try:
        yield lab
    finally:
        lab.close()
