"""``SemaphoreQueue``: the job queue, as one asyncio loop per queue (the Rust client's
``queue/mod.rs``, the TypeScript ``queue/queue.ts``).

The application enqueues items ``QueueItem(id, key, group, body)``; the queue
asks each key's holder for permits, admits items under confirmed grant claims
or drawn lease permits by calling ``admission.admit``, and returns each permit
when the application calls ``release(id)``. Releases it never gets are
recovered by asking ``admission.finished`` periodically.

All accounting lives in the synchronous ``QueueState``; one step of the loop:

1. ``poll`` the state (draws lease permits, decides each key's next message);
2. write the changed records to the store and wait until they are durable,
   before anything leaves the process;
3. hand admitted items to ``admit``, send the messages (at most one in flight
   per key and lane): each key's ``request`` as its own call, and every
   ``sync`` of the step in one ``batch`` call; each answer is fed to the state
   and wakes the loop;
4. sleep until an enqueue, a release, an answer or the next timer.

Store writes run on one worker thread (SQLite blocks), so the event loop never
waits on an fsync.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Generic, List, Optional, Protocol, Tuple, Union

from .. import wire
from ..client import AsyncSemaphoreClient
from ..errors import QueueShutdownError, QueueStoreFailedError, RejectedError
from ..plan import now_ms
from .state import AdmittedItem, B, Outgoing, QueueCounts, QueueItem, QueueState, StateConfig, lane_of
from .store import MemoryStore, QueueStore, changes, load_queue

#: Most JSON characters of the reports one batch call carries: half the server's
#: 1 MiB body limit, so a poll with many large reports is split instead of refused (413).
MAX_REPORT_BATCH_CHARS = 512 * 1024
#: Default time between two ``finished`` checks, in seconds.
DEFAULT_FINISHED_INTERVAL_S = 10.0
#: Most ids one ``finished`` call is asked about.
MAX_FINISHED_BATCH = 1_024
#: Default time ``shutdown`` spends returning permits, in seconds.
DEFAULT_SHUTDOWN_TIMEOUT_S = 5.0


class Admission(Protocol[B]):
    """The application side of a queue (either method may be a coroutine function)."""

    def admit(self, items: List[AdmittedItem[B]]) -> Union[Awaitable[None], None]:
        """Starts work for admitted items; must be a no-op for an id already started
        (after a restart, admitted items come again)."""

    def finished(self, ids: List[str]) -> Union[List[str], Awaitable[List[str]]]:
        """Of ``ids`` (admitted items), those whose work reached a terminal state; the queue releases them."""


@dataclass
class ShutdownReport:
    counts: QueueCounts
    #: Keys whose final reports did not reach the holder in time.
    unreported_keys: int


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class SemaphoreQueue(Generic[B]):
    """See the module docs. Start one with ``await SemaphoreQueue.start(...)``."""

    def __init__(
        self,
        client: AsyncSemaphoreClient,
        state: QueueState[B],
        store: QueueStore,
        admission: Admission[B],
        executor: ThreadPoolExecutor,
        finished_interval_s: float,
        shutdown_timeout_s: float,
        on_error: Optional[Callable[[BaseException, str], None]],
    ) -> None:
        self._client = client
        self._state = state
        self._store = store
        self._admission = admission
        self._executor = executor
        self._finished_interval_s = finished_interval_s
        self._shutdown_timeout_s = shutdown_timeout_s
        self._on_error = on_error
        self._stopping = False
        #: Stopped at once by ``halt``: the loop neither writes nor sends any more.
        self._halted = False
        #: Set when a store write failed: the queue fails closed.
        self._failed: Optional[QueueStoreFailedError] = None
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._write_lock = asyncio.Lock()
        self._loop = asyncio.ensure_future(self._run())

    @classmethod
    async def start(
        cls,
        client: AsyncSemaphoreClient,
        admission: Admission[B],
        *,
        client_id: str,
        store: Optional[QueueStore] = None,
        state: Optional[StateConfig] = None,
        finished_interval: float = DEFAULT_FINISHED_INTERVAL_S,
        shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT_S,
        on_error: Optional[Callable[[BaseException, str], None]] = None,
    ) -> SemaphoreQueue[B]:
        """Loads the store (if it holds a queue), restores items and permits, and starts the loop.
        ``client_id`` is this runner's id towards the holder: stable across restarts of one store."""
        store = store if store is not None else MemoryStore()
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="permitd-queue-store")
        loaded = await asyncio.get_running_loop().run_in_executor(executor, load_queue, store, client_id)
        restored: QueueState[B] = QueueState.restore(client_id, state or StateConfig(), loaded.items, loaded.keys, loaded.released)
        return cls(client, restored, store, admission, executor, finished_interval, shutdown_timeout, on_error)

    async def enqueue(self, items: List[QueueItem[B]]) -> Tuple[int, int]:
        """Adds items (known ids are skipped); durable when it returns. Returns (added, known)."""
        self._check(self._stopping)
        outcome = self._state.enqueue(items, now_ms())
        await self._persist()
        self._wake.set()
        return outcome

    def release(self, item_id: str) -> str:
        """The item's work reached a terminal state; its permit returns with the next report.
        Returns ``released``, ``cancelled``, ``already_released`` or ``unknown``."""
        self._check(self._halted)
        outcome = self._state.release(item_id)
        self._wake.set()
        return outcome

    def status(self, item_id: str) -> str:
        """``queued``, ``admitted``, ``released`` or ``unknown``."""
        return self._state.status(item_id)

    def counts(self) -> QueueCounts:
        return self._state.counts(now_ms())

    def failure(self) -> Optional[QueueStoreFailedError]:
        """The store failure that stopped the queue, if one did."""
        return self._failed

    async def shutdown(self) -> ShutdownReport:
        """Stops asking for permits, returns undrawn lease permits and reports every release (within the timeout)."""
        self._stopping = True
        self._wake.set()
        unreported = await self._loop
        if self._failed is not None:
            raise self._failed
        await self._persist()
        await self._close()
        return ShutdownReport(self.counts(), unreported)

    async def halt(self) -> None:
        """Stops at once, with no final reports and no more writes: what a crash would
        leave. The next ``start`` on the same store reports what was persisted and admits
        admitted items again."""
        self._halted = True
        self._stopping = True
        self._wake.set()
        await self._loop
        await self._close()

    async def _close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.get_running_loop().run_in_executor(self._executor, self._store.close)
        self._executor.shutdown(wait=True)

    def _check(self, stopped: bool) -> None:
        if self._failed is not None:
            raise self._failed
        if stopped:
            raise QueueShutdownError()

    async def _run(self) -> int:
        finished_due = asyncio.get_running_loop().time() + self._finished_interval_s
        finished: Optional[asyncio.Task[Any]] = None
        draining_until: Optional[float] = None
        clock = asyncio.get_running_loop().time
        while True:
            if draining_until is None and self._stopping:
                self._state.retire_all_leases()
                draining_until = clock() + self._shutdown_timeout_s
            if self._halted or self._failed is not None:
                return self._state.in_flight()
            now = now_ms()
            messages = self._state.poll(now) if draining_until is None else self._state.poll_reports(now)
            admits = self._state.take_admits()
            try:
                # Durable before anything it records leaves the process.
                await self._persist()
            except QueueStoreFailedError:
                return self._state.in_flight()  # fails closed: this step's admits and messages are dropped
            if self._halted:
                return self._state.in_flight()
            in_flight = self._state.in_flight()
            if draining_until is not None and ((in_flight == 0 and not messages) or clock() >= draining_until):
                return in_flight
            if admits:
                self._spawn(self._admit(admits))
            self._send_all(messages)
            if draining_until is None and finished is None and clock() >= finished_due:
                finished_due = clock() + self._finished_interval_s
                ids = self._state.admitted_ids(MAX_FINISHED_BATCH)
                if ids:
                    finished = self._spawn(self._check_finished(ids))
                    finished.add_done_callback(lambda _: self._wake.set())
            if finished is not None and finished.done():
                finished = None
            wake_at_ms = self._state.next_wakeup_ms(now_ms())
            wait = finished_due - clock()
            if wake_at_ms is not None:
                wait = min(wait, (wake_at_ms - now_ms()) / 1000)
            if draining_until is not None:
                wait = min(wait, draining_until - clock())
            await self._sleep(max(0.0, wait))

    async def _sleep(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._wake.wait(), timeout=seconds)
        except asyncio.TimeoutError:
            pass
        self._wake.clear()

    async def _admit(self, admits: List[AdmittedItem[B]]) -> None:
        try:
            await _maybe_await(self._admission.admit(admits))
        except Exception as error:
            self._report(error, "admit")

    async def _check_finished(self, ids: List[str]) -> None:
        try:
            done = await _maybe_await(self._admission.finished(ids))
            for item_id in done:
                self._state.release(item_id)
        except Exception as error:
            self._report(error, "finished")

    def _send_all(self, messages: List[Outgoing]) -> None:
        """Each key's request is its own call: a batch is answered when its slowest item is,
        so demand for several keys in one call would tie every key's grant to the slowest
        round. Every sync of the step goes in one batch call instead: a sync is answered
        with the next log entry whatever it travels with."""
        reports: List[Outgoing] = []
        for outgoing in messages:
            if lane_of(outgoing.message) == "demand":
                self._spawn(self._send_request(outgoing))
            else:
                reports.append(outgoing)
        for batch in report_batches(reports):
            self._spawn(self._send_reports(batch))

    async def _send_request(self, outgoing: Outgoing) -> None:
        key = outgoing.key
        try:
            answer = await self._client.request(key, outgoing.message)
        except Exception as error:
            self._report(error, f"request for key {key}; will retry")
            self._state.on_failure(key, "demand", now_ms())
        else:
            if not self._halted and self._failed is None:
                self._state.on_answer(key, answer, now_ms())
        self._wake.set()

    async def _send_reports(self, batch: List[Outgoing]) -> None:
        """One batch call of syncs: a failed call fails every item's report lane, a failed item only its own key's."""
        try:
            results = await self._client.batch([{"key": outgoing.key, "message": outgoing.message} for outgoing in batch])
        except Exception as error:
            self._report(error, f"report batch of {len(batch)} keys; will retry")
            for outgoing in batch:
                self._state.on_failure(outgoing.key, "report", now_ms())
        else:
            for outgoing, result in zip(batch, results):
                if isinstance(result, RejectedError):
                    self._report(result, f"report for key {outgoing.key}; will retry")
                    self._state.on_failure(outgoing.key, "report", now_ms())
                elif not self._halted and self._failed is None:
                    self._state.on_answer(outgoing.key, result, now_ms())
        self._wake.set()

    async def _persist(self) -> None:
        """Writes the state's changes; a failed write stops the queue for good and raises."""
        if self._halted:
            return
        if self._failed is not None:
            raise self._failed
        # One write at a time, in order: a later snapshot of a record must not land first.
        async with self._write_lock:
            changed = changes(self._state, self._state.take_dirty())
            if changed is None:
                return
            try:
                await asyncio.get_running_loop().run_in_executor(self._executor, self._store.write, *changed)
            except Exception as error:
                if self._failed is None:
                    self._failed = QueueStoreFailedError(error)
                self._report(self._failed, "writing the queue store; the queue stopped")
                self._wake.set()
                raise self._failed from error

    def _spawn(self, work: Awaitable[Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _report(self, error: BaseException, context: str) -> None:
        if self._on_error is not None:
            self._on_error(error, context)


def report_batches(reports: List[Outgoing], max_chars: int = MAX_REPORT_BATCH_CHARS) -> List[List[Outgoing]]:
    """Splits report messages into batch calls within the envelope's limits
    (``MAX_BATCH_ITEMS`` items, ``MAX_BATCH_KEYS`` keys) and ``max_chars``."""
    batches: List[List[Outgoing]] = []
    current: List[Outgoing] = []
    keys: set[str] = set()
    chars = 0
    for report in reports:
        size = len(json.dumps({"key": report.key, "message": report.message}))
        new_key = report.key not in keys
        full = (
            len(current) >= wire.MAX_BATCH_ITEMS or (new_key and len(keys) >= wire.MAX_BATCH_KEYS) or (current and chars + size > max_chars)
        )
        if full:
            batches.append(current)
            current, keys, chars = [], set(), 0
        current.append(report)
        keys.add(report.key)
        chars += size
    if current:
        batches.append(current)
    return batches
