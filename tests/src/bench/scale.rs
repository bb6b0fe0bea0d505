//! Scale: grow the number of keys that hold a live (unclaimed, long-lived)
//! grant, and at each size measure one client's round overhead on another key
//! and the leader's resident memory.
//!
//! The leader's RSS is sampled every [`RSS_SAMPLE_EVERY`] for
//! [`RSS_WINDOW`] while the probe runs (the populated keys are idle then), and
//! the median sample is the size's reading: the leader builds a snapshot from
//! time to time, and a build holds a copy of the state and its encoding for
//! a moment (up to +40% of the RSS at 100,000 keys), so a single reading lands in
//! one by chance and measures the build rather than the keys. The median is the
//! level the leader sits at as long as builds cover less than half the window;
//! the peak sample is reported beside it, so the builds' price stays visible.
//!
//! The scale cluster snapshots every [`SCALE_SNAPSHOT_EVERY_LOGS`] entries,
//! the shipped `cluster.toml`'s policy, not the test harness's ten times more
//! frequent one: the section measures what an operator runs.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::grant::{self, bench_http, GrantRun};
use super::stats::{quantile, rss_bytes};
use crate::Cluster;

/// Concurrent requests while keys are created.
const POPULATE_CONCURRENCY: usize = 64;
/// Claim deadline of the live grants: longer than any run.
const LIVE_GRANT_TIMEOUT_MS: u64 = 3_600_000;
/// Pause after populating, so snapshots and timers settle before probing.
const SETTLE: Duration = Duration::from_secs(2);
/// How often the leader's RSS is read while a size is probed.
const RSS_SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// For how long it is read (at least; the probe may run longer).
const RSS_WINDOW: Duration = Duration::from_secs(4);
/// `[raft] snapshot_every_logs` of the scale cluster: the shipped `cluster.toml`'s.
pub const SCALE_SNAPSHOT_EVERY_LOGS: u64 = 5_000;

/// One size's measurements.
#[derive(Debug, Clone, Default)]
pub struct ScalePoint {
    pub keys: usize,
    pub overhead_ms_p50: f64,
    pub overhead_ms_p99: f64,
    /// The leader's RSS: the median of the samples (see the module comment).
    pub rss_bytes: u64,
    /// The highest sample (a snapshot build, when one ran in the window).
    pub rss_bytes_peak: u64,
    pub rss_samples: usize,
    /// Median RSS growth per key since the first size.
    pub rss_bytes_per_key: Option<f64>,
    /// Peak RSS of this size less the first size's median, per key.
    pub rss_bytes_per_key_peak: Option<f64>,
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
        let tag = format!("probe-{size}");
        let (result, rss) = tokio::join!(
            grant::run(cluster, leader, &run, &tag),
            sample_rss(pid, RSS_WINDOW)
        );
        let per_key = |bytes: u64| {
            points.first().map(|first: &ScalePoint| {
                (bytes as f64 - first.rss_bytes as f64) / (size as f64 - first.keys as f64)
            })
        };
        let point = ScalePoint {
            keys: size,
            overhead_ms_p50: result.overhead_ms_p50,
            overhead_ms_p99: result.overhead_ms_p99,
            rss_bytes: rss.median,
            rss_bytes_peak: rss.peak,
            rss_samples: rss.samples,
            rss_bytes_per_key: per_key(rss.median),
            rss_bytes_per_key_peak: per_key(rss.peak),
            populate_keys_per_s,
        };
        points.push(point);
    }
    points
}

/// The leader's RSS over a window.
struct RssSamples {
    median: u64,
    peak: u64,
    samples: usize,
}

/// Reads `pid`'s RSS every [`RSS_SAMPLE_EVERY`] for `window`.
async fn sample_rss(pid: u32, window: Duration) -> RssSamples {
    let mut samples = Vec::new();
    let mut tick = tokio::time::interval(RSS_SAMPLE_EVERY);
    let end = tokio::time::Instant::now() + window;
    while tokio::time::Instant::now() < end {
        tick.tick().await;
        if let Some(bytes) = rss_bytes(pid) {
            samples.push(bytes as f64);
        }
    }
    let peak = samples.iter().copied().fold(0.0, f64::max);
    let count = samples.len();
    RssSamples {
        median: quantile(&mut samples, 0.5).max(0.0) as u64,
        peak: peak as u64,
        samples: count,
    }
}

/// Gives keys `from..to` one live grant each.
async fn populate(cluster: &Cluster, leader: u64, from: usize, to: usize) {
    // Defaults with the long claim deadline, before any of these keys exists.
    let defaults = serde_json::json!({"limit": 32, "roundWaitMs": 1, "roundPeriodMs": 1,
        "grantTimeoutMs": LIVE_GRANT_TIMEOUT_MS});
    super::stats::set_defaults(cluster, leader, &defaults).await;
    let http = bench_http(cluster);
    let url = cluster.node(leader).url();
    let next = Arc::new(AtomicUsize::new(from));
    let demand_at = permitd_client::client::now_ms();
    let body = serde_json::to_vec(&super::one_permit("scale".into(), demand_at, Vec::new()))
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
