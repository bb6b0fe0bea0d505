//! Finding the nodes: each node's own cluster status, asked directly; which
//! endpoint is which node id, learned in the background so that a leader named
//! by id in `x-permitd-leader` (the meta shard's, or any shard's) can be asked directly; and, when no node could
//! serve a call, waiting for one that knows a leader instead of sleeping out a
//! whole backoff.
//!
//! Nothing here goes through the call loop (`retry.rs`): these calls ask one
//! endpoint each, with a short limit, and feed what they learn to the tracker.

use std::time::Duration;

use permitd_core::contract::{paths, ClusterStatus};
use tokio::time::Instant;

use super::handle::SemaphoreClient;
use super::http::{decode, rejected};
use crate::error::ClientError;
use crate::leader::{find_ready, Endpoint, LeaderHint, READY_PROBE_INTERVAL_MS};
use crate::outgoing::Outgoing;
use crate::shard_leaders::ShardHint;

/// Least time between two rounds of node-id discovery (`/cluster/status`).
const NODE_ID_DISCOVERY_INTERVAL_MS: u64 = 30_000;

impl SemaphoreClient {
    /// The status of every endpoint, each asked directly (no leader routing);
    /// a node that does not answer yields its error.
    pub async fn cluster_status_of_each(
        &self,
    ) -> Vec<(String, Result<ClusterStatus, ClientError>)> {
        let endpoints: Vec<Endpoint> = self.tracker().endpoints().to_vec();
        let mut answers = Vec::with_capacity(endpoints.len());
        for endpoint in endpoints {
            let answer = self.status_of(&endpoint).await;
            if let Ok(status) = &answer {
                self.tracker().learn_node_id(&endpoint, status.id);
            }
            answers.push((endpoint.as_str().to_string(), answer));
        }
        answers
    }

    /// `endpoint`'s own `/cluster/status`, in one attempt of at most three
    /// connect timeouts.
    async fn status_of(&self, endpoint: &Endpoint) -> Result<ClusterStatus, ClientError> {
        let config = &self.inner.config;
        let limit = config.connect_timeout * 3;
        let url = endpoint.url(&paths::segments(paths::CLUSTER_STATUS, &[]));
        let response = Outgoing::get(&url)
            .bearer(config.token.as_deref())
            .limit(limit)
            .send(&self.inner.transport)
            .await
            .map_err(|error| ClientError::DeadlineExceeded {
                deadline: limit,
                attempts: 1,
                last: error.to_string(),
            })?;
        let status = response.status();
        let body = permitd_transport::collect(response.into_body())
            .await
            .unwrap_or_default();
        if !status.is_success() {
            return Err(rejected(status, &body));
        }
        decode(&url, &body)
    }

    /// Records that `endpoint` answered a call (`hint` its leader, `shard` its
    /// shard headers), and starts node-id discovery when a leader was named by
    /// an id that no endpoint is known to have (asking it directly would skip
    /// the forwarding hop).
    pub(super) fn note_answer(
        &self,
        endpoint: &Endpoint,
        hint: Option<&LeaderHint>,
        shard: Option<&ShardHint>,
    ) {
        let wants_ids = {
            let mut tracker = self.tracker();
            tracker.answered_for(endpoint, hint, shard);
            tracker.wants_node_ids()
        };
        if wants_ids {
            self.discover_node_ids();
        }
    }

    /// Learns which endpoint is which node id, in the background and rarely, so
    /// that a leader named by id can be asked directly.
    fn discover_node_ids(&self) {
        {
            let mut last = self.inner.last_discovery.lock().expect("discovery lock");
            let interval = Duration::from_millis(NODE_ID_DISCOVERY_INTERVAL_MS);
            if last.is_some_and(|at| at.elapsed() < interval) {
                return;
            }
            *last = Some(Instant::now());
        }
        let client = self.clone();
        tokio::spawn(async move {
            let answers = client.cluster_status_of_each().await;
            for (endpoint, answer) in answers {
                if let Err(error) = answer {
                    tracing::debug!(%endpoint, %error, "node id discovery");
                }
            }
        });
    }

    /// Waits until `wake` or until some node knows a leader, whichever is first,
    /// and makes that node the next one asked.
    pub(super) async fn wait_for_a_ready_node(&self, wake: Instant) {
        let endpoints = self.tracker().endpoints().to_vec();
        let floor = Instant::now() + Duration::from_millis(READY_PROBE_INTERVAL_MS);
        if let Some((endpoint, hint)) = find_ready(&self.inner.transport, &endpoints, wake).await {
            self.tracker().answered(&endpoint, hint.as_ref());
            // Never faster than one probe interval per retry.
            tokio::time::sleep_until(floor.min(wake)).await;
        }
    }
}
