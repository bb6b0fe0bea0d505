"""Permits as context managers: ``client.acquire(...)``, ``with client.permit(...)``.

One acquisition (the same as the Rust client's ``permit.rs`` and the TypeScript
``permit.ts``):

1. a ``request`` with demand ``{group, count, oldestAt}``; ``oldestAt`` stays the
   first ask's time so the caller keeps its place in line; repeated at the
   key's ``nextRequestAt`` until enough is granted (a round may grant part);
2. every grant is claimed at once with a ``sync`` (claim before admission): the
   holder reclaims a grant not claimed by its claim deadline;
3. the ``Permit`` holds the claimed grants. Claimed grants do not expire: a
   permit held for hours needs no heartbeat. ``permit.fence`` is the newest
   grant's fence, strictly increasing per key, for downstream checks;
4. ``permit.release()`` reports every permit released (a ``with`` block does it
   on exit, exceptions and cancellation included).

Giving up (``timeout`` passes, the task is cancelled, a call fails, Ctrl-C)
releases whatever was granted before the error goes on. A ``request`` in
flight at that moment is not cut off: what its round grants is released once
its answer comes (in the background for a cancelled async acquisition; a
timed-out one reads the answer first, so it may return one round after
``timeout``). Only a process that dies first leaves such a grant to the
holder, which reclaims it at its claim deadline (``grantTimeoutMs``). Python
finalizers do no network IO: a ``Permit`` that is neither released nor left by
its ``with`` block stays held (claimed grants do not expire).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence

from . import wire
from .errors import AcquireError, DeadlineExceededError
from .plan import ClientCore, Plan, Response, Sleep, now_ms

#: Prefix of the ``clientId`` an acquisition uses when the caller names none.
DEFAULT_CLIENT_ID_PREFIX = "permit-"
#: Least deadline of one ``request`` of an acquisition, in ms: a request is answered by
#: its round, so one sent just before the acquisition's timeout still gets its answer
#: (and its grants are released) instead of being cut off.
MIN_REQUEST_DEADLINE_MS = 2_000


@dataclass
class HeldGrant:
    """One grant a permit holds."""

    grant_id: str
    claimed: int
    fence: int


def claim_amounts(grants: Sequence[wire.GrantedPermits], needed: int) -> List[HeldGrant]:
    """What to claim of a round's grants: each in full until ``needed`` is covered."""
    claimed: List[HeldGrant] = []
    for grant in grants:
        if needed <= 0:
            break
        take = min(grant["permits"], needed)
        needed -= take
        claimed.append(HeldGrant(grant["grantId"], take, grant["fence"]))
    return claimed


def release_plan(core: ClientCore, key: str, client_id: str, grants: Sequence[HeldGrant]) -> Plan[None]:
    """Reports every permit of ``grants`` released (cumulative: harmless if a claim never landed)."""
    if not grants:
        return
    reports = [{"grantId": grant.grant_id, "claimed": grant.claimed, "released": grant.claimed} for grant in grants]
    yield from core.sync(key, {"clientId": client_id, "grants": reports})


def _abandoned(core: ClientCore, key: str, client_id: str) -> Any:
    """The hook of an acquisition's request: what a late answer granted, released."""

    def hook(outcome: Any) -> Optional[Plan[None]]:
        if not isinstance(outcome, Response) or outcome.status != 200:
            return None
        try:
            import json

            answer = wire.parse("SemaphoreResponse", json.loads(outcome.body))
        except (ValueError, wire.WireError):
            return None
        return release_plan(core, key, client_id, claim_amounts(answer.get("grants", []), 2**62))

    return hook


def acquire_plan(
    core: ClientCore, key: str, group: str, count: int, client_id: Optional[str], timeout_s: Optional[float]
) -> Plan[tuple[str, List[HeldGrant]]]:
    """Gathers ``count`` claimed permits; on any way out but success, releases what it holds."""
    if type(count) is not int or count < 1:
        raise AcquireError("zero_count", key, "a permit needs a count of at least 1")
    client_id = client_id or f"{DEFAULT_CLIENT_ID_PREFIX}{uuid.uuid4()}"
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    held: List[HeldGrant] = []
    try:
        yield from _gather(core, key, group, count, client_id, held, deadline, timeout_s)
        return client_id, held
    except GeneratorExit:
        raise
    except BaseException:
        try:
            yield from release_plan(core, key, client_id, held)
        except Exception:
            pass  # the holder keeps them; the original error says why we gave up
        raise


def _gather(
    core: ClientCore,
    key: str,
    group: str,
    count: int,
    client_id: str,
    held: List[HeldGrant],
    deadline: Optional[float],
    timeout_s: Optional[float],
) -> Plan[None]:
    oldest_at = now_ms()

    def timed_out() -> AcquireError:
        return AcquireError("timeout", key, f"no permit of key {key} within {timeout_s} s")

    def held_count() -> int:
        return sum(grant.claimed for grant in held)

    while held_count() < count:
        left_ms = None if deadline is None else int((deadline - time.monotonic()) * 1000)
        if left_ms is not None and left_ms <= 0:
            raise timed_out()
        wait_ms = (core.next_request_at(key) or 0) - now_ms()
        if wait_ms > 0:
            if left_ms is not None and wait_ms >= left_ms:
                yield Sleep(left_ms / 1000)
                raise timed_out()
            yield Sleep(wait_ms / 1000)
        reports = [{"grantId": grant.grant_id, "claimed": grant.claimed, "released": 0} for grant in held]
        request = {
            "clientId": client_id,
            "demand": [{"group": group, "count": count - held_count(), "oldestAt": oldest_at}],
            "grants": reports,
        }
        request_deadline = None if left_ms is None else max(left_ms, MIN_REQUEST_DEADLINE_MS)
        try:
            answer = yield from core.request(key, request, request_deadline, abandon=_abandoned(core, key, client_id))
        except DeadlineExceededError:
            if deadline is not None and time.monotonic() >= deadline:
                raise timed_out() from None
            raise
        refused = next((blocked for blocked in answer.get("blocked", []) if blocked["reason"] == "not_permitted"), None)
        if refused is not None:
            raise AcquireError("not_permitted", key, f"group {refused['group']} of key {key} is not permitted")
        fresh = claim_amounts(answer.get("grants", []), count - held_count())
        # Held before the claim is sent: giving up from here on releases them.
        held.extend(fresh)
        if fresh:
            yield from _claim(core, key, client_id, held, fresh)


def _claim(core: ClientCore, key: str, client_id: str, held: List[HeldGrant], fresh: List[HeldGrant]) -> Plan[None]:
    """Claims ``fresh`` grants with a ``sync``; keeps what the holder confirmed."""
    reports = [{"grantId": grant.grant_id, "claimed": grant.claimed, "released": 0} for grant in fresh]
    synced = yield from core.sync(key, {"clientId": client_id, "grants": reports})
    for result in synced["grantResults"]:
        grant = next((candidate for candidate in held if candidate.grant_id == result["grantId"]), None)
        if grant is None:
            continue
        grant.claimed = 0 if result["status"] == "not_found" else min(grant.claimed, result["claimed"])
        if grant.claimed == 0:
            held.remove(grant)


class PermitBase:
    """Claimed permits of one key (the fields both permit kinds share)."""

    def __init__(self, key: str, group: str, client_id: str, grants: List[HeldGrant]) -> None:
        self.key = key
        self.group = group
        self.client_id = client_id
        self.grants = grants
        self.released = False

    @property
    def count(self) -> int:
        """Permits held."""
        return sum(grant.claimed for grant in self.grants)

    @property
    def fence(self) -> int:
        """The newest grant's fence: strictly increasing per key."""
        return max((grant.fence for grant in self.grants), default=0)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(key={self.key!r}, group={self.group!r}, count={self.count}, fence={self.fence})"
