//! A job runner for the account-concurrency example: "each account may run N
//! jobs at once, each of its workflows at most M".
//!
//! Jobs of several accounts are spread over runner shards by a stable hash of
//! the account (one `SemaphoreQueue` per shard); each
//! account is a semaphore key with its own limit, each workflow a group with its
//! own cap. Admitted jobs run as tokio tasks for a random time, some fail; either
//! way the permit returns through `release`, and `finished` recovers any release
//! that got lost. A progress line per second; at the end, permit cycles (admit +
//! release) per second.
//!
//! ```text
//! permitd up --config cluster.toml &
//! cargo run --release -p permitd-client --example job_runner -- \
//!     --endpoints http://127.0.0.1:7001,http://127.0.0.1:7002,http://127.0.0.1:7003
//! ```

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use permitd_client::{
    Admission, AdmittedItem, QueueConfig, QueueItem, SemaphoreClient, SemaphoreQueue,
};
use permitd_core::config::{LeasePolicy, LimitedGroups, Provisioning};
use permitd_core::{GroupConfig, KeyConfigUpdate};
use rand::Rng;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

#[derive(Debug, Parser)]
struct Args {
    /// Node API base URLs, comma-separated.
    #[arg(
        long,
        env = "PERMITD_ENDPOINTS",
        default_value = "http://127.0.0.1:7001"
    )]
    endpoints: String,
    #[arg(long, default_value_t = 4)]
    accounts: usize,
    #[arg(long, default_value_t = 3)]
    workflows: usize,
    #[arg(long, default_value_t = 2_000)]
    jobs: usize,
    /// Runner shards per account.
    #[arg(long, default_value_t = 2)]
    shards: u32,
    /// Running jobs allowed per account.
    #[arg(long, default_value_t = 20)]
    account_limit: u64,
    /// Cap of each workflow within its account.
    #[arg(long, default_value_t = 10)]
    workflow_limit: u64,
    /// `strict` leases or `none`.
    #[arg(long, default_value = "strict")]
    leases: String,
    #[arg(long, default_value_t = 16)]
    permits_per_lease: u64,
    #[arg(long, default_value_t = 10)]
    min_job_ms: u64,
    #[arg(long, default_value_t = 50)]
    max_job_ms: u64,
    /// Share of jobs that fail (they still release their permit).
    #[arg(long, default_value_t = 0.05)]
    failure_rate: f64,
    #[arg(long, default_value_t = 10)]
    round_wait_ms: u64,
    #[arg(long, default_value_t = 20)]
    round_period_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    account: String,
    workflow: String,
    duration_ms: u64,
    fails: bool,
}

/// Per-account counters the progress line shows.
#[derive(Debug, Default, Clone, Copy)]
struct Progress {
    queued: u64,
    running: u64,
    done: u64,
    failed: u64,
}

/// The application side of one shard: runs admitted jobs once each.
#[derive(Debug, Clone)]
struct Runner {
    /// Ids started, so a repeated admit is a no-op.
    started: Arc<Mutex<HashSet<String>>>,
    /// Ids whose job ended, success or failure.
    ended: Arc<Mutex<HashSet<String>>>,
    progress: Arc<Mutex<BTreeMap<String, Progress>>>,
    /// Releases go to the shard's queue through here.
    releases: mpsc::UnboundedSender<String>,
}

impl Admission<Job> for Runner {
    async fn admit(&self, items: Vec<AdmittedItem<Job>>) {
        for item in items {
            if !self.started.lock().unwrap().insert(item.id.clone()) {
                continue;
            }
            let runner = self.clone();
            tokio::spawn(async move { runner.run(item).await });
        }
    }

    async fn finished(&self, ids: Vec<String>) -> Vec<String> {
        let ended = self.ended.lock().unwrap();
        ids.into_iter().filter(|id| ended.contains(id)).collect()
    }
}

impl Runner {
    async fn run(&self, item: AdmittedItem<Job>) {
        let job = item.body;
        self.count(&job.account, |progress| {
            progress.queued -= 1;
            progress.running += 1;
        });
        tokio::time::sleep(Duration::from_millis(job.duration_ms)).await;
        self.ended.lock().unwrap().insert(item.id.clone());
        self.count(&job.account, |progress| {
            progress.running -= 1;
            progress.done += 1;
            progress.failed += u64::from(job.fails);
        });
        let _ = self.releases.send(item.id);
    }

    fn count(&self, account: &str, change: impl FnOnce(&mut Progress)) {
        let mut progress = self.progress.lock().unwrap();
        change(progress.entry(account.to_string()).or_default());
    }
}

/// The shard of an account: a stable hash of the account, `width` shards each.
fn shard_for(account: &str, width: u32) -> String {
    let hash = account
        .chars()
        .fold(0u32, |hash, c| hash.wrapping_mul(31).wrapping_add(c as u32));
    format!("{account}-{}", hash % width.max(1))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let client = SemaphoreClient::connect([args.endpoints.clone()])?;
    let accounts: Vec<String> = (0..args.accounts).map(|n| format!("account-{n}")).collect();
    configure(&client, &args, &accounts).await?;

    let mut rng = rand::rng();
    let progress: Arc<Mutex<BTreeMap<String, Progress>>> = Arc::default();
    let mut by_shard: HashMap<String, Vec<QueueItem<Job>>> = HashMap::new();
    let run_id = uuid::Uuid::new_v4().simple().to_string();
    for n in 0..args.jobs {
        let account = accounts[rng.random_range(0..accounts.len())].clone();
        let workflow = format!("workflow-{}", rng.random_range(0..args.workflows.max(1)));
        let job = Job {
            duration_ms: rng.random_range(args.min_job_ms..=args.max_job_ms.max(args.min_job_ms)),
            fails: rng.random_bool(args.failure_rate.clamp(0.0, 1.0)),
            account: account.clone(),
            workflow: workflow.clone(),
        };
        progress
            .lock()
            .unwrap()
            .entry(account.clone())
            .or_default()
            .queued += 1;
        by_shard
            .entry(shard_for(&account, args.shards))
            .or_default()
            .push(QueueItem {
                id: format!("{run_id}-job-{n}"),
                key: account,
                group: workflow,
                body: job,
            });
    }

    let started_at = Instant::now();
    let mut queues = Vec::new();
    for (shard, items) in by_shard {
        let (releases, mut released) = mpsc::unbounded_channel::<String>();
        let runner = Runner {
            started: Arc::default(),
            ended: Arc::default(),
            progress: progress.clone(),
            releases,
        };
        let config = QueueConfig::new(format!("runner-{run_id}-{shard}"));
        let queue = Arc::new(SemaphoreQueue::start(client.clone(), config, runner)?);
        queue.enqueue(items).await?;
        let releaser = queue.clone();
        tokio::spawn(async move {
            while let Some(id) = released.recv().await {
                let _ = releaser.release(&id);
            }
        });
        queues.push(queue);
    }

    // Checks often (so the measurement ends when the last job does), prints
    // once a second.
    let mut ticker = tokio::time::interval(Duration::from_millis(20));
    let mut printed_at = Instant::now();
    loop {
        ticker.tick().await;
        let snapshot = progress.lock().unwrap().clone();
        let done: u64 = snapshot.values().map(|progress| progress.done).sum();
        if done as usize >= args.jobs {
            print_progress(started_at, &snapshot);
            break;
        }
        if printed_at.elapsed() >= Duration::from_secs(1) {
            printed_at = Instant::now();
            print_progress(started_at, &snapshot);
        }
    }
    let elapsed = started_at.elapsed().as_secs_f64();
    for queue in &queues {
        queue.shutdown().await?;
    }
    let failed: u64 = progress.lock().unwrap().values().map(|p| p.failed).sum();
    println!(
        "{} jobs ({failed} failed) in {elapsed:.1} s: {:.1} permit cycles per second (leases: {})",
        args.jobs,
        args.jobs as f64 / elapsed,
        args.leases
    );
    Ok(())
}

async fn configure(
    client: &SemaphoreClient,
    args: &Args,
    accounts: &[String],
) -> Result<(), Box<dyn std::error::Error>> {
    let leases = match args.leases.as_str() {
        "none" => None,
        "strict" => Some(LeasePolicy {
            permits_per_lease: args.permits_per_lease,
            ttl_ms: 60_000,
            limited_groups: LimitedGroups::WithinGroupLimit,
            ..LeasePolicy::with_provisioning(Provisioning::Strict)
        }),
        other => return Err(format!("--leases must be strict or none, not {other}").into()),
    };
    for account in accounts {
        let update = KeyConfigUpdate {
            limit: Some(args.account_limit),
            round_wait_ms: Some(args.round_wait_ms),
            round_period_ms: Some(args.round_period_ms),
            grant_timeout_ms: Some(10_000),
            leases: Some(leases.clone()),
        };
        client.set_key_config(account, &update).await?;
        for workflow in 0..args.workflows {
            let group = GroupConfig {
                limit: Some(args.workflow_limit),
                permitted: true,
            };
            client
                .set_group(account, &format!("workflow-{workflow}"), &group)
                .await?;
        }
    }
    Ok(())
}

fn print_progress(started_at: Instant, progress: &BTreeMap<String, Progress>) {
    let accounts: Vec<String> = progress
        .iter()
        .map(|(account, p)| format!("{account}: {}q {}r {}d", p.queued, p.running, p.done))
        .collect();
    println!(
        "[{:>5.1}s] {}",
        started_at.elapsed().as_secs_f64(),
        accounts.join(" | ")
    );
}
