//! The workload: job runners built on `SemaphoreQueue`, a producer per runner
//! that keeps every key's backlog full, and the shared job log that the checker
//! reads.
//!
//! The application side ([`Runner`]) is the only place jobs start and end: its
//! `admit` spawns the job and writes the real start and end times into the
//! [`JobLog`], then releases the item. Nothing in the log comes from permitd.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use permitd_client::{
    Admission, AdmittedItem, ClientConfig, ItemPermit, QueueConfig, QueueItem, SemaphoreClient,
    SemaphoreQueue, StateConfig,
};
use permitd_core::config::{Amount, LeasePolicy, Provisioning};
use permitd_core::tokens::{Role, TokenSpec};
use permitd_core::KeyConfigUpdate;
use rand::Rng;

use super::random::{RandomState, ReplayRng};

/// Claim window of every chaos key, in ms.
pub const GRANT_TIMEOUT_MS: u64 = 3_000;
/// Lease lifetime of every leasing chaos key, in ms: long against any single
/// outage the nemesis causes, so a heartbeat always gets through in time.
pub const LEASE_TTL_MS: u64 = 15_000;
/// Most items each runner keeps queued per key. Every few seconds each runner
/// draws a new target per key from 0 to this, so keys swing between contention
/// (demand well over the limit) and slack (where leases are handed out).
const BACKLOG: u64 = 6;
/// How long one backlog target lasts.
const PHASE: Duration = Duration::from_secs(3);
/// Shortest and longest job, in ms.
const JOB_MS: (u64, u64) = (30, 400);

/// One key of the workload.
#[derive(Debug, Clone)]
pub struct KeySpec {
    pub key: &'static str,
    /// `strict`, `under`, `over` or `none`.
    pub mode: &'static str,
    pub limit: u64,
    /// What may run at once: `limit`, or `limit + extra` for `over`.
    pub bound: u64,
    pub leases: Option<LeasePolicy>,
}

/// The four keys: strict leases, `under`, `over`, and no leases.
pub fn key_specs() -> Vec<KeySpec> {
    let policy = |provisioning| LeasePolicy {
        permits_per_lease: 2,
        ttl_ms: LEASE_TTL_MS,
        ..LeasePolicy::with_provisioning(provisioning)
    };
    vec![
        KeySpec {
            key: "chaos-strict",
            mode: "strict",
            limit: 8,
            bound: 8,
            leases: Some(policy(Provisioning::Strict)),
        },
        KeySpec {
            key: "chaos-under",
            mode: "under",
            limit: 8,
            bound: 8,
            leases: Some(policy(Provisioning::Under {
                reserve: Amount::Permits(3),
            })),
        },
        KeySpec {
            key: "chaos-over",
            mode: "over",
            limit: 6,
            bound: 6 + 3,
            leases: Some(policy(Provisioning::Over {
                extra: Amount::Permits(3),
            })),
        },
        KeySpec {
            key: "chaos-none",
            mode: "none",
            limit: 6,
            bound: 6,
            leases: None,
        },
    ]
}

/// Writes every key's configuration (retried: the cluster may be electing).
pub async fn configure(client: &SemaphoreClient, specs: &[KeySpec]) {
    for spec in specs {
        let update = KeyConfigUpdate {
            limit: Some(spec.limit),
            round_wait_ms: Some(20),
            round_period_ms: Some(50),
            grant_timeout_ms: Some(GRANT_TIMEOUT_MS),
            leases: Some(spec.leases.clone()),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match client.set_key_config(spec.key, &update).await {
                Ok(applied) if applied.limit == spec.limit => break,
                outcome => {
                    assert!(
                        Instant::now() < deadline,
                        "configure {}: {outcome:?}",
                        spec.key
                    );
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }
}

/// A runner token for the workload's keys and runners' client ids, created
/// with the admin client (retried: the cluster may still be settling).
pub async fn runner_token(admin: &SemaphoreClient, specs: &[KeySpec]) -> String {
    let spec = TokenSpec {
        name: "chaos-runners".into(),
        role: Role::Runner,
        keys: specs.iter().map(|spec| spec.key.to_string()).collect(),
        client_ids: vec!["chaos-runner-*".into()],
    };
    for _ in 0..50 {
        match admin.create_token(&spec).await {
            Ok(created) => return created.token,
            Err(error) => {
                eprintln!("creating the runner token: {error}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    panic!("no runner token could be created");
}

/// A client with short attempts, so a call stuck on a paused or cut-off node
/// moves on to another one.
pub fn chaos_client(
    endpoints: Vec<String>,
    token: &str,
    ca_file: Option<std::path::PathBuf>,
) -> SemaphoreClient {
    let mut config = ClientConfig::new(endpoints);
    config.token = Some(token.to_string());
    config.ca_file = ca_file;
    config.attempt_timeout = Duration::from_secs(3);
    config.call_timeout = Duration::from_secs(20);
    SemaphoreClient::new(config).expect("chaos client")
}

/// One job as the application saw it.
#[derive(Debug, Clone)]
pub struct JobRecord {
    pub key: String,
    pub runner: usize,
    pub duration_ms: u64,
    pub start: Option<Instant>,
    pub end: Option<Instant>,
    /// `grant` or `lease`.
    pub permit: Option<&'static str>,
    /// How often `admit` was called for it (a repeat must be a no-op).
    pub admits: u32,
}

/// The shared log of every job: the checker's only source.
#[derive(Debug)]
pub struct JobLog {
    pub origin: Instant,
    inner: Mutex<LogInner>,
}

#[derive(Debug, Default)]
struct LogInner {
    jobs: HashMap<String, JobRecord>,
    /// Per key, running job id → start.
    running: BTreeMap<String, HashMap<String, Instant>>,
    /// Per (runner, key): enqueued and started counts, for the producers.
    enqueued: BTreeMap<(usize, String), u64>,
    started: BTreeMap<(usize, String), u64>,
}

impl JobLog {
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
            inner: Mutex::new(LogInner::default()),
        }
    }

    fn enqueued(&self, id: &str, key: &str, runner: usize, duration_ms: u64) {
        let mut inner = self.inner.lock().unwrap();
        inner.jobs.insert(
            id.to_string(),
            JobRecord {
                key: key.to_string(),
                runner,
                duration_ms,
                start: None,
                end: None,
                permit: None,
                admits: 0,
            },
        );
        *inner.enqueued.entry((runner, key.to_string())).or_default() += 1;
    }

    /// Records an admit; true if the job starts now (its first admit).
    fn admitted(&self, id: &str, permit: &ItemPermit) -> bool {
        let now = Instant::now();
        let mut inner = self.inner.lock().unwrap();
        let Some(job) = inner.jobs.get_mut(id) else {
            return false;
        };
        job.admits += 1;
        if job.start.is_some() {
            return false;
        }
        job.start = Some(now);
        job.permit = Some(match permit {
            ItemPermit::Grant { .. } => "grant",
            ItemPermit::Lease { .. } => "lease",
        });
        let (key, runner) = (job.key.clone(), job.runner);
        inner
            .running
            .entry(key.clone())
            .or_default()
            .insert(id.to_string(), now);
        *inner.started.entry((runner, key)).or_default() += 1;
        true
    }

    fn ended(&self, id: &str) {
        let now = Instant::now();
        let mut inner = self.inner.lock().unwrap();
        let Some(job) = inner.jobs.get_mut(id) else {
            return;
        };
        job.end = Some(now);
        let key = job.key.clone();
        if let Some(running) = inner.running.get_mut(&key) {
            running.remove(id);
        }
    }

    fn is_ended(&self, id: &str) -> bool {
        let inner = self.inner.lock().unwrap();
        inner.jobs.get(id).is_some_and(|job| job.end.is_some())
    }

    /// Items runner `runner` has queued for `key` and not started yet.
    fn backlog(&self, runner: usize, key: &str) -> u64 {
        let inner = self.inner.lock().unwrap();
        let slot = (runner, key.to_string());
        let enqueued = inner.enqueued.get(&slot).copied().unwrap_or(0);
        enqueued.saturating_sub(inner.started.get(&slot).copied().unwrap_or(0))
    }

    /// Jobs of `key` running now that started before `before`.
    pub fn running_since(&self, key: &str, before: Instant) -> u64 {
        let inner = self.inner.lock().unwrap();
        inner.running.get(key).map_or(0, |running| {
            running.values().filter(|start| **start < before).count() as u64
        })
    }

    /// Jobs running now, all keys.
    pub fn running(&self) -> u64 {
        let inner = self.inner.lock().unwrap();
        inner.running.values().map(|r| r.len() as u64).sum()
    }

    /// Every job enqueued so far.
    pub fn snapshot(&self) -> Vec<(String, JobRecord)> {
        let inner = self.inner.lock().unwrap();
        let mut jobs: Vec<_> = inner
            .jobs
            .iter()
            .map(|(id, job)| (id.clone(), job.clone()))
            .collect();
        jobs.sort_by(|a, b| a.0.cmp(&b.0));
        jobs
    }

    /// (enqueued, ended) over all jobs.
    pub fn progress(&self) -> (usize, usize) {
        let inner = self.inner.lock().unwrap();
        let ended = inner.jobs.values().filter(|job| job.end.is_some()).count();
        (inner.jobs.len(), ended)
    }
}

impl Default for JobLog {
    fn default() -> Self {
        Self::new()
    }
}

/// One runner's application side. Item bodies are the job's duration in ms.
#[derive(Debug, Clone)]
pub struct Runner {
    log: Arc<JobLog>,
    queue: Arc<OnceLock<Weak<SemaphoreQueue<u64>>>>,
}

impl Admission<u64> for Runner {
    async fn admit(&self, items: Vec<AdmittedItem<u64>>) {
        for item in items {
            if !self.log.admitted(&item.id, &item.permit) {
                continue; // a repeated admit is a no-op
            }
            let runner = self.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(item.body)).await;
                runner.log.ended(&item.id);
                if let Some(queue) = runner.queue.get().and_then(Weak::upgrade) {
                    let _ = queue.release(&item.id);
                }
            });
        }
    }

    async fn finished(&self, ids: Vec<String>) -> Vec<String> {
        ids.into_iter().filter(|id| self.log.is_ended(id)).collect()
    }
}

/// A runner's queue and its producer.
#[derive(Debug)]
pub struct RunnerHandle {
    pub index: usize,
    pub queue: Arc<SemaphoreQueue<u64>>,
    producer: tokio::task::JoinHandle<u64>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl RunnerHandle {
    /// Starts runner `index` with its own client, and its producer, whose job
    /// durations and groups come from the run's `random_state`.
    pub fn start(
        index: usize,
        client: SemaphoreClient,
        specs: &[KeySpec],
        log: Arc<JobLog>,
        random_state: RandomState,
    ) -> Self {
        let runner = Runner {
            log: log.clone(),
            queue: Arc::new(OnceLock::new()),
        };
        let config = QueueConfig {
            finished_interval: Duration::from_millis(1_000),
            state: StateConfig {
                failure_retry_ms: 200,
                idle_lease_return_ms: Some(1_000),
                ..StateConfig::default()
            },
            ..QueueConfig::new(format!("chaos-runner-{index}"))
        };
        let queue =
            Arc::new(SemaphoreQueue::start(client, config, runner.clone()).expect("queue starts"));
        runner.queue.set(Arc::downgrade(&queue)).expect("set once");
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let producer = tokio::spawn(produce(
            index,
            queue.clone(),
            specs.iter().map(|spec| spec.key).collect(),
            log,
            ReplayRng::for_stream(random_state, index as u64),
            stop.clone(),
        ));
        Self {
            index,
            queue,
            producer,
            stop,
        }
    }

    /// Stops enqueueing; returns how many items this runner enqueued.
    pub async fn stop_producing(&mut self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        (&mut self.producer).await.unwrap_or(0)
    }
}

async fn produce(
    runner: usize,
    queue: Arc<SemaphoreQueue<u64>>,
    keys: Vec<&'static str>,
    log: Arc<JobLog>,
    mut rng: ReplayRng,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> u64 {
    let mut sequence = 0u64;
    let mut targets: Vec<u64> = Vec::new();
    let mut phase_ends = Instant::now();
    while !stop.load(std::sync::atomic::Ordering::Acquire) {
        if Instant::now() >= phase_ends {
            targets = keys.iter().map(|_| rng.random_range(0..=BACKLOG)).collect();
            phase_ends = Instant::now() + PHASE;
        }
        for (key, target) in keys.iter().zip(&targets) {
            let missing = target.saturating_sub(log.backlog(runner, key));
            if missing == 0 {
                continue;
            }
            let items: Vec<QueueItem<u64>> = (0..missing)
                .map(|_| {
                    sequence += 1;
                    let duration = rng.random_range(JOB_MS.0..=JOB_MS.1);
                    let group = format!("wf-{}", rng.random_range(0..3u32));
                    let id = format!("{key}/r{runner}/{sequence}");
                    log.enqueued(&id, key, runner, duration);
                    QueueItem {
                        id,
                        key: key.to_string(),
                        group,
                        body: duration,
                    }
                })
                .collect();
            queue.enqueue(items).await.expect("enqueue in memory");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    sequence
}
