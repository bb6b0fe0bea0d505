"""The durable job queue: ``SemaphoreQueue`` (the loop), ``QueueState`` (the pure
accounting), and its stores (``SqliteStore``, ``MemoryStore``)."""

from .queue import Admission, SemaphoreQueue, ShutdownReport, report_batches
from .state import AdmittedItem, QueueCounts, QueueItem, QueueState, StateConfig, lane_of
from .store import MemoryStore, QueueStore, SqliteStore

__all__ = [
    "Admission",
    "AdmittedItem",
    "MemoryStore",
    "QueueCounts",
    "QueueItem",
    "QueueState",
    "QueueStore",
    "SemaphoreQueue",
    "ShutdownReport",
    "SqliteStore",
    "StateConfig",
    "lane_of",
    "report_batches",
]
