"""The clients against a real three-node cluster of three shards (``harness.py``). Once
the shards' leaders settled (spread over their preferred nodes, as the nodes hand
shards over) and the client learned them, every call about a key goes to its shard's
leader:

- each answer names the node called as the leader (``x-permitd-leader``) of the key's
  shard (``x-permitd-shard``);
- each node's API counted exactly the keyed calls of the shards it leads
  (``permitd_http_requests_total``): a forwarded call counts on the node called and
  again on the leader.
"""

from __future__ import annotations

import urllib.request
import warnings
from typing import Any, Dict, Iterator, List, Optional, Tuple
from urllib.parse import unquote, urlsplit

import pytest

from harness import ADMIN_TOKEN, Cluster, eventually, http_json
from permitd import SemaphoreClient, shard_of
from permitd.plan import Outcome, Response, Send

SHARDS = 3
#: How long the shards' leaders are given to spread over their preferred nodes.
SPREAD_TIMEOUT_S = 30.0
#: How long the shards' leaders may take to settle, and the client to learn them.
SETTLE_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def sharded_cluster() -> Iterator[Cluster]:
    cluster = Cluster.start(shards=SHARDS)
    yield cluster
    cluster.stop()


def shard_leaders(cluster: Cluster) -> Tuple[Optional[List[int]], bool]:
    """Each shard's leader as every node names it (``/cluster/shards``) when all agree and
    every shard has one, and whether each is its shard's preferred leader
    (``voters[shard mod N]``, docs/scaling.md)."""
    maps: List[Dict[str, Any]] = []
    for url in cluster.urls():
        answer = http_json(f"{url}/cluster/shards")
        assert isinstance(answer, dict)
        maps.append(answer)
    first = [shard["leader"] for shard in maps[0]["shards"]]
    agreed = all([shard["leader"] for shard in other["shards"]] == first for other in maps)
    preferred = all(shard["leader"] == shard["members"][shard["shard"] % len(shard["members"])] for shard in maps[0]["shards"])
    complete = len(first) == SHARDS and all(isinstance(leader, int) for leader in first)
    return (first if agreed and complete else None), preferred


def settled_shard_leaders(cluster: Cluster) -> List[int]:
    """The shards' leaders once each shard is led by its preferred node (the node hands
    shards over once the preferred node has caught up: docs/architecture.md, "Shards")."""
    found: List[List[int]] = []

    def spread() -> bool:
        leaders, preferred = shard_leaders(cluster)
        found[:] = [leaders] if preferred and leaders is not None else []
        return bool(found)

    eventually(SPREAD_TIMEOUT_S, spread, "spread shard leaders")
    return found[0]


def keyed_calls_served(cluster: Cluster) -> List[float]:
    """Per node, the keyed calls (``/v1/semaphores/{key}...``) its API listener counted."""
    served = []
    for url in cluster.urls():
        request = urllib.request.Request(f"{url}/metrics", headers={"authorization": f"Bearer {ADMIN_TOKEN}"})
        with urllib.request.urlopen(request, timeout=2) as answer:
            lines = answer.read().decode().splitlines()
        keyed = [
            line
            for line in lines
            if line.startswith("permitd_http_requests_total{") and 'listener="api"' in line and 'route="/v1/semaphores/{key}' in line
        ]
        served.append(sum(float(line.rsplit(" ", 1)[1]) for line in keyed))
    return served


def keys_of_each_shard() -> List[Tuple[str, int]]:
    """Keys ``routed-N``, two of each shard, with their shard."""
    keys: List[Tuple[str, int]] = []
    taken = [0] * SHARDS
    n = 0
    while len(keys) < 2 * SHARDS:
        key = f"routed-{n}"
        shard = shard_of(key, SHARDS)
        if taken[shard] < 2:
            taken[shard] += 1
            keys.append((key, shard))
        n += 1
    return keys


def test_keyed_calls_go_to_their_shards_leader_without_a_forwarding_hop(sharded_cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = sharded_cluster
    keys = keys_of_each_shard()
    url_of = {node.id: node.url for node in cluster.nodes}
    with SemaphoreClient(cluster.urls(), token=ADMIN_TOKEN, call_timeout=20) as client:
        seen: List[Tuple[str, Optional[str], Optional[str]]] = []
        perform = client._driver.perform

        def recording(send: Send) -> Outcome:
            outcome = perform(send)
            if isinstance(outcome, Response):
                seen.append((send.url, outcome.headers.get("x-permitd-leader"), outcome.headers.get("x-permitd-shard")))
            return outcome

        monkeypatch.setattr(client._driver, "perform", recording)
        # A leader that moves during the calls (a stalled machine's election) sends some
        # to another node: the calls are made again, up to this often.
        for attempt in range(1, 4):
            leaders = settled_shard_leaders(cluster)
            if len(set(leaders)) == 1:
                warnings.warn(f"the shards' leaders did not spread: node {leaders[0]} leads every shard", stacklevel=1)

            # Warm-up: the answers teach the client the count and each shard's leader,
            # and node-id discovery which endpoint each leader is.
            def learned(leaders: List[int] = leaders) -> bool:
                for key, _ in keys:
                    client.usage(key)
                return all(client.leader_of_key(key) == url_of[leaders[shard]] for key, shard in keys)

            eventually(SETTLE_TIMEOUT_S, learned, f"the client learning {leaders}")
            assert client.shard_count() == SHARDS
            # Calls naming no key follow the meta shard's leader.
            client.tokens()
            assert client.leader() == url_of[leaders[0]]

            seen.clear()
            before = keyed_calls_served(cluster)
            expected = [0.0] * len(cluster.nodes)
            for _ in range(3):
                for key, shard in keys:
                    grant = client.request(key, {"clientId": "routed", "demand": [{"group": "g", "count": 1, "oldestAt": 1}]})
                    assert len(grant["grants"]) == 1, key
                    granted = grant["grants"][0]
                    report = {"grantId": granted["grantId"], "claimed": granted["permits"], "released": granted["permits"]}
                    client.sync(key, {"clientId": "routed", "grants": [report]})
                    assert client.usage(key)["granted"] == 0, key
                    expected[[node.id for node in cluster.nodes].index(leaders[shard])] += 3
            after = keyed_calls_served(cluster)
            calls = list(seen)
            if shard_leaders(cluster)[0] != leaders and attempt < 3:
                continue

            assert len(calls) == 3 * 3 * len(keys), "one attempt per call"
            for url, leader, shard_header in calls:
                parts = urlsplit(url)
                key = unquote(parts.path.split("/")[3])
                node = next(node for node in cluster.nodes if node.url == f"{parts.scheme}://{parts.netloc}")
                assert shard_header == str(shard_of(key, SHARDS)), url
                assert leader == str(node.id), f"{url} was answered by its shard's leader"
            served = [count - earlier for count, earlier in zip(after, before)]
            assert served == expected, f"keyed calls each node served (shard leaders {leaders})"
            return


def test_a_stream_of_every_shard_resumes_after_its_cursor_on_another_node() -> None:
    """A stream of every key at three shards merges them; its ids are cursors of one
    index per shard. The node streamed from dies mid-stream: the iterator resumes on
    the next endpoint right after the last id it saw, and every event arrives once."""
    cluster = Cluster.start(shards=SHARDS)
    try:
        leader = cluster.wait_for_leader()
        streamed, other = [node for node in cluster.nodes if node.id != leader][:2]
        keys = keys_of_each_shard()
        with SemaphoreClient([streamed.url, other.url], token=ADMIN_TOKEN, call_timeout=20) as client:
            stream = client.events(None, 0)
            for key, _ in keys:
                client.acquire(key, "wf", 1).release()
            rounds: List[Tuple[str, int]] = []
            cursors: List[str] = []

            def read_rounds(count: int) -> None:
                while len(rounds) < count:
                    message = next(stream)
                    assert message.id is None and message.cursor is not None, message
                    positions = [int(position) for position in message.cursor.split(",")]
                    assert len(positions) == SHARDS, message.cursor
                    record = message.record()
                    shard = shard_of(record["key"], SHARDS)
                    assert positions[shard] == record["logIndex"], (message.cursor, record)
                    cursors.append(message.cursor)
                    if record["type"] == "round":
                        rounds.append((record["key"], record["logIndex"]))

            read_rounds(len(keys))
            cluster.kill(streamed.id)
            # New rounds the dead node never sent: the stream must resume elsewhere.
            for key, _ in keys:
                client.acquire(key, "wf", 1).release()
            read_rounds(2 * len(keys))
            assert sorted(key for key, _ in rounds) == sorted(2 * [key for key, _ in keys])
            assert len(set(rounds)) == len(rounds), f"no round twice: {rounds}"
    finally:
        cluster.stop()
