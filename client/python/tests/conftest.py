"""Fixtures: a three-node cluster of real ``permitd`` processes (``harness.py``),
shared by the tests of a module that only read and write their own keys, or fresh
for a test that kills nodes."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import Cluster


@pytest.fixture(scope="module")
def shared_cluster() -> Iterator[Cluster]:
    cluster = Cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    cluster = Cluster.start()
    yield cluster
    cluster.stop()
