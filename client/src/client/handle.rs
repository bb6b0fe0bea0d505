//! [`SemaphoreClient`]: the handle a caller clones, and what its clones
//! share: one transport, the configuration, the leader tracker, each key's
//! `nextRequestAt` and the time of the last node-id discovery. The calls
//! themselves are `impl` blocks in the files beside this one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use permitd_transport::Transport;

use super::config::{transport, ClientConfig};
use crate::error::ClientError;
use crate::leader::{parse_endpoints, LeaderTracker};

/// A cheaply cloneable handle on the cluster; clones share the leader and the
/// per-key `nextRequestAt`.
#[derive(Debug, Clone)]
pub struct SemaphoreClient {
    pub(super) inner: Arc<Inner>,
}

/// What every clone of one [`SemaphoreClient`] shares.
#[derive(Debug)]
pub(super) struct Inner {
    /// Every HTTP exchange goes through it (`crate::outgoing`).
    pub(super) transport: Transport,
    pub(super) config: ClientConfig,
    /// A std mutex: held for a pick or an update, never across an await.
    tracker: Mutex<LeaderTracker>,
    /// Per key, ms since the epoch before which a request is not sent.
    pub(super) next_request_at_ms: Mutex<HashMap<String, u64>>,
    /// When node ids were last asked for, to bound discovery.
    pub(super) last_discovery: Mutex<Option<Instant>>,
}

impl SemaphoreClient {
    /// A client for `config`; fails on an empty or unparsable endpoint list.
    pub fn new(config: ClientConfig) -> Result<Self, ClientError> {
        let mut endpoints = Vec::new();
        for text in &config.endpoints {
            endpoints.extend(parse_endpoints(text)?);
        }
        let tracker = LeaderTracker::new(endpoints)?;
        let transport = transport(&config)?;
        Ok(Self {
            inner: Arc::new(Inner {
                transport,
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
    pub(super) fn tracker(&self) -> MutexGuard<'_, LeaderTracker> {
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
