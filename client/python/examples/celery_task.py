"""A Celery task under a permit: when none comes within 5 s the task is retried in
30 s (the worker takes other tasks meanwhile), at most 20 times.

    celery -A celery_task worker   (with PERMITD_ENDPOINTS, PERMITD_TOKEN set)
    >>> from celery_task import nightly_report; nightly_report.delay("42")

The broker here is in memory, for the example; use your own.
"""

import os

from celery import Celery  # type: ignore[import-untyped]

from permitd.integrations import permit_task

app = Celery("reports", broker=os.environ.get("CELERY_BROKER_URL", "memory://"))


@app.task(bind=True, max_retries=20)  # type: ignore[untyped-decorator]
@permit_task(lambda account: f"acct-{account}", "nightly-report", timeout=5, countdown=30)
def nightly_report(self: object, account: str) -> str:
    return f"report of acct-{account} done"
