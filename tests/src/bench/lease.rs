//! The lease path: `SemaphoreQueue` runners (in memory, strict leases or none) whose
//! application releases every admitted item at once, so each admission is one
//! whole permit cycle: enqueue → permit (a drawn lease permit, or a claimed
//! grant) → admit → release → reported back to the holder.
//!
//! A run's runners share one key, or are spread over several (runner `r` on
//! the key's `r mod keys`-th variant, [`LeaseRun::key_of`]). A feeder per
//! runner keeps a backlog queued; cycles are counted in `admit`,
//! and those admitted under a drawn lease permit apart, so a run shows whether
//! leases were issued at all. Contended runs (more runners than permits) also
//! time every admission, for the reuse gap ([`super::reuse`]).
//!
//! The window's cost ([`super::cpu`]) counts each admission as one cycle; the
//! runners' HTTP calls are counted by the nodes (the queue sends them).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use permitd_client::{
    Admission, AdmittedItem, ClientConfig, ItemPermit, QueueConfig, QueueItem, SemaphoreClient,
    SemaphoreQueue,
};
use serde_json::json;

use super::cpu::{Calls, Cost, Window};
use super::reuse;
use super::stats::{quantile, set_key_config};
use crate::{Cluster, ADMIN_TOKEN};

/// Items kept queued per runner, unless a run names fewer.
pub const BACKLOG: usize = 4_096;
/// Items per `enqueue` call.
const ENQUEUE_BATCH: usize = 1_024;
/// Pause of a feeder whose backlog is full.
const FEED_PAUSE: Duration = Duration::from_millis(2);

/// One lease-path run.
#[derive(Debug, Clone)]
pub struct LeaseRun {
    pub runners: usize,
    /// Keys the runners are spread over, each with `limit`.
    pub keys: usize,
    pub limit: u64,
    /// Strict leases on the key; otherwise grants only.
    pub leases: bool,
    /// Items each runner keeps queued.
    pub backlog: usize,
    pub permits_per_lease: u64,
    pub round_wait_ms: u64,
    pub warmup: Duration,
    pub measure: Duration,
}

impl LeaseRun {
    /// More runners on a key than its permits: every freed permit has a
    /// taker waiting.
    pub fn contended(&self) -> bool {
        (self.runners / self.keys.max(1)) as u64 > self.limit
    }

    /// Runner `runner`'s key: `key` itself when the run has one.
    pub fn key_of(&self, key: &str, runner: usize) -> String {
        match self.keys {
            0 | 1 => key.to_owned(),
            keys => format!("{key}-{}", runner % keys),
        }
    }
}

/// What one run measured.
#[derive(Debug, Clone, Default)]
pub struct LeaseResult {
    pub cycles_per_s: f64,
    /// Of those, cycles under a drawn lease permit.
    pub lease_cycles_per_s: f64,
    pub entries_per_s: f64,
    /// Contended runs: a freed permit's idle time, p50 and p99, in ms.
    pub reuse_gap_ms: Option<(f64, f64)>,
    /// CPU, entries and calls per admission in the window.
    pub cost: Cost,
}

/// The application side: counts and releases every admitted item.
#[derive(Debug, Clone)]
struct Releaser {
    cycles: Arc<AtomicU64>,
    lease_cycles: Arc<AtomicU64>,
    queue: Arc<Mutex<Weak<SemaphoreQueue<u8>>>>,
    /// When each item was admitted, on contended runs.
    admitted_at: Option<Arc<Mutex<Vec<Instant>>>>,
}

impl Admission<u8> for Releaser {
    async fn admit(&self, items: Vec<AdmittedItem<u8>>) {
        let queue = self.queue.lock().expect("queue slot").upgrade();
        let Some(queue) = queue else { return };
        if let Some(admitted_at) = &self.admitted_at {
            let now = Instant::now();
            admitted_at
                .lock()
                .expect("admissions")
                .extend(std::iter::repeat_n(now, items.len()));
        }
        let mut leased = 0;
        for item in &items {
            let _ = queue.release(&item.id);
            leased += u64::from(matches!(item.permit, ItemPermit::Lease { .. }));
        }
        self.cycles.fetch_add(items.len() as u64, Ordering::Relaxed);
        self.lease_cycles.fetch_add(leased, Ordering::Relaxed);
    }

    async fn finished(&self, _ids: Vec<String>) -> Vec<String> {
        Vec::new()
    }
}

/// Runs `run` on key `key` (or its variants, [`LeaseRun::key_of`]).
pub async fn run(cluster: &Cluster, leader: u64, run: &LeaseRun, key: &str) -> LeaseResult {
    let wait = run.round_wait_ms;
    let leases = run.leases.then(
        || json!({"provisioning": {"mode": "strict"}, "permitsPerLease": run.permits_per_lease}),
    );
    let config = json!({"limit": run.limit, "roundWaitMs": wait, "roundPeriodMs": wait,
        "grantTimeoutMs": 60_000, "leases": leases});
    for runner in 0..run.keys.max(1) {
        set_key_config(cluster, leader, &run.key_of(key, runner), &config).await;
    }
    let mut client_config = ClientConfig::new(cluster.nodes.iter().map(|node| node.url()));
    client_config.token = Some(ADMIN_TOKEN.to_string());
    super::transport::transport().client(cluster, &mut client_config);
    let client = SemaphoreClient::new(client_config).expect("client");
    let cycles = Arc::new(AtomicU64::new(0));
    let lease_cycles = Arc::new(AtomicU64::new(0));
    // The gaps match a key's returns to its admissions, which are timed
    // together: one key only.
    let admitted_at = (run.contended() && run.keys <= 1 && reuse::install())
        .then(|| Arc::new(Mutex::new(Vec::new())));
    reuse::take_returns(key);
    let started = Instant::now();
    let window_start = started + run.warmup;
    let window_end = window_start + run.measure;
    let mut runners = Vec::new();
    for runner in 0..run.runners {
        let slot = Arc::new(Mutex::new(Weak::new()));
        let releaser = Releaser {
            cycles: cycles.clone(),
            lease_cycles: lease_cycles.clone(),
            queue: slot.clone(),
            admitted_at: admitted_at.clone(),
        };
        let mut config = QueueConfig::new(format!("{key}-runner-{runner}"));
        config.shutdown_timeout = Duration::from_secs(2);
        let queue =
            Arc::new(SemaphoreQueue::start(client.clone(), config, releaser).expect("queue"));
        *slot.lock().expect("queue slot") = Arc::downgrade(&queue);
        runners.push(tokio::spawn(feed(
            queue,
            run.key_of(key, runner),
            runner,
            run.backlog,
            window_end,
        )));
    }
    tokio::time::sleep_until(window_start.into()).await;
    let first_leased = lease_cycles.load(Ordering::Relaxed);
    let first_cycles = cycles.load(Ordering::Relaxed);
    let window = Window::open(cluster, leader, Calls::Served).await;
    tokio::time::sleep_until(window_end.into()).await;
    let last_leased = lease_cycles.load(Ordering::Relaxed);
    let last_cycles = cycles.load(Ordering::Relaxed);
    let cost = window.close(cluster).await;
    // All at once: a contended runner's shutdown waits for its held request
    // (up to its `waitMs`), and one by one the 64 runners took ~36 s.
    let shutdowns: Vec<_> = runners
        .into_iter()
        .map(|runner| {
            tokio::spawn(async move {
                let queue = runner.await.expect("feeder");
                let _ = queue.shutdown().await;
            })
        })
        .collect();
    for shutdown in shutdowns {
        shutdown.await.expect("queue shutdown");
    }
    let seconds = run.measure.as_secs_f64();
    let cycles_per_s = (last_cycles - first_cycles) as f64 / seconds;
    let cost = cost.with_cycles_per_s(cycles_per_s);
    let reuse_gap_ms = admitted_at.map(|admitted_at| {
        let admissions = admitted_at.lock().expect("admissions").clone();
        let returns = reuse::take_returns(key);
        let limit = run.limit as usize;
        let mut gaps = reuse::gaps_ms(&returns, &admissions, limit, window_start, window_end);
        (quantile(&mut gaps, 0.5), quantile(&mut gaps, 0.99))
    });
    LeaseResult {
        cycles_per_s,
        lease_cycles_per_s: (last_leased - first_leased) as f64 / seconds,
        entries_per_s: cost.entries_per_s(),
        reuse_gap_ms,
        cost,
    }
}

/// Keeps `BACKLOG` items queued until `until`; hands the queue back.
async fn feed(
    queue: Arc<SemaphoreQueue<u8>>,
    key: String,
    runner: usize,
    backlog: usize,
    until: Instant,
) -> Arc<SemaphoreQueue<u8>> {
    let mut next = 0u64;
    while Instant::now() < until {
        let queued = queue.counts().queued;
        if queued >= backlog {
            tokio::time::sleep(FEED_PAUSE).await;
            continue;
        }
        let items = (0..ENQUEUE_BATCH.min(backlog - queued))
            .map(|_| {
                next += 1;
                QueueItem {
                    id: format!("{runner}-{next}"),
                    key: key.clone(),
                    group: "g".into(),
                    body: 0,
                }
            })
            .collect();
        if queue.enqueue(items).await.is_err() {
            break;
        }
    }
    queue
}
