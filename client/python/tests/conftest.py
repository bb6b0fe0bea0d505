"""Fixtures: a three-node cluster of real ``permitd`` processes (``harness.py``),
shared by the tests of a module that only read and write their own keys, or fresh
for a test that kills nodes."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Iterator, Optional

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import Cluster

#: Longest a test may run before it fails (a hung stream or process must not hang CI);
#: the power-loss test, with its 50 cuts, gets longer.
TEST_TIMEOUT_S = 120
POWER_LOSS_TIMEOUT_S = 900


@pytest.fixture(autouse=True)
def time_limit(request: pytest.FixtureRequest) -> Iterator[None]:
    limit = POWER_LOSS_TIMEOUT_S if request.node.get_closest_marker("power_loss") else TEST_TIMEOUT_S

    def expire(signum: int, frame: Optional[FrameType]) -> None:
        raise TimeoutError(f"the test ran past {limit} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(limit)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


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
