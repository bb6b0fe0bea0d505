//! Every maximum permitd accepts, in one place.
//!
//! Inputs are checked against these at the edge (`validate`), so the round engine
//! can rely on them: sums of counts fit an `i64` with room to spare, and no message
//! can make a round do unbounded work.

/// Longest semaphore key, in bytes of UTF-8.
pub const MAX_KEY_BYTES: usize = 256;
/// Longest group name, in bytes of UTF-8.
pub const MAX_GROUP_BYTES: usize = 256;
/// Longest `clientId`, in bytes of UTF-8.
pub const MAX_CLIENT_ID_BYTES: usize = 256;
/// Longest `requestId`, in bytes of UTF-8.
pub const MAX_REQUEST_ID_BYTES: usize = 128;
/// Longest `grantId` or `leaseId` a client may report, in bytes (a UUID is 36).
pub const MAX_REPORTED_ID_BYTES: usize = 64;

/// Longest `waitMs` of a request: how long the leader may hold a request that
/// a round left empty-handed, waiting for a later round that grants it
/// something. Half the Rust client's default call timeout.
pub const MAX_REQUEST_WAIT_MS: u64 = 15_000;

/// Demand entries (groups) in one request.
pub const MAX_DEMAND_ENTRIES: usize = 1_024;
/// Grant reports in one request or sync.
pub const MAX_GRANT_REPORTS: usize = 4_096;
/// Lease reports in one request or sync.
pub const MAX_LEASE_REPORTS: usize = 1_024;

/// Largest permit count a message may carry (demand `count`, reported `claimed`,
/// `released`, `drawn`). Reports are clamped to the grant anyway; this only keeps
/// arithmetic far from overflow.
pub const MAX_COUNT: u64 = 1_000_000_000;
/// Largest key `limit`, group `limit`, lease `reserve`/`extra` and `permitsPerLease`,
/// in permits. It also bounds live grants per key: every live grant holds a permit.
pub const MAX_LIMIT: u64 = 1_000_000;
/// Largest timestamp accepted (`oldestAt`), in ms since the Unix epoch: 2^53 - 1,
/// the largest integer JSON peers represent exactly.
pub const MAX_TIMESTAMP_MS: u64 = (1 << 53) - 1;
/// Longest delay a configuration may name (`roundWaitMs`, `roundPeriodMs`,
/// `grantTimeoutMs`, `ttlMs`), in ms: 2^31 - 1 (about 24.8 days), the longest
/// timer delay common runtimes accept.
pub const MAX_DELAY_MS: u64 = (1 << 31) - 1;
/// Largest lease provisioning ratio (`{"ratio": r}`); 1.0 reserves the whole limit.
pub const MAX_PROVISIONING_RATIO: f64 = 1_000.0;
/// Most groups one key may have settings for (`PUT .../groups/{group}`).
pub const MAX_CONFIGURED_GROUPS_PER_KEY: usize = 10_000;
/// Answers remembered per (key, clientId) for `requestId` de-duplication; the oldest
/// is forgotten first.
pub const MAX_REMEMBERED_ANSWERS_PER_CLIENT: usize = 32;
/// Answers remembered per key, all clients together; the one due to be
/// forgotten first goes first. Bounds a key's answer rows whatever the number
/// of clients.
pub const MAX_REMEMBERED_ANSWERS_PER_KEY: usize = 1_024;
/// How long a key delete's answer is kept for its `requestId`, in ms: far
/// longer than a client retries one call (permitctl's deadline is 10 s).
pub const DELETE_ANSWER_TTL_MS: u64 = 10 * 60 * 1_000;
/// Most key deletes remembered for their `requestId`s, all keys together; the
/// one due to be forgotten first goes first. Deletes are an operator's calls.
pub const MAX_REMEMBERED_DELETES: usize = 1_024;

/// Largest HTTP request body, in bytes (413 beyond).
pub const MAX_BODY_BYTES: usize = 1024 * 1024;
/// Items one `POST /v1/batch` carries (the body is bounded by `MAX_BODY_BYTES`
/// as any other). A client's poll across its keys and lanes fits in one call.
pub const MAX_BATCH_ITEMS: usize = 256;
/// Distinct keys one batch names: each may hold the call until its round, so
/// this bounds the rounds one call waits on.
pub const MAX_BATCH_KEYS: usize = 128;
/// Requests waiting for one key's round on the leader (429 beyond).
pub const MAX_PENDING_REQUESTS_PER_KEY: usize = 10_000;
/// Log entries of rounds and syncs the leader may have proposed and not yet
/// seen applied (`[limits] entries_in_flight`), and its default. One: what
/// falls due while an entry is in flight goes in the next, so entries grow
/// with the load and their number stays at one per commit. Measured against
/// 2 and 4 with and without a network's delay on the peer links, it served
/// more on every multi-key row at no cost in latency (docs/scaling.md, "One
/// entry in flight, with a network's delay").
pub const MAX_ENTRIES_IN_FLIGHT: usize = 64;
pub const DEFAULT_ENTRIES_IN_FLIGHT: usize = 1;
/// Message bytes (requests and syncs, as received) one round entry carries; more
/// wait for the next entry. One message always goes, so this is at least
/// `MAX_BODY_BYTES` in effect. Kept small so that one entry is sent, flushed and
/// applied well within a heartbeat's reach on a busy node; what is left goes
/// in the next entry, one commit later.
pub const MAX_ENTRY_MESSAGE_BYTES: usize = 1024 * 1024;
/// Keys whose rounds share one log entry; more wait for the next entry.
pub const MAX_KEYS_PER_ENTRY: usize = 256;
/// Requests and syncs waiting on the leader, all keys together
/// (`[limits] max_parked_messages`, at most this): 503 `overloaded` beyond.
pub const MAX_PARKED_MESSAGES: usize = 100_000;
/// Bytes (as received) of the requests and syncs waiting on the leader, all keys
/// together (`[limits] max_parked_bytes`, at most this): 503 `overloaded` beyond.
pub const MAX_PARKED_BYTES: usize = 256 * 1024 * 1024;
/// Longest a round or sync entry may wait to commit, in ms, before the leader
/// counts as cut off from its quorum (`[limits] commit_timeout_ms`, default):
/// its callers and every waiting message are answered 503 `no_quorum`.
pub const COMMIT_TIMEOUT_MS: u64 = 3_000;
/// Largest `[limits] commit_timeout_ms`.
pub const MAX_COMMIT_TIMEOUT_MS: u64 = 60_000;
/// Keys one cluster holds state for.
pub const MAX_KEYS: usize = 1_000_000;

/// Lifecycle events each node keeps in memory for `GET /v1/events` to resume
/// from; a `from` older than the oldest kept answers 410 `too_far_behind`
/// once older events were dropped.
pub const EVENT_BUFFER_EVENTS: usize = 10_000;
/// Event streams (`GET /v1/events`) one node serves at once (429
/// `too_many_subscribers` beyond).
pub const MAX_EVENT_SUBSCRIBERS: usize = 64;
/// Seconds between keep-alive comments on an idle event stream.
pub const EVENT_KEEP_ALIVE_SECONDS: u64 = 15;
/// Longest event-stream cursor (`cursor=`, `Last-Event-ID`), in bytes: one
/// log index of at most 20 digits per shard, a comma between two
/// (`contract::event_stream::EventCursor`). A cursor is also checked against
/// the stream's own shard count, so a node of S shards takes at most
/// `21 × S - 1` bytes.
pub const MAX_EVENT_CURSOR_BYTES: usize =
    EVENT_CURSOR_BYTES_PER_SHARD * crate::shard::MAX_SHARDS as usize - 1;
/// Bytes one shard's position may take in a cursor: a `u64` has at most 20
/// decimal digits, and one comma separates it from the next.
pub const EVENT_CURSOR_BYTES_PER_SHARD: usize = 21;

/// API tokens one cluster holds (`POST /v1/tokens` answers 409 beyond).
pub const MAX_TOKENS: usize = 1_000;
/// Longest token name, in bytes of UTF-8.
pub const MAX_TOKEN_NAME_BYTES: usize = 128;
/// Key patterns, and separately clientId patterns, one token may carry.
pub const MAX_TOKEN_PATTERNS: usize = 64;
/// Longest a connection may take to send a request's header, in ms; the time a
/// kept-alive connection sits idle before its next request counts too (hyper runs
/// one timer for both), so this is also the idle keep-alive timeout. The connection
/// is closed beyond it.
pub const HEADER_READ_TIMEOUT_MS: u64 = 10_000;
/// Longest pause between two parts of a request body, in ms (the body is refused
/// beyond it). `MAX_BODY_BYTES` bounds its size.
pub const BODY_READ_TIMEOUT_MS: u64 = 10_000;
/// Connections one listener of a node serves at once; further ones wait in the
/// kernel's accept queue until one closes.
pub const MAX_CONNECTIONS_PER_LISTENER: usize = 4_096;
