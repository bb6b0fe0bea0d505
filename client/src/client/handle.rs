//! [`SemaphoreClient`]: the handle a caller clones, and what its clones
//! share: one transport, the configuration, the leader tracker (with each
//! shard's leader), each key's
//! `nextRequestAt` and the time of the last node-id discovery. The calls
//! themselves are `impl` blocks in the files beside this one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use permitd_transport::Transport;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

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
    /// Backoff jitter and fresh ids: seeded by `config.seed`, else the OS's.
    rng: Mutex<StdRng>,
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
        let config_seed = config.seed;
        Ok(Self {
            inner: Arc::new(Inner {
                transport,
                config,
                tracker: Mutex::new(tracker),
                next_request_at_ms: Mutex::new(HashMap::new()),
                last_discovery: Mutex::new(None),
                rng: Mutex::new(match config_seed {
                    Some(seed) => StdRng::seed_from_u64(seed),
                    None => StdRng::from_os_rng(),
                }),
            }),
        })
    }

    /// A client with default settings for `endpoints`.
    pub fn connect<S: Into<String>>(
        endpoints: impl IntoIterator<Item = S>,
    ) -> Result<Self, ClientError> {
        Self::new(ClientConfig::new(endpoints))
    }

    /// The node currently asked first for calls naming no key (the meta
    /// shard's leader).
    pub fn leader(&self) -> Option<String> {
        self.tracker()
            .leader()
            .map(|endpoint| endpoint.as_str().to_string())
    }

    /// The node a call about `key` is sent to first: the leader of the key's
    /// shard, once an answer named it and its endpoint is known.
    pub fn leader_of_key(&self, key: &str) -> Option<String> {
        self.tracker()
            .leader_of_key(key)
            .map(|endpoint| endpoint.as_str().to_string())
    }

    /// The cluster's shard count, as the answers said (1 until one says otherwise).
    pub fn shard_count(&self) -> u32 {
        self.tracker().shard_count()
    }

    /// Callers hold the guard for one pick or update, never across an await.
    pub(super) fn tracker(&self) -> MutexGuard<'_, LeaderTracker> {
        self.inner.tracker.lock().expect("tracker lock")
    }
}

/// The client's seams: its wall clock and its random draws.
impl SemaphoreClient {
    /// Milliseconds since the Unix epoch by the client's clock.
    pub fn now_ms(&self) -> u64 {
        match &self.inner.config.wall_clock {
            Some(clock) => clock(),
            None => super::now_ms(),
        }
    }

    /// A draw in `[0, 1)`, for backoff jitter.
    pub(super) fn random_unit(&self) -> f64 {
        self.rng().random::<f64>()
    }

    /// A fresh random (version 4) UUID, for request and client ids.
    pub(crate) fn new_uuid(&self) -> uuid::Uuid {
        uuid::Builder::from_random_bytes(self.rng().random()).into_uuid()
    }

    fn rng(&self) -> std::sync::MutexGuard<'_, StdRng> {
        self.inner
            .rng
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
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
