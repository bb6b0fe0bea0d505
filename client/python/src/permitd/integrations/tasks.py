"""A context manager for task bodies (Airflow, Prefect, Dagster, RQ, scripts):

    @task
    def nightly_report(account: str) -> None:
        with task_permit(f"acct-{account}", "nightly-report", timeout=600) as permit:
            run_report(fence=permit.fence)

The permit is acquired on entry and released on exit, exceptions included.
Task runners fork or spawn processes and run many task bodies in each, so the
client is one per process (``shared_client``), built from ``PERMITD_ENDPOINTS``,
``PERMITD_TOKEN`` and ``PERMITD_CA_FILE`` on first use (a forked child builds
its own: connections are not shared across a fork). While the body runs,
``PERMITD_FENCE`` holds the permit's fence for commands it starts, as
``permitctl run`` sets it (the environment is the process's: one task body at a
time per process, as Airflow's and Prefect's workers run them).
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from typing import Dict, Iterator, Optional, Tuple

from ..client import Permit, SemaphoreClient

_clients: Dict[int, SemaphoreClient] = {}
_lock = threading.Lock()


def shared_client() -> SemaphoreClient:
    """This process's client, configured from the environment."""
    with _lock:
        client = _clients.get(os.getpid())
        if client is None:
            client = SemaphoreClient()
            _clients.clear()  # a parent's client, inherited over a fork, is not used here
            _clients[os.getpid()] = client
        return client


@contextmanager
def task_permit(
    key: str,
    group: str,
    count: int = 1,
    *,
    timeout: Optional[float] = None,
    client: Optional[SemaphoreClient] = None,
    client_id: Optional[str] = None,
) -> Iterator[Permit]:
    """Runs the ``with`` body under ``count`` permits of ``key`` for ``group``."""
    chosen = client or shared_client()
    with chosen.permit(key, group, count, timeout=timeout, client_id=client_id) as permit:
        saved: Tuple[Optional[str]] = (os.environ.get("PERMITD_FENCE"),)
        os.environ["PERMITD_FENCE"] = str(permit.fence)
        try:
            yield permit
        finally:
            if saved[0] is None:
                os.environ.pop("PERMITD_FENCE", None)
            else:
                os.environ["PERMITD_FENCE"] = saved[0]
