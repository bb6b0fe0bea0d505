"""The wire protocol, version 1: JSON shapes as ``TypedDict``s, with validators.

These mirror ``permitd-core``'s serde types (``core/src/protocol.rs``,
``core/src/config.rs``, ``core/src/usage.rs``, ``core/src/contract/``), as the
TypeScript client's ``wire.ts`` does. They cannot drift silently: the Rust test
``tests/tests/wire_samples.rs`` writes a sample of every type to
``client/typescript/test/fixtures/wire-samples.json``; the Python tests parse
every sample with the validators below and write the whole file back, byte for
byte (``encode``).

``parse(name, value)`` checks the shape and raises a ``WireError`` naming the
path of the first bad field; it returns a fresh dict holding only known fields
(unknown extra fields are ignored, as the server ignores them). Counts and
times are non-negative integers (times are ms since the epoch).
"""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, List, Literal, Optional, TypedDict, Union, cast

# ---- messages ------------------------------------------------------------------


class Demand(TypedDict):
    """Permits wanted for one group; ``oldestAt`` orders demand across clients."""

    group: str
    count: int
    oldestAt: int


class GrantReport(TypedDict):
    """Cumulative high-water marks for one grant."""

    grantId: str
    claimed: int
    released: int


class _LeaseReportBase(TypedDict):
    leaseId: str
    drawn: int
    released: int


class LeaseReport(_LeaseReportBase, total=False):
    """Cumulative high-water marks for one lease, and whether drawing stopped."""

    retired: bool


class _MessageBase(TypedDict):
    type: str
    v: int
    clientId: str


class SemaphoreRequest(_MessageBase, total=False):
    """A ``request`` (demand and reports) or a ``sync`` (reports only)."""

    requestId: str
    demand: List[Demand]
    grants: List[GrantReport]
    leases: List[LeaseReport]
    waitMs: int


class GrantedPermits(TypedDict):
    """Permits newly granted for one group; ``fence`` grows strictly per key."""

    grantId: str
    group: str
    permits: int
    fence: int


class Blocked(TypedDict):
    group: str
    reason: str


class GrantResult(TypedDict):
    """The holder's view of one reported grant: ``ok``, ``expired`` or ``not_found``."""

    grantId: str
    claimed: int
    status: str


class LeaseGrant(TypedDict):
    """A lease as the holder sees it; ``expiresAt <= now`` means: stop drawing."""

    leaseId: str
    group: str
    permits: int
    expiresAt: int


class _ResponseBase(TypedDict):
    type: str
    v: int
    grantResults: List[GrantResult]


class SemaphoreResponse(_ResponseBase, total=False):
    """A ``grant`` (``grants``, ``blocked``, ``nextRequestAt`` present) or a ``synced``."""

    grants: List[GrantedPermits]
    blocked: List[Blocked]
    leases: List[LeaseGrant]
    contended: bool
    nextRequestAt: int


class _GroupUsageBase(TypedDict):
    granted: int


class GroupUsage(_GroupUsageBase, total=False):
    limit: int


class Usage(TypedDict):
    """``GET /v1/semaphores/{key}/usage``."""

    limit: int
    granted: int
    leased: int
    available: int
    groups: Dict[str, GroupUsage]


class ErrorBody(TypedDict, total=False):
    code: str
    message: str
    field: str


class ClusterMember(TypedDict):
    id: int
    addr: str
    raftAddr: str
    role: str


class ClusterStatus(TypedDict):
    """``GET /cluster/status``: the answering node's view."""

    id: int
    leader: Optional[int]
    term: int
    lastLogIndex: Optional[int]
    lastApplied: Optional[int]
    initialized: bool
    members: List[ClusterMember]


class ShardStatus(TypedDict):
    shard: int
    leader: Optional[int]
    term: int
    members: List[int]
    appliedIndex: Optional[int]


class ShardMap(TypedDict):
    """``GET /cluster/shards``: every shard and its leader, as the answering node sees them."""

    id: int
    shards: List[ShardStatus]


JSON = Any
"""A decoded JSON value whose shape a validator below checks."""

BLOCKED_REASONS = ("group_limit", "limit", "not_permitted", "limit_resolution_error")
GRANT_STATUSES = ("ok", "expired", "not_found")

#: Every error code a node answers with (``core/src/contract/errors.rs``), in its order.
ERROR_CODES = (
    "bad_request",
    "unauthorized",
    "forbidden",
    "not_found",
    "method_not_allowed",
    "already_initialized",
    "membership_conflict",
    "too_many_tokens",
    "key_in_use",
    "too_far_behind",
    "payload_too_large",
    "unsupported_media_type",
    "too_many_pending",
    "too_many_keys",
    "too_many_subscribers",
    "not_leader",
    "no_quorum",
    "leader_changed",
    "key_deleted",
    "shutting_down",
    "overloaded",
    "timeout",
    "internal",
)

#: Most items of one ``POST /v1/batch`` (``core/src/limits.rs``).
MAX_BATCH_ITEMS = 256
#: Most distinct keys of one batch: each key may hold the call until its round.
MAX_BATCH_KEYS = 128
#: The response header naming the leader (of the shard that answered).
LEADER_HEADER = "x-permitd-leader"
#: The response header naming the shard that answered.
SHARD_HEADER = "x-permitd-shard"
#: The response header naming the cluster's shard count (absent: 1).
SHARDS_HEADER = "x-permitd-shards"


class WireError(ValueError):
    """A value that is not the expected shape; ``path`` names the bad field."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


# ---- validators ----------------------------------------------------------------

Parser = Callable[[JSON, str], JSON]


class _Optional:
    """A field that may be absent (``null`` is not absent: it must parse)."""

    def __init__(self, parser: Parser) -> None:
        self.parser = parser


def _record(value: JSON, path: str) -> Dict[str, JSON]:
    if not isinstance(value, dict):
        raise WireError(path, "expected an object")
    return cast(Dict[str, JSON], value)


def _count(value: JSON, path: str) -> int:
    # bool is an int subclass in Python; JSON true is no count.
    if type(value) is not int or value < 0:
        raise WireError(path, "expected a non-negative integer")
    return value


def _finite(value: JSON, path: str) -> float:
    if type(value) not in (int, float) or value < 0 or value != value or value == float("inf"):
        raise WireError(path, "expected a non-negative number")
    return cast(float, value)


def _text(value: JSON, path: str) -> str:
    if not isinstance(value, str):
        raise WireError(path, "expected a string")
    return value


def _flag(value: JSON, path: str) -> bool:
    if not isinstance(value, bool):
        raise WireError(path, "expected a boolean")
    return value


def _one_of(*names: str) -> Parser:
    def parse(value: JSON, path: str) -> str:
        if not isinstance(value, str) or value not in names:
            raise WireError(path, f"expected one of {', '.join(names)}")
        return value

    return parse


def _version(value: JSON, path: str) -> int:
    if type(value) is not int or value != 1:
        raise WireError(path, "unsupported protocol version, expected 1")
    return 1


def _list(item: Parser) -> Parser:
    def parse(value: JSON, path: str) -> List[JSON]:
        if not isinstance(value, list):
            raise WireError(path, "expected an array")
        return [item(entry, f"{path}[{index}]") for index, entry in enumerate(value)]

    return parse


def _nullable(inner: Parser) -> Parser:
    return lambda value, path: None if value is None else inner(value, path)


def _object(fields: Dict[str, Union[Parser, _Optional]]) -> Parser:
    def parse(value: JSON, path: str) -> Dict[str, JSON]:
        source = _record(value, path)
        out: Dict[str, JSON] = {}
        for name, parser in fields.items():
            if isinstance(parser, _Optional):
                if name in source:
                    out[name] = parser.parser(source[name], f"{path}.{name}")
            else:
                out[name] = parser(source.get(name), f"{path}.{name}")
        return out

    return parse


def _tagged(tag: str, variants: Dict[str, Parser]) -> Parser:
    """A union tagged by the field ``tag``: the tag, then the variant's own fields."""

    def parse(value: JSON, path: str) -> Dict[str, JSON]:
        source = _record(value, path)
        name = source.get(tag)
        variant = variants.get(name) if isinstance(name, str) else None
        if variant is None:
            raise WireError(f"{path}.{tag}", f"expected one of {', '.join(variants)}")
        return {tag: name, **variant(source, path)}

    return parse


def _dictionary(item: Parser) -> Parser:
    def parse(value: JSON, path: str) -> Dict[str, JSON]:
        return {name: item(entry, f"{path}.{name}") for name, entry in _record(value, path).items()}

    return parse


_O = _Optional
_demand = _object({"group": _text, "count": _count, "oldestAt": _count})
_grant_report = _object({"grantId": _text, "claimed": _count, "released": _count})
_lease_report = _object({"leaseId": _text, "drawn": _count, "released": _count, "retired": _O(_flag)})
_granted = _object({"grantId": _text, "group": _text, "permits": _count, "fence": _count})
_blocked = _object({"group": _text, "reason": _one_of(*BLOCKED_REASONS)})
_grant_result = _object({"grantId": _text, "claimed": _count, "status": _one_of(*GRANT_STATUSES)})
_lease_grant = _object({"leaseId": _text, "group": _text, "permits": _count, "expiresAt": _count})
_permit_request = _object(
    {
        "v": _version,
        "clientId": _text,
        "requestId": _O(_text),
        "demand": _O(_list(_demand)),
        "grants": _O(_list(_grant_report)),
        "leases": _O(_list(_lease_report)),
        "waitMs": _O(_count),
    }
)
_permit_sync = _object({"v": _version, "clientId": _text, "grants": _O(_list(_grant_report)), "leases": _O(_list(_lease_report))})
_permit_grant = _object(
    {
        "v": _version,
        "grants": _list(_granted),
        "blocked": _list(_blocked),
        "grantResults": _list(_grant_result),
        "leases": _O(_list(_lease_grant)),
        "contended": _O(_flag),
        "nextRequestAt": _count,
    }
)
_permit_sync_result = _object(
    {"v": _version, "grantResults": _list(_grant_result), "leases": _O(_list(_lease_grant)), "contended": _O(_flag)}
)


def _amount(value: JSON, path: str) -> JSON:
    if isinstance(value, dict):
        return _object({"ratio": _finite})(value, path)
    return _count(value, path)


_provisioning = _tagged(
    "mode",
    {"strict": _object({}), "under": _object({"reserve": _amount}), "over": _object({"extra": _amount})},
)
_lease_policy = _object(
    {
        "provisioning": _provisioning,
        "permitsPerLease": _O(_count),
        "ttlMs": _O(_count),
        "maxGroups": _O(_count),
        "maxClientsPerGroup": _O(_count),
        "limitedGroups": _O(_one_of("exclude", "withinGroupLimit")),
    }
)
_usage = _object(
    {
        "limit": _count,
        "granted": _count,
        "leased": _count,
        "available": _count,
        "groups": _dictionary(_object({"granted": _count, "limit": _O(_count)})),
    }
)
_semaphore_request = _tagged("type", {"request": _permit_request, "sync": _permit_sync})
_semaphore_response = _tagged("type", {"grant": _permit_grant, "synced": _permit_sync_result})
_error_body = _object({"code": _one_of(*ERROR_CODES), "message": _text, "field": _O(_text)})
_nullable_count = _O(_nullable(_count))

#: The validators, one per wire type, by the type's name (the fixture's names).
PARSERS: Dict[str, Parser] = {
    "SemaphoreRequest": _semaphore_request,
    "SemaphoreResponse": _semaphore_response,
    "BatchRequest": _object({"v": _version, "items": _list(_object({"key": _text, "message": _semaphore_request}))}),
    "BatchResponse": _object(
        {
            "v": _version,
            "items": _list(_object({"status": _count, "answer": _O(_semaphore_response), "error": _O(_error_body)})),
        }
    ),
    "Usage": _usage,
    "KeyConfig": _object(
        {
            "limit": _count,
            "roundWaitMs": _count,
            "roundPeriodMs": _count,
            "grantTimeoutMs": _count,
            "leases": _nullable(_lease_policy),
        }
    ),
    "KeyConfigUpdate": _object(
        {
            "limit": _nullable_count,
            "roundWaitMs": _nullable_count,
            "roundPeriodMs": _nullable_count,
            "grantTimeoutMs": _nullable_count,
            "leases": _O(_nullable(_lease_policy)),
        }
    ),
    "GroupConfig": _object({"limit": _nullable_count, "permitted": _O(_flag)}),
    "KeyList": _object({"keys": _list(_object({"key": _text, "usage": _usage})), "next": _O(_text)}),
    "ClusterStatus": _object(
        {
            "id": _count,
            "leader": _nullable(_count),
            "term": _count,
            "lastLogIndex": _nullable(_count),
            "lastApplied": _nullable(_count),
            "initialized": _flag,
            "members": _list(_object({"id": _count, "addr": _text, "raftAddr": _text, "role": _one_of("voter", "learner")})),
        }
    ),
    "ShardMap": _object(
        {
            "id": _count,
            "shards": _list(
                _object(
                    {
                        "shard": _count,
                        "leader": _nullable(_count),
                        "term": _count,
                        "members": _list(_count),
                        "appliedIndex": _nullable(_count),
                    }
                )
            ),
        }
    ),
    "ErrorAnswer": _object({"error": _error_body}),
    "KeyDeleted": _object(
        {
            "existed": _flag,
            "released": _object({"grants": _count, "leases": _count, "permits": _count}),
            "clients": _count,
            "logIndex": _count,
        }
    ),
}

WireTypeName = Literal[
    "SemaphoreRequest",
    "SemaphoreResponse",
    "BatchRequest",
    "BatchResponse",
    "Usage",
    "KeyConfig",
    "KeyConfigUpdate",
    "GroupConfig",
    "KeyList",
    "ClusterStatus",
    "ShardMap",
    "ErrorAnswer",
    "KeyDeleted",
]


def parse(name: str, value: JSON) -> JSON:
    """Parses ``value`` as the wire type ``name``; raises ``WireError`` on a mismatch."""
    parser = PARSERS.get(name)
    if parser is None:
        raise KeyError(f"no wire type {name}")
    return parser(value, name)


def encode(value: JSON) -> bytes:
    """A message body as sent: compact JSON, UTF-8."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def encode_pretty(value: JSON) -> str:
    """JSON as ``serde_json::to_string_pretty`` writes a ``Value`` (sorted keys, two spaces)."""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
