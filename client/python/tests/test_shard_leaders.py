"""Routing by shard, without processes: the table of shard leaders (counting, learning,
forgetting), the shard headers, the key of a call's path, the leader tracker sending
each key's calls to its shard's leader, and a call's plan stepped by hand. The same
cases as the Rust client's ``shard_leaders.rs`` and ``leader.rs`` tests and the
TypeScript ``shard-leaders.test.ts``."""

from __future__ import annotations

import json
from typing import Dict, List, Optional, Tuple

from permitd import MAX_SHARDS, shard_of
from permitd.leader import LeaderTracker
from permitd.plan import ClientConfig, ClientCore, Response, Send, key_of
from permitd.shard_leaders import ShardHint, ShardLeaders, parse_shard_hint

N1, N2, N3 = "http://n1:1", "http://n2:2", "http://n3:3"


def of(shard: int, shards: int) -> ShardHint:
    return ShardHint(shard=shard, shards=shards)


def key_in(shard: int, shards: int, prefix: str = "key-") -> str:
    return next(f"{prefix}{n}" for n in range(10_000) if shard_of(f"{prefix}{n}", shards) == shard)


def three_nodes() -> Tuple[LeaderTracker, List[str]]:
    """A tracker over nodes 1, 2 and 3 with their ids known, and a key of each of 3 shards."""
    tracker = LeaderTracker([N1, N2, N3])
    for node_id, endpoint in enumerate([N1, N2, N3], start=1):
        tracker.learn_node_id(endpoint, node_id)
    return tracker, [key_in(shard, 3) for shard in range(3)]


def test_the_table_counts_one_shard_until_told_otherwise_and_ignores_counts_out_of_range() -> None:
    table = ShardLeaders()
    assert table.count() == 1
    assert table.shard_of("any key") == 0
    for bad in (0, -1, MAX_SHARDS + 1, 2**63):
        assert not table.learn_count(bad), bad
    assert table.count() == 1
    assert table.learn_count(MAX_SHARDS)
    assert table.count() == MAX_SHARDS
    assert table.learn_count(3)
    assert not table.learn_count(3), "the same count changes nothing"
    for key in ("a", "acct-1", "acct/7 b", ""):
        assert table.shard_of(key) == shard_of(key, 3), key


def test_the_table_learns_replaces_and_forgets_leaders_and_a_new_count_forgets_them_all() -> None:
    table = ShardLeaders()
    table.learn_count(3)
    table.set(1, ("node", 2))
    table.set(2, ("endpoint", 0))
    table.set(3, ("node", 9))  # no shard 3 of 3
    assert [table.leader(shard) for shard in range(4)] == [None, ("node", 2), ("endpoint", 0), None]
    table.set(1, ("node", 3))
    assert table.leader(1) == ("node", 3)
    table.forget(1)
    assert table.known() == [("endpoint", 0)]
    table.set(0, ("node", 1))
    table.forget_where(lambda leader: leader[0] == "endpoint")
    assert table.known() == [("node", 1)]
    assert table.learn_count(5)
    assert table.known() == []
    table.set(4, ("node", 2))
    table.learn_count(5_000)
    assert table.leader(4) == ("node", 2), "an ignored count keeps what is known"


def test_shard_headers_read_as_a_hint_and_a_calls_key_is_the_segment_after_v1_semaphores() -> None:
    assert parse_shard_hint(None, None) is None
    assert parse_shard_hint("2", None) == ShardHint(2, 1)
    assert parse_shard_hint("2", " 3 ") == ShardHint(2, 3)
    assert parse_shard_hint(None, "3") == ShardHint(None, 3)
    assert parse_shard_hint("2", "many") is None
    assert parse_shard_hint("-1", "3") is None
    assert key_of(["v1", "semaphores", "acct/7"]) == "acct/7"
    assert key_of(["v1", "semaphores", "k", "groups", "g"]) == "k"
    for keyless in (["v1", "semaphores"], ["v1", "batch"], ["v1", "tokens", "3"], ["cluster", "status"]):
        assert key_of(keyless) is None, keyless


def test_each_shard_is_asked_at_its_own_leader_and_only_the_meta_shard_moves_the_keyless_leader() -> None:
    tracker, (k0, k1, k2) = three_nodes()
    assert tracker.shard_count() == 1
    tracker.answered_for(N1, 2, of(1, 3))
    tracker.answered_for(N3, 3, of(2, 3))
    assert tracker.shard_count() == 3
    assert tracker.pick_for(k1) == N2
    assert tracker.pick_for(k2) == N3
    assert tracker.leader() == N1, "the first node that answered, while the meta shard's leader is unknown"
    assert tracker.pick_for(k0) == N1
    tracker.answered_for(N1, 3, of(0, 3))
    assert tracker.pick() == N3
    assert tracker.pick_for(None) == N3
    assert tracker.pick_for(k0) == N3
    tracker.answered_for(N2, 2, of(1, 3))
    assert tracker.pick() == N3, "another shard's answer leaves the keyless leader"
    assert tracker.leader_of_key(k2) == N3


def test_one_shard_answers_and_answers_without_or_covering_every_shard_work_as_before_shards() -> None:
    tracker, (k0, k1, _) = three_nodes()
    tracker.answered_for(N3, 2, of(0, 1))
    assert tracker.shard_count() == 1
    assert tracker.pick() == N2
    assert tracker.pick_for(k1) == N2
    tracker.answered_for(N3, 3, None)
    assert tracker.pick() == N3
    tracker.answered_for(N1, None, ShardHint(None, 3))
    assert tracker.shard_count() == 3
    assert tracker.leader_of_key(k0) is None
    assert tracker.pick_for(k0) == N1, "the node that answered is asked first"


def test_a_new_count_forgets_the_shard_leaders_and_a_count_above_max_shards_is_ignored() -> None:
    tracker, (_, k1, _) = three_nodes()
    tracker.answered_for(N1, 2, of(1, 3))
    assert tracker.leader_of_key(k1) == N2
    tracker.answered_for(N1, 1, of(7, MAX_SHARDS + 1))
    assert tracker.shard_count() == 3
    assert tracker.leader_of_key(k1) == N2
    tracker.answered_for(N1, 1, of(0, 4))
    assert tracker.shard_count() == 4
    assert (tracker.leader_of_key(k1) is not None) == (shard_of(k1, 4) == 0)


def test_a_shard_leader_named_by_an_unknown_id_waits_for_node_id_discovery() -> None:
    tracker = LeaderTracker([N1, N2])
    key = key_in(1, 2)
    tracker.answered_for(N1, 2, of(1, 2))
    assert tracker.wants_node_ids()
    assert tracker.pick_for(key) == N1
    tracker.learn_node_id(N1, 1)
    assert tracker.wants_node_ids(), "node 2 is still unknown"
    tracker.learn_node_id(N2, 2)
    assert not tracker.wants_node_ids()
    assert tracker.pick_for(key) == N2
    assert tracker.pick() == N1, "shard 1 is not the meta shard"


def test_a_failing_shard_takes_the_leader_it_names_or_forgets_its_own() -> None:
    tracker, (k0, k1, k2) = three_nodes()
    tracker.answered_for(N1, 1, of(0, 3))
    tracker.answered_for(N2, 2, of(1, 3))
    tracker.answered_for(N3, 3, of(2, 3))
    tracker.failed_for(N2, k1, 3, of(1, 3))  # not_leader naming node 3
    assert tracker.pick_for(k1) == N3
    assert tracker.pick() == N1, "the meta shard's leader stays"
    tracker.failed_for(N3, k2, 3, of(2, 3))  # leader_changed, naming itself
    assert tracker.leader_of_key(k2) is None
    assert tracker.pick_for(k2) == N1
    assert tracker.pick_for(k1) == N3, "shard 1 is another shard"
    tracker.failed_for(N1, k0, 2, of(0, 3))
    assert tracker.pick() == N2, "a meta shard failure naming node 2 moves the keyless leader"


def test_an_unreachable_node_is_forgotten_as_every_shards_leader() -> None:
    tracker, (k0, k1, k2) = three_nodes()
    tracker.answered_for(N1, 1, of(0, 3))
    tracker.answered_for(N1, 2, of(1, 3))
    tracker.answered_for(N1, 2, of(2, 3))
    tracker.failed_for(N2, k1, None, None)  # no answer at all
    assert tracker.leader_of_key(k1) is None
    assert tracker.leader_of_key(k2) is None
    assert tracker.leader_of_key(k0) == N1
    tracker.failed_for(N1, k0, None, None)
    assert tracker.leader() is None
    assert tracker.pick_for(k0) == N2


def answer(body: object, headers: Optional[Dict[str, str]] = None) -> Response:
    return Response(200, headers or {}, json.dumps(body).encode())


USAGE = {"key": "k", "limit": 10, "granted": 0, "leased": 0, "claimed": 0, "pending": 0, "groups": {}}


def test_a_plan_sends_each_keys_calls_to_its_shards_leader() -> None:
    client = ClientCore(ClientConfig(endpoints=[N1, N2, N3], random=lambda: 0.0))
    k1, k2 = key_in(1, 3), key_in(2, 3)

    def usage(key: str, answered: Dict[str, str]) -> str:
        plan = client.call("GET", ["v1", "semaphores", key, "usage"])
        sent = next(plan)
        assert isinstance(sent, Send)
        try:
            plan.send(answer(USAGE, answered))
        except StopIteration:
            pass
        return sent.url

    # The first call goes to the first node; its answer names shard 1's leader by URL.
    assert usage(k1, {"x-permitd-leader": N2, "x-permitd-shard": "1", "x-permitd-shards": "3"}).startswith(f"{N1}/")
    assert usage(k1, {"x-permitd-leader": N2, "x-permitd-shard": "1", "x-permitd-shards": "3"}).startswith(f"{N2}/")
    assert usage(k2, {"x-permitd-leader": N3, "x-permitd-shard": "2", "x-permitd-shards": "3"}).startswith(f"{N1}/")
    assert usage(k2, {"x-permitd-leader": N3, "x-permitd-shard": "2", "x-permitd-shards": "3"}).startswith(f"{N3}/")
    assert client.shard_count() == 3
    assert (client.leader_of_key(k1), client.leader_of_key(k2)) == (N2, N3)
    # A 503 for shard 2 naming node 2 moves shard 2's calls there.
    plan = client.call("GET", ["v1", "semaphores", k2, "usage"])
    first = next(plan)
    assert isinstance(first, Send) and first.url.startswith(f"{N3}/")
    busy = json.dumps({"error": {"code": "not_leader", "message": "no"}}).encode()
    plan.send(Response(503, {"x-permitd-leader": N2, "x-permitd-shard": "2", "x-permitd-shards": "3"}, busy))
    second = plan.send(None)
    assert isinstance(second, Send) and second.url.startswith(f"{N2}/")
    assert client.leader() == N1, "calls naming no key still go to the first node that answered"
