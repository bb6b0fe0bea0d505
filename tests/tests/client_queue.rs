//! `SemaphoreQueue` against a real three-node cluster.
//!
//! The application side here ([`Jobs`]) runs each admitted item as a tokio task
//! and counts, independently of permitd, how many jobs of each account run at
//! once and how often each job ran. The checks:
//! - never more running jobs of an account than its limit (strict leases, and
//!   no leases);
//! - every enqueued job runs exactly once;
//! - once all jobs ended, every key's usage returns to 0 granted, 0 leased;
//! - a runner restarted from its queue dir loses no job and leaks no permit;
//! - releases the application never sent are recovered through `finished`;
//! - in a cluster of three shards, a client calls each key's shard's leader
//!   directly once it learned them: every node serves exactly the keyed calls
//!   of the shards it leads, and no call takes a forwarding hop (the test
//!   waits for the leaders to spread over the nodes, and says so on stderr
//!   when they did not).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use permitd_client::{
    Admission, AdmittedItem, ClientConfig, ItemStatus, QueueConfig, QueueError, QueueItem,
    SemaphoreClient, SemaphoreQueue, StateConfig,
};
use permitd_core::config::{LeasePolicy, Provisioning};
use permitd_core::contract::protocol::{Demand, GrantReport, PermitRequest, PermitSync, V1};
use permitd_core::shard::shard_of;
use permitd_core::{GroupConfig, KeyConfigUpdate};
use permitd_tests::{eventually, Cluster, Settings, ADMIN_TOKEN};

/// How long all jobs of one test may take to run.
const JOBS_TIMEOUT: Duration = Duration::from_secs(90);
/// How long usage may take to return to zero once every job ended.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// The sharded test runs alone, the others side by side: its shards' leaders
/// spread by handovers, which a machine kept busy by the other tests'
/// clusters can hold off for long (a handover needs an election on time).
static ALONE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// Counters shared by every runner of a test: the independent observer.
#[derive(Debug, Default)]
struct Observer {
    running: Mutex<HashMap<String, u64>>,
    max_running: Mutex<HashMap<String, u64>>,
    runs: Mutex<HashMap<String, u32>>,
    ended: Mutex<HashSet<String>>,
}

impl Observer {
    fn start(&self, account: &str) {
        let mut running = self.running.lock().unwrap();
        let now = running.entry(account.to_string()).or_default();
        *now += 1;
        let mut max = self.max_running.lock().unwrap();
        let seen = max.entry(account.to_string()).or_default();
        *seen = (*seen).max(*now);
    }

    fn end(&self, account: &str, id: &str) {
        *self.running.lock().unwrap().get_mut(account).unwrap() -= 1;
        self.ended.lock().unwrap().insert(id.to_string());
    }

    fn ended(&self) -> usize {
        self.ended.lock().unwrap().len()
    }
}

/// One runner's application side. Bodies are the job's duration in ms.
#[derive(Debug, Clone)]
struct Jobs {
    observer: Arc<Observer>,
    /// The runner's current queue, for releases (replaced on restart).
    queue: Arc<Mutex<Weak<SemaphoreQueue<u64>>>>,
    /// Release every job whose number is divisible by this; others are left
    /// to `finished`. 1 releases all.
    release_every: u64,
}

impl Jobs {
    fn new(observer: Arc<Observer>, release_every: u64) -> Self {
        Self {
            observer,
            queue: Arc::new(Mutex::new(Weak::new())),
            release_every,
        }
    }

    async fn run(&self, item: AdmittedItem<u64>) {
        self.observer.start(&item.key);
        tokio::time::sleep(Duration::from_millis(item.body)).await;
        self.observer.end(&item.key, &item.id);
        let number: u64 = item.id.rsplit('-').next().unwrap().parse().unwrap();
        if number.is_multiple_of(self.release_every) {
            if let Some(queue) = self.queue.lock().unwrap().upgrade() {
                queue.release(&item.id).unwrap();
            }
        }
    }
}

impl Admission<u64> for Jobs {
    async fn admit(&self, items: Vec<AdmittedItem<u64>>) {
        for item in items {
            let first = {
                let mut runs = self.observer.runs.lock().unwrap();
                let count = runs.entry(item.id.clone()).or_default();
                *count += 1;
                *count == 1
            };
            // A repeated admit of one id is a no-op (counted, to check it is one).
            if first {
                let jobs = self.clone();
                tokio::spawn(async move { jobs.run(item).await });
            }
        }
    }

    async fn finished(&self, ids: Vec<String>) -> Vec<String> {
        let ended = self.observer.ended.lock().unwrap();
        ids.into_iter().filter(|id| ended.contains(id)).collect()
    }
}

fn client_for(cluster: &Cluster) -> SemaphoreClient {
    let mut config = ClientConfig::new(cluster.nodes.iter().map(|node| node.url()));
    config.token = Some(ADMIN_TOKEN.to_string());
    SemaphoreClient::new(config).unwrap()
}

fn strict_leases(ttl_ms: u64) -> Option<LeasePolicy> {
    Some(LeasePolicy {
        permits_per_lease: 4,
        ttl_ms,
        ..LeasePolicy::with_provisioning(Provisioning::Strict)
    })
}

async fn configure(
    client: &SemaphoreClient,
    key: &str,
    limit: u64,
    leases: Option<LeasePolicy>,
    grant_timeout_ms: u64,
) {
    let update = KeyConfigUpdate {
        limit: Some(limit),
        round_wait_ms: Some(20),
        round_period_ms: Some(40),
        grant_timeout_ms: Some(grant_timeout_ms),
        leases: Some(leases),
    };
    let applied = client.set_key_config(key, &update).await.unwrap();
    assert_eq!(applied.limit, limit);
}

fn queue_config(client_id: &str) -> QueueConfig {
    QueueConfig {
        finished_interval: Duration::from_millis(500),
        state: StateConfig {
            failure_retry_ms: 200,
            idle_lease_return_ms: Some(500),
            ..StateConfig::default()
        },
        ..QueueConfig::new(client_id)
    }
}

async fn start_queue(
    client: &SemaphoreClient,
    config: QueueConfig,
    jobs: &Jobs,
) -> Arc<SemaphoreQueue<u64>> {
    // A crashed runner's queue dir may stay locked for a moment while its
    // loop task is dropped.
    let deadline = Instant::now() + Duration::from_secs(10);
    let queue = loop {
        match SemaphoreQueue::start(client.clone(), config.clone(), jobs.clone()) {
            Ok(queue) => break Arc::new(queue),
            Err(error @ QueueError::Locked { .. }) if Instant::now() < deadline => {
                eprintln!("queue dir busy ({error}); retrying");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => panic!("queue start: {error}"),
        }
    };
    *jobs.queue.lock().unwrap() = Arc::downgrade(&queue);
    queue
}

/// Job `n` of `key`: id `{key}-job-{n}`, body a duration of 5 to 40 ms.
fn job(key: &str, group: &str, n: u64) -> QueueItem<u64> {
    QueueItem {
        id: format!("{key}-job-{n}"),
        key: key.to_string(),
        group: group.to_string(),
        body: 5 + (n * 7919) % 36,
    }
}

async fn wait_until_ended(observer: &Observer, total: usize) {
    let deadline = Instant::now() + JOBS_TIMEOUT;
    while observer.ended() < total {
        assert!(
            Instant::now() < deadline,
            "only {} of {total} jobs ended",
            observer.ended()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_for_zero_usage(client: &SemaphoreClient, keys: &[&str]) {
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    for key in keys {
        loop {
            let usage = client.usage(key).await.unwrap();
            if usage.granted == 0 && usage.leased == 0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{key} still holds permits: {usage:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

fn assert_ran_once(observer: &Observer, total: usize) {
    let runs = observer.runs.lock().unwrap();
    assert_eq!(runs.len(), total, "every job was admitted");
    let ended = observer.ended.lock().unwrap();
    assert_eq!(ended.len(), total, "every job ended");
    drop(ended);
    // Repeated admits (after a restart) are counted but must not start a job twice:
    // `run` is spawned only for the first, so `ended` has each id once by
    // construction; `running` must be back to zero.
    let running = observer.running.lock().unwrap();
    assert!(running.values().all(|count| *count == 0), "{running:?}");
}

/// Two runners, two accounts with limits 4 and 6, three workflows (one capped).
async fn limits_hold(leases: Option<LeasePolicy>) {
    let cluster = Cluster::start(Settings::default()).await;
    let client = client_for(&cluster);
    let accounts = [("acct-a", 4u64), ("acct-b", 6u64)];
    for (key, limit) in accounts {
        configure(&client, key, limit, leases.clone(), 10_000).await;
        let capped = GroupConfig {
            limit: Some(2),
            permitted: true,
        };
        client.set_group(key, "wf-capped", &capped).await.unwrap();
    }
    let observer = Arc::new(Observer::default());
    let mut queues = Vec::new();
    let mut total = 0usize;
    for runner in 0..2u64 {
        let jobs = Jobs::new(observer.clone(), 1);
        let queue = start_queue(&client, queue_config(&format!("runner-{runner}")), &jobs).await;
        let mut items = Vec::new();
        for (key, _) in accounts {
            for n in 0..40u64 {
                let group = ["wf-0", "wf-1", "wf-capped"][(n % 3) as usize];
                items.push(job(key, group, runner * 1_000 + n));
            }
        }
        total += items.len();
        let outcome = queue.enqueue(items.clone()).await.unwrap();
        assert_eq!(outcome.added, items.len());
        // A known id again is a no-op.
        assert_eq!(queue.enqueue(items[..3].to_vec()).await.unwrap().known, 3);
        queues.push(queue);
    }
    wait_until_ended(&observer, total).await;
    let max = observer.max_running.lock().unwrap().clone();
    for (key, limit) in accounts {
        let seen = max.get(key).copied().unwrap_or(0);
        assert!(
            seen <= limit,
            "{key}: {seen} jobs ran at once, limit {limit}"
        );
        assert!(seen > 0, "{key}: nothing ran");
    }
    assert_ran_once(&observer, total);
    wait_for_zero_usage(&client, &["acct-a", "acct-b"]).await;
    for queue in &queues {
        let report = queue.shutdown().await.unwrap();
        assert_eq!((report.counts.queued, report.counts.admitted), (0, 0));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn queue_respects_account_limits_with_strict_leases() {
    let _side_by_side = ALONE.read().await;
    limits_hold(strict_leases(5_000)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn queue_respects_account_limits_without_leases() {
    let _side_by_side = ALONE.read().await;
    limits_hold(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restarted_runner_loses_no_job_and_leaks_no_permit() {
    let _side_by_side = ALONE.read().await;
    let cluster = Cluster::start(Settings::default()).await;
    let client = client_for(&cluster);
    let key = "acct-restart";
    // Short claim window: a request whose answer died with the runner strands
    // its grants only that long.
    configure(&client, key, 3, strict_leases(5_000), 2_000).await;
    let dir = tempfile::tempdir().unwrap();
    let config = queue_config("runner-restart").with_path(dir.path().join("queue"));
    let observer = Arc::new(Observer::default());
    let jobs = Jobs::new(observer.clone(), 1);
    let queue = start_queue(&client, config.clone(), &jobs).await;
    let items: Vec<QueueItem<u64>> = (0..60u64).map(|n| job(key, "wf", n)).collect();
    queue.enqueue(items).await.unwrap();
    let deadline = Instant::now() + JOBS_TIMEOUT;
    while observer.ended() < 10 {
        assert!(Instant::now() < deadline, "no progress before the restart");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Crash: the handle and its loop go away mid-flight, without final reports.
    drop(queue);
    // The fault itself: the runner stays down for a while before it restarts
    // (a restart too soon on a still-locked file is retried by start_queue).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let queue = start_queue(&client, config, &jobs).await;
    wait_until_ended(&observer, 60).await;
    let max = observer.max_running.lock().unwrap()[key];
    assert!(max <= 3, "{max} jobs ran at once, limit 3");
    assert_ran_once(&observer, 60);
    wait_for_zero_usage(&client, &[key]).await;
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    while queue.counts().admitted > 0 {
        assert!(Instant::now() < deadline, "{:?}", queue.counts());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for n in 0..60u64 {
        assert_eq!(
            queue.status(&format!("{key}-job-{n}")),
            ItemStatus::Released
        );
    }
    let report = queue.shutdown().await.unwrap();
    assert_eq!((report.counts.queued, report.counts.admitted), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn releases_never_reported_are_recovered_through_finished() {
    let _side_by_side = ALONE.read().await;
    let cluster = Cluster::start(Settings::default()).await;
    let client = client_for(&cluster);
    let key = "acct-finished";
    configure(&client, key, 4, None, 10_000).await;
    let observer = Arc::new(Observer::default());
    // Only every third job is released by the application.
    let jobs = Jobs::new(observer.clone(), 3);
    let queue = start_queue(&client, queue_config("runner-finished"), &jobs).await;
    let items: Vec<QueueItem<u64>> = (0..30u64).map(|n| job(key, "wf", n)).collect();
    queue.enqueue(items).await.unwrap();
    wait_until_ended(&observer, 30).await;
    assert!(observer.max_running.lock().unwrap()[key] <= 4);
    assert_ran_once(&observer, 30);
    wait_for_zero_usage(&client, &[key]).await;
    assert_eq!(queue.status(&format!("{key}-job-1")), ItemStatus::Released);
    assert_eq!(queue.status("never-enqueued"), ItemStatus::Unknown);
    queue.shutdown().await.unwrap();
}

/// The shard count of [`keyed_calls_go_to_their_shards_leader_without_a_hop`].
const SHARDS: u32 = 3;
/// How long the client may take to learn every shard's leader.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Per node, the keyed calls (`/v1/semaphores/{key}…`) its API listener
/// counted (`permitd_http_requests_total`): a forwarded call counts on the
/// node called and again on the leader.
async fn keyed_calls_served(cluster: &Cluster) -> Vec<f64> {
    let mut served = Vec::new();
    for node in &cluster.nodes {
        let url = format!("{}/metrics", node.url());
        let text = cluster
            .http
            .get(url)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let total: f64 = text
            .lines()
            .filter(|line| line.starts_with("permitd_http_requests_total{"))
            .filter(|line| line.contains("listener=\"api\""))
            .filter(|line| line.contains("route=\"/v1/semaphores/{key}"))
            .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum();
        served.push(total);
    }
    served
}

/// A request for one permit of `key`'s group `g`, claimed and released by a
/// sync, and a usage read: the three keyed calls a runner makes.
async fn use_one_permit(client: &SemaphoreClient, key: &str) -> f64 {
    let request = PermitRequest {
        v: V1,
        client_id: "routed".into(),
        request_id: None,
        demand: vec![Demand {
            group: "g".into(),
            count: 1,
            oldest_at_ms: 1,
        }],
        grants: vec![],
        leases: None,
        wait_ms: None,
    };
    let grant = client.request(key, request).await.unwrap();
    assert_eq!(grant.grants.len(), 1, "{key}: {grant:?}");
    let grant = &grant.grants[0];
    let report = GrantReport {
        grant_id: grant.grant_id.to_string(),
        claimed: grant.permits,
        released: grant.permits,
    };
    let sync = PermitSync {
        v: V1,
        client_id: "routed".into(),
        grants: vec![report],
        leases: None,
    };
    client.sync(key, sync).await.unwrap();
    assert_eq!(client.usage(key).await.unwrap().granted, 0, "{key}");
    3.0
}

/// Keys `routed-N`, `per_shard` of each of [`SHARDS`] shards, with their shard.
fn keys_of_each_shard(per_shard: u32) -> Vec<(String, u32)> {
    let mut taken = [0u32; SHARDS as usize];
    let mut keys = Vec::new();
    for n in 0.. {
        let key = format!("routed-{n}");
        let shard = shard_of(&key, SHARDS).unwrap();
        if taken[shard as usize] < per_shard {
            taken[shard as usize] += 1;
            keys.push((key, shard));
        }
        if keys.len() == (per_shard * SHARDS) as usize {
            break;
        }
    }
    keys
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keyed_calls_go_to_their_shards_leader_without_a_hop() {
    let _alone = ALONE.write().await;
    let settings = Settings {
        shards: Some(SHARDS),
        ..Settings::default()
    };
    let cluster = Cluster::start(settings).await;
    let keys = keys_of_each_shard(2);
    let client = client_for(&cluster);
    let url_of = |id: u64| cluster.node(id).url();
    // A leader that moves during the calls (a stalled machine's election)
    // sends some to another node: the calls are made again, up to this often.
    for attempt in 1..=3 {
        // Every shard led by its preferred node (the harness waits for it).
        let leaders = cluster.wait_spread().await;
        let distinct: HashSet<u64> = leaders.iter().copied().collect();
        if distinct.len() == 1 {
            eprintln!("the shards' leaders did not spread: {leaders:?}");
        }

        // Warm-up: the answers teach the client the count and each shard's
        // leader, and node-id discovery which endpoint each leader is.
        let learned = eventually(SETTLE_TIMEOUT, || async {
            for (key, _) in &keys {
                client.usage(key).await.unwrap();
            }
            keys.iter().all(|(key, shard)| {
                client.leader_of_key(key) == Some(url_of(leaders[*shard as usize]))
            })
        })
        .await;
        let known: Vec<_> = keys
            .iter()
            .map(|(key, _)| client.leader_of_key(key))
            .collect();
        assert!(learned, "the client never learned {leaders:?}: {known:?}");
        assert_eq!(client.shard_count(), SHARDS);
        // Calls naming no key follow the meta shard's leader.
        client.tokens().await.unwrap();
        assert_eq!(client.leader(), Some(url_of(leaders[0])));

        let before = keyed_calls_served(&cluster).await;
        let mut expected = vec![0.0; cluster.nodes.len()];
        for _ in 0..3 {
            for (key, shard) in &keys {
                let calls = use_one_permit(&client, key).await;
                let leader = leaders[*shard as usize];
                let index = cluster
                    .nodes
                    .iter()
                    .position(|node| node.id == leader)
                    .unwrap();
                expected[index] += calls;
            }
        }
        let after = keyed_calls_served(&cluster).await;
        // A leader that moved mid-run (a handover) makes the count moot: again.
        let map = cluster.admin_get(1, "/cluster/shards").await;
        let now: Option<Vec<u64>> = map.and_then(|map| {
            let shards = map["shards"].as_array()?.clone();
            shards
                .iter()
                .map(|shard| shard["leader"].as_u64())
                .collect()
        });
        if now.as_ref() != Some(&leaders) && attempt < 3 {
            continue;
        }
        let served: Vec<f64> = after
            .iter()
            .zip(&before)
            .map(|(after, before)| after - before)
            .collect();
        assert_eq!(
            served, expected,
            "keyed calls each node served (shard leaders {leaders:?}): a call for \
             another shard's key, or a forwarded one, would show here"
        );
        return;
    }
}
