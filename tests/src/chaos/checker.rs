//! The independent checker. It trusts only the job log the runners' own
//! `admit` writes (real start and end of every job) and, for the lost-grant
//! check, compares the cluster's count against what the log says is running.
//!
//! - **Concurrency**: per key, the most jobs whose [start, end) intervals
//!   overlap, from a sweep over the log (a start at the same instant as an end
//!   counts as overlapping: conservative). Must not exceed the key's limit
//!   (`limit + extra` for `over`).
//! - **Lost grants**: every ~300 ms, per key, read usage (linearizable) between
//!   instants `t1` and `t2`. Every job that started before `t1` and is still
//!   running at `t2` held its permit for the whole read, so the cluster must
//!   count at least that many (`granted + leased`). Jobs starting or ending
//!   during the read (in-flight rounds and reports) are left out, so the check
//!   has no timing slack to tune. The same read checks the cluster's own count
//!   against the bound.
//! - **Leaks**: once every job ended, usage must return to 0 granted, 0 leased
//!   within `2 × grantTimeout + lease TTL`. A key still holding then gets one
//!   round (a zero-demand request): if that brings it to zero, what was left was
//!   expired leases that only a round retires (reported, see [`Drained`]);
//!   otherwise it is a leak.
//! - **Jobs never run**: every enqueued job must have started and ended.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use permitd_client::SemaphoreClient;
use permitd_core::contract::protocol::{Demand, PermitRequest, V1};
use serde_json::{json, Value};

use super::workload::{JobLog, JobRecord, KeySpec};

/// Time between two lost-grant samples of one key.
const SAMPLE_EVERY: Duration = Duration::from_millis(300);
/// Limit on one usage read of the sampler.
const SAMPLE_TIMEOUT: Duration = Duration::from_secs(5);
/// Violations kept in full (the count is always exact).
const MAX_KEPT: usize = 50;

/// One broken property.
#[derive(Debug, Clone)]
pub struct Violation {
    /// `over_limit`, `usage_over_limit`, `lost_grant`, `leak`, `never_ran`,
    /// `no_recovery`, `profile_incomplete`.
    pub kind: &'static str,
    pub key: Option<String>,
    pub at_ms: u64,
    pub detail: String,
}

impl Violation {
    pub fn to_json(&self) -> Value {
        json!({"kind": self.kind, "key": self.key, "atMs": self.at_ms, "detail": self.detail})
    }
}

/// Violations found so far, shared by the checker's tasks.
#[derive(Debug, Default)]
pub struct Findings {
    kept: Mutex<Vec<Violation>>,
    by_kind: Mutex<BTreeMap<&'static str, u64>>,
}

impl Findings {
    pub fn add(&self, violation: Violation) {
        eprintln!(
            "chaos: VIOLATION {} {:?}: {}",
            violation.kind, violation.key, violation.detail
        );
        *self
            .by_kind
            .lock()
            .unwrap()
            .entry(violation.kind)
            .or_default() += 1;
        let mut kept = self.kept.lock().unwrap();
        if kept.len() < MAX_KEPT {
            kept.push(violation);
        }
    }

    pub fn total(&self) -> u64 {
        self.by_kind.lock().unwrap().values().sum()
    }

    pub fn by_kind(&self) -> BTreeMap<&'static str, u64> {
        self.by_kind.lock().unwrap().clone()
    }

    pub fn kept(&self) -> Vec<Violation> {
        self.kept.lock().unwrap().clone()
    }
}

/// Per-key figures of the usage sampler.
#[derive(Debug, Clone, Default)]
pub struct SampleStats {
    pub samples: u64,
    pub failed_reads: u64,
    /// Most `granted + leased` the cluster reported.
    pub max_held: u64,
    /// Most jobs that provably held a permit during one read.
    pub max_running_during_read: u64,
}

/// The lost-grant sampler, running until stopped.
#[derive(Debug)]
pub struct Sampler {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<BTreeMap<String, SampleStats>>,
}

impl Sampler {
    pub fn start(
        client: SemaphoreClient,
        specs: Vec<KeySpec>,
        log: Arc<JobLog>,
        findings: Arc<Findings>,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(sample(client, specs, log, findings, stop.clone()));
        Self { stop, task }
    }

    pub async fn stop(self) -> BTreeMap<String, SampleStats> {
        self.stop.store(true, Ordering::Release);
        self.task.await.unwrap_or_default()
    }
}

async fn sample(
    client: SemaphoreClient,
    specs: Vec<KeySpec>,
    log: Arc<JobLog>,
    findings: Arc<Findings>,
    stop: Arc<AtomicBool>,
) -> BTreeMap<String, SampleStats> {
    let mut stats: BTreeMap<String, SampleStats> = specs
        .iter()
        .map(|spec| (spec.key.to_string(), SampleStats::default()))
        .collect();
    while !stop.load(Ordering::Acquire) {
        for spec in &specs {
            let stat = stats.get_mut(spec.key).expect("known key");
            let t1 = Instant::now();
            let read = tokio::time::timeout(SAMPLE_TIMEOUT, client.usage(spec.key)).await;
            let Ok(Ok(usage)) = read else {
                stat.failed_reads += 1;
                continue;
            };
            // Still running now (t2), and started before t1.
            let running = log.running_since(spec.key, t1);
            let held = usage.granted + usage.leased;
            stat.samples += 1;
            stat.max_held = stat.max_held.max(held);
            stat.max_running_during_read = stat.max_running_during_read.max(running);
            let at_ms = log.origin.elapsed().as_millis() as u64;
            if held < running {
                findings.add(Violation {
                    kind: "lost_grant",
                    key: Some(spec.key.to_string()),
                    at_ms,
                    detail: format!(
                        "{running} jobs held permits through the read, the cluster counts \
                         {} granted + {} leased",
                        usage.granted, usage.leased
                    ),
                });
            }
            if held > spec.bound {
                findings.add(Violation {
                    kind: "usage_over_limit",
                    key: Some(spec.key.to_string()),
                    at_ms,
                    detail: format!(
                        "the cluster counts {} granted + {} leased, bound {}",
                        usage.granted, usage.leased, spec.bound
                    ),
                });
            }
        }
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
    stats
}

/// The most jobs of one key that ran at once, and when (ms since the origin).
#[derive(Debug, Clone, Copy, Default)]
pub struct Concurrency {
    pub max: u64,
    pub at_ms: u64,
}

/// Per key, the most overlapping [start, end) intervals in the log.
pub fn max_concurrency(
    origin: Instant,
    jobs: &[(String, JobRecord)],
) -> BTreeMap<String, Concurrency> {
    // (time, +1 start / -1 end); at equal times starts sort first (conservative).
    let mut events: BTreeMap<String, Vec<(Instant, i8)>> = BTreeMap::new();
    for (_, job) in jobs {
        let Some(start) = job.start else { continue };
        let list = events.entry(job.key.clone()).or_default();
        list.push((start, 1));
        if let Some(end) = job.end {
            list.push((end, -1));
        }
    }
    events
        .into_iter()
        .map(|(key, mut list)| {
            list.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
            let mut now = 0i64;
            let mut best = Concurrency::default();
            for (at, delta) in list {
                now += i64::from(delta);
                if now as u64 > best.max {
                    best = Concurrency {
                        max: now as u64,
                        at_ms: at.saturating_duration_since(origin).as_millis() as u64,
                    };
                }
            }
            (key, best)
        })
        .collect()
}

/// How one key came back to zero after the drain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Drained {
    /// Usage reached 0 granted, 0 leased this many ms into the drain window.
    Zero(u64),
    /// Still held at the end of the window, but a round of the key (one
    /// zero-demand request from the checker) brought it to zero: expired leases
    /// nobody reported (their grant answer was lost with a killed leader) are
    /// retired only by the key's next round. What the window left is kept.
    ZeroAfterRound(String),
    /// Still held after the window and a round: a leak.
    Leak(String),
}

/// Polls usage of every key until it is 0 granted, 0 leased, or `within`
/// passes; a key still holding then gets one round (see [`Drained`]).
pub async fn wait_drained(
    client: &SemaphoreClient,
    specs: &[KeySpec],
    within: Duration,
) -> BTreeMap<String, Drained> {
    let start = Instant::now();
    let deadline = start + within;
    let mut outcome = BTreeMap::new();
    for spec in specs {
        let result = match poll_zero(client, spec.key, deadline).await {
            Ok(()) => Drained::Zero(start.elapsed().as_millis() as u64),
            Err(left) => {
                let poke = PermitRequest {
                    v: V1,
                    client_id: "chaos-checker".into(),
                    request_id: None,
                    demand: vec![Demand {
                        group: "checker".into(),
                        count: 0,
                        oldest_at_ms: 1,
                    }],
                    grants: Vec::new(),
                    leases: None,
                    wait_ms: None,
                };
                let _ = tokio::time::timeout(SAMPLE_TIMEOUT, client.request(spec.key, poke)).await;
                let again = Instant::now() + Duration::from_secs(5);
                match poll_zero(client, spec.key, again).await {
                    Ok(()) => Drained::ZeroAfterRound(left),
                    Err(still) => Drained::Leak(format!("{left}; after a round: {still}")),
                }
            }
        };
        outcome.insert(spec.key.to_string(), result);
    }
    outcome
}

/// Polls one key's usage until it is zero (`Ok`) or `deadline` passes (`Err`
/// with the last usage seen).
async fn poll_zero(client: &SemaphoreClient, key: &str, deadline: Instant) -> Result<(), String> {
    loop {
        let read = tokio::time::timeout(SAMPLE_TIMEOUT, client.usage(key)).await;
        let last = match read {
            Ok(Ok(usage)) if usage.granted == 0 && usage.leased == 0 => return Ok(()),
            Ok(Ok(usage)) => format!("{} granted, {} leased", usage.granted, usage.leased),
            Ok(Err(error)) => format!("usage failed: {error}"),
            Err(_) => "usage timed out".to_string(),
        };
        if Instant::now() >= deadline {
            return Err(last);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(key: &str, start: Option<u64>, end: Option<u64>, origin: Instant) -> JobRecord {
        let at = |ms: u64| origin + Duration::from_millis(ms);
        JobRecord {
            key: key.into(),
            runner: 0,
            duration_ms: 0,
            start: start.map(at),
            end: end.map(at),
            permit: Some("grant"),
            admits: 1,
        }
    }

    #[test]
    fn overlapping_intervals_are_counted_per_key() {
        let origin = Instant::now();
        let jobs = vec![
            ("a1".to_string(), job("a", Some(0), Some(10), origin)),
            ("a2".to_string(), job("a", Some(5), Some(20), origin)),
            ("a3".to_string(), job("a", Some(10), Some(30), origin)), // touches a1's end
            ("a4".to_string(), job("a", Some(25), None, origin)),     // never ended
            ("a5".to_string(), job("a", None, None, origin)),         // never ran
            ("b1".to_string(), job("b", Some(0), Some(1), origin)),
            ("b2".to_string(), job("b", Some(1), Some(2), origin)),
        ];
        let seen = max_concurrency(origin, &jobs);
        // a1, a2, a3 at 10 ms (a start at an end's instant counts as overlapping).
        assert_eq!(seen["a"].max, 3);
        assert_eq!(seen["a"].at_ms, 10);
        assert_eq!(seen["b"].max, 2);
    }
}
