"""Pure pieces, without processes: backoff, leader routing, Retry-After, the SSE
parser, claim amounts, and a call's plan stepped by hand (the same plan both
clients run), so retries, ``requestId`` and leader hints are checked exactly."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional

import pytest

from permitd import RejectedError
from permitd.backoff import Backoff
from permitd.errors import DeadlineExceededError
from permitd.events import Cursor, SseParser, stream_error
from permitd.leader import LeaderTracker, parse_endpoints, parse_leader_hint
from permitd.permit import claim_amounts
from permitd.plan import ClientConfig, ClientCore, Failure, Response, Send, Sleep, parse_retry_after


def test_backoff_doubles_to_its_cap_with_equal_jitter_and_honours_retry_after() -> None:
    backoff = Backoff(50, 400)
    assert [backoff.next_delay_ms(0.0) for _ in range(5)] == [25, 50, 100, 200, 200]
    assert Backoff(50, 400).next_delay_ms(0.999) == 49
    assert Backoff(50, 400).next_delay_ms(0.5, retry_after_ms=1_000) == 1_000


def test_endpoints_are_normalised_and_deduplicated() -> None:
    assert parse_endpoints("127.0.0.1:7001, http://127.0.0.1:7001/ https://Node-2:443") == ["http://127.0.0.1:7001", "https://node-2:443"]
    with pytest.raises(ValueError, match="no endpoints"):
        parse_endpoints(" , ")
    assert parse_leader_hint("2") == 2
    assert parse_leader_hint("http://10.0.0.1:7001/") == "http://10.0.0.1:7001"


def test_the_leader_is_asked_first_and_a_failed_node_passes_the_turn() -> None:
    tracker = LeaderTracker(["http://a", "http://b", "http://c"])
    assert tracker.pick() == "http://a"
    tracker.failed("http://a", None)
    assert tracker.pick() == "http://b"
    tracker.answered("http://b", 3)  # an id not known yet: b is taken until ids are learned
    assert tracker.wants_node_ids()
    assert tracker.pick() == "http://b"
    tracker.learn_node_id("http://c", 3)
    assert tracker.pick() == "http://c"
    tracker.failed("http://c", "http://d")  # a URL hint is learned as a new endpoint
    assert tracker.pick() == "http://d"


def test_retry_after_reads_seconds_and_dates() -> None:
    assert parse_retry_after("2") == 2_000
    assert parse_retry_after(None) is None
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0
    assert parse_retry_after("soon") is None


def test_sse_messages_are_cut_at_blank_lines_across_chunks() -> None:
    parser = SseParser()
    parser.feed(b": keep-alive\n\nevent: round\nid: 7\nda")
    assert not parser.ready
    parser.feed(b'ta: {"a":1}\r\n\r\nevent: blocked\ndata:x\ndata: y\n\n')
    first, second = parser.ready
    assert (first.event, first.id, first.data) == ("round", 7, '{"a":1}')
    assert (second.id, second.data) == (None, "x\ny")
    error = stream_error('{"error":{"code":"too_far_behind","message":"resume from 9"}}')
    assert (error.status, error.code) == (410, "too_far_behind")


def test_a_merged_streams_id_is_a_cursor_the_stream_resumes_after() -> None:
    parser = SseParser()
    parser.feed(b"event: round\nid: 12,0,7\ndata: {}\n\nid: \xd9\xa3\ndata: {}\n\nid: 9\ndata: {}\n\n")
    merged, foreign_digit, single = parser.ready
    assert (merged.id, merged.cursor) == (None, "12,0,7")
    assert (foreign_digit.id, foreign_digit.cursor) == (None, "\u0663")
    assert (single.id, single.cursor) == (9, "9")
    cursor = Cursor(None, 0)
    assert cursor.query() == {"from": "0"}
    cursor.seen(merged)
    assert cursor.query() == {"cursor": "12,0,7"}
    cursor.seen(single)
    assert Cursor("k", None).query() == {"key": "k"}


def test_claims_cover_what_is_needed_and_no_more() -> None:
    grants = [{"grantId": "a", "group": "g", "permits": 2, "fence": 7}, {"grantId": "b", "group": "g", "permits": 5, "fence": 7}]
    assert [grant.claimed for grant in claim_amounts(grants, 4)] == [2, 2]  # type: ignore[arg-type]
    assert claim_amounts(grants, 0) == []  # type: ignore[arg-type]


# ---- a call's plan, stepped by hand ------------------------------------------------


def response(status: int, body: Any, headers: Optional[Dict[str, str]] = None) -> Response:
    return Response(status, headers or {}, json.dumps(body).encode())


GRANT = {"type": "grant", "v": 1, "grants": [], "blocked": [], "grantResults": [], "nextRequestAt": 5}
BUSY = {"error": {"code": "overloaded", "message": "busy"}}


def core(endpoints: List[str]) -> ClientCore:
    return ClientCore(ClientConfig(endpoints=endpoints, token="t0ken", random=lambda: 0.0))


def test_a_request_is_retried_with_one_request_id_honouring_retry_after_and_the_leader_hint() -> None:
    client = core(["http://a", "http://b", "http://c"])
    plan = client.request("acct-1", {"clientId": "runner-1", "demand": []})
    first = next(plan)
    assert isinstance(first, Send) and first.url == "http://a/v1/semaphores/acct-1"
    assert first.headers["authorization"] == "Bearer t0ken"
    sent = json.loads(first.body or b"")
    assert sent["type"] == "request" and sent["v"] == 1 and sent["requestId"]
    pause = plan.send(response(503, BUSY, {"retry-after": "1", "x-permitd-leader": "http://c"}))
    assert isinstance(pause, Sleep) and pause.seconds >= 1.0
    second = plan.send(None)
    assert isinstance(second, Send) and second.url == "http://c/v1/semaphores/acct-1"
    assert json.loads(second.body or b"")["requestId"] == sent["requestId"], "a retry replays"
    pause = plan.send(Failure("connection refused"))
    assert isinstance(pause, Sleep)
    third = plan.send(None)
    assert isinstance(third, Send) and not third.url.startswith("http://c")
    with pytest.raises(StopIteration) as done:
        plan.send(response(200, GRANT, {"x-permitd-leader": "http://b"}))
    assert done.value.value["nextRequestAt"] == 5
    assert client.leader() == "http://b"
    assert client.next_request_at("acct-1") == 5


def test_a_rejection_ends_the_call_with_the_servers_code_and_field() -> None:
    plan = core(["http://a"]).sync("acct-1", {"clientId": "runner-1"})
    next(plan)
    with pytest.raises(RejectedError) as refused:
        plan.send(response(400, {"error": {"code": "bad_request", "message": "no", "field": "grants[0].claimed"}}))
    assert (refused.value.status, refused.value.code, refused.value.field) == (400, "bad_request", "grants[0].claimed")


def test_retries_stop_at_the_calls_deadline() -> None:
    client = ClientCore(ClientConfig(endpoints=["http://a"], call_timeout_ms=120, backoff_initial_ms=100, random=lambda: 0.99))
    plan = client.call("GET", ["v1", "semaphores", "k", "usage"], shape="Usage")
    effect = next(plan)
    with pytest.raises(DeadlineExceededError) as late:
        while True:
            effect = plan.send(response(429, BUSY) if isinstance(effect, Send) else None)
    assert late.value.attempts >= 1
