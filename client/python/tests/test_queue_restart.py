"""The queue across a restart of its worker process: the worker is SIGKILLed while
it holds permits; a new process on the same SQLite store admits the same items
again under the same permits (no new grant for them), and the rest follow as
they are released."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import List

from harness import ADMIN_TOKEN, Cluster
from permitd import SemaphoreClient

WORKER = str(Path(__file__).resolve().parent / "queue_worker.py")


class Worker:
    def __init__(self, cluster: Cluster, store: str) -> None:
        env = {**os.environ, "PERMITD_ENDPOINTS": ",".join(cluster.urls()), "PERMITD_TOKEN": ADMIN_TOKEN}
        self.process = subprocess.Popen(
            [sys.executable, WORKER, "commands", store, "runner-restart", "restart"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        assert self.expect("ready") == ["ready"]

    def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def expect(self, word: str) -> List[str]:
        """The next line starting with ``word`` (other lines are kept in ``seen``)."""
        assert self.process.stdout is not None
        while True:
            line = self.process.stdout.readline()
            assert line, f"the worker exited waiting for {word}"
            words = line.split()
            if words[0] == word:
                return words

    def admitted(self, count: int) -> List[str]:
        return [self.expect("admitted")[1] for _ in range(count)]

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()


def test_the_queue_survives_a_restart_of_its_worker_process(cluster: Cluster, tmp_path: Path) -> None:
    store = str(tmp_path / "queue.sqlite")
    with SemaphoreClient(cluster.urls(), token=ADMIN_TOKEN) as client:
        client.set_key_config("restart", {"limit": 2})
        first = Worker(cluster, store)
        first.send("enqueue 0 6")
        first.expect("enqueued")
        running = first.admitted(2)
        first.kill()  # a crash: no final reports
        usage = client.usage("restart")
        assert usage["granted"] == 2, "the dead worker's permits stay held"
        second = Worker(cluster, store)
        again = second.admitted(2)
        assert sorted(again) == sorted(running), "the same items, admitted again under their permits"
        done: set[str] = set()
        while len(done) < 6:
            item = again.pop(0)
            second.send(f"release {item}")
            done.add(item)
            if len(done) < 5:
                again.extend(second.admitted(1))
            assert client.usage("restart")["granted"] <= 2
        second.send("shutdown")
        assert second.expect("shutdown") == ["shutdown", "0"]
        assert done == {f"item-{index}" for index in range(6)}
        assert client.usage("restart")["granted"] == 0
        assert client.holders("restart")["clients"] == {}
