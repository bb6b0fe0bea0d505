"""A Celery task under a permit, retried (not blocking the worker) when none comes in time:

    app = Celery(...)

    @app.task(bind=True, max_retries=20)
    @permit_task(lambda account: f"acct-{account}", "nightly-report", timeout=5, countdown=30)
    def nightly_report(self, account: str) -> int:
        ...

The wrapped function must be a bound task (``bind=True``): its first argument is
the task. The permit is acquired before the body runs and released after it,
exceptions included. When ``timeout`` passes first (``AcquireError`` of kind
``timeout``: whatever was granted meanwhile was released), or the cluster could
not be reached within the client's call deadline (``DeadlineExceededError``),
the decorator raises ``self.retry(countdown=..., exc=error)``, so Celery
schedules the task again and the worker takes other tasks meanwhile;
``max_retries`` bounds the waiting. Other errors (a refused group, a bad token)
fail the task: retrying would not help.
No import of Celery here: the task is used through ``retry`` and ``request``.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional, TypeVar, Union, cast

from ..client import SemaphoreClient
from ..errors import AcquireError, DeadlineExceededError
from .tasks import shared_client

F = TypeVar("F", bound=Callable[..., Any])
KeyOf = Union[str, Callable[..., str]]
"""A key, or a function of the task's arguments (without the task) that names it."""


def permit_task(
    key: KeyOf,
    group: str,
    count: int = 1,
    *,
    timeout: float = 5.0,
    countdown: float = 10.0,
    client: Optional[SemaphoreClient] = None,
) -> Callable[[F], F]:
    """Decorates a bound Celery task function (see the module docs)."""

    def decorate(function: F) -> F:
        @functools.wraps(function)
        def run(task: Any, *args: Any, **kwargs: Any) -> Any:
            name = key(*args, **kwargs) if callable(key) else key
            chosen = client or shared_client()
            try:
                permit = chosen.acquire(name, group, count, timeout=timeout)
            except (AcquireError, DeadlineExceededError) as error:
                if isinstance(error, AcquireError) and error.kind != "timeout":
                    raise
                raise task.retry(countdown=countdown, exc=error) from error
            with permit:
                return function(task, *args, **kwargs)

        return cast(F, run)

    return decorate
