"""A task body under a permit, as in an Airflow ``@task`` or a Prefect ``@flow``:
the client comes from ``PERMITD_ENDPOINTS``/``PERMITD_TOKEN``, one per process.

    PERMITD_TOKEN=change-me-local-admin-token python client/python/examples/task_body.py acct-42
"""

import os
import subprocess
import sys

from permitd.integrations import shared_client, task_permit


def nightly_report(key: str) -> None:  # decorate with @task (Airflow) or @flow (Prefect)
    with task_permit(key, "nightly-report", timeout=60) as permit:
        print(f"task running under fence {permit.fence}")
        # Commands started from the body see the fence, as under `permitctl run`.
        subprocess.run(["sh", "-c", 'echo "child sees fence $PERMITD_FENCE"'], check=True)


if __name__ == "__main__":
    key = sys.argv[1] if len(sys.argv) > 1 else "acct-42"
    shared_client().set_key_config(key, {"limit": 1})
    nightly_report(key)
    print("usage after:", shared_client().usage(key), "PERMITD_FENCE" in os.environ)
