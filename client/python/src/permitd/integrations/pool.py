"""An asyncio worker pool whose jobs each run under a permit of their key:

    async with AsyncWorkerPool(client, workers=16) as pool:
        reports = [pool.submit(f"acct-{account}", "nightly-report", build_report, account) for account in accounts]
        results = await asyncio.gather(*reports)

``workers`` bounds the jobs this process runs at once; the permits bound them
across every process sharing the key. A job waits in the pool's queue, then a
worker acquires its permit (oldest job first), runs it and releases the permit
(exceptions and cancellation included). ``submit`` returns a future of the
job's result; leaving the ``async with`` block waits for every submitted job.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, List, Optional, Tuple

from ..client import AsyncSemaphoreClient

#: Most jobs waiting in one pool's queue; ``submit`` beyond it fails at once.
MAX_QUEUED_JOBS = 100_000

Job = Tuple[str, str, int, Optional[float], Callable[..., Awaitable[Any]], Tuple[Any, ...], "asyncio.Future[Any]"]


class AsyncWorkerPool:
    def __init__(self, client: AsyncSemaphoreClient, *, workers: int = 8) -> None:
        if workers < 1:
            raise ValueError("a pool needs at least one worker")
        self._client = client
        self._jobs: asyncio.Queue[Optional[Job]] = asyncio.Queue(MAX_QUEUED_JOBS)
        self._workers: List[asyncio.Task[None]] = [asyncio.ensure_future(self._work()) for _ in range(workers)]

    def submit(
        self, key: str, group: str, work: Callable[..., Awaitable[Any]], *args: Any, count: int = 1, timeout: Optional[float] = None
    ) -> asyncio.Future[Any]:
        """Queues ``work(*args)`` to run under ``count`` permits of ``key``; its result's future."""
        result: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._jobs.put_nowait((key, group, count, timeout, work, args, result))
        return result

    async def _work(self) -> None:
        while True:
            job = await self._jobs.get()
            if job is None:
                return
            key, group, count, timeout, work, args, result = job
            if result.cancelled():
                continue
            try:
                async with self._client.permit(key, group, count, timeout=timeout):
                    value = await work(*args)
            except asyncio.CancelledError:
                result.cancel()
                raise
            except Exception as error:
                if not result.done():
                    result.set_exception(error)
            else:
                if not result.done():
                    result.set_result(value)

    async def close(self) -> None:
        """Waits for every submitted job, then stops the workers."""
        for _ in self._workers:
            await self._jobs.put(None)
        await asyncio.gather(*self._workers)

    async def __aenter__(self) -> AsyncWorkerPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
