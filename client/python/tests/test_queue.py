"""``SemaphoreQueue`` against real permitd processes: items admitted within the
limit, grants and leases alike, permits returned on release and at shutdown."""

from __future__ import annotations

import asyncio
from typing import Any, Dict, List

import pytest

from harness import ADMIN_TOKEN, Cluster
from permitd import AdmittedItem, AsyncSemaphoreClient, QueueItem, SemaphoreQueue, SqliteStore


class Runner:
    """Admits into a set, finishes each item after a short while; tracks the most running at once."""

    def __init__(self) -> None:
        self.running: Dict[str, AdmittedItem[int]] = {}
        self.done: List[str] = []
        self.peak = 0
        self.kinds: set[str] = set()
        self.queue: SemaphoreQueue[int] | None = None

    def admit(self, items: List[AdmittedItem[int]]) -> None:
        for item in items:
            assert item.id not in self.done, f"{item.id} admitted after it finished"
            self.running[item.id] = item
            self.kinds.add(item.permit["kind"])
            asyncio.get_running_loop().call_later(0.02, self.finish, item.id)
        self.peak = max(self.peak, len(self.running))

    def finish(self, item_id: str) -> None:
        if self.running.pop(item_id, None) is not None and self.queue is not None:
            self.done.append(item_id)
            self.queue.release(item_id)

    def finished(self, ids: List[str]) -> List[str]:
        return []


async def run_queue(cluster: Cluster, key: str, config: Dict[str, Any], store: SqliteStore | None, items: int, chunk: int) -> Runner:
    """Runs ``items`` items through a queue, enqueued ``chunk`` at a time (each chunk once the last is done)."""
    async with AsyncSemaphoreClient(cluster.urls(), token=ADMIN_TOKEN) as client:
        await client.set_key_config(key, config)
        runner = Runner()
        errors: List[str] = []
        queue: SemaphoreQueue[int] = await SemaphoreQueue.start(
            client, runner, client_id=f"queue-{key}", store=store, on_error=lambda error, where: errors.append(f"{where}: {error}")
        )
        runner.queue = queue
        deadline = asyncio.get_running_loop().time() + 30
        for start in range(0, items, chunk):
            batch = [QueueItem(f"{key}-{index}", key, f"wf-{index % 2}", index) for index in range(start, min(items, start + chunk))]
            assert (await queue.enqueue(batch)) == (len(batch), 0)
            while len(runner.done) < start + len(batch):
                assert asyncio.get_running_loop().time() < deadline, f"{len(runner.done)} of {items} done; errors {errors}"
                await asyncio.sleep(0.01)
        assert (await queue.enqueue([QueueItem(f"{key}-0", key, "wf-0", 0)])) == (0, 1)
        assert queue.status(f"{key}-0") == "released"
        report = await queue.shutdown()
        assert report.unreported_keys == 0
        usage = await client.usage(key)
        assert usage["granted"] == 0 and usage["leased"] == 0, usage
        return runner


def test_the_queue_admits_within_the_limit_under_grants(shared_cluster: Cluster) -> None:
    runner = asyncio.run(run_queue(shared_cluster, "queue-grants", {"limit": 3}, None, 30, 30))
    assert runner.kinds == {"grant"}
    assert runner.peak <= 3 and sorted(runner.done) == sorted(f"queue-grants-{index}" for index in range(30))


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_the_queue_admits_within_the_limit_under_leases(shared_cluster: Cluster, store: str, tmp_path: Any) -> None:
    key = f"queue-leases-{store}"
    # Leases share what grants leave: demand below the limit, a few items at a time.
    leases = {"limit": 6, "leases": {"provisioning": {"mode": "strict"}, "permitsPerLease": 2, "ttlMs": 10_000}}
    sqlite = SqliteStore(str(tmp_path / "queue.sqlite")) if store == "sqlite" else None
    runner = asyncio.run(run_queue(shared_cluster, key, leases, sqlite, 24, 2))
    assert runner.peak <= 6
    assert "lease" in runner.kinds, runner.kinds
