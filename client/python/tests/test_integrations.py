"""The integrations and the examples, against real permitd processes: the examples
run as they are (as subprocesses, pointed at the test cluster through
``PERMITD_ENDPOINTS``/``PERMITD_TOKEN``); the Celery decorator retries the task
while the permit is held elsewhere; the asyncio pool keeps each key within its
limit."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest
from celery import Celery  # type: ignore[import-untyped]

from harness import ADMIN_TOKEN, Cluster
from permitd import AcquireError, AsyncSemaphoreClient, SemaphoreClient
from permitd.integrations import AsyncWorkerPool, permit_task, task_permit
from permitd.integrations import tasks as task_module

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture
def environment(shared_cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[Dict[str, str]]:
    monkeypatch.setenv("PERMITD_ENDPOINTS", ",".join(shared_cluster.urls()))
    monkeypatch.setenv("PERMITD_TOKEN", ADMIN_TOKEN)
    task_module._clients.clear()
    yield dict(os.environ)
    task_module._clients.clear()


def run_example(name: str, environment: Dict[str, str], *args: str) -> List[str]:
    done = subprocess.run([sys.executable, str(EXAMPLES / name), *args], env=environment, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_the_readme_example_runs(environment: Dict[str, str]) -> None:
    lines = run_example("with_permit.py", environment)
    assert lines[0].startswith("holding 1 permit of acct-42, fence ")
    assert "running under fence" in lines[2] and lines[3] == "report done: 1234 rows"
    assert "'granted': 0" in lines[4]


def test_the_task_body_example_runs_and_hands_the_fence_to_children(environment: Dict[str, str]) -> None:
    lines = run_example("task_body.py", environment, "acct-task")
    fence = lines[0].removeprefix("task running under fence ")
    assert lines[1] == f"child sees fence {fence}"
    assert "'granted': 0" in lines[2] and lines[2].endswith("False"), "PERMITD_FENCE is restored after the body"


def test_the_asyncio_pool_example_runs(environment: Dict[str, str]) -> None:
    lines = run_example("asyncio_pool.py", environment)
    assert sorted(lines) == sorted(f"exported acct-{account} part {part}" for account in range(3) for part in range(4))


def test_the_pool_keeps_each_key_within_its_limit(shared_cluster: Cluster) -> None:
    async def scenario() -> None:
        async with AsyncSemaphoreClient(shared_cluster.urls(), token=ADMIN_TOKEN) as client:
            await client.set_key_config("pool-a", {"limit": 2})
            running: Dict[str, int] = {"pool-a": 0}
            peak = [0]

            async def job(index: int) -> int:
                running["pool-a"] += 1
                peak[0] = max(peak[0], running["pool-a"])
                await asyncio.sleep(0.03)
                running["pool-a"] -= 1
                if index == 3:
                    raise ValueError("job 3 failed")
                return index

            async with AsyncWorkerPool(client, workers=5) as pool:
                futures = [pool.submit("pool-a", "g", job, index) for index in range(10)]
                results = await asyncio.gather(*futures, return_exceptions=True)
            assert peak[0] == 2
            assert isinstance(results[3], ValueError) and results[:3] == [0, 1, 2]
            assert (await client.usage("pool-a"))["granted"] == 0

    asyncio.run(scenario())


def test_the_celery_decorator_retries_the_task_while_no_permit_comes(environment: Dict[str, str], shared_cluster: Cluster) -> None:
    app = Celery("permitd-test", broker="memory://", backend="cache+memory://")
    app.conf.task_always_eager = True
    runs: List[int] = []

    @app.task(bind=True, max_retries=2)  # type: ignore[untyped-decorator]
    @permit_task(lambda account: f"celery-{account}", "report", timeout=0.3, countdown=0)
    def report(self: Any, account: str) -> str:
        runs.append(self.request.retries)
        return f"report {account}"

    with SemaphoreClient(shared_cluster.urls(), token=ADMIN_TOKEN) as client:
        client.set_key_config("celery-7", {"limit": 1})
        with client.permit("celery-7", "other"):
            held = report.apply(args=("7",))
            assert held.state == "FAILURE" and isinstance(held.result, AcquireError), "retried, then out of retries"
            assert runs == [], "the body never ran without a permit"
            assert client.usage("celery-7")["granted"] == 1, "the retries left nothing granted"
        assert report.apply(args=("7",)).get() == "report 7"
        assert runs == [0]
        assert client.usage("celery-7")["granted"] == 0
    sys.path.insert(0, str(EXAMPLES))
    try:
        import celery_task

        celery_task.app.conf.task_always_eager = True
        assert celery_task.nightly_report.apply(args=("8",)).get() == "report of acct-8 done"
    finally:
        sys.path.remove(str(EXAMPLES))


def test_task_permit_releases_when_the_body_fails(environment: Dict[str, str]) -> None:
    with pytest.raises(RuntimeError, match="task failed"), task_permit("task-fails", "g") as permit:
        assert permit.count == 1
        raise RuntimeError("task failed")
    assert task_module.shared_client().usage("task-fails")["granted"] == 0
