"""The protocol once, without IO: every call is a *plan* that the sync and the async
client drive.

A plan is a generator that yields effects (``Send`` an HTTP request, ``Sleep``)
and receives their outcomes (``Response``, ``Failure``, ``None``); its return
value is the call's result. ``SemaphoreClient`` runs plans with ``httpx.Client``
and ``time.sleep``, ``AsyncSemaphoreClient`` with ``httpx.AsyncClient`` and
``asyncio.sleep`` (``drive.py``), so leader routing, retries, ``requestId``,
``nextRequestAt`` and the acquisition rules are written once, here and in
``permit.py``, and tested the same way for both.

One call (``ClientCore.call``) is a loop of attempts inside a per-call deadline:
pick a node (the remembered leader first: for a call about a key, the leader of the
key's shard, ``leader.py``), send, and on a
retryable failure (connection error, attempt timeout, 429, 502, 503, 504) back
off with capped jittered exponential delays (``backoff.py``), never sooner than
the server's ``Retry-After``, and try again. Any other rejection ends the call
with a ``RejectedError`` carrying the server's ``code``. Same rules as the Rust
client's ``client.rs`` and the TypeScript ``client.ts``.

Retries are safe: a ``request`` always carries a ``requestId`` (a fresh UUID
unless the caller set one), the same on every attempt, so the holder answers a
retry of a committed round with the original answer; reports are cumulative.
"""

from __future__ import annotations

import email.utils
import json
import random
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Generator, List, Mapping, Optional, Sequence, Tuple, TypeVar, Union, cast
from urllib.parse import quote, urlencode

from . import wire
from .backoff import DEFAULT_INITIAL_DELAY_MS, DEFAULT_MAX_DELAY_MS, Backoff
from .errors import DeadlineExceededError, RejectedError, UnexpectedAnswerError
from .leader import LeaderTracker, parse_endpoints, parse_leader_hint
from .shard_leaders import parse_shard_hint

#: Default deadline of one call, retries included, in ms.
DEFAULT_CALL_TIMEOUT_MS = 30_000
#: Default limit of one HTTP attempt, in ms (a request waits for its round).
DEFAULT_ATTEMPT_TIMEOUT_MS = 15_000
#: Default limit on opening a connection to one node, in ms (a node that is down refuses at
#: once; one cut off by the network must not take a whole attempt).
DEFAULT_CONNECT_TIMEOUT_MS = 1_000
#: Least time between two rounds of node-id discovery, in ms.
NODE_ID_DISCOVERY_INTERVAL_MS = 30_000
#: Limit of one node-id discovery call, in ms.
NODE_ID_DISCOVERY_TIMEOUT_MS = 1_000
#: Keys whose ``nextRequestAt`` is remembered before past entries are pruned.
MAX_REMEMBERED_KEYS = 100_000
#: Answers retried: what a node marks retryable (429, 503, with ``Retry-After``) and gateway failures.
RETRYABLE_STATUSES = (429, 502, 503, 504)
#: Longest error body kept in an error message, in characters.
MAX_ERROR_BODY_CHARS = 512
#: Furthest in the future a ``nextRequestAt`` is believed, in ms from receipt: a later
#: one (a node's clock far ahead) is taken as this, since asking sooner than the
#: holder's round only waits at the holder, while believing it could stall a key.
MAX_NEXT_REQUEST_AHEAD_MS = 60_000

# ---- effects and outcomes --------------------------------------------------------


@dataclass
class Send:
    """One HTTP attempt. ``abandon`` (for a ``request``'s attempt) is told the
    answer when the caller gave up while it was in flight (see ``permit.py``)."""

    method: str
    url: str
    headers: Dict[str, str]
    body: Optional[bytes]
    timeout_ms: int
    abandon: Optional[Callable[[Any], Any]] = None


@dataclass
class Sleep:
    seconds: float


@dataclass
class Response:
    status: int
    headers: Mapping[str, str]
    body: bytes


@dataclass
class Failure:
    """The attempt got no HTTP answer (connection refused or reset, timeout)."""

    reason: str


Effect = Union[Send, Sleep]
Outcome = Union[Response, Failure, None]
T = TypeVar("T")
Plan = Generator[Effect, Any, T]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def believed_next_request_at(at_ms: int, now: int) -> int:
    """The ``nextRequestAt`` a client acts on: at most ``MAX_NEXT_REQUEST_AHEAD_MS`` ahead."""
    return min(at_ms, now + MAX_NEXT_REQUEST_AHEAD_MS)


def parse_retry_after(value: Optional[str]) -> Optional[int]:
    """``Retry-After`` in seconds or as an HTTP date, in ms."""
    if value is None:
        return None
    try:
        seconds = float(value.strip())
        return int(seconds * 1000) if seconds >= 0 else None
    except ValueError:
        pass
    try:
        at = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0, int(at.timestamp() * 1000) - now_ms())


def rejected(status: int, text: str) -> RejectedError:
    """The error of a non-success answer: the server's ``{error: {code, message}}``, or the raw text."""
    try:
        error = wire.parse("ErrorAnswer", json.loads(text))["error"]
        return RejectedError(status, error["code"], error["message"], error.get("field"))
    except (ValueError, wire.WireError):
        return RejectedError(status, f"http_{status}", text[:MAX_ERROR_BODY_CHARS])


def key_of(segments: Sequence[str]) -> Optional[str]:
    """The key a call of ``segments`` is about: the segment after ``/v1/semaphores``.
    Listings, batches, tokens and cluster calls name none."""
    return segments[2] if len(segments) >= 3 and segments[0] == "v1" and segments[1] == "semaphores" else None


def segments_path(segments: Sequence[str]) -> str:
    """Path segments, each percent-encoded (keys and groups may hold ``/``)."""
    return "/".join(quote(segment, safe="") for segment in segments)


# ---- settings ------------------------------------------------------------------


@dataclass
class ClientConfig:
    """How a client reaches the cluster (``ClientConfig`` of the Rust client)."""

    endpoints: List[str]
    token: Optional[str] = None
    ca_file: Optional[str] = None
    http2: bool = False
    call_timeout_ms: int = DEFAULT_CALL_TIMEOUT_MS
    attempt_timeout_ms: int = DEFAULT_ATTEMPT_TIMEOUT_MS
    connect_timeout_ms: int = DEFAULT_CONNECT_TIMEOUT_MS
    backoff_initial_ms: int = DEFAULT_INITIAL_DELAY_MS
    backoff_max_ms: int = DEFAULT_MAX_DELAY_MS
    random: Callable[[], float] = field(default=random.random, repr=False)

    def __repr__(self) -> str:
        token = None if self.token is None else "<redacted>"
        return f"ClientConfig(endpoints={self.endpoints!r}, token={token}, ca_file={self.ca_file!r}, http2={self.http2})"


# ---- the core --------------------------------------------------------------------


class ClientCore:
    """The state both clients share (leader, per-key ``nextRequestAt``) and their plans.

    A lock guards the state: a sync client may be used from many threads."""

    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        self.tracker = LeaderTracker(parse_endpoints(config.endpoints))
        self._lock = threading.Lock()
        self._next_request_at_ms: Dict[str, int] = {}
        self._last_discovery_ms = -NODE_ID_DISCOVERY_INTERVAL_MS
        self._auth: Dict[str, str] = {} if config.token is None else {"authorization": f"Bearer {config.token}"}

    def leader(self) -> Optional[str]:
        with self._lock:
            return self.tracker.leader()

    def leader_of_key(self, key: str) -> Optional[str]:
        with self._lock:
            return self.tracker.leader_of_key(key)

    def shard_count(self) -> int:
        with self._lock:
            return self.tracker.shard_count()

    def next_request_at(self, key: str) -> Optional[int]:
        with self._lock:
            return self._next_request_at_ms.get(key)

    def remember_next_request_at(self, key: str, at_ms: int) -> None:
        now = now_ms()
        at_ms = believed_next_request_at(at_ms, now)
        with self._lock:
            known = self._next_request_at_ms
            if len(known) >= MAX_REMEMBERED_KEYS:
                for stale in [name for name, at in known.items() if at <= now]:
                    del known[stale]
            if len(known) < MAX_REMEMBERED_KEYS or key in known:
                known[key] = at_ms

    # ---- one call ----

    def call(
        self,
        method: str,
        segments: Sequence[str],
        body: Any = None,
        shape: Optional[str] = None,
        *,
        timeout_ms: Optional[int] = None,
        query: Optional[Mapping[str, str]] = None,
        abandon: Optional[Callable[[Any], Any]] = None,
    ) -> Plan[Any]:
        """Attempts inside the deadline; the answer parsed as the wire type ``shape``."""
        deadline_ms = timeout_ms if timeout_ms is not None else self.config.call_timeout_ms
        deadline = time.monotonic() + deadline_ms / 1000
        backoff = Backoff(self.config.backoff_initial_ms, self.config.backoff_max_ms)
        data = None if body is None else wire.encode(body)
        tail = segments_path(segments) + (f"?{urlencode(query)}" if query else "")
        headers = dict(self._auth)
        if data is not None:
            headers["content-type"] = "application/json"
        yield from self._discover_node_ids_if_due()
        key = key_of(segments)
        attempts = 0
        while True:
            attempts += 1
            with self._lock:
                endpoint = self.tracker.pick_for(key)
            url = f"{endpoint}/{tail}"
            left_ms = int((deadline - time.monotonic()) * 1000)
            timeout = max(1, min(left_ms, self.config.attempt_timeout_ms))
            outcome = yield Send(method, url, headers, data, timeout, abandon)
            done, value, retry_after_ms = self._settle(endpoint, key, url, outcome, shape)
            if done:
                return value
            delay = backoff.next_delay_ms(self.config.random(), retry_after_ms)
            if time.monotonic() + delay / 1000 >= deadline:
                raise DeadlineExceededError(deadline_ms, attempts, value)
            yield Sleep(delay / 1000)

    def _settle(
        self, endpoint: str, key: Optional[str], url: str, outcome: Outcome, shape: Optional[str]
    ) -> Tuple[bool, Any, Optional[int]]:
        """(done, parsed answer) or (not done, the reason, ``Retry-After``); raises on a rejection.
        ``key`` is the key the call is about, if any: its shard's leader was asked."""
        if not isinstance(outcome, Response):
            with self._lock:
                self.tracker.failed_for(endpoint, key, None, None)
            reason = outcome.reason if isinstance(outcome, Failure) else "no outcome"
            return False, f"{endpoint}: {reason}", None
        hint = parse_leader_hint(outcome.headers.get(wire.LEADER_HEADER))
        shard = parse_shard_hint(outcome.headers.get(wire.SHARD_HEADER), outcome.headers.get(wire.SHARDS_HEADER))
        text = outcome.body.decode("utf-8", "replace")
        if outcome.status in RETRYABLE_STATUSES:
            if outcome.status != 429:
                with self._lock:
                    self.tracker.failed_for(endpoint, key, hint, shard)
            return False, str(rejected(outcome.status, text)), parse_retry_after(outcome.headers.get("retry-after"))
        if not 200 <= outcome.status < 300:
            raise rejected(outcome.status, text)
        with self._lock:
            self.tracker.answered_for(endpoint, hint, shard)
        try:
            value = None if text == "" else json.loads(text)
            return True, value if shape is None else wire.parse(shape, value), None
        except (ValueError, wire.WireError) as error:
            raise UnexpectedAnswerError(url, str(error)) from error

    def _discover_node_ids_if_due(self) -> Plan[None]:
        """Learns which endpoint is which node id, when a leader was named by an id no endpoint
        is known to have (at most every ``NODE_ID_DISCOVERY_INTERVAL_MS``). It runs before a
        call's first attempt, never between an answer and its return: an interruption
        there would lose the answer (a grant nobody claims until its deadline)."""
        with self._lock:
            if not self.tracker.wants_node_ids() or now_ms() - self._last_discovery_ms < NODE_ID_DISCOVERY_INTERVAL_MS:
                return
            self._last_discovery_ms = now_ms()
            endpoints = list(self.tracker.endpoints)
        for endpoint in endpoints:
            outcome = yield Send("GET", f"{endpoint}/cluster/status", dict(self._auth), None, NODE_ID_DISCOVERY_TIMEOUT_MS)
            if not isinstance(outcome, Response) or outcome.status != 200:
                continue
            try:
                status = wire.parse("ClusterStatus", json.loads(outcome.body))
            except (ValueError, wire.WireError):
                continue
            with self._lock:
                self.tracker.learn_node_id(endpoint, status["id"])

    # ---- the v1 API ----

    def request(
        self, key: str, message: Mapping[str, Any], timeout_ms: Optional[int] = None, abandon: Optional[Callable[[Any], Any]] = None
    ) -> Plan[wire.SemaphoreResponse]:
        """A ``request``, after the key's ``nextRequestAt``, inside the call's deadline: when
        ``nextRequestAt`` falls after it, fails at once instead of sleeping past it."""
        body = {**message, "type": "request", "v": 1}
        body.setdefault("requestId", str(uuid.uuid4()))
        deadline_ms = timeout_ms if timeout_ms is not None else self.config.call_timeout_ms
        started = time.monotonic()
        wait_ms = (self.next_request_at(key) or 0) - now_ms()
        if wait_ms > 0:
            if wait_ms >= deadline_ms:
                raise DeadlineExceededError(deadline_ms, 0, f"the key's nextRequestAt is {wait_ms} ms away")
            yield Sleep(wait_ms / 1000)
        remaining = max(1, deadline_ms - int((time.monotonic() - started) * 1000))
        answer = yield from self.call("POST", ["v1", "semaphores", key], body, "SemaphoreResponse", timeout_ms=remaining, abandon=abandon)
        if answer["type"] != "grant":
            raise UnexpectedAnswerError(f"/v1/semaphores/{key}", "a synced answer to a request")
        self.remember_next_request_at(key, answer["nextRequestAt"])
        return cast(wire.SemaphoreResponse, answer)

    def sync(self, key: str, message: Mapping[str, Any], timeout_ms: Optional[int] = None) -> Plan[wire.SemaphoreResponse]:
        """A ``sync`` (reports only); applied with the next log entry, no round."""
        body = {**message, "type": "sync", "v": 1}
        answer = yield from self.call("POST", ["v1", "semaphores", key], body, "SemaphoreResponse", timeout_ms=timeout_ms)
        if answer["type"] != "synced":
            raise UnexpectedAnswerError(f"/v1/semaphores/{key}", "a grant answer to a sync")
        return cast(wire.SemaphoreResponse, answer)

    def batch(
        self, items: Sequence[Mapping[str, Any]], timeout_ms: Optional[int] = None
    ) -> Plan[List[Union[wire.SemaphoreResponse, RejectedError]]]:
        """Many ``request``s and ``sync``s, for many keys, in one call (``POST /v1/batch``).

        Each item is ``{"key", "message"}``; returns each item's answer or its own
        ``RejectedError``, in order (an item's error never fails its neighbours).
        ``request`` items get a ``requestId`` when they have none, the same on every
        attempt. Unlike ``request`` it does not wait for ``nextRequestAt`` first."""
        sent = []
        for item in items:
            message = {**item["message"], "v": 1}
            if message.get("type") == "request":
                message.setdefault("requestId", str(uuid.uuid4()))
            sent.append({"key": item["key"], "message": message})
        answer = yield from self.call("POST", ["v1", "batch"], {"v": 1, "items": sent}, "BatchResponse", timeout_ms=timeout_ms)
        results = batch_results(sent, answer["items"])
        for item, result in zip(sent, results):
            if not isinstance(result, RejectedError) and result["type"] == "grant":
                self.remember_next_request_at(item["key"], result["nextRequestAt"])
        return results

    def get(self, segments: Sequence[str], shape: Optional[str], query: Optional[Mapping[str, str]] = None) -> Plan[Any]:
        return self.call("GET", segments, None, shape, query=query)


def batch_results(
    sent: Sequence[Mapping[str, Any]], answers: Sequence[Mapping[str, Any]]
) -> List[Union[wire.SemaphoreResponse, RejectedError]]:
    """Each item's outcome, checked against what was sent: one answer per item, and a
    ``request`` answered by a ``grant``, a ``sync`` by ``synced``."""
    if len(answers) != len(sent):
        raise UnexpectedAnswerError("/v1/batch", f"{len(answers)} answers to {len(sent)} items")
    results: List[Union[wire.SemaphoreResponse, RejectedError]] = []
    for index, item in enumerate(answers):
        answer = item.get("answer")
        if answer is not None:
            expected = "grant" if sent[index]["message"]["type"] == "request" else "synced"
            if answer["type"] != expected:
                raise UnexpectedAnswerError("/v1/batch", f"item {index}: a {answer['type']} answer to a {sent[index]['message']['type']}")
            results.append(answer)
            continue
        # An item with neither answer nor error is the server's fault, as Rust's `into_result` has it.
        error = item.get("error") or {"code": "internal", "message": "batch item answered neither an answer nor an error"}
        results.append(RejectedError(item["status"], error["code"], error["message"], error.get("field")))
    return results
