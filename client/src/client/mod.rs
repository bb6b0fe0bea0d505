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
//!    pick a node (the remembered leader first, see [`crate::leader`]), send,
//!    and on a retryable failure (connection error, attempt timeout,
//!    502/503/504, 429) back off with capped exponential jitter
//!    ([`crate::backoff`]), never sooner than the server's `Retry-After`, and
//!    try again. When no node could serve the call, a readiness probe may find
//!    one sooner (`discovery.rs`). Anything else the server rejects ends the
//!    call with [`ClientError::Rejected`].
//! 3. One attempt's URL and token, and its answer (status, `x-permitd-leader`,
//!    `Retry-After`, error body, decoding), go through the helpers of
//!    `http.rs`. A success may start node-id discovery in the background
//!    (`discovery.rs`), so that a leader named by id can be asked directly.
//!
//! Retries are safe: a `request` always carries a `requestId` (a fresh UUID v4
//! when the caller set none), kept across the call's attempts, so the holder
//! answers a retry of a committed round with the original answer; reports are
//! cumulative and configuration writes replace whole values.
//!
//! `config.rs` holds [`ClientConfig`] and its defaults; `stream.rs` opens the
//! long-lived `GET`s of the event stream, which have no call deadline.

mod config;
mod discovery;
mod http;
mod next_request;
mod retry;
mod semaphores;
mod settings;
mod stream;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

pub use self::config::{
    ClientConfig, DEFAULT_ATTEMPT_TIMEOUT_MS, DEFAULT_CALL_TIMEOUT_MS, DEFAULT_CONNECT_TIMEOUT_MS,
};
pub use self::next_request::{believed_next_request_at, now_ms, MAX_NEXT_REQUEST_AHEAD_MS};
pub use self::semaphores::ItemResult;
use crate::error::ClientError;
use crate::leader::{parse_endpoints, LeaderTracker};

/// A cheaply cloneable handle on the cluster; clones share the leader and the
/// per-key `nextRequestAt`.
#[derive(Debug, Clone)]
pub struct SemaphoreClient {
    inner: Arc<Inner>,
}

/// What every clone of one [`SemaphoreClient`] shares.
#[derive(Debug)]
struct Inner {
    http: reqwest::Client,
    config: ClientConfig,
    /// A std mutex: held for a pick or an update, never across an await.
    tracker: Mutex<LeaderTracker>,
    /// Per key, ms since the epoch before which a request is not sent.
    next_request_at_ms: Mutex<HashMap<String, u64>>,
    /// When node ids were last asked for, to bound discovery.
    last_discovery: Mutex<Option<Instant>>,
}

impl SemaphoreClient {
    /// A client for `config`; fails on an empty or unparsable endpoint list.
    pub fn new(config: ClientConfig) -> Result<Self, ClientError> {
        let mut endpoints = Vec::new();
        for text in &config.endpoints {
            endpoints.extend(parse_endpoints(text)?);
        }
        let tracker = LeaderTracker::new(endpoints)?;
        let http = config::http_client(&config)?;
        Ok(Self {
            inner: Arc::new(Inner {
                http,
                config,
                tracker: Mutex::new(tracker),
                next_request_at_ms: Mutex::new(HashMap::new()),
                last_discovery: Mutex::new(None),
            }),
        })
    }

    /// A client with default settings for `endpoints`.
    pub fn connect<S: Into<String>>(
        endpoints: impl IntoIterator<Item = S>,
    ) -> Result<Self, ClientError> {
        Self::new(ClientConfig::new(endpoints))
    }

    /// The node currently asked first.
    pub fn leader(&self) -> Option<String> {
        self.tracker()
            .leader()
            .map(|endpoint| endpoint.as_str().to_string())
    }

    /// Callers hold the guard for one pick or update, never across an await.
    fn tracker(&self) -> MutexGuard<'_, LeaderTracker> {
        self.inner.tracker.lock().expect("tracker lock")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_endpoints_fail_construction() {
        assert!(matches!(
            SemaphoreClient::new(ClientConfig::new(Vec::<String>::new())),
            Err(ClientError::NoEndpoints)
        ));
        assert!(SemaphoreClient::connect(["ftp://x"]).is_err());
        assert!(SemaphoreClient::connect(["127.0.0.1:7001,127.0.0.1:7002"]).is_ok());
    }
}
