"""A worker process around a ``SemaphoreQueue`` on a ``SqliteStore``, for the tests
that kill it: ``python queue_worker.py MODE STORE CLIENT_ID KEY`` (endpoints and
token from ``PERMITD_ENDPOINTS``/``PERMITD_TOKEN``). Everything it reports is one
flushed stdout line:

- ``commands``: reads stdin lines ``enqueue FIRST COUNT``, ``release ID``,
  ``shutdown``; prints ``ready``, ``enqueued FIRST COUNT`` once durable,
  ``admitted ID KIND``, ``shutdown UNREPORTED``;
- ``churn``: enqueues items one by one as fast as it can, never releasing;
  prints ``enqueued ID`` once each is acknowledged (durable) and ``claim GRANT
  CLAIMED`` before each claim leaves the process (the holder may see it from
  then on). The power-loss test kills it at a random moment.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from typing import Any, List, Mapping, Sequence

from permitd import AdmittedItem, AsyncSemaphoreClient, QueueItem, SemaphoreQueue, SqliteStore
from permitd.client import BatchResult


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Printing:
    def admit(self, items: List[AdmittedItem[int]]) -> None:
        for item in items:
            say(f"admitted {item.id} {item.permit['kind']}")

    def finished(self, ids: List[str]) -> List[str]:
        return []


class ClaimPrintingClient(AsyncSemaphoreClient):
    """Prints every claim a sync carries before it is sent."""

    async def batch(self, items: Sequence[Mapping[str, Any]], *, timeout: float | None = None) -> List[BatchResult]:
        for item in items:
            for report in item["message"].get("grants", []):
                if report["claimed"] > 0:
                    say(f"claim {report['grantId']} {report['claimed']}")
        return await super().batch(items, timeout=timeout)


async def commands(queue: SemaphoreQueue[int], key: str) -> None:
    lines: asyncio.Queue[str] = asyncio.Queue()
    loop = asyncio.get_running_loop()

    def read() -> None:
        for line in sys.stdin:
            loop.call_soon_threadsafe(lines.put_nowait, line.strip())
        loop.call_soon_threadsafe(lines.put_nowait, "shutdown")

    threading.Thread(target=read, daemon=True).start()
    say("ready")
    while True:
        words = (await lines.get()).split()
        if words[0] == "enqueue":
            first, count = int(words[1]), int(words[2])
            await queue.enqueue([QueueItem(f"item-{index}", key, "wf", index) for index in range(first, first + count)])
            say(f"enqueued {first} {count}")
        elif words[0] == "release":
            queue.release(words[1])
        elif words[0] == "shutdown":
            report = await queue.shutdown()
            say(f"shutdown {report.unreported_keys}")
            return


async def churn(queue: SemaphoreQueue[int], key: str) -> None:
    say("ready")
    index = 0
    while True:
        item_id = f"{os.getpid()}-{index}"
        await queue.enqueue([QueueItem(item_id, key, f"wf-{index % 3}", index)])
        say(f"enqueued {item_id}")
        index += 1


async def main(mode: str, store_path: str, client_id: str, key: str) -> None:
    client = ClaimPrintingClient() if mode == "churn" else AsyncSemaphoreClient()
    queue: SemaphoreQueue[int] = await SemaphoreQueue.start(
        client, Printing(), client_id=client_id, store=SqliteStore(store_path), finished_interval=3600
    )
    await (churn(queue, key) if mode == "churn" else commands(queue, key))
    await client.aclose()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
