"""The SQLite queue store under power cuts, on powerfs (the project's FUSE
filesystem that drops every write not fsynced when the power is cut; see
``powerfs/src/lib.rs``).

Each cut: a worker process (``queue_worker.py churn``) runs a queue whose store
lives on the powerfs mount, enqueueing items one by one against a real permitd
node, printing each acknowledged enqueue and each claim before it leaves the
process. At a random moment the worker is SIGKILLed and the power is cut
(``power-loss``, or ``power-loss-torn SEED`` to tear the newest unsynced write
too); then the store is read back. Nothing acknowledged may be lost: every
acknowledged item is there, and every claim the holder may have seen is there
with at least as many permits claimed. The next cut's worker starts from what
survived, so recovery after a cut is exercised as well.

``POWER_LOSS_CUTS`` (default 50) and ``POWER_LOSS_SEED`` replay a run. Needs
root, ``/dev/fuse`` and the powerfs binary (``POWERFS_BIN``, else
``$CARGO_TARGET_DIR/debug/powerfs``): skipped without them unless
``POWERFS_BIN`` is set, in which case their absence fails.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from harness import ADMIN_TOKEN, Cluster
from permitd import SemaphoreClient
from permitd.queue.store import ITEM_PREFIX, KEY_PREFIX, SqliteStore

WORKER = str(Path(__file__).resolve().parent / "queue_worker.py")
KEY = "power"


def powerfs_bin() -> Optional[str]:
    explicit = os.environ.get("POWERFS_BIN")
    target = os.environ.get("CARGO_TARGET_DIR")
    found = explicit or (os.path.join(target, "debug", "powerfs") if target else None)
    usable = found is not None and os.path.exists(found) and os.geteuid() == 0 and os.path.exists("/dev/fuse")
    if usable:
        return found
    if explicit:
        pytest.fail(f"POWERFS_BIN={explicit} is set but unusable (needs the binary, root and /dev/fuse)")
    return None


class PowerFs:
    """``powerfs BACKING MOUNTPOINT`` as a child process, driven through its stdin."""

    def __init__(self, binary: str, directory: str) -> None:
        self.mount = os.path.join(directory, "mnt")
        backing = os.path.join(directory, "backing")
        os.makedirs(self.mount)
        os.makedirs(backing)
        self.process = subprocess.Popen([binary, backing, self.mount], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.answer().startswith("mounted"), "powerfs did not mount"

    def answer(self) -> str:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line, "powerfs exited"
        return line.strip()

    def command(self, line: str) -> str:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        return self.answer()

    def stop(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("quit\n")
        self.process.stdin.close()
        self.process.wait(30)


class Churn:
    """One worker process, and what it acknowledged and sent, read by a thread."""

    def __init__(self, cluster: Cluster, store: str) -> None:
        env = {**os.environ, "PERMITD_ENDPOINTS": ",".join(cluster.urls()), "PERMITD_TOKEN": ADMIN_TOKEN}
        self.process = subprocess.Popen(
            [sys.executable, WORKER, "churn", store, "runner-power", KEY], stdout=subprocess.PIPE, env=env, text=True
        )
        self.ready = threading.Event()
        self.enqueued: List[str] = []
        self.claims: List[tuple[str, int]] = []
        self.reader = threading.Thread(target=self._read)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            words = line.split()
            if not words or (len(words) < 2 and words[0] != "ready"):
                continue  # a line cut by the kill
            if words[0] == "ready":
                self.ready.set()
            elif words[0] == "enqueued":
                self.enqueued.append(words[1])
            elif words[0] == "claim" and len(words) == 3 and words[2].isdigit():
                self.claims.append((words[1], int(words[2])))

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        self.reader.join()


def lost(store_path: str, enqueued: List[str], claims: Dict[str, int]) -> List[str]:
    """What the store lacks of what was acknowledged or seen."""
    store = SqliteStore(store_path)
    try:
        records = store.load()
    finally:
        store.close()
    missing = [f"item {item_id}" for item_id in enqueued if ITEM_PREFIX + item_id not in records]
    grants = records.get(KEY_PREFIX + KEY, {"grants": {}})["grants"]
    for grant_id, claimed in claims.items():
        if grants.get(grant_id, {"claimed": 0})["claimed"] < claimed:
            missing.append(f"claim {grant_id} of {claimed}")
    return missing


@pytest.mark.power_loss
def test_no_acknowledged_enqueue_or_seen_claim_is_lost_to_a_power_cut() -> None:
    binary = powerfs_bin()
    if binary is None:
        pytest.skip("needs root, /dev/fuse and the powerfs binary (POWERFS_BIN or $CARGO_TARGET_DIR/debug/powerfs)")
    cuts = int(os.environ.get("POWER_LOSS_CUTS", "50"))
    seed = int(os.environ.get("POWER_LOSS_SEED", str(random.randrange(1 << 30))))
    draw = random.Random(seed)
    cluster = Cluster.start(nodes=1)
    directory = tempfile.mkdtemp(prefix="permitd-py-power-")
    fs = PowerFs(binary, directory)
    try:
        with SemaphoreClient(cluster.urls(), token=ADMIN_TOKEN) as client:
            client.set_key_config(KEY, {"limit": 1_000_000})
        store = os.path.join(fs.mount, "queue.sqlite")
        enqueued: List[str] = []
        claims: Dict[str, int] = {}
        reports = []
        for cut in range(cuts):
            churn = Churn(cluster, store)
            assert churn.ready.wait(30), f"cut {cut}: the worker did not start (seed {seed})"
            time.sleep(draw.uniform(0.05, 0.6))
            churn.kill()
            reports.append(fs.command("power-loss" if cut % 3 else f"power-loss-torn {draw.randrange(1 << 30)}"))
            assert reports[-1].startswith("power loss"), reports[-1]
            enqueued.extend(churn.enqueued)
            for grant_id, claimed in churn.claims:
                claims[grant_id] = max(claims.get(grant_id, 0), claimed)
            missing = lost(store, enqueued, claims)
            assert not missing, f"cut {cut} (seed {seed}) lost {missing[:5]}; {reports[-1]}"
        dropped = sum(int(report.split()[2]) for report in reports)
        seen = f"{len(enqueued)} acknowledged enqueues and {len(claims)} seen claims"
        print(f"{cuts} cuts (seed {seed}): {seen}, none lost; {dropped} unsynced writes dropped")
        assert enqueued and claims, "the workers acknowledged and claimed something"
    finally:
        fs.stop()
        cluster.stop()
