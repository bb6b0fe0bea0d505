"""The clients against real permitd processes: acquire, contention and release,
sync and async; cancellation and errors release what was granted; the admin and
read calls; batch; the event stream resuming on another node."""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from typing import List

import pytest

from harness import ADMIN_TOKEN, Cluster, metric_total
from permitd import AcquireError, AsyncSemaphoreClient, DeadlineExceededError, RejectedError, SemaphoreClient, SseMessage


def test_acquire_contention_and_release(shared_cluster: Cluster) -> None:
    with SemaphoreClient(shared_cluster.urls(), token=ADMIN_TOKEN) as client:
        client.set_key_config("contended", {"limit": 2})
        holding: List[int] = []
        peak: List[int] = [0]
        fences: List[int] = []
        lock = threading.Lock()

        def worker() -> None:
            for _ in range(3):
                with client.permit("contended", "wf", 1, timeout=20) as permit:
                    with lock:
                        holding.append(1)
                        peak[0] = max(peak[0], len(holding))
                        fences.append(permit.fence)
                    time.sleep(0.03)
                    with lock:
                        holding.pop()

        threads = [threading.Thread(target=worker) for _ in range(5)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(fences) == 15
        assert peak[0] == 2, "the limit is used and never passed"
        assert client.usage("contended")["granted"] == 0
        assert client.holders("contended")["clients"] == {}


def test_a_timed_out_acquisition_releases_what_it_was_granted(shared_cluster: Cluster) -> None:
    with SemaphoreClient(shared_cluster.urls(), token=ADMIN_TOKEN) as client:
        client.set_key_config("partial", {"limit": 3})
        first = client.acquire("partial", "wf", 2)
        with pytest.raises(AcquireError) as late:
            client.acquire("partial", "wf", 3, timeout=0.5)  # gets 1 of 3, then gives up
        assert late.value.kind == "timeout"
        assert client.usage("partial")["granted"] == 2, "the partial grant went back"
        first.release()
        first.release()  # a second release does nothing
        assert client.usage("partial")["granted"] == 0
        with pytest.raises(AcquireError) as zero:
            client.acquire("partial", "wf", 0)
        assert zero.value.kind == "zero_count"
        client.set_group("partial", "closed", {"permitted": False})
        with pytest.raises(AcquireError) as refused:
            client.acquire("partial", "closed", 1, timeout=5)
        assert refused.value.kind == "not_permitted"


def test_the_decorator_releases_on_exceptions_and_passes_the_fence(shared_cluster: Cluster) -> None:
    with SemaphoreClient(shared_cluster.urls(), token=ADMIN_TOKEN) as client:
        client.set_key_config("decorated", {"limit": 1})

        @client.with_permit("decorated", "wf", fence_arg="fence")
        def job(rows: int, fence: int = 0) -> int:
            assert client.usage("decorated")["granted"] == 1
            if rows < 0:
                raise ValueError("bad rows")
            return fence

        assert job(3) > 0
        with pytest.raises(ValueError, match="bad rows"):
            job(-1)
        assert client.usage("decorated")["granted"] == 0


def _blocked(cluster: Cluster) -> float:
    return sum(metric_total(url, "permitd_blocked_total") for url in cluster.urls())


def test_async_acquire_cancellation_and_release(shared_cluster: Cluster) -> None:
    async def scenario() -> None:
        async with AsyncSemaphoreClient(shared_cluster.urls(), token=ADMIN_TOKEN) as client:
            await client.set_key_config("async", {"limit": 2})
            async with client.permit("async", "wf", 2) as held:
                assert held.count == 2
                blocked_before = _blocked(shared_cluster)
                waiter = asyncio.ensure_future(client.acquire("async", "wf", 1))
                for _ in range(1_000):  # up to 10 s, until a round answered it "blocked"
                    if _blocked(shared_cluster) > blocked_before:
                        break
                    await asyncio.sleep(0.01)
                assert not waiter.done(), "the third permit waits"
                waiter.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await waiter
            fences = []

            @client.with_permit("async", "wf", fence_arg="fence")
            async def job(fence: int = 0) -> None:
                fences.append(fence)
                await asyncio.sleep(0.02)

            await asyncio.gather(*(job() for _ in range(6)))
            assert len(set(fences)) >= 3, "rounds of two: fences grow"
            task = asyncio.ensure_future(job())
            await asyncio.sleep(0.01)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await client.aclose()  # waits for background releases of abandoned requests
            async with AsyncSemaphoreClient(shared_cluster.urls(), token=ADMIN_TOKEN) as reader:
                usage = await reader.usage("async")
                assert usage["granted"] == 0, usage

    asyncio.run(scenario())


def test_admin_reads_tokens_and_batch(shared_cluster: Cluster) -> None:
    with SemaphoreClient(shared_cluster.urls(), token=ADMIN_TOKEN) as client:
        client.set_key_config("acct-batch", {"limit": 4})
        results = client.batch(
            [
                {
                    "key": "acct-batch",
                    "message": {"type": "request", "clientId": "r-1", "demand": [{"group": "g", "count": 2, "oldestAt": 1}]},
                },
                {
                    "key": "acct-batch",
                    "message": {"type": "sync", "clientId": "r-1", "grants": [{"grantId": "nope", "claimed": 1, "released": 0}]},
                },
            ]
        )
        grant = results[0]
        assert not isinstance(grant, RejectedError) and grant["grants"][0]["permits"] == 2
        assert "acct-batch" in [key["key"] for key in client.keys()]  # noqa: SIM118 (the API's keys, not a dict's)
        assert client.holders("acct-batch")["clients"]["r-1"]
        dropped = client.force_release("acct-batch", "r-1")
        assert dropped["grants"] == 1
        created = client.create_token({"name": "py-runner", "role": "runner", "keys": ["acct-*"], "clientIds": ["py-*"]})
        assert any(token["id"] == created["id"] for token in client.tokens())
        with SemaphoreClient(shared_cluster.urls(), token=created["token"]) as runner:
            with runner.permit("acct-batch", "g", 1, client_id="py-1") as permit:
                assert permit.count == 1
            with pytest.raises(RejectedError) as forbidden:
                runner.acquire("other", "g", 1, client_id="py-1")
            assert (forbidden.value.status, forbidden.value.code) == (403, "forbidden")
        client.revoke_token(created["id"])
        with pytest.raises(RejectedError) as bad:
            client.set_key_config("acct-batch", {"limit": -1})
        assert bad.value.code == "bad_request"
        assert client.cluster_status()["initialized"]
        shards = client.cluster_shards()["shards"]
        assert [shard["shard"] for shard in shards] == [0]
        assert shards[0]["members"] == sorted(node.id for node in shared_cluster.nodes)


def test_the_event_stream_resumes_from_its_cursor_on_another_node(cluster: Cluster) -> None:
    # The node streamed from first is a follower: killing it leaves the cluster working.
    leader = cluster.wait_for_leader()
    follower, other = [node for node in cluster.nodes if node.id != leader][:2]
    with SemaphoreClient([follower.url, other.url], token=ADMIN_TOKEN) as client:
        client.set_key_config("events", {"limit": 5})
        stream = client.events("events", 0)
        seen: List[SseMessage] = []
        for _ in range(5):
            client.acquire("events", "wf", 1).release()
        while len(seen) < 4:
            seen.append(next(stream))
        cluster.kill(follower.id)
        for _ in range(3):
            client.acquire("events", "wf", 1).release()
        while len(seen) < 8:
            seen.append(next(stream))
        with SemaphoreClient([other.url], token=ADMIN_TOKEN) as fresh:
            again = fresh.events("events", 0)
            expected = [next(again) for _ in range(8)]
        assert [(message.id, message.event, message.data) for message in seen] == [
            (message.id, message.event, message.data) for message in expected
        ]
        assert {message.record()["type"] for message in seen} >= {"round"}


def test_both_clients_speak_http2_when_asked(shared_cluster: Cluster) -> None:
    versions: List[str] = []
    with SemaphoreClient(shared_cluster.urls(), token=ADMIN_TOKEN, http2=True) as client:
        with client.permit("http2", "wf") as permit:
            assert permit.count == 1
        versions.append(client._driver.http.get(f"{shared_cluster.urls()[0]}/healthz").http_version)

    async def scenario() -> None:
        async with AsyncSemaphoreClient(shared_cluster.urls(), token=ADMIN_TOKEN, http2=True) as client:
            async with client.permit("http2", "wf") as permit:
                assert permit.count == 1
            versions.append((await client._driver.http.get(f"{shared_cluster.urls()[0]}/healthz")).http_version)

    asyncio.run(scenario())
    assert versions == ["HTTP/2", "HTTP/2"]


def test_a_second_cancellation_does_not_cut_the_release_of_partial_grants_off(shared_cluster: Cluster) -> None:
    async def scenario() -> None:
        async with AsyncSemaphoreClient(shared_cluster.urls(), token=ADMIN_TOKEN) as reader:
            await reader.set_key_config("double-cancel", {"limit": 3})
            client = AsyncSemaphoreClient(shared_cluster.urls(), token=ADMIN_TOKEN)
            waiter = asyncio.ensure_future(client.acquire("double-cancel", "wf", 5))  # gets 3, waits for 2 more
            deadline = asyncio.get_running_loop().time() + 10
            while (await reader.usage("double-cancel"))["granted"] < 3:
                assert asyncio.get_running_loop().time() < deadline, "the first 3 were not granted"
            waiter.cancel()
            for _ in range(5):  # cancelled again and again while it releases
                await asyncio.sleep(0.001)
                waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
            await client.aclose()
            assert (await reader.usage("double-cancel"))["granted"] == 0

    asyncio.run(scenario())


@pytest.mark.skipif(shutil.which("openssl") is None, reason="makes its certificates with openssl")
def test_both_clients_trust_the_clusters_ca_over_https() -> None:
    cluster = Cluster.start(nodes=1, tls=True)
    try:
        assert cluster.ca_file is not None and cluster.urls()[0].startswith("https://")
        with SemaphoreClient(cluster.urls(), token=ADMIN_TOKEN, ca_file=cluster.ca_file) as client, client.permit("tls", "wf") as permit:
            assert permit.count == 1
        untrusting = SemaphoreClient(cluster.urls(), token=ADMIN_TOKEN, call_timeout=1)
        with untrusting, pytest.raises(DeadlineExceededError, match="CERTIFICATE_VERIFY_FAILED"):
            untrusting.usage("tls")

        async def scenario() -> None:
            client = AsyncSemaphoreClient(cluster.urls(), token=ADMIN_TOKEN, ca_file=cluster.ca_file)
            async with client, client.permit("tls", "wf") as permit:
                assert permit.count == 1

        asyncio.run(scenario())
    finally:
        cluster.stop()


def test_a_key_in_use_is_deleted_only_when_forced(shared_cluster: Cluster) -> None:
    with SemaphoreClient(shared_cluster.urls(), token=ADMIN_TOKEN) as client:
        client.set_key_config("acct-delete", {"limit": 3})
        permit = client.acquire("acct-delete", "g", 2, timeout=10)
        with pytest.raises(RejectedError) as in_use:
            client.delete_key("acct-delete")
        assert (in_use.value.status, in_use.value.code) == (409, "key_in_use")
        deleted = client.delete_key("acct-delete", force=True)
        assert deleted["existed"] and deleted["released"]["permits"] == 2
        assert client.usage("acct-delete")["granted"] == 0
        assert client.delete_key("acct-delete")["existed"] is False  # a retry without requestId
        del permit  # its grant went with the key; its release finds nothing
