"""permitd's Python client: permits (``SemaphoreClient``, ``AsyncSemaphoreClient``),
the durable job queue (``SemaphoreQueue``) and job-runner integrations
(``permitd.integrations``). The wire contract is ``docs/protocol.md``.
``shard_of`` gives the shard a key belongs to, as the cluster computes it.
"""

from .client import AsyncPermit, AsyncSemaphoreClient, Permit, SemaphoreClient
from .errors import (
    AcquireError,
    ClientIdMismatchError,
    ConfigError,
    DeadlineExceededError,
    InvalidItemError,
    PermitdError,
    QueueShutdownError,
    QueueStoreFailedError,
    RejectedError,
    UnexpectedAnswerError,
)
from .events import SseMessage
from .queue import Admission, AdmittedItem, MemoryStore, QueueItem, SemaphoreQueue, SqliteStore
from .shard import MAX_SHARDS, shard_of

__all__ = [
    "AcquireError",
    "Admission",
    "AdmittedItem",
    "AsyncPermit",
    "AsyncSemaphoreClient",
    "ClientIdMismatchError",
    "ConfigError",
    "DeadlineExceededError",
    "InvalidItemError",
    "MAX_SHARDS",
    "MemoryStore",
    "Permit",
    "PermitdError",
    "QueueItem",
    "QueueShutdownError",
    "QueueStoreFailedError",
    "RejectedError",
    "SemaphoreClient",
    "SemaphoreQueue",
    "SqliteStore",
    "SseMessage",
    "UnexpectedAnswerError",
    "shard_of",
]
