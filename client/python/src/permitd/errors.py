"""The client's errors: one class per way a call, an acquisition or the queue can fail.

Every error derives from ``PermitdError``. A rejection by the server carries its
``status`` and ``code`` (one of ``wire.ERROR_CODES``, or ``http_<status>`` when
something answered without the contract's body) and the bad ``field`` when the
server named one.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple


class PermitdError(Exception):
    """Any error of this package.

    Picklable with its fields (Celery and multiprocessing carry errors across
    processes): each subclass keeps its constructor's arguments."""

    _init_args: Tuple[Any, ...] = ()

    def __reduce__(self) -> Any:
        if self._init_args:
            return (type(self), self._init_args)
        return super().__reduce__()


class ConfigError(PermitdError, ValueError):
    """The client was configured wrongly: no endpoints, or one that cannot serve as a base URL."""


class RejectedError(PermitdError):
    """The server answered a non-retryable error (a 4xx other than 429, or 500)."""

    def __init__(self, status: int, code: str, message: str, field: Optional[str] = None) -> None:
        suffix = "" if field is None else f" (field {field})"
        super().__init__(f"{status} {code}: {message}{suffix}")
        self._init_args = (status, code, message, field)
        self.status = status
        self.code = code
        self.message = message
        self.field = field


class DeadlineExceededError(PermitdError):
    """The per-call deadline passed while the call was still being retried."""

    def __init__(self, deadline_ms: int, attempts: int, last: str) -> None:
        super().__init__(f"no answer within {deadline_ms} ms after {attempts} attempts; last error: {last}")
        self._init_args = (deadline_ms, attempts, last)
        self.deadline_ms = deadline_ms
        self.attempts = attempts
        self.last = last


class UnexpectedAnswerError(PermitdError):
    """The server answered 2xx with a body that is not the expected shape."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"unexpected answer from {url}: {reason}")
        self._init_args = (url, reason)
        self.url = url
        self.reason = reason


class AcquireError(PermitdError):
    """Why an acquisition gave up; whatever was granted by then was released.

    ``kind`` is ``zero_count``, ``not_permitted``, ``timeout`` or ``cancelled``.
    """

    def __init__(self, kind: str, key: str, message: str) -> None:
        super().__init__(message)
        self._init_args = (kind, key, message)
        self.kind = kind
        self.key = key


class QueueShutdownError(PermitdError):
    """The queue is shut down (or halted)."""

    def __init__(self) -> None:
        super().__init__("the queue is shut down")


class QueueStoreFailedError(PermitdError):
    """The queue's store failed a write, so the queue stopped for good.

    It admits and sends nothing more: what it would send or admit could not be
    made durable, and a crash would then lose a claim or a drawn permit. Start a
    new queue on a working store: it reports and admits again what was durable.
    """

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"the queue stopped: its store failed: {cause}")
        self._init_args = (cause,)
        self.__cause__ = cause


class ClientIdMismatchError(PermitdError):
    """The queue store belongs to another client id: the holder would not know its grants."""

    def __init__(self, stored: str, configured: str) -> None:
        super().__init__(f"the queue store belongs to client {stored!r}, not {configured!r}")
        self._init_args = (stored, configured)
        self.stored = stored
        self.configured = configured


class InvalidItemError(PermitdError):
    """An enqueued item was refused (bad id, key or group)."""

    def __init__(self, item_id: str, reason: str) -> None:
        super().__init__(f"invalid item {item_id[:64]!r}: {reason}")
        self._init_args = (item_id, reason)
        self.item_id = item_id
        self.reason = reason
