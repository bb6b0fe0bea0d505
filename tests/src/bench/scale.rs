//! Scale: grow the number of keys that hold a live (unclaimed, long-lived)
//! grant, and at each size measure one client's round overhead on another key
//! and the leader's resident memory.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::grant::{self, bench_http, GrantRun};
use super::stats::rss_bytes;
use crate::Cluster;

/// Concurrent requests while keys are created.
const POPULATE_CONCURRENCY: usize = 64;
/// Claim deadline of the live grants: longer than any run.
const LIVE_GRANT_TIMEOUT_MS: u64 = 3_600_000;
/// Pause after populating, so snapshots and timers settle before probing.
const SETTLE: Duration = Duration::from_secs(2);

/// One size's measurements.
#[derive(Debug, Clone, Default)]
pub struct ScalePoint {
    pub keys: usize,
    pub overhead_ms_p50: f64,
    pub overhead_ms_p99: f64,
    pub rss_bytes: u64,
    /// RSS growth per key since the first size.
    pub rss_bytes_per_key: Option<f64>,
    pub populate_keys_per_s: f64,
}

/// Measures every size in `sizes` (ascending) on a fresh `cluster`.
pub async fn run(cluster: &Cluster, sizes: &[usize], probe: Duration) -> Vec<ScalePoint> {
    let leader = cluster.wait_for_leader().await;
    let pid = cluster.node(leader).pid().expect("the leader runs");
    let mut points: Vec<ScalePoint> = Vec::new();
    let mut held = 0;
    for &size in sizes {
        let started = std::time::Instant::now();
        populate(cluster, leader, held, size).await;
        let populate_keys_per_s = (size - held) as f64 / started.elapsed().as_secs_f64();
        held = size;
        tokio::time::sleep(SETTLE).await;
        let run = GrantRun {
            clients: 1,
            keys: 1,
            round_wait_ms: 1,
            limit: 32,
            grant_timeout_ms: LIVE_GRANT_TIMEOUT_MS,
            with_syncs: false,
            warmup: Duration::from_millis(300),
            measure: probe,
        };
        let result = grant::run(cluster, leader, &run, &format!("probe-{size}")).await;
        let rss = rss_bytes(pid).unwrap_or(0);
        let rss_bytes_per_key = points
            .first()
            .map(|first| (rss as f64 - first.rss_bytes as f64) / (size as f64 - first.keys as f64));
        points.push(ScalePoint {
            keys: size,
            overhead_ms_p50: result.overhead_ms_p50,
            overhead_ms_p99: result.overhead_ms_p99,
            rss_bytes: rss,
            rss_bytes_per_key,
            populate_keys_per_s,
        });
    }
    points
}

/// Gives keys `from..to` one live grant each.
async fn populate(cluster: &Cluster, leader: u64, from: usize, to: usize) {
    // Defaults with the long claim deadline, before any of these keys exists.
    let defaults = serde_json::json!({"limit": 32, "roundWaitMs": 1, "roundPeriodMs": 1,
        "grantTimeoutMs": LIVE_GRANT_TIMEOUT_MS});
    super::stats::set_defaults(cluster, leader, &defaults).await;
    let http = bench_http();
    let url = cluster.node(leader).url();
    let next = Arc::new(AtomicUsize::new(from));
    let body = serde_json::to_vec(&super::one_permit("scale".into(), Vec::new()))
        .expect("protocol values serialise");
    let mut workers = Vec::new();
    for _ in 0..POPULATE_CONCURRENCY {
        let (http, url, next, body) = (http.clone(), url.clone(), next.clone(), body.clone());
        workers.push(tokio::spawn(async move {
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                if index >= to {
                    return;
                }
                let endpoint = format!("{url}/v1/semaphores/scale-{index}");
                for _ in 0..5 {
                    let sent = http
                        .post(&endpoint)
                        .header(reqwest::header::CONTENT_TYPE, "application/json")
                        .body(body.clone())
                        .send()
                        .await;
                    if sent.is_ok_and(|answer| answer.status().is_success()) {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }));
    }
    for worker in workers {
        worker.await.expect("populate worker");
    }
}
