//! `bench`: throughput, latency, failover and scale of a real three-node
//! cluster on loopback (the `permitd` binary the harness finds, real WAL with
//! fsync, real HTTP), printed as one markdown table and saved as JSON.
//!
//! Sections, in the order they run:
//! 1. the physical floor: median fdatasync of a 4 KiB append on the data disk
//!    (the call the log uses);
//! 2. the grant path ([`grant`]): 1–256 clients on 1 or 100 keys, at
//!    `roundWaitMs` 1 and 5, no leases, limit 32 per key;
//! 3. messages per second at saturation: the grant loop plus a `sync` per grant;
//! 4. the queue path ([`lease`]): `SemaphoreQueue` runners with strict leases
//!    (demand far over the limit, and at each runner's share of it) and, in the
//!    contended case, without leases; contended runs also give the reuse gap
//!    ([`reuse`]): a freed permit's idle time before it is admitted again;
//! 5. failover ([`failover`]): SIGKILL of the leader to the first grant;
//! 6. scale ([`scale`]): round overhead and leader RSS with 1 to 100,000 keys,
//!    on a fresh cluster;
//! 7. shards ([`shards`]): fresh clusters of S Raft groups, each idle, then
//!    under the grant path (256 clients, 100 keys) and queue runners spread
//!    over 64 keys, with every node's CPU, fsyncs and peer calls; more S idle
//!    only;
//! 8. shard failover ([`shard_failover`]): a fresh cluster of three shards
//!    under steady load on every shard; SIGKILL of a node that leads one to
//!    its shard's first grant, and the other shards' failed calls and
//!    latency during that failover against before it.
//!
//! Every throughput row also says what it cost ([`cpu`]): CPU µs per permit
//! cycle of the leader, the followers, the clients (the bench process) and in
//! total, log entries per second and CPU per entry, HTTP calls per cycle, and
//! the followers' leader contact gaps over the window ([`gaps`]: p99.9 and
//! max). The header counts the leader changes outside the failover section
//! (expected 0).
//!
//! Every loop is bounded in count and time; all traffic goes to 127.0.0.1.
//! `PERMITD_BENCH_LINK_DELAY_US` puts a network's one-way delay on every peer
//! link ([`slow_links`]).
//! Targets are reported against, never asserted.

pub mod cpu;
pub mod failover;
pub mod floor;
pub mod gaps;
pub mod grant;
pub mod lease;
mod report;
pub mod reuse;
pub mod scale;
pub mod shard_failover;
pub mod shards;
pub mod slow_links;
pub mod stats;
pub mod transport;

use std::ops::{Deref, DerefMut};
use std::time::{Duration, Instant};

pub use report::{target_dir, Report};

use crate::{Cluster, Settings};

/// Which sections run, and how long.
#[derive(Debug, Clone)]
pub struct Profile {
    pub name: &'static str,
    pub fsync_samples: usize,
    pub grant_clients: Vec<usize>,
    pub grant_keys: Vec<usize>,
    pub round_waits_ms: Vec<u64>,
    pub warmup: Duration,
    pub measure: Duration,
    pub saturation_clients: usize,
    /// `(runners, limit, strict leases, backlog per runner)` of each queue run.
    pub lease_runs: Vec<(usize, u64, bool, usize)>,
    pub lease_measure: Duration,
    pub failover_kills: usize,
    pub scale_sizes: Vec<usize>,
    pub scale_probe: Duration,
    /// Shard counts of the shards section's clusters, each measured idle and
    /// under load ([`shards`]).
    pub shard_counts: Vec<u32>,
    /// Shard counts measured idle only (what S groups cost with no load).
    pub idle_shard_counts: Vec<u32>,
    /// Clients of the shards section's grant row.
    pub shard_grant_clients: usize,
    /// The shards section's window with no load.
    pub idle_window: Duration,
    /// Kills of the shard failover section, one per round.
    pub shard_failover_rounds: usize,
    /// Its steady window before each kill (the latency it compares with).
    pub shard_failover_steady: Duration,
    /// Sections to run (all when empty): floor, grant, messages, lease,
    /// failover, scale, shards, shard-failover.
    pub only: Vec<String>,
}

/// The queue runs: the lease path with demand far over the limit (grants take
/// it all, as the protocol specifies: grants come first), with each runner's demand at its share of the
/// limit (leases are issued), and the contended case with and without leases.
fn lease_runs() -> Vec<(usize, u64, bool, usize)> {
    vec![
        (16, 1_000, true, lease::BACKLOG),
        (16, 1_000, true, 1_000 / 16),
        (64, 32, true, lease::BACKLOG),
        (64, 32, false, lease::BACKLOG),
    ]
}

/// Limit of every grant-path key (the target's "limit 32").
pub const GRANT_LIMIT: u64 = 32;
/// Permits per lease on the lease path (the default `permitsPerLease`).
pub const PERMITS_PER_LEASE: u64 = 64;

impl Profile {
    /// Everything the issue asks for; a few minutes.
    pub fn full() -> Self {
        Self {
            name: "full",
            fsync_samples: 200,
            grant_clients: vec![1, 16, 64, 256],
            grant_keys: vec![1, 100],
            round_waits_ms: vec![1, 5],
            warmup: Duration::from_secs(1),
            measure: Duration::from_secs(4),
            saturation_clients: 256,
            lease_runs: lease_runs(),
            lease_measure: Duration::from_secs(5),
            failover_kills: 10,
            scale_sizes: vec![1, 1_000, 100_000],
            scale_probe: Duration::from_secs(3),
            shard_counts: vec![1, 3, 16],
            idle_shard_counts: vec![64],
            shard_grant_clients: 256,
            idle_window: Duration::from_secs(5),
            shard_failover_rounds: 12,
            shard_failover_steady: Duration::from_secs(2),
            only: Vec::new(),
        }
    }

    /// Every section, shortened to well under a minute (CI).
    pub fn quick() -> Self {
        Self {
            name: "quick",
            fsync_samples: 50,
            grant_clients: vec![1, 64],
            grant_keys: vec![1],
            round_waits_ms: vec![1, 5],
            warmup: Duration::from_millis(300),
            measure: Duration::from_millis(1_200),
            saturation_clients: 64,
            lease_runs: lease_runs(),
            lease_measure: Duration::from_millis(1_500),
            failover_kills: 2,
            scale_sizes: vec![1, 1_000],
            scale_probe: Duration::from_secs(1),
            shard_counts: vec![1, 3],
            idle_shard_counts: vec![64],
            shard_grant_clients: 256,
            idle_window: Duration::from_secs(2),
            shard_failover_rounds: 5,
            shard_failover_steady: Duration::from_secs(1),
            only: Vec::new(),
        }
    }

    fn runs(&self, section: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|only| only == section)
    }
}

/// A request for one permit of group `g`, reporting `grants`: what every bench
/// client asks. It may be held for a second when a round has nothing for it
/// (`waitMs`), as a client under contention would ask. `oldest_at_ms` is when
/// the demand was created (ms since the Unix epoch): rounds serve the oldest
/// demand first, so equal values would hand every tie to the lowest client id.
pub(crate) fn one_permit(
    client_id: String,
    oldest_at_ms: u64,
    grants: Vec<permitd_core::contract::protocol::GrantReport>,
) -> permitd_core::contract::protocol::SemaphoreRequest {
    use permitd_core::contract::protocol::{Demand, PermitRequest, SemaphoreRequest, V1};
    SemaphoreRequest::Request(PermitRequest {
        v: V1,
        client_id,
        request_id: None,
        demand: vec![Demand {
            group: "g".into(),
            count: 1,
            oldest_at_ms,
        }],
        grants,
        leases: None,
        wait_ms: Some(1_000),
    })
}

/// Nodes of every bench cluster.
const NODES: usize = 3;

/// Worker threads of each of the bench's processes — the three nodes and the
/// bench's own runtime, which plays every client — on this machine: its share
/// of the cores, at least one (what `permitd up` gives nodes sharing a
/// machine). On two cores, runtimes of one thread per core in all four
/// processes cost about half the throughput in cross-thread wake-ups.
/// `PERMITD_BENCH_THREADS` overrides it (to compare).
pub fn threads_per_process() -> u16 {
    if let Some(threads) = std::env::var("PERMITD_BENCH_THREADS")
        .ok()
        .and_then(|value| value.parse::<u16>().ok())
    {
        return threads.max(1);
    }
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    u16::try_from((cores / (NODES + 1)).max(1)).unwrap_or(u16::MAX)
}

/// The cluster settings of every bench cluster. To compare settings without a
/// rebuild: `PERMITD_BENCH_TOML` adds `cluster.toml` tables (e.g. `[limits]
/// entries_in_flight = 8`), `PERMITD_BENCH_RAFT_TIMINGS` replaces the Raft
/// timings as `heartbeat,election_min,election_max` in ms.
fn settings() -> Settings {
    Settings {
        nodes: NODES,
        defaults: "limit = 32\nroundWaitMs = 1\nroundPeriodMs = 1\ngrantTimeoutMs = 60000\n".into(),
        worker_threads: Some(threads_per_process()),
        tls: transport::transport().tls,
        extra_toml: std::env::var("PERMITD_BENCH_TOML").unwrap_or_default(),
        raft_timings_ms: std::env::var("PERMITD_BENCH_RAFT_TIMINGS")
            .ok()
            .and_then(|timings| parse_timings(&timings)),
        // Each row names its shard count; the suite's PERMITD_TEST_SHARDS
        // (every test cluster at 8 shards) does not apply to the bench.
        shards: None,
        ..Settings::default()
    }
}

/// A bench cluster, behind delayed peer links when
/// `PERMITD_BENCH_LINK_DELAY_US` asks for them.
#[derive(Debug)]
pub struct BenchCluster {
    cluster: Cluster,
    /// Dropped after the nodes, which end the links' connections.
    _links: Option<slow_links::SlowLinks>,
}

impl BenchCluster {
    /// Starts a cluster of `settings` (see [`Cluster::start`]).
    pub async fn start(settings: Settings) -> Self {
        let mut links = slow_links::delay_from_env().map(slow_links::SlowLinks::new);
        let cluster = Cluster::start_advertising(settings, |_, raft_addr| {
            links.as_mut().map(|links| links.front(raft_addr))
        })
        .await;
        Self {
            cluster,
            _links: links,
        }
    }
}

impl Deref for BenchCluster {
    type Target = Cluster;
    fn deref(&self) -> &Cluster {
        &self.cluster
    }
}

impl DerefMut for BenchCluster {
    fn deref_mut(&mut self) -> &mut Cluster {
        &mut self.cluster
    }
}

/// `heartbeat,election_min,election_max` in ms.
fn parse_timings(timings: &str) -> Option<(u64, u64, u64)> {
    let parsed: Vec<u64> = timings
        .split(',')
        .map(|part| part.trim().parse().ok())
        .collect::<Option<_>>()?;
    match parsed[..] {
        [heartbeat, min, max] => Some((heartbeat, min, max)),
        _ => None,
    }
}

/// Runs `profile` and returns the report (not yet printed or saved).
pub async fn run(profile: &Profile) -> Report {
    let started = Instant::now();
    let mut report = Report::new(profile.name);
    let mut cluster = BenchCluster::start(settings()).await;
    cluster.wait_for_leader().await;
    // Terms seen outside the failover section: (from, to) stretches.
    let mut calm_from = cpu::max_term(&cluster).await;
    let mut calm_terms = 0;
    if profile.runs("floor") {
        eprintln!("bench: floor");
        let floor = floor::measure(cluster.dir.path(), profile.fsync_samples);
        report.floor(&floor);
    }
    if profile.runs("grant") {
        for &wait in &profile.round_waits_ms {
            for &keys in &profile.grant_keys {
                for &clients in &profile.grant_clients {
                    let run = grant_run(profile, clients, keys, wait, false);
                    let tag = format!("g{wait}-{keys}-{clients}");
                    let leader = leader_for(&cluster, &tag).await;
                    let result = grant::run(&cluster, leader, &run, &tag).await;
                    report.grant(&run, &result);
                }
            }
        }
    }
    if profile.runs("messages") {
        let run = grant_run(profile, profile.saturation_clients, 100, 1, true);
        let leader = leader_for(&cluster, "messages").await;
        let result = grant::run(&cluster, leader, &run, "messages").await;
        report.messages(&run, &result);
    }
    if profile.runs("lease") {
        for (index, &(runners, limit, leases, backlog)) in profile.lease_runs.iter().enumerate() {
            let run = lease::LeaseRun {
                runners,
                keys: 1,
                limit,
                leases,
                backlog,
                permits_per_lease: PERMITS_PER_LEASE,
                round_wait_ms: 1,
                warmup: profile.warmup * 2,
                measure: profile.lease_measure,
            };
            let key = format!("lease-{index}");
            let leader = leader_for(&cluster, &key).await;
            let result = lease::run(&cluster, leader, &run, &key).await;
            report.lease(&run, &result);
        }
    }
    if profile.runs("failover") {
        eprintln!("bench: failover");
        let before = cpu::max_term(&cluster).await;
        calm_terms += before.saturating_sub(calm_from);
        let result = failover::run(&mut cluster, profile.failover_kills).await;
        cluster.wait_for_leader().await;
        calm_from = cpu::max_term(&cluster).await;
        report.failover(&result, calm_from.saturating_sub(before));
    }
    calm_terms += cpu::max_term(&cluster).await.saturating_sub(calm_from);
    drop(cluster);
    if profile.runs("scale") {
        eprintln!("bench: scale");
        let cluster = BenchCluster::start(Settings {
            snapshot_every_logs: scale::SCALE_SNAPSHOT_EVERY_LOGS,
            ..settings()
        })
        .await;
        cluster.wait_for_leader().await;
        let from = cpu::max_term(&cluster).await;
        let points = scale::run(&cluster, &profile.scale_sizes, profile.scale_probe).await;
        calm_terms += cpu::max_term(&cluster).await.saturating_sub(from);
        report.scale(&points);
    }
    if profile.runs("shards") {
        report.shards(&shards::run(profile).await);
    }
    if profile.runs("shard-failover") {
        report.shard_failover(&shard_failover::run(profile).await);
    }
    report.leader_changes(calm_terms);
    report.finish(started.elapsed());
    report
}

/// The current leader (runs may have moved it), announcing run `name`.
async fn leader_for(cluster: &Cluster, name: &str) -> u64 {
    let leader = cluster.wait_for_leader().await;
    eprintln!("bench: {name} (leader {leader})");
    leader
}

fn grant_run(
    profile: &Profile,
    clients: usize,
    keys: usize,
    round_wait_ms: u64,
    with_syncs: bool,
) -> grant::GrantRun {
    grant::GrantRun {
        clients,
        keys,
        round_wait_ms,
        limit: GRANT_LIMIT,
        grant_timeout_ms: 60_000,
        with_syncs,
        warmup: profile.warmup,
        measure: profile.measure,
    }
}
