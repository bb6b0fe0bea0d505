"""What the Python client adds to a lone acquire, over the same HTTP exchanges made raw.

    python client/python/bench/acquire_overhead.py [ENDPOINT] [ITERATIONS]

against a running cluster (default ``http://127.0.0.1:7001``, cluster.toml's admin
token or ``PERMITD_TOKEN``). An acquire is two calls: a ``request`` answered by its
round, and the ``sync`` that claims the grant. Each iteration times, on a fresh key
(so no ``nextRequestAt`` wait), ``SemaphoreClient.acquire`` and the same two POSTs
over one kept-alive ``http.client`` connection with ``json`` (the raw call), in
alternating order; releases are not timed. It prints p50 and p99 of both and of the
paired difference, in wall time and in the calling thread's CPU time: on a shared,
loaded machine the wall time of a round (tens of ms) swamps a sub-millisecond
difference, while the CPU time the client spends of its own does not depend on
how long the node takes.
"""

from __future__ import annotations

import http.client
import json
import os
import statistics
import sys
import time
import uuid
from typing import Any, Dict, List
from urllib.parse import urlsplit

from permitd import SemaphoreClient


def percentile(values: List[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


class Raw:
    def __init__(self, endpoint: str, token: str) -> None:
        url = urlsplit(endpoint)
        self.connection = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port or 80)
        self.headers = {"authorization": f"Bearer {token}", "content-type": "application/json"}

    def post(self, key: str, body: Dict[str, Any]) -> Any:
        self.connection.request("POST", f"/v1/semaphores/{key}", json.dumps(body), self.headers)
        answer = self.connection.getresponse()
        data = answer.read()
        assert answer.status == 200, data
        return json.loads(data)

    def acquire(self, key: str) -> List[Dict[str, Any]]:
        client_id = f"raw-{uuid.uuid4()}"
        demand = [{"group": "bench", "count": 1, "oldestAt": int(time.time() * 1000)}]
        grant = self.post(key, {"type": "request", "v": 1, "clientId": client_id, "requestId": str(uuid.uuid4()), "demand": demand})
        claims = [{"grantId": g["grantId"], "claimed": g["permits"], "released": 0} for g in grant["grants"]]
        self.post(key, {"type": "sync", "v": 1, "clientId": client_id, "grants": claims})
        return [{**claim, "clientId": client_id} for claim in claims]

    def release(self, key: str, claims: List[Dict[str, Any]]) -> None:
        grants = [{"grantId": claim["grantId"], "claimed": claim["claimed"], "released": claim["claimed"]} for claim in claims]
        self.post(key, {"type": "sync", "v": 1, "clientId": claims[0]["clientId"], "grants": grants})


def main() -> None:
    endpoint = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:7001"
    iterations = int(sys.argv[2]) if len(sys.argv) > 2 else 500
    token = os.environ.get("PERMITD_TOKEN", "change-me-local-admin-token")
    client = SemaphoreClient(endpoint, token=token)
    raw = Raw(endpoint, token)
    run = uuid.uuid4().hex[:8]
    client_ms: List[float] = []
    raw_ms: List[float] = []
    client_cpu_ms: List[float] = []
    raw_cpu_ms: List[float] = []
    for index in range(iterations + 50):
        order = ("client", "raw") if index % 2 == 0 else ("raw", "client")
        for side in order:
            key = f"bench-{run}-{side}-{index}"
            started, started_cpu = time.perf_counter(), time.thread_time()
            if side == "client":
                permit = client.acquire(key, "bench", 1)
                elapsed, cpu = (time.perf_counter() - started) * 1000, (time.thread_time() - started_cpu) * 1000
                permit.release()
            else:
                claims = raw.acquire(key)
                elapsed, cpu = (time.perf_counter() - started) * 1000, (time.thread_time() - started_cpu) * 1000
                raw.release(key, claims)
            if index >= 50:  # warm-up left out
                (client_ms if side == "client" else raw_ms).append(elapsed)
                (client_cpu_ms if side == "client" else raw_cpu_ms).append(cpu)
    differences = [c - r for c, r in zip(client_ms, raw_ms)]
    cpu_differences = [c - r for c, r in zip(client_cpu_ms, raw_cpu_ms)]
    print(f"{iterations} lone acquires each, {endpoint}")
    rows = (
        ("wall, client", client_ms),
        ("wall, raw http.client", raw_ms),
        ("wall, paired difference", differences),
        ("cpu, client", client_cpu_ms),
        ("cpu, raw http.client", raw_cpu_ms),
        ("cpu, paired difference", cpu_differences),
    )
    for name, values in rows:
        p50, p99, mean = percentile(values, 0.5), percentile(values, 0.99), statistics.mean(values)
        print(f"{name:>24}: p50 {p50:.3f} ms  p99 {p99:.3f} ms  mean {mean:.3f} ms")
    for unit, mine, theirs in (("wall", client_ms, raw_ms), ("cpu", client_cpu_ms, raw_cpu_ms)):
        p50 = percentile(mine, 0.5) - percentile(theirs, 0.5)
        p99 = percentile(mine, 0.99) - percentile(theirs, 0.99)
        print(f"overhead ({unit}): p50 {p50:.3f} ms, p99 {p99:.3f} ms")


if __name__ == "__main__":
    main()
