//! Waiting on conditions rather than for fixed times.

use std::time::{Duration, Instant};

use crate::{Cluster, POLL};

/// The leader's gauge of requests parked for a round or held.
pub const PENDING_REQUESTS: &str = "permitd_pending_requests";

/// Polls `check` until it holds or `timeout` passes; returns whether it held.
pub async fn eventually<F, Fut>(timeout: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if check().await {
            return true;
        }
        tokio::time::sleep(POLL).await;
    }
    false
}

/// Waits until node `id`'s `permitd_pending_requests` gauge (requests parked
/// for a round, or held, on that node) reads `expected`.
pub async fn wait_for_pending(cluster: &Cluster, id: u64, expected: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let pending = cluster.metric(id, PENDING_REQUESTS).await;
        if pending == Some(expected as f64) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "pending never reached {expected}: {pending:?}"
        );
        tokio::time::sleep(POLL).await;
    }
}
