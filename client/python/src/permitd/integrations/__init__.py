"""Job-runner integrations, each small and tested with a short example:

- ``celery.permit_task``: a Celery task runs under a permit; when none is
  granted in time the task is retried (``self.retry``), so the worker slot is
  freed instead of blocked;
- ``pool.AsyncWorkerPool``: an asyncio worker pool whose jobs each run under a
  permit of their key;
- ``tasks.task_permit``: a context manager for Airflow, Prefect or Dagster task
  bodies, on one client per process configured from ``PERMITD_*``.
"""

from .celery import permit_task
from .pool import AsyncWorkerPool
from .tasks import shared_client, task_permit

__all__ = ["AsyncWorkerPool", "permit_task", "shared_client", "task_permit"]
