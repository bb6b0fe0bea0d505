//! A runner's `SemaphoreQueue` loses power, again and again, against a real
//! cluster: its queue dir is on a `powerfs` mount that drops every write not
//! fsynced and every create or rename whose dir was not fsynced.
//!
//! The runner is a child process (this test binary again, as the ignored
//! `runner_child` test) whose working directory is the mount and whose queue
//! path is relative (`queue`), as a runner's config often is. It enqueues jobs
//! on two keys (grants only, and strict leases), its application prints each
//! admission and releases each job a few ms later. After a random number of
//! acknowledged enqueues and admissions the parent SIGKILLs it, cuts the power
//! (half the cuts tear the newest unsynced write), reads the queue dir back
//! and counts:
//! - **lost enqueues**: acknowledged (`enqueue` returned) but neither queued
//!   nor remembered as released;
//! - **lost admissions**: admitted (the application saw it) but stored as
//!   queued or unknown: its permit's claim or draw, which the holder saw, was
//!   forgotten;
//! - after the last cut, a runner drains the queue (every job runs and is
//!   released, the queue shuts down): **stuck jobs** not released, and the
//!   keys' usage must return to zero (a claim the store forgot would keep its
//!   grant forever: a leaked permit).
//!
//! `QUEUE_POWER_LOSS_CUTS` (default 50) sets the cuts, `QUEUE_POWER_LOSS_SEED`
//! replays a run. Needs FUSE (`/dev/fuse`, root); without it the test says so
//! and passes.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use permitd_client::queue::state::Phase;
use permitd_client::queue::store::QueueStore;
use permitd_client::{
    Admission, AdmittedItem, ClientConfig, QueueConfig, QueueItem, SemaphoreClient, SemaphoreQueue,
    StateConfig,
};
use permitd_core::config::{LeasePolicy, Provisioning};
use permitd_core::KeyConfigUpdate;
use permitd_powerfs::PowerFs;
use permitd_tests::{eventually, Cluster, Settings, ADMIN_TOKEN};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The child's settings, in this env var: `{life} {drain} {url,url,...}`.
const CHILD_ENV: &str = "QUEUE_POWER_LOSS_CHILD";
const CLIENT_ID: &str = "runner-power-loss";
/// The queue's path, relative to the child's working dir (the mount).
const QUEUE_DIR: &str = "queue";
const GRANT_KEY: &str = "acct-grants";
const LEASE_KEY: &str = "acct-leases";
/// Items queued at once by the child; it enqueues more as they are admitted.
const QUEUED_AT_ONCE: usize = 12;
/// Most a child waits to print its next line before the test gives up on it.
const CHILD_SILENT_FOR: Duration = Duration::from_secs(30);
/// How long the draining runner may take, and usage to return to zero.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug)]
struct ChildSpec {
    urls: Vec<String>,
    /// Numbers this life's item ids.
    life: usize,
    /// Enqueue nothing; run and release what is there, shut down, exit.
    drain: bool,
}

impl ChildSpec {
    fn to_env(&self) -> String {
        format!("{} {} {}", self.life, self.drain, self.urls.join(","))
    }

    fn from_env(value: &str) -> Self {
        let mut parts = value.split(' ');
        let mut next = || parts.next().expect("a whole child spec");
        Self {
            life: next().parse().unwrap(),
            drain: next().parse().unwrap(),
            urls: next().split(',').map(str::to_string).collect(),
        }
    }
}

/// The runner's application: prints each admission, releases each job a few
/// ms later (again after a restart hands it over again).
#[derive(Clone)]
struct Jobs {
    queue: Arc<Mutex<Weak<SemaphoreQueue<u64>>>>,
}

impl Admission<u64> for Jobs {
    async fn admit(&self, items: Vec<AdmittedItem<u64>>) {
        for item in items {
            println!("admitted {}", item.id);
            let queue = self.queue.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(item.body)).await;
                if let Some(queue) = queue.lock().unwrap().upgrade() {
                    let _ = queue.release(&item.id);
                }
            });
        }
    }

    async fn finished(&self, _ids: Vec<String>) -> Vec<String> {
        Vec::new()
    }
}

#[test]
#[ignore = "run by a_queue_loses_nothing_to_power_cuts as its child process"]
fn runner_child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let spec = ChildSpec::from_env(&spec);
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(run_child(spec));
}

async fn run_child(spec: ChildSpec) {
    let mut config = ClientConfig::new(spec.urls.clone());
    config.token = Some(ADMIN_TOKEN.to_string());
    let client = SemaphoreClient::new(config).unwrap();
    let jobs = Jobs {
        queue: Arc::new(Mutex::new(Weak::new())),
    };
    let queue_config = QueueConfig {
        state: StateConfig {
            failure_retry_ms: 100,
            idle_lease_return_ms: Some(300),
            ..StateConfig::default()
        },
        ..QueueConfig::new(CLIENT_ID).with_path(QUEUE_DIR)
    };
    let queue = Arc::new(SemaphoreQueue::start(client, queue_config, jobs.clone()).unwrap());
    *jobs.queue.lock().unwrap() = Arc::downgrade(&queue);
    println!("started");
    if spec.drain {
        drain(&queue).await;
        return;
    }
    let mut rng = rand::rng();
    for n in 0.. {
        while queue.counts().queued >= QUEUED_AT_ONCE {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let id = format!("life{}-{n}", spec.life);
        let item = QueueItem {
            id: id.clone(),
            key: [GRANT_KEY, LEASE_KEY][n % 2].to_string(),
            group: "wf".to_string(),
            body: rng.random_range(0..20),
        };
        queue.enqueue(vec![item]).await.unwrap();
        println!("enqueued {id}");
    }
}

/// Waits until every item was admitted and released, shuts down. Prints the
/// counts as they change (what is stuck, if the test gives up on it).
async fn drain(queue: &SemaphoreQueue<u64>) {
    let mut last = None;
    loop {
        let counts = queue.counts();
        if counts.queued == 0 && counts.admitted == 0 {
            break;
        }
        if last != Some(counts) {
            println!("draining {counts:?}");
            last = Some(counts);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let report = queue.shutdown().await.unwrap();
    println!("drained {report:?}");
}

/// What every life of the runner printed: the acknowledged and the seen.
#[derive(Debug, Default)]
struct Seen {
    enqueued: BTreeSet<String>,
    admitted: BTreeSet<String>,
}

/// A running child and its printed lines.
struct Runner {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Runner {
    fn start(mount: &Path, spec: &ChildSpec) -> Self {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "runner_child",
                "--include-ignored",
                "--nocapture",
            ])
            .env(CHILD_ENV, spec.to_env())
            .current_dir(mount)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    return;
                }
            }
        });
        Self { child, lines }
    }

    /// The next line, recorded in `seen`; panics if the child fell silent.
    fn next(&self, seen: &mut Seen) -> String {
        let line = match self.lines.recv_timeout(CHILD_SILENT_FOR) {
            Ok(line) => line,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                panic!("the runner printed nothing for {CHILD_SILENT_FOR:?}")
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                panic!("the runner ended early (its stderr above says why)")
            }
        };
        record(&line, seen);
        line
    }

    /// SIGKILLs the child and records what it printed before it died.
    fn kill(mut self, seen: &mut Seen) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        while let Ok(line) = self.lines.recv() {
            record(&line, seen);
        }
    }
}

fn record(line: &str, seen: &mut Seen) {
    if let Some(id) = line.strip_prefix("enqueued ") {
        seen.enqueued.insert(id.to_string());
    } else if let Some(id) = line.strip_prefix("admitted ") {
        seen.admitted.insert(id.to_string());
    }
}

/// What the queue dir holds after a cut, compared with what was seen.
#[derive(Debug, Default, Clone, Copy)]
struct Losses {
    enqueues: usize,
    admissions: usize,
}

/// Opens the queue dir as a restarted runner would and counts what it lost.
/// Also returns the ids it remembers as released.
fn check_store(queue_dir: &Path, seen: &Seen) -> (Losses, BTreeSet<String>) {
    let store = QueueStore::open(queue_dir, CLIENT_ID).expect("the queue dir opens after a cut");
    let (items, _keys, released) = store.load::<u64>().expect("the queue dir reads back");
    let phases: BTreeMap<String, Phase> = items
        .into_iter()
        .map(|item| (item.id, item.phase))
        .collect();
    let released: BTreeSet<String> = released.into_iter().map(|(_, id)| id).collect();
    let known = |id: &String| phases.contains_key(id) || released.contains(id);
    let admitted = |id: &String| {
        released.contains(id) || matches!(phases.get(id), Some(Phase::Admitted { .. }))
    };
    let losses = Losses {
        enqueues: seen.enqueued.iter().filter(|id| !known(id)).count(),
        admissions: seen.admitted.iter().filter(|id| !admitted(id)).count(),
    };
    for id in seen.enqueued.iter().filter(|id| !known(id)) {
        eprintln!("LOST enqueue {id}");
    }
    for id in seen.admitted.iter().filter(|id| !admitted(id)) {
        eprintln!("LOST admission {id} (stored: {:?})", phases.get(id));
    }
    (losses, released)
}

async fn configure(client: &SemaphoreClient) {
    for (key, leases) in [
        (GRANT_KEY, None),
        (
            LEASE_KEY,
            Some(LeasePolicy {
                permits_per_lease: 3,
                ttl_ms: 5_000,
                ..LeasePolicy::with_provisioning(Provisioning::Strict)
            }),
        ),
    ] {
        let update = KeyConfigUpdate {
            limit: Some(6),
            round_wait_ms: Some(5),
            round_period_ms: Some(20),
            grant_timeout_ms: Some(1_000),
            leases: Some(leases),
        };
        client.set_key_config(key, &update).await.unwrap();
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

/// The mount, or `None` (after saying why) where FUSE is not available.
fn mount(root: &Path) -> Option<(PowerFs, PathBuf)> {
    if let Err(error) = std::fs::File::options()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        eprintln!("SKIPPED: cannot open /dev/fuse ({error}): powerfs needs FUSE");
        return None;
    }
    let backing = root.join("backing");
    let mountpoint = root.join("disk");
    std::fs::create_dir_all(&backing).unwrap();
    std::fs::create_dir_all(&mountpoint).unwrap();
    let disk = PowerFs::mount(&backing, &mountpoint).expect("mount powerfs");
    let mountpoint = disk.mountpoint().to_path_buf();
    Some((disk, mountpoint))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_loses_nothing_to_power_cuts() {
    let root = tempfile::tempdir().unwrap();
    let Some((disk, mountpoint)) = mount(root.path()) else {
        return;
    };
    let cuts: usize = env_or("QUEUE_POWER_LOSS_CUTS", 50);
    let now_ns = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let seed: u64 = env_or("QUEUE_POWER_LOSS_SEED", now_ns.as_nanos() as u64);
    eprintln!("QUEUE_POWER_LOSS_SEED={seed} QUEUE_POWER_LOSS_CUTS={cuts}");
    let mut rng = StdRng::seed_from_u64(seed);
    let cluster = Cluster::start(Settings::default()).await;
    let urls: Vec<String> = cluster.nodes.iter().map(|node| node.url()).collect();
    let mut config = ClientConfig::new(urls.clone());
    config.token = Some(ADMIN_TOKEN.to_string());
    let client = SemaphoreClient::new(config).unwrap();
    configure(&client).await;

    let queue_dir = mountpoint.join(QUEUE_DIR);
    let mut seen = Seen::default();
    let mut total = Losses::default();
    let (mut writes_dropped, mut torn) = (0, 0);
    let started = Instant::now();
    for life in 0..cuts {
        let spec = ChildSpec {
            urls: urls.clone(),
            life,
            drain: false,
        };
        let runner = Runner::start(&mountpoint, &spec);
        // Cut after a random number of lines: acknowledged enqueues and
        // admissions, mostly while steps are being written.
        let lines_before_cut = rng.random_range(2..40);
        let mut printed = 0;
        while printed < lines_before_cut {
            if runner.next(&mut seen) != "started" {
                printed += 1;
            }
        }
        runner.kill(&mut seen);
        let tear = rng.random_bool(0.5).then(|| rng.random());
        let report = disk.power_loss(tear).expect("power loss");
        writes_dropped += report.writes_dropped;
        torn += usize::from(report.torn.is_some());
        let (losses, _) = check_store(&queue_dir, &seen);
        total.enqueues += losses.enqueues;
        total.admissions += losses.admissions;
    }
    let cut_time = started.elapsed();

    // The last runner: every job runs and is released, the queue shuts down.
    let spec = ChildSpec {
        urls: urls.clone(),
        life: cuts,
        drain: true,
    };
    let mut runner = Runner::start(&mountpoint, &spec);
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    while !runner.next(&mut seen).starts_with("drained") {
        assert!(Instant::now() < deadline, "the queue drains in time");
    }
    runner.child.wait().unwrap();
    let (_, released) = check_store(&queue_dir, &seen);
    let stuck = seen.enqueued.difference(&released).count();
    let usage_zero = eventually(DRAIN_TIMEOUT, || async {
        let mut zero = true;
        for key in [GRANT_KEY, LEASE_KEY] {
            let usage = client.usage(key).await.unwrap();
            zero &= usage.granted == 0 && usage.leased == 0;
        }
        zero
    })
    .await;
    eprintln!(
        "queue power loss: {cuts} cuts in {cut_time:.1?} ({writes_dropped} unsynced writes \
         dropped, {torn} torn), {} enqueues acknowledged, {} admissions seen; lost: {} \
         enqueues, {} admissions; stuck after the drain: {stuck}; usage back to zero: \
         {usage_zero}",
        seen.enqueued.len(),
        seen.admitted.len(),
        total.enqueues,
        total.admissions,
    );
    assert_eq!(
        total.enqueues, 0,
        "acknowledged enqueues lost (seed {seed})"
    );
    assert_eq!(total.admissions, 0, "seen admissions lost (seed {seed})");
    assert_eq!(
        stuck, 0,
        "jobs never released after the drain (seed {seed})"
    );
    assert!(
        usage_zero,
        "a permit leaked: usage never returned to zero (seed {seed})"
    );
    drop(cluster);
    disk.unmount().unwrap();
}
