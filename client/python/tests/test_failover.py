"""A leader killed under a permit and under a waiting request: calls in flight fail
and are retried on the new leader, and nothing is granted twice (usage never
passes the limit, holders list only the rightful holder, fences grow)."""

from __future__ import annotations

import threading
import time
from typing import Callable, List

import pytest

from harness import ADMIN_TOKEN, Cluster, eventually, metric_total
from permitd import AcquireError, Permit, SemaphoreClient


class UsageWatch:
    """Reads the key's usage in the background; ``peak`` is the most ever granted."""

    def __init__(self, client: SemaphoreClient, key: str) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(client, key), daemon=True)
        self._thread.start()

    def _watch(self, client: SemaphoreClient, key: str) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, client.usage(key)["granted"])
            except Exception:
                pass  # an election: reads fail for a moment
            time.sleep(0.02)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def clients(cluster: Cluster, count: int) -> List[SemaphoreClient]:
    return [SemaphoreClient(cluster.urls(), token=ADMIN_TOKEN, call_timeout=20) for _ in range(count)]


def in_thread(work: Callable[[], Permit]) -> Callable[[], Permit]:
    """Runs ``work`` in a thread; the returned function joins it and gives its result."""
    box: List[object] = []
    thread = threading.Thread(target=lambda: box.append(_outcome(work)))
    thread.start()

    def join() -> Permit:
        thread.join(30)
        assert box, "the acquisition did not finish"
        if isinstance(box[0], BaseException):
            raise box[0]
        assert isinstance(box[0], Permit)
        return box[0]

    return join


def _outcome(work: Callable[[], Permit]) -> object:
    try:
        return work()
    except BaseException as error:
        return error


def test_a_leader_killed_while_a_permit_is_held(cluster: Cluster) -> None:
    holder, other, reader = clients(cluster, 3)
    holder.set_key_config("failover-held", {"limit": 1})
    permit = holder.acquire("failover-held", "wf", 1)
    watch = UsageWatch(reader, "failover-held")
    leader = cluster.wait_for_leader()
    cluster.kill(leader)
    assert cluster.wait_for_leader() != leader
    with pytest.raises(AcquireError):
        other.acquire("failover-held", "wf", 1, timeout=2)  # the permit is still held on the new leader
    permit.release()  # retried until the new leader takes it
    second = other.acquire("failover-held", "wf", 1, timeout=10)
    assert second.fence > permit.fence
    holders = reader.holders("failover-held")["clients"]
    assert list(holders) == [second.client_id]
    second.release()
    assert watch.stop() <= 1, "granted twice"
    assert reader.usage("failover-held")["granted"] == 0


def test_a_leader_killed_while_a_request_waits(cluster: Cluster) -> None:
    holder, waiter, reader = clients(cluster, 3)
    holder.set_key_config("failover-wait", {"limit": 1})
    first = holder.acquire("failover-wait", "wf", 1)
    watch = UsageWatch(reader, "failover-wait")
    leader = cluster.wait_for_leader()
    leader_url = cluster.node(leader).url
    blocked_before = metric_total(leader_url, "permitd_blocked_total")
    join = in_thread(lambda: waiter.acquire("failover-wait", "wf", 1, timeout=25))
    # The waiter's requests are answered "blocked by the limit" before the kill.
    eventually(10, lambda: metric_total(leader_url, "permitd_blocked_total") > blocked_before, "the waiter is blocked")
    cluster.kill(leader)
    assert cluster.wait_for_leader() != leader
    first.release()
    second = join()
    assert second.count == 1 and second.fence > first.fence
    assert waiter.leader() != cluster.node(leader).url, "the waiter moved to the new leader"
    assert list(reader.holders("failover-wait")["clients"]) == [second.client_id]
    second.release()
    assert watch.stop() <= 1, "granted twice"
    assert reader.usage("failover-wait")["granted"] == 0
