"""The queue's two lanes per key (``queue/state.py``), as the Rust client's
``queue/state/messages.rs`` tests and ``lane_properties.rs`` and the TypeScript
``lanes.test.ts`` check them: scenarios, then seeded random runs against a small
holder, checking after every poll:

- at most one request and one sync in flight per key;
- requests carry demand, and reports only of releases of confirmed claims of a
  key without leases (they ride instead of a sync): claim before admission;
- a report never waits behind a request: a key whose report lane is free (and
  not waiting out a failure) has nothing left to report;
- no request leaves in a poll that hands out admits of its key;
- the state's in-flight count is the driver's;
- never more items admitted than permits handed out, and no item twice;
- reports are cumulative: a grant's or lease's reported marks never go down.

A failing run names its seed (``LANES_SEED=n`` replays one; ``LANES_RUNS`` sets
how many).
"""

from __future__ import annotations

import os
import random
from typing import Any, Dict, List, Optional, Tuple

from permitd.queue import MemoryStore, QueueItem, QueueState, StateConfig, lane_of, report_batches
from permitd.queue.state import Outgoing
from permitd.queue.store import changes, load_queue
from permitd.wire import MAX_BATCH_KEYS

KEY = "acct-1"


def item(item_id: str, key: str = KEY, group: str = "wf") -> QueueItem[str]:
    return QueueItem(item_id, key, group, item_id)


def grant_answer(
    grants: List[Dict[str, Any]], leases: List[Dict[str, Any]], next_request_at: int, results: Optional[List[Dict[str, Any]]] = None
) -> Any:
    return {
        "type": "grant",
        "v": 1,
        "grants": grants,
        "blocked": [],
        "grantResults": results or [],
        "leases": leases,
        "nextRequestAt": next_request_at,
    }


def claim_answer(grant_id: str, claimed: int) -> Any:
    return {"type": "synced", "v": 1, "grantResults": [{"grantId": grant_id, "claimed": claimed, "status": "ok"}]}


def only(messages: List[Outgoing]) -> Dict[str, Any]:
    assert len(messages) == 1, messages
    return messages[0].message


def lanes(messages: List[Outgoing]) -> List[str]:
    return [lane_of(outgoing.message) for outgoing in messages]


def two_of_three_admitted() -> QueueState[str]:
    """a, b, c queued at 0; a grant of 2 (nextRequestAt 2,100) claimed for a and b, confirmed at 1,200."""
    state: QueueState[str] = QueueState("runner-1")
    state.enqueue([item("a"), item("b"), item("c")], 0)
    assert only(state.poll(0))["type"] == "request"
    state.on_answer(KEY, grant_answer([{"grantId": "G", "group": "wf", "permits": 2, "fence": 1}], [], 2_100), 1_000)
    claim = only(state.poll(1_000))
    assert claim["type"] == "sync" and claim["grants"] == [{"grantId": "G", "claimed": 2, "released": 0}]
    assert state.take_admits() == [], "no admission before the claim is confirmed"
    state.on_answer(KEY, claim_answer("G", 2), 1_200)
    assert [admitted.id for admitted in state.take_admits()] == ["a", "b"]
    return state


def test_a_release_is_reported_while_a_request_waits_for_its_round() -> None:
    state = two_of_three_admitted()
    request = only(state.poll(2_100))
    assert request["type"] == "request" and "grants" not in request, "requests carry demand only"
    assert request["demand"] == [{"group": "wf", "count": 1, "oldestAt": 0}]
    assert request["waitMs"] == 1_000
    state.release("a")
    assert only(state.poll(2_101))["grants"] == [{"grantId": "G", "claimed": 2, "released": 1}]
    state.release("b")
    assert state.poll(2_102) == [], "the second release waits for the first's answer"
    assert state.in_flight() == 2
    state.on_answer(KEY, claim_answer("G", 2), 2_103)  # the lanes are answered in either order
    assert only(state.poll(2_103))["grants"] == [{"grantId": "G", "claimed": 2, "released": 2}]
    state.on_answer(KEY, grant_answer([], [], 4_000), 2_104)
    assert state.in_flight() == 1


def test_both_lanes_leave_in_one_poll_and_fail_apart() -> None:
    state: QueueState[str] = QueueState("runner-1")
    state.enqueue([item("a"), item("b")], 0)
    assert only(state.poll(0))["type"] == "request"
    state.on_answer(KEY, grant_answer([{"grantId": "G", "group": "wf", "permits": 1, "fence": 1}], [], 900), 1_000)
    messages = state.poll(2_100)
    assert lanes(messages) == ["report", "demand"]
    assert messages[0].message["grants"] == [{"grantId": "G", "claimed": 1, "released": 0}]
    assert "grants" not in messages[1].message, "a claim never rides in a request"
    state.on_failure(KEY, "report", 2_200)
    assert state.poll(2_300) == []
    assert state.next_wakeup_ms(2_300) == 2_200 + StateConfig().failure_retry_ms
    assert only(state.poll(3_200))["type"] == "sync"
    state.on_failure(KEY, "demand", 3_300)
    assert state.poll(3_301) == []
    assert only(state.poll(4_300))["type"] == "request"


def test_releases_ride_in_the_request_of_the_same_poll() -> None:
    state = two_of_three_admitted()
    state.release("a")
    request = only(state.poll(2_100))
    assert request["type"] == "request" and request["grants"] == [{"grantId": "G", "claimed": 2, "released": 1}]
    assert state.in_flight() == 1, "the report lane stays free"
    assert state.poll(2_101) == []
    state.release("b")
    assert only(state.poll(2_102))["grants"] == [{"grantId": "G", "claimed": 2, "released": 2}]
    state.on_answer(KEY, grant_answer([], [], 4_000, [{"grantId": "G", "claimed": 2, "status": "ok"}]), 2_103)
    record = state.key_record(KEY)
    assert record is not None and record["grants"]["G"]["ackedReleased"] == 1


def test_the_releases_of_a_failed_request_go_out_on_the_report_lane() -> None:
    state = two_of_three_admitted()
    state.release("a")
    assert only(state.poll(2_100))["type"] == "request"
    state.on_failure(KEY, "demand", 2_200)
    sync = only(state.poll(2_200))
    assert sync["type"] == "sync" and sync["grants"] == [{"grantId": "G", "claimed": 2, "released": 1}]


def test_no_request_while_a_lease_awaits_confirmation_and_heartbeats_come_at_half_ttl() -> None:
    state: QueueState[str] = QueueState("runner-1")
    state.enqueue([item("a"), item("b"), item("c")], 0)
    only(state.poll(0))
    lease: Any = {"leaseId": "L", "group": "wf", "permits": 2, "expiresAt": 60_100}
    state.on_answer(KEY, grant_answer([], [lease], 100), 100)
    assert lanes(state.poll(5_000)) == ["report"], "nextRequestAt passed, but the lease may serve the items"
    assert state.poll(5_001) == []
    state.on_answer(KEY, {"type": "synced", "v": 1, "grantResults": [], "leases": [lease]}, 5_002)
    assert [admitted.id for admitted in state.take_admits()] == ["a", "b"]
    messages = state.poll(5_003)
    assert lanes(messages) == ["report", "demand"], "the draws, and c's demand"
    assert messages[0].message["leases"] == [{"leaseId": "L", "drawn": 2, "released": 0, "retired": False}]
    state.on_answer(KEY, {"type": "synced", "v": 1, "grantResults": [], "leases": [lease]}, 5_004)
    assert state.next_wakeup_ms(5_005) is not None
    assert state.poll(30_000) == [], "no heartbeat before half the TTL"
    heartbeat = state.poll(30_100)
    assert lanes(heartbeat) == ["report"] and heartbeat[0].message["leases"][0]["drawn"] == 2


def test_a_lease_is_claimed_drawn_retired_and_settled() -> None:
    state: QueueState[str] = QueueState("runner-1")
    state.enqueue([item("a"), item("b")], 0)
    only(state.poll(0))
    lease: Any = {"leaseId": "L", "group": "wf", "permits": 3, "expiresAt": 60_000}
    state.on_answer(KEY, grant_answer([], [lease], 100), 100)
    claim = only(state.poll(100))
    assert claim["leases"] == [{"leaseId": "L", "drawn": 0, "released": 0, "retired": False}], "claimed before drawn"
    assert state.take_admits() == []
    state.on_answer(KEY, {"type": "synced", "v": 1, "grantResults": [], "leases": [lease]}, 200)
    assert sorted(admitted.id for admitted in state.take_admits()) == ["a", "b"]
    drawn = only(state.poll(200))
    state.on_answer(KEY, {"type": "synced", "v": 1, "grantResults": [], "leases": [lease]}, 210)
    assert drawn["leases"][0]["drawn"] == 2
    state.release("a")
    state.release("b")
    state.retire_all_leases()  # what shutdown does
    retired = only(state.poll_reports(300))
    assert retired["leases"] == [{"leaseId": "L", "drawn": 2, "released": 2, "retired": True}]
    settled: Any = {**lease, "permits": 2, "expiresAt": 300}
    state.on_answer(KEY, {"type": "synced", "v": 1, "grantResults": [], "leases": [settled]}, 310)
    assert state.key_record(KEY) is None, "a settled lease is forgotten, and with it the key"
    assert state.in_flight() == 0


def test_a_lease_the_holder_retires_stops_serving_and_an_unknown_one_is_dropped() -> None:
    state: QueueState[str] = QueueState("runner-1")
    state.enqueue([item("a")], 0)
    only(state.poll(0))
    lease: Any = {"leaseId": "L", "group": "wf", "permits": 2, "expiresAt": 60_000}
    state.on_answer(KEY, grant_answer([], [lease], 100), 100)
    only(state.poll(100))
    state.on_answer(KEY, {"type": "synced", "v": 1, "grantResults": [], "leases": [lease]}, 200)
    assert [admitted.id for admitted in state.take_admits()] == ["a"]
    only(state.poll(200))
    unknown: Any = {"leaseId": "L", "group": "", "permits": 0, "expiresAt": 250}  # the holder lost it
    state.on_answer(KEY, {"type": "synced", "v": 1, "grantResults": [], "leases": [unknown]}, 250)
    record = state.key_record(KEY)
    assert record is not None and record["leases"]["L"]["retired"]
    state.enqueue([item("b")], 300)
    messages = state.poll(300)
    assert state.take_admits() == [], "a retired lease serves no new item"
    assert "demand" in lanes(messages), "b is asked for instead"


def test_a_restored_state_reports_every_holding_and_admits_admitted_items_again() -> None:
    state = two_of_three_admitted()
    store = MemoryStore()
    load_queue(store, "runner-1")
    changed = changes(state, state.take_dirty())
    assert changed is not None
    store.write(*changed)
    loaded = load_queue(store, "runner-1")
    restored: QueueState[str] = QueueState.restore("runner-1", StateConfig(), loaded.items, loaded.keys, loaded.released)
    assert sorted(admitted.id for admitted in restored.take_admits()) == ["a", "b"]
    assert restored.status("c") == "queued"
    sync = next(outgoing.message for outgoing in restored.poll(1_300) if outgoing.message["type"] == "sync")
    assert sync["grants"] == [{"grantId": "G", "claimed": 2, "released": 0}], "forced: every grant reported once"


def test_a_polls_reports_are_split_into_batch_calls_within_the_envelopes_limits() -> None:
    def sync(key: str, reports: int = 0) -> Outgoing:
        grants = [{"grantId": f"g-{index}", "claimed": 1, "released": 1} for index in range(reports)]
        return Outgoing(key, {"type": "sync", "v": 1, "clientId": "c", "grants": grants})

    many = [sync(f"k-{index}") for index in range(300)]
    assert [len(batch) for batch in report_batches(many)] == [MAX_BATCH_KEYS, MAX_BATCH_KEYS, 300 - 2 * MAX_BATCH_KEYS]
    assert report_batches([]) == []
    big = [sync("a"), sync("b", 100), sync("c")]
    import json

    size = len(json.dumps({"key": "b", "message": big[1].message}))
    assert [[report.key for report in batch] for batch in report_batches(big, size)] == [["a"], ["b"], ["c"]]


# ---- random runs -----------------------------------------------------------------

KEYS = ["acct-1", "acct-2"]
GROUPS = ["wf-a", "wf-b"]
LEASE_TTL_MS = 60_000


def confirmed(reports: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The holder's answer to grant reports: every claim confirmed as sent."""
    return [{"grantId": report["grantId"], "claimed": report["claimed"], "status": "ok"} for report in reports]


class Driver:
    """The test's side: what is in flight per key and lane, and a small holder that grants, lends and echoes."""

    def __init__(self, state: QueueState[int], draw: random.Random) -> None:
        self.state = state
        self.draw = draw
        self.now_ms = 0
        self.next_item = 0
        self.next_grant = 0
        self.demand: Dict[str, Tuple[List[str], List[Dict[str, Any]]]] = {}
        self.reports: Dict[str, Dict[str, Any]] = {}
        self.report_retry_at_ms: Dict[str, int] = {}
        self.lent: Dict[str, Dict[str, Any]] = {}
        self.admitted: List[str] = []
        self.ever_admitted: set[str] = set()
        self.permits_handed_out = 0
        self.admits_seen = 0
        self.marks: Dict[str, Tuple[int, int]] = {}

    def step(self) -> None:
        roll = self.draw.random() * 15
        key = self.draw.choice(KEYS)
        if roll < 1:
            items = []
            for _ in range(1 + self.draw.randrange(4)):
                self.next_item += 1
                items.append(QueueItem(f"item-{self.next_item}", key, self.draw.choice(GROUPS), 0))
            self.state.enqueue(items, self.now_ms)
        elif roll < 4:
            if self.admitted:
                self.state.release(self.admitted.pop(self.draw.randrange(len(self.admitted))))
        elif roll < 8:
            self.now_ms += self.draw.randrange(30)
            self.poll()
        elif roll < 11:
            self.answer_demand(key, self.draw.random() < 0.5, self.draw.randrange(4), self.draw.randrange(20))
        elif roll < 14:
            self.answer_report(key, self.draw.random() < 0.5)
        elif self.draw.random() < 0.5:
            if self.demand.pop(key, None) is not None:
                self.state.on_failure(key, "demand", self.now_ms)
        elif self.reports.pop(key, None) is not None:
            self.state.on_failure(key, "report", self.now_ms)
            self.report_retry_at_ms[key] = self.now_ms + StateConfig().failure_retry_ms

    def answer_demand(self, key: str, as_lease: bool, permits: int, period_ms: int) -> None:
        sent = self.demand.pop(key, None)
        if sent is None:
            return
        groups, reports = sent
        grants: List[Dict[str, Any]] = []
        leases: List[Dict[str, Any]] = []
        if groups and permits > 0:
            self.permits_handed_out += permits
            self.next_grant += 1
            if as_lease:
                lease: Dict[str, Any] = {
                    "leaseId": f"lease-{self.next_grant}",
                    "group": groups[0],
                    "permits": permits,
                    "expiresAt": self.now_ms + LEASE_TTL_MS,
                }
                self.lent[lease["leaseId"]] = lease
                leases.append(lease)
            else:
                grants.append({"grantId": f"grant-{self.next_grant}", "group": groups[0], "permits": permits, "fence": self.next_grant})
        self.state.on_answer(key, grant_answer(grants, leases, self.now_ms + period_ms, confirmed(reports)), self.now_ms)

    def answer_report(self, key: str, contended: bool) -> None:
        """Every claim confirmed, every lease echoed (a retired lease keeps only its drawn permits)."""
        sync = self.reports.pop(key, None)
        if sync is None:
            return
        leases = [
            {
                **self.lent[report["leaseId"]],
                "permits": report["drawn"] if report.get("retired") else self.lent[report["leaseId"]]["permits"],
            }
            for report in sync["leases"]
        ]
        answer: Any = {"type": "synced", "v": 1, "grantResults": confirmed(sync["grants"]), "leases": leases, "contended": contended}
        self.state.on_answer(
            key,
            answer,
            self.now_ms,
        )

    def check_cumulative(self, message: Dict[str, Any]) -> None:
        for report in message.get("grants", []):
            before = self.marks.get(report["grantId"], (0, 0))
            # The small holder confirms every claim as sent, so no mark may go down.
            assert report["claimed"] >= before[0] and report["released"] >= before[1], "a grant's marks went down"
            assert report["released"] <= report["claimed"]
            self.marks[report["grantId"]] = (report["claimed"], report["released"])
        for report in message.get("leases", []):
            before = self.marks.get(report["leaseId"], (0, 0))
            assert report["drawn"] >= before[0] and report["released"] >= before[1], "a lease's marks went down"
            assert report["released"] <= report["drawn"] <= self.lent[report["leaseId"]]["permits"]
            self.marks[report["leaseId"]] = (report["drawn"], report["released"])

    def poll(self) -> None:
        messages = self.state.poll(self.now_ms)
        admits = self.state.take_admits()
        for outgoing in messages:
            key, message = outgoing.key, outgoing.message
            self.check_cumulative(message)
            if message["type"] == "request":
                assert key not in self.demand, "two requests in flight"
                record = self.state.key_record(key)
                for report in message.get("grants", []):
                    assert record is not None and record["grants"][report["grantId"]]["claimConfirmed"], "a request carries a claim"
                assert not message.get("grants") or not (record or {}).get("leases"), "a request carries reports of a key with leases"
                assert not any(admitted.key == key for admitted in admits), "a request left in a poll that admitted items of its key"
                self.demand[key] = ([demand["group"] for demand in message["demand"]], message.get("grants", []))
            else:
                assert key not in self.reports, "two syncs in flight"
                self.reports[key] = message
        for admitted in admits:
            assert admitted.id not in self.ever_admitted, f"{admitted.id} admitted twice"
            self.ever_admitted.add(admitted.id)
        self.admits_seen += len(admits)
        self.admitted.extend(admitted.id for admitted in admits)
        assert self.admits_seen <= self.permits_handed_out, f"{self.admits_seen} admitted under {self.permits_handed_out} permits"
        assert self.state.in_flight() == len(self.demand) + len(self.reports)
        for key in KEYS:
            report_free = key not in self.reports and self.now_ms >= self.report_retry_at_ms.get(key, 0)
            assert not report_free or not self.state.reports_due(key, self.now_ms), f"a report of {key} waits with its lane free"


def test_random_runs_keep_the_lanes_rules() -> None:
    runs = int(os.environ.get("LANES_RUNS", "300"))
    seeds = [int(os.environ["LANES_SEED"])] if "LANES_SEED" in os.environ else range(1, runs + 1)
    for seed in seeds:
        draw = random.Random(seed)
        driver = Driver(QueueState("runner-1", StateConfig()), draw)
        try:
            for _ in range(1 + draw.randrange(120)):
                driver.step()
        except AssertionError as error:
            raise AssertionError(f"seed {seed}: {error}") from error
