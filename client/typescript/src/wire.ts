/**
 * The wire protocol, version 1, as TypeScript types with runtime validation.
 *
 * These mirror `permitd-core`'s serde types (`core/src/contract/protocol.rs`,
 * `core/src/config.rs`, `core/src/engine/usage.rs`). They cannot drift silently: a Rust
 * test writes a sample of every type to `test/fixtures/wire-samples.json` and
 * fails when the committed file differs, and the TypeScript tests parse every
 * sample with the validators below and check that it serialises back the same.
 *
 * Every `parseX` checks the shape and throws a `WireError` naming the path of
 * the first bad field; it returns a fresh object holding only known fields.
 * Counts and times are non-negative integers (times are ms since the epoch).
 */

/** A message a client sends to `POST /v1/semaphores/{key}`. */
export type SemaphoreRequest = ({ type: "request" } & PermitRequest) | ({ type: "sync" } & PermitSync);

/** Asks for permits per group and reports on held grants and leases. */
export interface PermitRequest {
  v: 1;
  clientId: string;
  /** Lets a retried request get the original answer instead of new grants. */
  requestId?: string;
  demand?: Demand[];
  grants?: GrantReport[];
  /** Present (even empty) when the client supports leases. */
  leases?: LeaseReport[];
  /**
   * How long (ms, at most 15,000) the leader may hold this request when a round
   * leaves it empty-handed, instead of answering with nothing; only pure demand
   * requests (no reports) are held. See docs/protocol.md "Held requests".
   */
  waitMs?: number;
}

/** Cumulative reports without demand. */
export interface PermitSync {
  v: 1;
  clientId: string;
  grants?: GrantReport[];
  leases?: LeaseReport[];
}

/** Permits wanted for one group; `oldestAt` orders demand across clients. */
export interface Demand {
  group: string;
  count: number;
  oldestAt: number;
}

/** Cumulative high-water marks for one grant. */
export interface GrantReport {
  grantId: string;
  claimed: number;
  released: number;
}

/** Cumulative high-water marks for one lease, and whether drawing stopped. */
export interface LeaseReport {
  leaseId: string;
  drawn: number;
  released: number;
  retired?: boolean;
}

/** The holder's answer. */
export type SemaphoreResponse = ({ type: "grant" } & PermitGrant) | ({ type: "synced" } & PermitSyncResult);

/** The answer to a request, once its round ran. */
export interface PermitGrant {
  v: 1;
  grants: GrantedPermits[];
  blocked: Blocked[];
  grantResults: GrantResult[];
  /** Only for clients that sent `leases`. */
  leases?: LeaseGrant[];
  /** Only when true. */
  contended?: boolean;
  nextRequestAt: number;
}

/** The answer to a sync. */
export interface PermitSyncResult {
  v: 1;
  grantResults: GrantResult[];
  leases?: LeaseGrant[];
  contended?: boolean;
}

/** Permits newly granted for one group; `fence` grows strictly per key. */
export interface GrantedPermits {
  grantId: string;
  group: string;
  permits: number;
  fence: number;
}

export type BlockedReason = "group_limit" | "limit" | "not_permitted" | "limit_resolution_error";

/** Why some of a group's demand stayed queued. */
export interface Blocked {
  group: string;
  reason: BlockedReason;
}

export type GrantStatus = "ok" | "expired" | "not_found";

/** The holder's view of one reported grant. */
export interface GrantResult {
  grantId: string;
  claimed: number;
  status: GrantStatus;
}

/** A lease as the holder sees it; `expiresAt <= now` means: stop drawing. */
export interface LeaseGrant {
  leaseId: string;
  group: string;
  permits: number;
  expiresAt: number;
}

/** `GET /v1/semaphores/{key}/usage`. */
export interface Usage {
  limit: number;
  granted: number;
  leased: number;
  available: number;
  groups: Record<string, GroupUsage>;
}

export interface GroupUsage {
  granted: number;
  limit?: number;
}

/** A number of permits, or a share of the limit. */
export type Amount = number | { ratio: number };

export type Provisioning =
  | { mode: "strict" }
  | { mode: "under"; reserve: Amount }
  | { mode: "over"; extra: Amount };

export interface LeasePolicy {
  provisioning: Provisioning;
  permitsPerLease?: number;
  ttlMs?: number;
  maxGroups?: number;
  maxClientsPerGroup?: number;
  limitedGroups?: "exclude" | "withinGroupLimit";
}

/** A key's effective configuration (`GET .../config`). */
export interface KeyConfig {
  limit: number;
  roundWaitMs: number;
  roundPeriodMs: number;
  grantTimeoutMs: number;
  leases: LeasePolicy | null;
}

/** `PUT .../config`: omitted fields take the cluster defaults; `leases: null` disables leases. */
export interface KeyConfigUpdate {
  limit?: number | null;
  roundWaitMs?: number | null;
  roundPeriodMs?: number | null;
  grantTimeoutMs?: number | null;
  leases?: LeasePolicy | null;
}

/** What an admin's force release dropped, or a forced key delete released. */
export interface ForceReleased {
  grants: number;
  leases: number;
  /** Grant permits plus lease footprint returned to the key. */
  permits: number;
}

/** `DELETE /v1/semaphores/{key}`: what the delete did (a replay by `requestId` gets it again). */
export interface KeyDeleted {
  /** The key held settings or state, now gone; `false`: nothing was kept for it, nothing changed. */
  existed: boolean;
  released: ForceReleased;
  /** Clients whose grants or leases were released. */
  clients: number;
  /** The log index of the entry that deleted the key. */
  logIndex: number;
}

/** `PUT .../groups/{group}`. */
export interface GroupConfig {
  limit?: number | null;
  permitted?: boolean;
}

/** One key of `GET /v1/semaphores`. */
export interface KeyUsage {
  key: string;
  usage: Usage;
}

/** One page of `GET /v1/semaphores`; `next` (when more keys follow) is the next page's `after`. */
export interface KeyList {
  keys: KeyUsage[];
  next?: string;
}

export type MemberRole = "voter" | "learner";

export interface ClusterMember {
  id: number;
  /** `host:port` of its public API. */
  addr: string;
  raftAddr: string;
  role: MemberRole;
}

/** `GET /cluster/status`: the answering node's view. */
export interface ClusterStatus {
  id: number;
  leader: number | null;
  term: number;
  lastLogIndex: number | null;
  lastApplied: number | null;
  initialized: boolean;
  members: ClusterMember[];
}

/** One shard as the answering node sees it. */
export interface ShardStatus {
  shard: number;
  leader: number | null;
  term: number;
  /** The voters of the shard's group, ascending. */
  members: number[];
  appliedIndex: number | null;
}

/** `GET /cluster/shards`: every shard and its leader, in shard order (`shardOf` says a key's). */
export interface ShardMap {
  id: number;
  shards: ShardStatus[];
}

/** Every error code a node answers with (`core/src/contract/errors.rs`). */
export const ERROR_CODES = [
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
] as const;
export type ErrorCode = (typeof ERROR_CODES)[number];

/** Every error answer: `{"error": {"code", "message", "field"?}}`. */
export interface ErrorAnswer {
  error: { code: ErrorCode; message: string; field?: string };
}

/** Most items of one `POST /v1/batch` (`core/src/limits.rs`). */
export const MAX_BATCH_ITEMS = 256;
/** Most distinct keys of one batch: each key may hold the call until its round. */
export const MAX_BATCH_KEYS = 128;

/** One item of `POST /v1/batch`: what `POST /v1/semaphores/{key}` would carry. */
export interface BatchItem {
  key: string;
  message: SemaphoreRequest;
}

/** `POST /v1/batch`: 1 to `MAX_BATCH_ITEMS` items, at most `MAX_BATCH_KEYS` keys. */
export interface BatchRequest {
  v: 1;
  items: BatchItem[];
}

/** One item's answer: the status its own call would have had, with `answer` (200) or `error`. */
export interface BatchItemAnswer {
  status: number;
  answer?: SemaphoreResponse;
  error?: ErrorAnswer["error"];
}

/** The answer of `POST /v1/batch`: one per item, in order. */
export interface BatchResponse {
  v: 1;
  items: BatchItemAnswer[];
}

/** A value that is not the expected shape. */
export class WireError extends Error {
  constructor(
    readonly path: string,
    readonly reason: string,
  ) {
    super(`${path}: ${reason}`);
    this.name = "WireError";
  }
}

type Parser<T> = (value: unknown, path: string) => T;

function record(value: unknown, path: string): Record<string, unknown> {
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new WireError(path, "expected an object");
  }
  return value as Record<string, unknown>;
}

const count: Parser<number> = (value, path) => {
  if (typeof value !== "number" || !Number.isSafeInteger(value) || value < 0) {
    throw new WireError(path, "expected a non-negative integer");
  }
  return value;
};

const finite: Parser<number> = (value, path) => {
  if (typeof value !== "number" || !Number.isFinite(value) || value < 0) {
    throw new WireError(path, "expected a non-negative number");
  }
  return value;
};

const text: Parser<string> = (value, path) => {
  if (typeof value !== "string") throw new WireError(path, "expected a string");
  return value;
};

const flag: Parser<boolean> = (value, path) => {
  if (typeof value !== "boolean") throw new WireError(path, "expected a boolean");
  return value;
};

function oneOf<T extends string>(...names: T[]): Parser<T> {
  return (value, path) => {
    if (typeof value !== "string" || !(names as string[]).includes(value)) {
      throw new WireError(path, `expected one of ${names.join(", ")}`);
    }
    return value as T;
  };
}

function list<T>(item: Parser<T>): Parser<T[]> {
  return (value, path) => {
    if (!Array.isArray(value)) throw new WireError(path, "expected an array");
    return value.map((entry, index) => item(entry, `${path}[${index}]`));
  };
}

function nullable<T>(inner: Parser<T>): Parser<T | null> {
  return (value, path) => (value === null ? null : inner(value, path));
}

/** Parses `fields` of `value`; a field whose parser is wrapped in `optional` may be absent. */
interface Optional<T> {
  optional: Parser<T>;
}
function optional<T>(parser: Parser<T>): Optional<T> {
  return { optional: parser };
}
type Fields<T> = { [K in keyof T]-?: Parser<T[K]> | Optional<Exclude<T[K], undefined>> };

function object<T>(fields: Fields<T>): Parser<T> {
  return (value, path) => {
    const source = record(value, path);
    const out: Record<string, unknown> = {};
    for (const [name, parser] of Object.entries(fields) as [string, Parser<unknown> | Optional<unknown>][]) {
      const field = source[name];
      if (typeof parser === "object") {
        if (field !== undefined) out[name] = parser.optional(field, `${path}.${name}`);
      } else {
        out[name] = parser(field, `${path}.${name}`);
      }
    }
    return out as T;
  };
}

const version: Parser<1> = (value, path) => {
  if (value !== 1) throw new WireError(path, "unsupported protocol version, expected 1");
  return 1;
};

const demand = object<Demand>({ group: text, count, oldestAt: count });
const grantReport = object<GrantReport>({ grantId: text, claimed: count, released: count });
const leaseReport = object<LeaseReport>({
  leaseId: text,
  drawn: count,
  released: count,
  retired: optional(flag),
});
const grantedPermits = object<GrantedPermits>({ grantId: text, group: text, permits: count, fence: count });
const blocked = object<Blocked>({
  group: text,
  reason: oneOf("group_limit", "limit", "not_permitted", "limit_resolution_error"),
});
const grantResult = object<GrantResult>({
  grantId: text,
  claimed: count,
  status: oneOf("ok", "expired", "not_found"),
});
const leaseGrant = object<LeaseGrant>({ leaseId: text, group: text, permits: count, expiresAt: count });

const permitRequest = object<PermitRequest>({
  v: version,
  clientId: text,
  requestId: optional(text),
  demand: optional(list(demand)),
  grants: optional(list(grantReport)),
  leases: optional(list(leaseReport)),
  waitMs: optional(count),
});
const permitSync = object<PermitSync>({
  v: version,
  clientId: text,
  grants: optional(list(grantReport)),
  leases: optional(list(leaseReport)),
});
const permitGrant = object<PermitGrant>({
  v: version,
  grants: list(grantedPermits),
  blocked: list(blocked),
  grantResults: list(grantResult),
  leases: optional(list(leaseGrant)),
  contended: optional(flag),
  nextRequestAt: count,
});
const permitSyncResult = object<PermitSyncResult>({
  v: version,
  grantResults: list(grantResult),
  leases: optional(list(leaseGrant)),
  contended: optional(flag),
});

/** A union tagged by the field `tag`: the tag, then the variant's own fields. */
function tagged<T>(tag: string, variants: Record<string, Parser<object>>): Parser<T> {
  return (value, path) => {
    const source = record(value, path);
    const name = source[tag];
    const variant = typeof name === "string" ? variants[name] : undefined;
    if (!variant) {
      throw new WireError(`${path}.${tag}`, `expected one of ${Object.keys(variants).join(", ")}`);
    }
    return { [tag]: name, ...variant(source, path) } as T;
  };
}

const amount: Parser<Amount> = (value, path) =>
  typeof value === "number" ? count(value, path) : object<{ ratio: number }>({ ratio: finite })(value, path);

const provisioning = tagged<Provisioning>("mode", {
  strict: object({}),
  under: object<{ reserve: Amount }>({ reserve: amount }),
  over: object<{ extra: Amount }>({ extra: amount }),
});

const leasePolicy = object<LeasePolicy>({
  provisioning,
  permitsPerLease: optional(count),
  ttlMs: optional(count),
  maxGroups: optional(count),
  maxClientsPerGroup: optional(count),
  limitedGroups: optional(oneOf("exclude", "withinGroupLimit")),
});

function dictionary<T>(item: Parser<T>): Parser<Record<string, T>> {
  return (value, path) => {
    const source = record(value, path);
    const out: Record<string, T> = {};
    for (const [name, entry] of Object.entries(source)) out[name] = item(entry, `${path}.${name}`);
    return out;
  };
}

const groupUsage = object<GroupUsage>({ granted: count, limit: optional(count) });
const usage = object<Usage>({
  limit: count,
  granted: count,
  leased: count,
  available: count,
  groups: dictionary(groupUsage),
});

const semaphoreRequest = tagged<SemaphoreRequest>("type", { request: permitRequest, sync: permitSync });
const semaphoreResponse = tagged<SemaphoreResponse>("type", { grant: permitGrant, synced: permitSyncResult });
const errorBody = object<ErrorAnswer["error"]>({ code: oneOf<ErrorCode>(...ERROR_CODES), message: text, field: optional(text) });

/** The validators, one per wire type, by the type's name. */
export const parse = {
  SemaphoreRequest: semaphoreRequest,
  SemaphoreResponse: semaphoreResponse,
  BatchRequest: object<BatchRequest>({ v: version, items: list(object<BatchItem>({ key: text, message: semaphoreRequest })) }),
  BatchResponse: object<BatchResponse>({
    v: version,
    items: list(object<BatchItemAnswer>({ status: count, answer: optional(semaphoreResponse), error: optional(errorBody) })),
  }),
  PermitGrant: permitGrant,
  PermitSyncResult: permitSyncResult,
  Usage: usage,
  KeyConfig: object<KeyConfig>({
    limit: count,
    roundWaitMs: count,
    roundPeriodMs: count,
    grantTimeoutMs: count,
    leases: nullable(leasePolicy),
  }),
  KeyConfigUpdate: object<KeyConfigUpdate>({
    limit: optional(nullable(count)),
    roundWaitMs: optional(nullable(count)),
    roundPeriodMs: optional(nullable(count)),
    grantTimeoutMs: optional(nullable(count)),
    leases: optional(nullable(leasePolicy)),
  }),
  GroupConfig: object<GroupConfig>({ limit: optional(nullable(count)), permitted: optional(flag) }),
  ShardMap: object<ShardMap>({
    id: count,
    shards: list(
      object<ShardStatus>({
        shard: count,
        leader: nullable(count),
        term: count,
        members: list(count),
        appliedIndex: nullable(count),
      }),
    ),
  }),
  KeyDeleted: object<KeyDeleted>({
    existed: flag,
    released: object<ForceReleased>({ grants: count, leases: count, permits: count }),
    clients: count,
    logIndex: count,
  }),
  KeyList: object<KeyList>({ keys: list(object<KeyUsage>({ key: text, usage })), next: optional(text) }),
  ClusterStatus: object<ClusterStatus>({
    id: count,
    leader: nullable(count),
    term: count,
    lastLogIndex: nullable(count),
    lastApplied: nullable(count),
    initialized: flag,
    members: list(
      object<ClusterMember>({ id: count, addr: text, raftAddr: text, role: oneOf<MemberRole>("voter", "learner") }),
    ),
  }),
  ErrorAnswer: object<ErrorAnswer>({ error: errorBody }),
} satisfies Record<string, Parser<unknown>>;

/** The name of every wire type with a validator. */
export type WireTypeName = keyof typeof parse;

/** Parses `value` as the wire type `name`, throwing a `WireError` on a mismatch. */
export function parseWire<N extends WireTypeName>(name: N, value: unknown): ReturnType<(typeof parse)[N]> {
  return parse[name](value, name) as ReturnType<(typeof parse)[N]>;
}
