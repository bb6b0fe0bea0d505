"""The queue's accounting: a synchronous, deterministic state machine, the same rules
as the Rust client's ``queue/state/`` and the TypeScript ``queue/state.ts`` (read
the Rust module docs for the why).

No IO, no clock, no randomness: time comes in as ``now_ms``, the holder's answers
as wire values; out come the next message per key (``poll``) and the items to
admit (``take_admits``). ``queue.py`` only carries values between this, the
network, the application and the store.

One item's life: ``queued`` -> (a permit of a confirmed lease is drawn:
``admitted``) or (a grant arrives: ``claiming`` -> the claim is confirmed:
``admitted``; came back ``expired``/``not_found``: ``queued`` again) ->
``release(id)``.

Each key has two independent lanes to the holder, each with at most one message
in flight:

- the **demand** lane carries ``request``s: demand only, sent when items are
  queued, ``nextRequestAt`` has come, no lease of the key awaits confirmation
  (its permits may serve the queued items; asking again could bring a second
  lease for them), and the same poll neither drew lease permits of the key nor
  hands out admits of it (the demand just changed). A request may be held by the
  leader up to ``request_wait_ms`` when its round leaves it empty-handed;
- the **report** lane carries ``sync``s: grant claims, lease claims, releases and
  heartbeats, sent as soon as they exist, never behind a request waiting for its
  round.

When a poll sends both and the reports only return permits (releases of
confirmed grant claims; no claim, no lease), the releases ride in the request
instead: the holder applies a request's grant reports with its next entry, as a
sync's. Claims always go in syncs: an item is admitted only once its claim is
confirmed (claim before admission), and a request is answered only after its
round. Reports are cumulative, so the lanes may be answered in any order; what a
sync reported is kept so its answer is matched against what the holder saw. A
failed message frees its lane after ``failure_retry_ms``.

Invariants:

- an item is admitted only under a confirmed grant claim or a permit drawn from
  a confirmed lease; each permit admits at most one item;
- ``released <= claimed`` per grant, ``released <= drawn <= permits`` per lease;
- reports are cumulative high-water marks: resending one is harmless;
- a grant is forgotten once all its claimed permits are released and the holder
  acknowledged that; a lease once the holder settled it;
- released ids are remembered (up to ``MAX_RELEASED_REMEMBERED``).

Records are plain JSON-able dicts, so the store writes them as they are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Generic, List, Optional, Set, Tuple, TypeVar

from .. import wire
from ..errors import InvalidItemError
from ..plan import believed_next_request_at

#: Longest item id, key and group, in bytes of UTF-8 (as the server counts keys and groups).
MAX_ITEM_ID_BYTES = 256
MAX_KEY_BYTES = 256
MAX_GROUP_BYTES = 256
#: Released ids remembered for ``status`` and no-op re-enqueues.
MAX_RELEASED_REMEMBERED = 100_000
#: Caps of one message, as the server's limits (``core/src/limits.rs``).
MAX_DEMAND_ENTRIES = 1_024
MAX_GRANT_REPORTS = 4_096
MAX_LEASE_REPORTS = 1_024
#: Default wait after a failed message before the key's next one, in ms.
DEFAULT_FAILURE_RETRY_MS = 1_000
#: Default time a lease may sit with nothing queued in its group before its undrawn permits go back, in ms.
DEFAULT_IDLE_LEASE_RETURN_MS = 30_000
#: Default ``waitMs`` of a request (the Rust queue's ``StateConfig::request_wait_ms``):
#: short enough that the counts and ``oldestAt`` a held request carries are never long out of date.
DEFAULT_REQUEST_WAIT_MS = 1_000

B = TypeVar("B")


@dataclass
class StateConfig:
    failure_retry_ms: int = DEFAULT_FAILURE_RETRY_MS
    #: ``None`` keeps idle leases until ``contended`` or expiry.
    idle_lease_return_ms: Optional[int] = DEFAULT_IDLE_LEASE_RETURN_MS
    #: ``waitMs`` of each request; 0 sends none (the first round answers).
    request_wait_ms: int = DEFAULT_REQUEST_WAIT_MS


@dataclass
class QueueItem(Generic[B]):
    """An item of work: it runs under one permit of ``key`` for ``group``."""

    id: str
    key: str
    group: str
    body: B


@dataclass
class AdmittedItem(Generic[B]):
    """An item whose permit is confirmed; ``permit`` is ``{"kind": "grant", "grantId", "fence"}``
    or ``{"kind": "lease", "leaseId"}``."""

    id: str
    key: str
    group: str
    body: B
    permit: Dict[str, Any]


@dataclass
class QueueCounts:
    queued: int = 0
    claiming: int = 0
    admitted: int = 0
    released: int = 0
    grants: int = 0
    leases: int = 0
    drawable: int = 0


@dataclass
class Dirty:
    """Records changed since the store last saw them."""

    items: Set[str] = field(default_factory=set)
    keys: Set[str] = field(default_factory=set)
    released_added: List[Tuple[int, str]] = field(default_factory=list)
    released_removed: List[Tuple[int, str]] = field(default_factory=list)


@dataclass
class InFlight:
    """What a message reported, to match its answer against."""

    grants: Dict[str, wire.GrantReport] = field(default_factory=dict)
    leases: Dict[str, wire.LeaseReport] = field(default_factory=dict)


@dataclass
class KeyRuntime:
    demand_in_flight: bool = False
    #: The releases riding in that request, to match its answer against.
    riding: Optional[InFlight] = None
    #: A sync in flight, with what it reported.
    report_in_flight: Optional[InFlight] = None
    demand_retry_at_ms: int = 0
    report_retry_at_ms: int = 0
    #: Report every holding once (after a restart, or at shutdown).
    force_report: bool = False

    def in_flight(self) -> int:
        return int(self.demand_in_flight) + int(self.report_in_flight is not None)


@dataclass
class Outgoing:
    """A message to send for a key."""

    key: str
    message: Dict[str, Any]


def lane_of(message: Dict[str, Any]) -> str:
    """``demand`` for a ``request``, ``report`` for a ``sync``."""
    return "demand" if message["type"] == "request" else "report"


# Record shapes (JSON-able dicts, as stored):
# item: {id, key, group, body, enqueuedAtMs, order, phase: {phase: queued|claiming|admitted, grantId?, releaseRequested?, permit?}}
# key:  {grants: {id: grant}, leases: {id: lease}, nextRequestAtMs}
# grant: {group, permits, fence, claimed, claimConfirmed, claiming: [ids], released, ackedReleased}
# lease: {group, permits, expiresAtMs, ttlMs, drawn, released, retired, confirmed, acked, idleSinceMs}
Record = Dict[str, Any]


def _empty(record: Record) -> bool:
    return not record["grants"] and not record["leases"]


def _grant_awaits_confirmation(grant: Record) -> bool:
    return not grant["claimConfirmed"] and grant["claimed"] > 0


def _grant_needs_report(grant: Record, riding: int = 0) -> bool:
    """An unconfirmed claim, or releases beyond those acknowledged and those riding in the request in flight."""
    return _grant_awaits_confirmation(grant) or grant["released"] > max(grant["ackedReleased"], riding)


def _grants_need_report(record: Record, runtime: Optional[KeyRuntime]) -> bool:
    riding = runtime.riding if runtime is not None else None
    return any(
        _grant_needs_report(grant, riding.grants[grant_id]["released"] if riding and grant_id in riding.grants else 0)
        for grant_id, grant in record["grants"].items()
    )


def _lease_awaits_confirmation(lease: Record) -> bool:
    return not lease["confirmed"] and not lease["retired"]


def _lease_drawable(lease: Record, now_ms: int) -> bool:
    return bool(lease["confirmed"] and not lease["retired"] and lease["drawn"] < lease["permits"] and now_ms < lease["expiresAtMs"])


def _lease_heartbeat_due_ms(lease: Record) -> Optional[int]:
    if not lease["retired"] and lease["drawn"] > lease["released"]:
        return max(0, int(lease["expiresAtMs"]) - int(lease["ttlMs"]) // 2)
    return None


def _lease_report(lease_id: str, lease: Record) -> wire.LeaseReport:
    return {"leaseId": lease_id, "drawn": lease["drawn"], "released": lease["released"], "retired": lease["retired"]}


def _lease_needs_report(lease: Record) -> bool:
    acked = lease["acked"]
    if _lease_awaits_confirmation(lease) or acked is None:
        return True
    return bool(
        acked["drawn"] != lease["drawn"] or acked["released"] != lease["released"] or acked.get("retired", False) != lease["retired"]
    )


def _live_echo(echo: wire.LeaseGrant, now_ms: int) -> bool:
    return echo["permits"] > 0 and echo["group"] != "" and echo["expiresAt"] > now_ms


def _utf8(text: str) -> int:
    return len(text.encode())


def _validate(item: QueueItem[Any]) -> None:
    if not isinstance(item.id, str) or item.id == "" or _utf8(item.id) > MAX_ITEM_ID_BYTES:
        raise InvalidItemError(str(item.id), "id must be 1 to 256 bytes")
    if not isinstance(item.key, str) or item.key == "" or _utf8(item.key) > MAX_KEY_BYTES:
        raise InvalidItemError(item.id, "key must be 1 to 256 bytes")
    if not isinstance(item.group, str) or _utf8(item.group) > MAX_GROUP_BYTES:
        raise InvalidItemError(item.id, "group must be at most 256 bytes")


class QueueState(Generic[B]):
    """See the module docs."""

    def __init__(self, client_id: str, config: Optional[StateConfig] = None) -> None:
        self.client_id = client_id
        self.config = config or StateConfig()
        self._items: Dict[str, Record] = {}
        #: key -> group -> queued entries (at_ms, order, id), oldest first.
        self._queued: Dict[str, Dict[str, List[Tuple[int, int, str]]]] = {}
        self._keys: Dict[str, Record] = {}
        self._runtime: Dict[str, KeyRuntime] = {}
        #: id -> seq, in seq order (dicts keep insertion order).
        self._released: Dict[str, int] = {}
        self._next_order = 0
        self._next_released_seq = 0
        self._admits: List[AdmittedItem[B]] = []
        self._dirty = Dirty()

    @classmethod
    def restore(
        cls, client_id: str, config: StateConfig, items: List[Record], keys: List[Tuple[str, Record]], released: List[Tuple[int, str]]
    ) -> QueueState[B]:
        """A queue rebuilt from stored records: admitted items are admitted again, every holding reported once."""
        state: QueueState[B] = cls(client_id, config)
        for seq, item_id in sorted(released):
            state._next_released_seq = max(state._next_released_seq, seq + 1)
            state._released[item_id] = seq
        for key, record in keys:
            for lease in record["leases"].values():
                lease["confirmed"] = lease["confirmed"] or lease["drawn"] > 0
            if not _empty(record):
                state._runtime_of(key).force_report = True
            state._keys[key] = record
        for item in sorted(items, key=lambda item: int(item["order"])):
            state._next_order = max(state._next_order, item["order"] + 1)
            phase = item["phase"]
            if phase["phase"] == "queued":
                state._index_queued(item)
            if phase["phase"] == "admitted":
                state._admits.append(_admitted(item, phase["permit"]))
            state._items[item["id"]] = item
        return state

    # ---- items ----

    def enqueue(self, items: List[QueueItem[B]], now_ms: int) -> Tuple[int, int]:
        """Adds items; known ids are skipped. All or nothing: one invalid item rejects the batch.
        Returns (added, known)."""
        for item in items:
            _validate(item)
        added = known = 0
        for item in items:
            if item.id in self._items or item.id in self._released:
                known += 1
                continue
            record = {
                "id": item.id,
                "key": item.key,
                "group": item.group,
                "body": item.body,
                "enqueuedAtMs": now_ms,
                "order": self._next_order,
                "phase": {"phase": "queued"},
            }
            self._next_order += 1
            self._index_queued(record)
            self._items[item.id] = record
            self._dirty.items.add(item.id)
            added += 1
        return added, known

    def release(self, item_id: str) -> str:
        """The item's work reached a terminal state (or, if still queued, it is dropped).
        Returns ``released``, ``cancelled``, ``already_released`` or ``unknown``."""
        item = self._items.get(item_id)
        if item is None:
            return "already_released" if item_id in self._released else "unknown"
        phase = item["phase"]
        if phase["phase"] == "queued":
            self._unindex_queued(item)
            self._forget_item(item_id)
            return "cancelled"
        if phase["phase"] == "claiming":
            phase["releaseRequested"] = True
            self._dirty.items.add(item_id)
            return "released"
        self._return_permit(item["key"], phase["permit"])
        self._forget_item(item_id)
        return "released"

    def status(self, item_id: str) -> str:
        """``queued``, ``admitted``, ``released`` or ``unknown``."""
        item = self._items.get(item_id)
        if item is None:
            return "released" if item_id in self._released else "unknown"
        return "admitted" if item["phase"]["phase"] == "admitted" else "queued"

    def counts(self, now_ms: int) -> QueueCounts:
        counts = QueueCounts(released=len(self._released))
        for item in self._items.values():
            phase = item["phase"]["phase"]
            if phase == "admitted":
                counts.admitted += 1
            else:
                counts.queued += 1
            if phase == "claiming":
                counts.claiming += 1
        for record in self._keys.values():
            counts.grants += len(record["grants"])
            for lease in record["leases"].values():
                counts.leases += 1
                if _lease_drawable(lease, now_ms):
                    counts.drawable += lease["permits"] - lease["drawn"]
        return counts

    def admitted_ids(self, limit: int) -> List[str]:
        """Ids of admitted items, oldest first, at most ``limit``: what to ask ``finished`` about."""
        admitted = sorted(
            (item for item in self._items.values() if item["phase"]["phase"] == "admitted"), key=lambda item: int(item["order"])
        )
        return [item["id"] for item in admitted[:limit]]

    def take_admits(self) -> List[AdmittedItem[B]]:
        admits, self._admits = self._admits, []
        return admits

    def take_dirty(self) -> Dirty:
        dirty, self._dirty = self._dirty, Dirty()
        return dirty

    def item(self, item_id: str) -> Optional[Record]:
        return self._items.get(item_id)

    def key_record(self, key: str) -> Optional[Record]:
        return self._keys.get(key)

    def _has_queued(self, key: str) -> bool:
        return bool(self._queued.get(key))

    def _index_queued(self, item: Record) -> None:
        entries = self._queued.setdefault(item["key"], {}).setdefault(item["group"], [])
        entry = (item["enqueuedAtMs"], item["order"], item["id"])
        at = len(entries)
        while at > 0 and entries[at - 1][:2] > entry[:2]:
            at -= 1
        entries.insert(at, entry)

    def _unindex_queued(self, item: Record) -> None:
        entries = self._queued.get(item["key"], {}).get(item["group"])
        if entries is not None:
            entries[:] = [entry for entry in entries if entry[2] != item["id"]]
        self._prune_queued(item["key"], item["group"])

    def _prune_queued(self, key: str, group: str) -> None:
        groups = self._queued.get(key)
        if groups is None:
            return
        if group in groups and not groups[group]:
            del groups[group]
        if not groups:
            del self._queued[key]

    def _return_permit(self, key: str, permit: Dict[str, Any]) -> None:
        record = self._keys.get(key)
        if record is None:
            return
        if permit["kind"] == "grant":
            grant = record["grants"].get(permit["grantId"])
            if grant is not None:
                grant["released"] = min(grant["released"] + 1, grant["claimed"])
        else:
            lease = record["leases"].get(permit["leaseId"])
            if lease is not None:
                lease["released"] = min(lease["released"] + 1, lease["drawn"])
        self._dirty.keys.add(key)

    def _forget_item(self, item_id: str) -> None:
        del self._items[item_id]
        self._dirty.items.add(item_id)
        seq = self._next_released_seq
        self._next_released_seq += 1
        self._released[item_id] = seq
        self._dirty.released_added.append((seq, item_id))
        while len(self._released) > MAX_RELEASED_REMEMBERED:
            forgotten = next(iter(self._released))
            oldest = self._released.pop(forgotten)
            self._dirty.released_removed.append((oldest, forgotten))

    # ---- grants ----

    def _accept_grant(self, key: str, granted: wire.GrantedPermits) -> None:
        """A new grant: the oldest queued items of its group claim its permits."""
        entries = self._queued.get(key, {}).get(granted["group"], [])
        claiming = [entry[2] for entry in entries[: granted["permits"]]]
        del entries[: granted["permits"]]
        self._prune_queued(key, granted["group"])
        if not claiming:
            return  # the holder reclaims it at the deadline
        for item_id in claiming:
            self._items[item_id]["phase"] = {"phase": "claiming", "grantId": granted["grantId"], "releaseRequested": False}
            self._dirty.items.add(item_id)
        self._record_of(key)["grants"][granted["grantId"]] = {
            "group": granted["group"],
            "permits": granted["permits"],
            "fence": granted["fence"],
            "claimed": len(claiming),
            "claimConfirmed": False,
            "claiming": claiming,
            "released": 0,
            "ackedReleased": 0,
        }

    def _apply_grant_results(self, key: str, sent: InFlight, results: List[wire.GrantResult]) -> None:
        for result in results:
            report = sent.grants.get(result["grantId"])
            record = self._keys.get(key)
            grant = None if record is None else record["grants"].get(result["grantId"])
            if report is None or record is None or grant is None:
                continue
            if result["status"] == "not_found":
                del record["grants"][result["grantId"]]
                if not grant["claimConfirmed"]:
                    self._settle_claims(key, result["grantId"], grant, grant["claiming"], 0)
                continue
            if not grant["claimConfirmed"] and report["claimed"] == grant["claimed"]:
                confirmed = min(result["claimed"], grant["claimed"])
                claiming = grant["claiming"]
                grant["claimed"] = confirmed
                grant["claimConfirmed"] = True
                grant["claiming"] = []
                self._settle_claims(key, result["grantId"], grant, claiming, confirmed)
            grant["ackedReleased"] = max(grant["ackedReleased"], min(report["released"], grant["claimed"]))
            if grant["claimConfirmed"] and grant["released"] >= grant["claimed"] and grant["ackedReleased"] >= grant["claimed"]:
                del record["grants"][result["grantId"]]

    def _settle_claims(self, key: str, grant_id: str, grant: Record, claiming: List[str], confirmed: int) -> None:
        """Admits the first ``confirmed`` claiming items, requeues the rest; items released meanwhile are released."""
        permit = {"kind": "grant", "grantId": grant_id, "fence": grant["fence"]}
        for index, item_id in enumerate(claiming):
            item = self._items.get(item_id)
            if item is None or item["phase"]["phase"] != "claiming":
                continue
            release_requested = item["phase"]["releaseRequested"]
            self._dirty.items.add(item_id)
            if index < confirmed:
                item["phase"] = {"phase": "admitted", "permit": permit}
                if release_requested:
                    self._return_permit(key, permit)
                    self._forget_item(item_id)
                else:
                    self._admits.append(_admitted(item, permit))
            elif release_requested:
                self._forget_item(item_id)
            else:
                item["phase"] = {"phase": "queued"}
                self._index_queued(item)

    # ---- leases ----

    def retire_all_leases(self) -> None:
        """For shutdown: stop drawing from every lease and report every holding once more."""
        for key, record in self._keys.items():
            changed = False
            for lease in record["leases"].values():
                changed = changed or not lease["retired"]
                lease["retired"] = True
            if changed:
                self._dirty.keys.add(key)
            runtime = self._runtime_of(key)
            runtime.force_report = not _empty(record)
            runtime.report_retry_at_ms = 0

    def _apply_lease_echoes(self, key: str, sent: InFlight, echoes: List[wire.LeaseGrant], now_ms: int) -> None:
        record = self._record_of(key)
        for echo in echoes:
            lease = record["leases"].get(echo["leaseId"])
            report = sent.leases.get(echo["leaseId"])
            if lease is None:
                if _live_echo(echo, now_ms) and report is None:
                    record["leases"][echo["leaseId"]] = {
                        "group": echo["group"],
                        "permits": echo["permits"],
                        "expiresAtMs": echo["expiresAt"],
                        "ttlMs": echo["expiresAt"] - now_ms,
                        "drawn": 0,
                        "released": 0,
                        "retired": False,
                        "confirmed": False,
                        "acked": None,
                        "idleSinceMs": None,
                    }
                continue
            settled = (
                report is not None
                and echo["permits"] <= report["released"]
                and report["released"] >= report["drawn"]
                and lease["drawn"] == report["drawn"]
            )
            if settled:
                del record["leases"][echo["leaseId"]]
                continue
            if report is not None:
                lease["acked"] = dict(report)
                # Only an echo of this client's own report confirms the lease.
                if _live_echo(echo, now_ms):
                    lease["confirmed"] = True
            if echo["group"] == "" or echo["expiresAt"] <= now_ms or echo["expiresAt"] < lease["expiresAtMs"]:
                lease["retired"] = True
            else:
                lease["expiresAtMs"] = echo["expiresAt"]

    def _return_idle_leases(self, key: str) -> None:
        """``contended``: stop drawing from leases whose group has nothing queued."""
        groups = self._queued.get(key, {})
        for lease in self._keys.get(key, {"leases": {}})["leases"].values():
            if lease["group"] not in groups:
                lease["retired"] = True

    def _retire_stale_leases(self, key: str, now_ms: int) -> None:
        groups = self._queued.get(key, {})
        idle_ms = self.config.idle_lease_return_ms
        for lease in self._keys.get(key, {"leases": {}})["leases"].values():
            if lease["retired"]:
                continue
            if lease["group"] in groups:
                lease["idleSinceMs"] = None
            elif lease["idleSinceMs"] is None:
                lease["idleSinceMs"] = now_ms
            idle_expired = lease["idleSinceMs"] is not None and idle_ms is not None and now_ms >= lease["idleSinceMs"] + idle_ms
            if now_ms >= lease["expiresAtMs"] or idle_expired:
                lease["retired"] = True
                self._dirty.keys.add(key)

    def _draw(self, key: str, now_ms: int) -> bool:
        """Admits queued items under drawable lease permits, oldest first per group; whether it drew any."""
        record = self._keys.get(key)
        groups = self._queued.get(key)
        if record is None or groups is None:
            return False
        drew = False
        for lease_id, lease in sorted(record["leases"].items()):
            entries = groups.get(lease["group"])
            while entries and _lease_drawable(lease, now_ms):
                item_id = entries.pop(0)[2]
                lease["drawn"] += 1
                drew = True
                permit = {"kind": "lease", "leaseId": lease_id}
                item = self._items[item_id]
                item["phase"] = {"phase": "admitted", "permit": permit}
                self._dirty.items.add(item_id)
                self._admits.append(_admitted(item, permit))
        if drew:
            for group in [group for group, entries in groups.items() if not entries]:
                del groups[group]
            if not groups:
                del self._queued[key]
            self._dirty.keys.add(key)
        return drew

    # ---- messages ----

    def in_flight(self) -> int:
        """Messages in flight, over every key and lane."""
        return sum(runtime.in_flight() for runtime in self._runtime.values())

    def poll(self, now_ms: int) -> List[Outgoing]:
        """Advances time: draws, retires stale leases, and returns the messages now due,
        at most one per key and lane (each takes its lane until ``on_answer`` or ``on_failure``)."""
        # Keys with admits not yet taken: the demand a request would carry just changed.
        admitted = {item.key for item in self._admits}
        outgoing: List[Outgoing] = []
        for key in self._active_keys():
            drew = self._draw(key, now_ms) or key in admitted
            self._retire_stale_leases(key, now_ms)
            report = self._report_lane_free(key, now_ms) and self.reports_due(key, now_ms)
            demand = not drew and self._demand_due(key, now_ms)
            ride = report and demand and self._only_releases(key)
            if report and not ride:
                outgoing.append(Outgoing(key, self._take_sync(key)))
            if demand:
                outgoing.append(Outgoing(key, self._take_request(key, ride)))
        return outgoing

    def _only_releases(self, key: str) -> bool:
        """Whether everything the key has to report returns permits: releases of confirmed claims, nothing forced, no lease."""
        record = self._keys.get(key)
        runtime = self._runtime.get(key)
        if record is None or (runtime is not None and runtime.force_report):
            return False
        return not record["leases"] and not any(_grant_awaits_confirmation(grant) for grant in record["grants"].values())

    def poll_reports(self, now_ms: int) -> List[Outgoing]:
        """Reports only (never demand) for every key with something to report: what shutdown sends."""
        return [
            Outgoing(key, self._take_sync(key))
            for key in sorted(self._keys)
            if self._report_lane_free(key, now_ms) and self.reports_due(key, now_ms)
        ]

    def next_wakeup_ms(self, now_ms: int) -> Optional[int]:
        """When ``poll`` may next have something to do, absent new items, releases or answers."""
        times: List[int] = []
        for key in self._active_keys():
            runtime = self._runtime.get(key) or KeyRuntime()
            record = self._keys.get(key)
            lease_claims = record is not None and any(_lease_awaits_confirmation(lease) for lease in record["leases"].values())
            if not runtime.demand_in_flight and self._has_queued(key) and not lease_claims:
                times.append(max(self._next_request_at_ms(key), runtime.demand_retry_at_ms))
            if record is None:
                continue
            reports_free = runtime.report_in_flight is None
            retry = runtime.report_retry_at_ms
            if reports_free and runtime.force_report and not _empty(record):
                times.append(max(now_ms, retry))
            if reports_free and _grants_need_report(record, runtime):
                times.append(max(now_ms, retry))
            for lease in record["leases"].values():
                if reports_free and _lease_needs_report(lease):
                    times.append(max(now_ms, retry))
                due = _lease_heartbeat_due_ms(lease)
                if reports_free and due is not None:
                    times.append(max(due, retry))
                if not lease["retired"]:
                    times.append(lease["expiresAtMs"])
                    idle = self.config.idle_lease_return_ms
                    if lease["idleSinceMs"] is not None and idle is not None:
                        times.append(lease["idleSinceMs"] + idle)
        return max(min(times), now_ms) if times else None

    def on_answer(self, key: str, answer: wire.SemaphoreResponse, now_ms: int) -> None:
        """The holder answered the key's message in flight on the answer's lane (``grant``: demand, ``synced``: report)."""
        runtime = self._runtime.get(key)
        if runtime is None:
            return
        if answer["type"] == "grant":
            if not runtime.demand_in_flight:
                return
            runtime.demand_in_flight = False
            sent = runtime.riding or InFlight()
            runtime.riding = None
        else:
            if runtime.report_in_flight is None:
                return
            sent = runtime.report_in_flight
            runtime.report_in_flight = None
        self._dirty.keys.add(key)
        if answer["type"] == "grant":
            for granted in answer.get("grants", []):
                self._accept_grant(key, granted)
            record = self._record_of(key)
            record["nextRequestAtMs"] = max(record["nextRequestAtMs"], believed_next_request_at(answer.get("nextRequestAt", 0), now_ms))
        self._apply_grant_results(key, sent, answer["grantResults"])
        self._apply_lease_echoes(key, sent, answer.get("leases", []), now_ms)
        if answer.get("contended", False):
            self._return_idle_leases(key)
        self._draw(key, now_ms)
        self._drop_if_empty(key)

    def on_failure(self, key: str, lane: str, now_ms: int) -> None:
        """The key's message in flight on ``lane`` failed: the lane waits ``failure_retry_ms``."""
        runtime = self._runtime.get(key)
        if runtime is None:
            return
        retry_at_ms = now_ms + self.config.failure_retry_ms
        if lane == "demand":
            runtime.demand_in_flight = False
            # Its releases are reported again, on the report lane.
            runtime.riding = None
            runtime.demand_retry_at_ms = retry_at_ms
        else:
            runtime.report_in_flight = None
            runtime.report_retry_at_ms = retry_at_ms

    def _active_keys(self) -> List[str]:
        return sorted(set(self._keys) | set(self._queued))

    def _busy(self, key: str) -> bool:
        runtime = self._runtime.get(key)
        return runtime is not None and runtime.in_flight() > 0

    def _next_request_at_ms(self, key: str) -> int:
        record = self._keys.get(key)
        return 0 if record is None else int(record["nextRequestAtMs"])

    def _report_lane_free(self, key: str, now_ms: int) -> bool:
        runtime = self._runtime.get(key)
        return runtime is None or (runtime.report_in_flight is None and now_ms >= runtime.report_retry_at_ms)

    def _demand_due(self, key: str, now_ms: int) -> bool:
        runtime = self._runtime.get(key)
        lane_free = runtime is None or (not runtime.demand_in_flight and now_ms >= runtime.demand_retry_at_ms)
        record = self._keys.get(key)
        lease_claims = record is not None and any(_lease_awaits_confirmation(lease) for lease in record["leases"].values())
        return lane_free and not lease_claims and self._has_queued(key) and self._next_request_at_ms(key) <= now_ms

    def reports_due(self, key: str, now_ms: int) -> bool:
        """Whether the key has something to report now (public for the lane tests)."""
        record = self._keys.get(key)
        if record is None or _empty(record):
            return False
        runtime = self._runtime.get(key)
        if (runtime is not None and runtime.force_report) or _grants_need_report(record, runtime):
            return True
        for lease in record["leases"].values():
            due = _lease_heartbeat_due_ms(lease)
            if _lease_needs_report(lease) or (due is not None and due <= now_ms):
                return True
        return False

    def _grant_reports(self, key: str, forced: bool) -> List[wire.GrantReport]:
        """Reports of every grant that needs one (every grant when ``forced``), capped."""
        grants = self._keys[key]["grants"] if key in self._keys else {}
        chosen = [(grant_id, grant) for grant_id, grant in sorted(grants.items()) if forced or _grant_needs_report(grant)]
        return [
            {"grantId": grant_id, "claimed": grant["claimed"], "released": grant["released"]}
            for grant_id, grant in chosen[:MAX_GRANT_REPORTS]
        ]

    def _take_sync(self, key: str) -> Dict[str, Any]:
        runtime = self._runtime_of(key)
        forced = runtime.force_report
        runtime.force_report = False
        grants = self._grant_reports(key, forced)
        leases = sorted(self._keys[key]["leases"].items()) if key in self._keys else []
        # Unconfirmed leases first: one left out until its claim deadline is reclaimed.
        ordered = [entry for entry in leases if not entry[1]["confirmed"]] + [entry for entry in leases if entry[1]["confirmed"]]
        lease_reports = [_lease_report(lease_id, lease) for lease_id, lease in ordered[:MAX_LEASE_REPORTS]]
        runtime.report_in_flight = InFlight(
            {report["grantId"]: report for report in grants}, {report["leaseId"]: report for report in lease_reports}
        )
        return {"type": "sync", "v": 1, "clientId": self.client_id, "grants": grants, "leases": lease_reports}

    def _take_request(self, key: str, ride: bool) -> Dict[str, Any]:
        """The key's request; with its releases riding if ``ride`` (see the module docs)."""
        groups = self._queued.get(key, {})
        demand = sorted(
            ({"group": group, "count": len(entries), "oldestAt": entries[0][0]} for group, entries in groups.items() if entries),
            key=lambda entry: (entry["oldestAt"], entry["group"]),
        )[:MAX_DEMAND_ENTRIES]
        runtime = self._runtime_of(key)
        runtime.demand_in_flight = True
        # `leases` present, though empty: this client takes leases.
        request: Dict[str, Any] = {"type": "request", "v": 1, "clientId": self.client_id, "demand": demand, "leases": []}
        if self.config.request_wait_ms > 0:
            request["waitMs"] = self.config.request_wait_ms
        if ride:
            grants = self._grant_reports(key, False)
            runtime.riding = InFlight({report["grantId"]: report for report in grants})
            request["grants"] = grants
        return request

    def _drop_if_empty(self, key: str) -> None:
        record = self._keys.get(key)
        if record is not None and _empty(record) and not self._has_queued(key) and not self._busy(key):
            del self._keys[key]
            self._runtime.pop(key, None)
            self._dirty.keys.add(key)

    def _record_of(self, key: str) -> Record:
        return self._keys.setdefault(key, {"grants": {}, "leases": {}, "nextRequestAtMs": 0})

    def _runtime_of(self, key: str) -> KeyRuntime:
        return self._runtime.setdefault(key, KeyRuntime())


def _admitted(item: Record, permit: Dict[str, Any]) -> AdmittedItem[Any]:
    return AdmittedItem(item["id"], item["key"], item["group"], item["body"], permit)
