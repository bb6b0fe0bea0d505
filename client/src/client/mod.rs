//! [`SemaphoreClient`]: every call of the v1 API against a list of nodes.
//!
//! How one call flows, file by file (all under `client/src/client/`):
//! 1. An endpoint method builds a path and a body and hands them to the call
//!    loop: `semaphores.rs` holds the runner's calls (`request`, `sync`,
//!    `batch`, `usage`), `settings.rs` the operator's configuration of keys,
//!    groups and tokens; the crate's [`admin`](crate::admin) (listing,
//!    holders, force release, cluster status and membership) and
//!    [`events`](crate::events) add more. A `request` first waits for its
//!    key's `nextRequestAt` from the previous answer (`next_request.rs`): the
//!    holder would not run the round sooner.
//! 2. The call loop (`retry.rs`) makes attempts inside a per-call deadline:
//!    pick a node (the remembered leader first: for a call about a key, the
//!    leader of the key's shard, see [`crate::leader`]), send,
//!    and on a retryable failure (connection error, attempt timeout,
//!    502/503/504, 429) back off with capped exponential jitter
//!    ([`crate::backoff`]), never sooner than the server's `Retry-After`, and
//!    try again. When no node could serve the call, a readiness probe may find
//!    one sooner (`discovery.rs`). Anything else the server rejects ends the
//!    call with [`ClientError::Rejected`](crate::ClientError::Rejected).
//! 3. One attempt's URL and token, and its answer (status, `x-permitd-leader`,
//!    `x-permitd-shard` and `x-permitd-shards`, `Retry-After`, error body, decoding), go through the helpers of
//!    `http.rs`. A success may start node-id discovery in the background
//!    (`discovery.rs`), so that a leader named by id can be asked directly.
//!
//! Retries are safe: a `request` always carries a `requestId` (a fresh UUID v4
//! when the caller set none), kept across the call's attempts, so the holder
//! answers a retry of a committed round with the original answer; reports are
//! cumulative and configuration writes replace whole values.
//!
//! `handle.rs` holds the [`SemaphoreClient`] itself and what its clones
//! share; `config.rs` holds [`ClientConfig`] and its defaults; `stream.rs`
//! opens the long-lived `GET`s of the event stream, which have no call
//! deadline. This file only declares and re-exports, so that no file below
//! names it back (its module graph stays acyclic: `scripts/module-arrows client/src`).

mod config;
mod discovery;
mod handle;
mod http;
mod next_request;
mod retry;
mod semaphores;
mod settings;
mod stream;

pub use self::config::{
    ClientConfig, DEFAULT_ATTEMPT_TIMEOUT_MS, DEFAULT_CALL_TIMEOUT_MS, DEFAULT_CONNECT_TIMEOUT_MS,
};
pub use self::handle::SemaphoreClient;
pub use self::next_request::{believed_next_request_at, now_ms, MAX_NEXT_REQUEST_AHEAD_MS};
pub use self::semaphores::ItemResult;
