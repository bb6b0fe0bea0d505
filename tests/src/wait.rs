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
    eventually_seen(timeout, || {
        let held = check();
        async move { (held.await, ()) }
    })
    .await
    .0
}

/// Polls `look` until what it saw satisfies it or `timeout` passes; returns
/// whether it did and the last thing seen (for the failure's message).
pub async fn eventually_seen<T, F, Fut>(timeout: Duration, mut look: F) -> (bool, T)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = (bool, T)>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let (held, seen) = look().await;
        if held || Instant::now() >= deadline {
            return (held, seen);
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Waits until node `id`'s `permitd_pending_requests` gauge (requests parked
/// for a round, or held, on that node) reads `expected`.
pub async fn wait_for_pending(cluster: &Cluster, id: u64, expected: u64) {
    let (reached, pending) = eventually_seen(Duration::from_secs(20), || async {
        let pending = cluster.metric(id, PENDING_REQUESTS).await;
        (pending == Some(expected as f64), pending)
    })
    .await;
    assert!(reached, "pending never reached {expected}: {pending:?}");
}
